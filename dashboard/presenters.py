"""Layout of the deadline board: where each bar, whisker and cutoff line sits on a lane's time
axis (percent of the lane's width) and which tone each run gets. Presentation only: what the
numbers mean (cost, the risk order) is decided in forecasting.board, what is shown in
dashboard.pages."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from forecasting.board import Board, RunView
from forecasting.estimators.deadline import on_time_tone
from tracker.models import Deadline

# Tick spacings the axis may use, in seconds: the first that gives at most MAX_TICKS wins.
TICK_STEPS = (
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    172800,
    604800,
    1209600,
    2592000,
)
MAX_TICKS = 7
# Labels past this share of an axis would spill out of it (a label is centred on its time).
KEEP_LABELS_BEFORE = 0.97
# The host page's windows run from 3 minutes to a day: whole minutes first, each spacing at
# most twice the one before, so every window of 7 minutes or more gets at least three labels.
HOST_TICK_STEPS = (60, 120, 180, *TICK_STEPS)
# Share of the axis shown before "now", so the now-line and short bars stay visible.
LEAD_IN = 0.04
# A P90 this many times further than the cutoff is clipped: the lane stays readable and the
# clipped whisker ends in an arrow.
OVERSHOOT = 2.0
NO_DEADLINE_HORIZON_S = 30 * 86400


def tone(o: RunView) -> str:
    """ok / warn / bad by the chance of making the cutoff; info without a cutoff."""
    if o.in_trouble:
        return "bad"  # crashed, failed or stalled: red whatever its odds were
    if not o.run.is_active:
        return "done"
    if o.p_on_time is None:
        return "info" if o.run.deadline_id is None else "unknown"
    return on_time_tone(o.p_on_time)


@dataclass
class Tick:
    left: float
    epoch: float
    daily: bool


@dataclass
class Marker:
    left: float
    epoch: float
    kind: str  # now, train_by, cutoff


@dataclass
class Bar:
    width: float  # from now to the P50 finish
    whisker_left: float
    whisker_width: float
    clipped: bool


@dataclass
class Row:
    o: RunView
    tone: str
    bar: Bar | None


@dataclass
class Lane:
    deadline: Deadline | None
    rows: list[Row]
    ticks: list[Tick]
    markers: list[Marker]
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class BoardView:
    board: Board
    lanes: list[Lane]
    live: bool


class _Axis:
    def __init__(self, now: float, end: float) -> None:
        end = max(end, now + 600)
        self.start = now - LEAD_IN * (end - now)
        self.end = end

    def pos(self, t: float) -> float:
        return max(0.0, min(100.0, 100 * (t - self.start) / (self.end - self.start)))

    def ticks(self) -> list[Tick]:
        return time_ticks(self.start, self.end)


def time_ticks(start: float, end: float, steps: tuple[int, ...] = TICK_STEPS) -> list[Tick]:
    """Ticks on whole multiples of the finest spacing in `steps` that keeps at most MAX_TICKS
    labels, placed in percent of [start, end].

    The count that decides is the count kept: a label in the lane's last 3% is dropped (it would
    spill out), so choosing on width / step alone could leave a 15-minute window with two labels.
    Choosing on the kept count, with spacings at most twice their neighbours, leaves at least
    three whenever the window holds 3.5 of the finest spacing."""
    width = end - start
    inside = start + KEEP_LABELS_BEFORE * width  # the last label must sit before this

    def kept(step: int) -> int:
        first = (math.floor(start / step) + 1) * step
        return max(0, math.ceil((inside - first) / step))

    longest = steps[-1]
    # Past the longest spacing (a cutoff years out), whole multiples of it: never more
    # than MAX_TICKS labels, however far the axis reaches.
    fallback = longest * math.ceil(width / longest / MAX_TICKS)
    step = next((s for s in steps if kept(s) <= MAX_TICKS), fallback)
    first = (math.floor(start / step) + 1) * step

    def pos(t: float) -> float:
        return max(0.0, min(100.0, 100 * (t - start) / width))

    return [
        Tick(pos(t), float(t), step >= 86400)
        for t in range(first, math.ceil(inside), step)
        if t < inside
    ]


def _lane(now: float, deadline: Deadline | None, outlooks: list[RunView]) -> Lane:
    p90s = [o.finish[2] for o in outlooks if o.finish]
    if deadline is not None:
        cutoff = deadline.cutoff.timestamp()
        horizon = cutoff + 0.05 * max(cutoff - now, 600)
        far = max(p90s, default=horizon)
        end = max(horizon, min(far, now + OVERSHOOT * max(cutoff - now, 600)))
    else:
        end = min(max(p90s, default=now + 3600), now + NO_DEADLINE_HORIZON_S)
    axis = _Axis(now, end * 1.0 + 0.03 * (end - now))
    markers = [Marker(axis.pos(now), now, "now")]
    if deadline is not None:
        if deadline.buffer.total_seconds() > 0:
            t = deadline.train_by.timestamp()
            markers.append(Marker(axis.pos(t), t, "train_by"))
        t = deadline.cutoff.timestamp()
        markers.append(Marker(axis.pos(t), t, "cutoff"))
    rows = [Row(o, tone(o), _bar(axis, now, o)) for o in outlooks]
    counts = {
        t: sum(1 for r in rows if r.tone == t and not r.o.in_trouble)
        for t in ("ok", "warn", "bad", "unknown")
    }
    counts["trouble"] = sum(1 for r in rows if r.o.in_trouble)
    return Lane(deadline, rows, axis.ticks(), markers, counts)


def _bar(axis: _Axis, now: float, o: RunView) -> Bar | None:
    if o.finish is None:
        return None
    p10, p50, p90 = o.finish
    left = axis.pos(now)
    wl = axis.pos(p10)
    return Bar(
        width=axis.pos(p50) - left,
        whisker_left=wl,
        whisker_width=max(0.3, axis.pos(p90) - wl),
        clipped=p90 > axis.end,
    )


def board_view(board: Board, now: datetime) -> BoardView:
    t = now.timestamp()
    lanes = [_lane(t, lane.deadline, lane.runs) for lane in board.lanes]
    if board.unscheduled:
        lanes.append(_lane(t, None, board.unscheduled))
    live = any(r.o.run.is_active for lane in lanes for r in lane.rows)
    return BoardView(board, lanes, live)
