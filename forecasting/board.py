"""The deadline board's rules: which runs it lists, what a run costs so far and to finish, and
the risk order runs and lanes are listed in.

`RunView` is a run's outlook (forecasting.selectors.RunOutlook) with its cost and its risk; the
run page shows one too. Pages compose these (dashboard.pages); where bars and ticks sit is
dashboard.presenters'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from forecasting.estimators import formatting as fmt
from forecasting.estimators import thresholds as th
from forecasting.selectors import RunOutlook, outlooks_for, with_latest_forecasts
from tracker.models import Deadline, Membership, Project, Run
from tracker.selectors import deadline_list_for_projects, run_list_recent

# Runs that ended this recently stay on the board, so "did it make it?" is answered there.
RECENT_END = timedelta(hours=24)
# A run that crashed (reported, or inferred by the server: it has no end time) stays longer, at
# the top of its lane: it is the one a lead most needs to see.
CRASH_KEEP = timedelta(hours=72)
# Runs that need someone: they sort above every running run, red.
TROUBLE = (Run.Status.CRASHED, Run.Status.FAILED, Run.Status.STALLED)
BOARD_MAX_RUNS = 500


@dataclass
class RunView(RunOutlook):
    """A run's outlook as a page shows it: with its cost and its place in the risk order."""

    gpu_hours_so_far: float | None = None
    gpu_hours_to_finish: float | None = None
    cost_so_far: float | None = None
    cost_to_finish: float | None = None
    # The processes the cost is priced on, and whether that is the run's word or the default
    # (a run that reports no world size is priced as one process, and pages say so).
    gpu_count: int | None = None
    gpu_count_assumed: bool = False
    # GPU-hours measured by the host agents on the run's GPUs: its own vs others' (or None).
    gpu_split: dict[str, Any] | None = None
    risk: float = 0.0

    @property
    def in_trouble(self) -> bool:
        return self.run.status in TROUBLE

    @property
    def margin_s(self) -> float | None:
        """Seconds to spare before the cutoff (train-by), negative when late: the actual end
        for a finished run, the P50 finish for a running one."""
        if self.run.is_active and self.finish is not None:
            return margin_before_train_by(self.run, at_s=self.finish[1])
        return end_margin_s(self.run)

    @property
    def outcome(self) -> str | None:
        """'made it, 29 s spare' / 'missed by 3 h' for a finished run aimed at a cutoff."""
        return end_outcome(self.run)

    @property
    def margin_text(self) -> str | None:
        """'P50 3 h 6 min after the cutoff' for a running run aimed at a cutoff."""
        margin = self.margin_s
        if margin is None or not self.run.is_active:
            return None
        line = "train-by" if self.run.deadline and self.run.deadline.buffer else "cutoff"
        side = "before" if margin >= 0 else "after"
        return f"P50 {fmt.span(margin)} {side} the {line}"

    @classmethod
    def of(cls, outlook: RunOutlook, *, now: datetime) -> RunView:
        view = cls(**{f.name: getattr(outlook, f.name) for f in fields(RunOutlook)})
        _cost(view, now)
        view.risk = _risk(view)
        return view


def margin_before_train_by(run: Run, *, at_s: float) -> float | None:
    """Seconds from `at_s` (epoch) to the run's train-by (its cutoff less the buffer), negative
    past it; None for a run aimed at no cutoff."""
    if run.deadline is None:
        return None
    return run.deadline.train_by.timestamp() - at_s


def end_margin_s(run: Run) -> float | None:
    """How much a finished run had to spare at its end (negative: how late it was)."""
    if run.status != Run.Status.FINISHED or run.ended_at is None:
        return None
    return margin_before_train_by(run, at_s=run.ended_at.timestamp())


def end_outcome(run: Run) -> str | None:
    """'made it, 29 s spare' / 'missed by 3 h': a finished run against its cutoff, as the board,
    the run page and the end-of-run message say it (one rule)."""
    margin = end_margin_s(run)
    if margin is None:
        return None
    return f"made it, {fmt.span(margin)} spare" if margin >= 0 else f"missed by {fmt.span(margin)}"


