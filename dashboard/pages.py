"""What the deadline board and the run page show, composed from the selectors of the layers
below (forecast outlooks, open flags, run summaries) in a bounded number of queries, plus what
only a page needs: cost so far and to finish, and the risk order runs are listed in.

Layout (where bars and ticks sit) is in dashboard.presenters; this module decides what is shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db.models import Q

from forecasting.estimators import formatting as fmt
from forecasting.gpu import selectors as gpu_selectors
from forecasting.models import Flag
from forecasting.selectors import (
    RunOutlook,
    flag_history,
    open_flags_by_run,
    outlooks_for,
    with_latest_forecasts,
)
from tracker import rank_timings
from tracker.models import Deadline, Membership, Run
from tracker.selectors import Marker, loss_key_for, run_markers, series_keys, series_last

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
        deadline = self.run.deadline
        if deadline is None:
            return None
        train_by = deadline.train_by.timestamp()
        if self.run.status == Run.Status.FINISHED and self.run.ended_at is not None:
            return train_by - self.run.ended_at.timestamp()
        if self.run.is_active and self.finish is not None:
            return train_by - self.finish[1]
        return None

    @property
    def outcome(self) -> str | None:
        """'made it, 29 s spare' / 'missed by 3 h' for a finished run aimed at a cutoff."""
        margin = self.margin_s
        if margin is None or self.run.is_active:
            return None
        return (
            f"made it, {fmt.span(margin)} spare" if margin >= 0 else f"missed by {fmt.span(margin)}"
        )

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


def _cost(out: RunView, now: datetime) -> None:
    run = out.run
    if not run.world_size:
        return
    end = run.ended_at or (now if run.is_active else run.last_seen_at)
    out.gpu_hours_so_far = run.world_size * max(0.0, (end - run.started_at).total_seconds()) / 3600
    if out.finish is not None:
        left = max(0.0, out.finish[1] - now.timestamp())
        out.gpu_hours_to_finish = run.world_size * left / 3600
    price = run.project.gpu_hour_price
    if price is not None:
        out.cost_so_far = out.gpu_hours_so_far * float(price)
        if out.gpu_hours_to_finish is not None:
            out.cost_to_finish = out.gpu_hours_to_finish * float(price)


def _risk(out: RunView) -> float:
    """Sort key, higher first: missing the cutoff dominates, then open problems."""
    risk = 0.0
    if out.p_on_time is not None:
        risk += 1.0 - out.p_on_time
    elif out.run.deadline is not None and out.run.is_active:
        risk += 0.5  # aimed at a cutoff with no forecast yet: unknown is not safe
    risk += 0.15 * min(len(out.flags), 3)
    if out.in_trouble:
        risk += 3.0  # crashed, failed or stalled: above every running run, whatever its odds
    elif not out.run.is_active:
        risk -= 2.0  # runs that finished sink to the bottom of their lane
    return risk


# --- the board -------------------------------------------------------------------------------


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

    @property
    def run_count(self) -> int:
        return len(self.unscheduled) + sum(len(lane.runs) for lane in self.lanes)


def board_for_user(*, user: Any, now: datetime) -> Board:
    """The deadline board of every project the user belongs to (7 queries with session/user)."""
    memberships = list(
        Membership.objects.select_related("project").filter(user=user).order_by("project__name")
    )
    projects = [m.project for m in memberships]
    by_id = {p.pk: p for p in projects}
    runs = list(
        with_latest_forecasts(
            Run.objects.select_related("deadline")
            .filter(project__in=projects)
            .filter(
                Q(status__in=Run.ACTIVE_STATUSES)
                | Q(ended_at__gte=now - RECENT_END)
                # A crash the server inferred has no end time: its last word dates it.
                | Q(status=Run.Status.CRASHED, last_seen_at__gte=now - CRASH_KEEP)
            ),
            now=now,
        ).order_by("-last_seen_at")[:BOARD_MAX_RUNS]
    )
    for run in runs:
        run.project = by_id[run.project_id]  # already loaded: no join per run
        if run.deadline is not None:
            run.deadline.project = run.project
    views = [RunView.of(o, now=now) for o in outlooks_for(runs)]
    deadlines = list(
        Deadline.objects.filter(project__in=projects, cutoff__gte=now - RECENT_END).order_by(
            "cutoff"
        )
    )
    for deadline in deadlines:
        deadline.project = by_id[deadline.project_id]
    return _arrange(now, memberships, views, deadlines)


def _arrange(
    now: datetime, memberships: list[Membership], views: list[RunView], deadlines: list[Deadline]
) -> Board:
    lanes = {d.pk: DeadlineLane(deadline=d, runs=[]) for d in deadlines}
    unscheduled = []
    for o in views:
        if o.run.deadline_id is None:
            unscheduled.append(o)
            continue
        if o.run.deadline_id not in lanes:  # a past cutoff that a run still aims at
            assert o.run.deadline is not None  # deadline_id is set
            lanes[o.run.deadline_id] = DeadlineLane(deadline=o.run.deadline, runs=[])
        lanes[o.run.deadline_id].runs.append(o)
    for lane in lanes.values():
        lane.runs.sort(key=lambda o: (-o.risk, o.finish[1] if o.finish else math.inf))
    unscheduled.sort(key=lambda o: (-o.risk, o.finish[1] if o.finish else math.inf))

    def lane_key(lane: DeadlineLane) -> tuple[int, float, float]:
        worst = lane.worst_p
        return (
            0 if lane.runs else 1,
            worst if worst is not None else 1.0,
            lane.deadline.cutoff.timestamp(),
        )

    return Board(
        now=now,
        memberships=memberships,
        lanes=sorted(lanes.values(), key=lane_key),
        unscheduled=unscheduled,
    )


# --- the run page ----------------------------------------------------------------------------


@dataclass
class RunPage:
    outlook: RunView
    flag_history: list[Flag]
    loss_key: str | None
    keys: list[str]
    # Whether any rank sent step timings: the ranks panel (heat map, slowest ranks) shows then.
    has_ranks: bool = False
    # An ended run's (step, loss) at its end: it has no forecast any more, and "healthy" alone
    # did not say what it reached.
    final_loss: tuple[float, float] | None = None

    @property
    def other_key(self) -> str | None:
        """The metric the "other metrics" chart opens on: the first that is not the loss."""
        return next((k for k in self.keys if k != self.loss_key), self.loss_key)


def run_page(*, run: Run, now: datetime) -> RunPage:
    """Summary of one run for its page (a constant handful of queries)."""
    annotated = with_latest_forecasts(
        Run.objects.select_related("project", "deadline"), now=now
    ).get(pk=run.pk)
    outlook = RunView.of(outlooks_for([annotated])[0], now=now)
    # Only here, not on the board: it reads the run's hosts' batch summaries.
    outlook.gpu_split = gpu_selectors.run_gpu_hours(run=annotated, now=now.timestamp())
    keys = series_keys(run=run)
    history = list(flag_history(run=run, limit=100))
    loss_key = loss_key_for(keys)
    final = None
    if loss_key is not None and not annotated.is_active:
        final = series_last(run=run, key=loss_key)
    return RunPage(
        outlook=outlook,
        flag_history=history,
        loss_key=loss_key,
        keys=keys,
        has_ranks=rank_timings.has_rank_timings(run=run),
        final_loss=final,
    )


def chart_markers(*, run: Run) -> list[Marker]:
    """The run's own markers, plus each open divergence flag's onset and suggested rollback."""
    out = run_markers(run=run)
    for flag in open_flags_by_run([run.pk]).get(run.pk, []):
        if flag.kind in Flag.DIVERGENCE_KINDS and flag.onset_step is not None:
            out.append(Marker("onset", float(flag.onset_step), f"{flag.kind} onset"))
            rollback = flag.data.get("rollback_step")
            if rollback is not None:
                out.append(Marker("rollback", float(rollback), "suggested rollback"))
        if flag.kind == Flag.Kind.STRAGGLER and flag.onset_step is not None:
            who = _straggler_who(flag.data)
            out.append(Marker("straggler", float(flag.onset_step), f"straggler onset: {who}"))
    return sorted(out, key=lambda m: m.step)


def _straggler_who(data: dict[str, Any]) -> str:
    ranks = [r for r in data.get("ranks") or [] if isinstance(r, int)]
    host = data.get("host") if isinstance(data.get("host"), str) else None
    if data.get("kind") == "host" and host:
        return host
    named = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks"
    return f"{named} on {host}" if host else named


@dataclass
class RanksView:
    """The ranks panel's data: the heat map (per host, or one host's ranks) and the slowest."""

    heatmap: rank_timings.Heatmap
    mode: str  # "hosts" or "ranks"
    hosts: list[str]
    ranks: int
    window: tuple[int, int] | None


# The heat map aggregates per host once a job has more ranks than this (thousands of rows
# would be one pixel each); below it every rank is a row.
RANK_ROWS_MAX = 64


def ranks_view(*, run: Run, host: str | None, buckets: int, last_steps: int) -> RanksView:
    timings = rank_timings.rank_timings_window(run=run, last_steps=last_steps)
    hosts = sorted({h or "(no host)" for h in timings.hosts})
    if host is None and timings.ranks.size <= RANK_ROWS_MAX:
        heat = rank_timings.heatmap(timings, buckets=buckets, by_host=False)
        mode = "ranks"
    else:
        heat = rank_timings.heatmap(timings, buckets=buckets, host=host)
        mode = "ranks" if host is not None else "hosts"
    window = (int(timings.steps[0]), int(timings.steps[-1])) if timings.steps.size else None
    return RanksView(heat, mode, hosts, int(timings.ranks.size), window)


def loss_forecast_path(
    loss: dict[str, Any], *, from_step: float, points: int = 24
) -> dict[str, list[float]] | None:
    """The loss forecast drawn as a fan from the current smoothed level to the planned end.

    Interpolated in log-step, the shape of a power-law tail; only its end is a forecast, the
    path between is a guide for the eye.
    """
    end, start_v = loss.get("final_step"), loss.get("smoothed_last")
    if end is None or start_v is None or from_step <= 0 or end <= from_step:
        return None
    steps = np.geomspace(from_step, end, points)
    frac = (np.log(steps) - math.log(from_step)) / (math.log(end) - math.log(from_step))
    out: dict[str, list[float]] = {"x": steps.tolist()}
    for q in ("p10", "p50", "p90"):
        v = loss.get(q)
        if v is None:
            return None
        out[q] = (start_v + (v - start_v) * frac).tolist()
    return out