def _cost(out: RunView, now: datetime) -> None:
    run = out.run
    # A cost that says "1 process assumed" answers more than a dash (Run.priced_processes).
    gpus, out.gpu_count_assumed = run.priced_processes
    out.gpu_count = gpus
    end = run.ended_at or (now if run.is_active else run.last_seen_at)
    out.gpu_hours_so_far = gpus * max(0.0, (end - run.started_at).total_seconds()) / 3600
    if out.finish is not None:
        left = max(0.0, out.finish[1] - now.timestamp())
        out.gpu_hours_to_finish = gpus * left / 3600
    price = run.project.gpu_hour_price
    if price is not None:
        out.cost_so_far = out.gpu_hours_so_far * float(price)
        if out.gpu_hours_to_finish is not None:
            out.cost_to_finish = out.gpu_hours_to_finish * float(price)


def _risk(out: RunView) -> float:
    """Sort key, higher first: missing the cutoff dominates, then open problems (the weights and
    why: thresholds.py, BOARD RISK)."""
    risk = 0.0
    if out.p_on_time is not None:
        risk += 1.0 - out.p_on_time
    elif out.run.deadline is not None and out.run.is_active:
        risk += th.BOARD_RISK_NO_FORECAST
    risk += th.BOARD_RISK_PER_FLAG * min(len(out.flags), th.BOARD_RISK_FLAGS_MAX)
    if out.in_trouble:
        risk += th.BOARD_RISK_TROUBLE
    elif not out.run.is_active:
        risk -= th.BOARD_RISK_ENDED_SINK
    return risk


@dataclass
class DeadlineLane:
    deadline: Deadline
    runs: list[RunView]

    @property
    def worst_p(self) -> float | None:
        ps = [r.p_on_time for r in self.runs if r.p_on_time is not None]
        return min(ps) if ps else None


@dataclass
class Board:
    now: datetime
    memberships: list[Membership]
    lanes: list[DeadlineLane]
    unscheduled: list[RunView]
    # Cutoffs older than the lanes keep (RECENT_END), newest first: listed under the board.
    past: list[Deadline] = field(default_factory=list)

    @property
    def run_count(self) -> int:
        return len(self.unscheduled) + sum(len(lane.runs) for lane in self.lanes)


def board_runs(*, projects: list[Project], now: datetime) -> list[RunView]:
    """The runs the board lists, newest word first, with their outlooks (3 queries)."""
    by_id = {p.pk: p for p in projects}
    recent = run_list_recent(
        projects=projects, ended_since=now - RECENT_END, crashed_since=now - CRASH_KEEP
    )
    runs = list(with_latest_forecasts(recent, now=now).order_by("-last_seen_at")[:BOARD_MAX_RUNS])
    for run in runs:
        run.project = by_id[run.project_id]  # already loaded: no join per run
        if run.deadline is not None:
            run.deadline.project = run.project
    return [RunView.of(o, now=now) for o in outlooks_for(runs)]


def board_deadlines(*, projects: list[Project], now: datetime) -> list[Deadline]:
    """The lanes the board opens: cutoffs ahead, and those passed within RECENT_END (1 query)."""
    return deadline_list_for_projects(projects=projects, cutoff_since=now - RECENT_END)


def board_arrange(
    *, now: datetime, memberships: list[Membership], runs: list[RunView], deadlines: list[Deadline]
) -> Board:
    """Runs into their deadlines' lanes, riskiest first; lanes with runs first, the worst odds
    first, then by cutoff."""
    lanes = {d.pk: DeadlineLane(deadline=d, runs=[]) for d in deadlines}
    unscheduled = []
    for o in runs:
        if o.run.deadline_id is None:
            unscheduled.append(o)
            continue
        if o.run.deadline_id not in lanes:  # a past cutoff that a run still aims at
            assert o.run.deadline is not None  # deadline_id is set
            lanes[o.run.deadline_id] = DeadlineLane(deadline=o.run.deadline, runs=[])
        lanes[o.run.deadline_id].runs.append(o)
    for lane in lanes.values():
        lane.runs.sort(key=_run_key)
    unscheduled.sort(key=_run_key)
    return Board(
        now=now,
        memberships=memberships,
        lanes=sorted(lanes.values(), key=_lane_key),
        unscheduled=unscheduled,
    )


def _run_key(o: RunView) -> tuple[float, float]:
    return (-o.risk, o.finish[1] if o.finish else math.inf)


def _lane_key(lane: DeadlineLane) -> tuple[int, float, float]:
    worst = lane.worst_p
    return (
        0 if lane.runs else 1,
        worst if worst is not None else 1.0,
        lane.deadline.cutoff.timestamp(),
    )
