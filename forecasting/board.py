"""What the deadline board and the run page show, read in a bounded number of queries.

The board answers "which runs make their cutoffs, which are at risk and why" for every project
of a user. Everything here is read from stored forecasts and flags (the forecasting task did the
work), plus run summary fields, so the number of queries does not grow with runs or points:
latest forecasts per kind are picked by correlated subqueries that the (run, kind, computed_at)
index serves, then fetched by id in one query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db.models import (
    BinaryField,
    F,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models import OuterRef as Outer
from django.db.models.functions import Substr

from forecasting.models import Flag, Forecast
from forecasting.selectors import flag_history, open_flags_by_run
from forecasting.services import loss_key_for
from tracker.models import Deadline, Event, Membership, MetricChunk, Run, RunSegment
from tracker.selectors import series_keys
from tracker.series import concat, latest_wins, superseded_mask

# How far back "how the ETA moved" looks: a lead's day.
MOVE_WINDOW = timedelta(hours=24)
# Runs that ended this recently stay on the board, so "did it make it?" is answered there.
RECENT_END = timedelta(hours=24)
BOARD_MAX_RUNS = 500


@dataclass
class RunOutlook:
    """One run as the board and run page show it. Times are epoch seconds."""

    run: Run
    eta: dict[str, Any] | None = None
    finish: tuple[float, float, float] | None = None  # P10, P50, P90 finish
    computed_at: datetime | None = None
    deadline_risk: dict[str, Any] | None = None
    p_on_time: float | None = None
    eta_moved_s: float | None = None  # + later (slipped), - earlier, over the window
    eta_moved_over_s: float | None = None  # the span the move was measured over
    rate: float | None = None  # steps per second now
    rate_change: float | None = None  # relative change over the same window (-0.1 = 10% slower)
    loss: dict[str, Any] | None = None
    flags: list[Flag] = field(default_factory=list)
    gpu_hours_so_far: float | None = None
    gpu_hours_to_finish: float | None = None
    cost_so_far: float | None = None
    cost_to_finish: float | None = None
    risk: float = 0.0

    @property
    def half_spread_s(self) -> float | None:
        return None if self.finish is None else (self.finish[2] - self.finish[0]) / 2

    @property
    def loss_healthy(self) -> bool:
        return not any(f.kind in Flag.DIVERGENCE_KINDS for f in self.flags)


@dataclass
class DeadlineLane:
    deadline: Deadline
    runs: list[RunOutlook]

    @property
    def worst_p(self) -> float | None:
        ps = [r.p_on_time for r in self.runs if r.p_on_time is not None]
        return min(ps) if ps else None


@dataclass
class Board:
    now: datetime
    memberships: list[Membership]
    lanes: list[DeadlineLane]
    unscheduled: list[RunOutlook]

    @property
    def run_count(self) -> int:
        return len(self.unscheduled) + sum(len(lane.runs) for lane in self.lanes)


def _latest_id(kind: str, **extra: Any) -> Subquery:
    qs = Forecast.objects.filter(run=Outer("pk"), kind=kind, **extra)
    return Subquery(qs.order_by("-computed_at", "-id").values("id")[:1])


def _annotated(runs: QuerySet[Run], now: datetime) -> QuerySet[Run]:
    window_start = Forecast.objects.filter(
        run=Outer("pk"), kind=Forecast.Kind.ETA, computed_at__gte=now - MOVE_WINDOW
    ).order_by("computed_at", "id")
    return runs.annotate(
        eta_id=_latest_id(Forecast.Kind.ETA),
        eta_start_id=Subquery(window_start.values("id")[:1]),
        deadline_fc_id=_latest_id(Forecast.Kind.DEADLINE),
        loss_id=_latest_id(Forecast.Kind.LOSS),
    )


def outlooks_for(runs: list[Run], *, now: datetime) -> list[RunOutlook]:
    """Outlooks of runs fetched through `_annotated` (2 queries whatever their number)."""
    ids = {
        getattr(r, a)
        for r in runs
        for a in ("eta_id", "eta_start_id", "deadline_fc_id", "loss_id")
        if getattr(r, a, None)
    }
    forecasts = {f.id: f for f in Forecast.objects.filter(id__in=ids)} if ids else {}
    flags = open_flags_by_run([r.pk for r in runs]) if runs else {}
    return [
        _outlook(
            run,
            forecasts=forecasts,
            flags=flags.get(run.pk, []),
            now=now,
        )
        for run in runs
    ]


def _outlook(
    run: Run, *, forecasts: dict[int, Forecast], flags: list[Flag], now: datetime
) -> RunOutlook:
    out = RunOutlook(run=run, flags=flags)
    eta = forecasts.get(getattr(run, "eta_id", None) or -1)
    start = forecasts.get(getattr(run, "eta_start_id", None) or -1)
    if eta is not None and run.is_active and eta.finish_p50 is not None:
        out.eta, out.computed_at = eta.data, eta.computed_at
        out.finish = (
            eta.finish_p10 or eta.finish_p50,
            eta.finish_p50,
            eta.finish_p90 or eta.finish_p50,
        )
        out.rate = eta.data.get("rate_steps_per_s")
        if start is not None and start.id != eta.id and start.finish_p50 is not None:
            out.eta_moved_s = eta.finish_p50 - start.finish_p50
            out.eta_moved_over_s = (eta.computed_at - start.computed_at).total_seconds()
            start_rate = start.data.get("rate_steps_per_s")
            if out.rate and start_rate:
                out.rate_change = out.rate / start_rate - 1.0
    dl = forecasts.get(getattr(run, "deadline_fc_id", None) or -1)
    if dl is not None and run.deadline is not None and run.is_active:
        out.deadline_risk = dl.data
        out.p_on_time = dl.data.get("p_on_time")
    loss = forecasts.get(getattr(run, "loss_id", None) or -1)
    if loss is not None:
        out.loss = loss.data
    _cost(out, now)
    out.risk = _risk(out)
    return out


def _cost(out: RunOutlook, now: datetime) -> None:
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


def _risk(out: RunOutlook) -> float:
    """Sort key, higher first: missing the cutoff dominates, then open problems."""
    risk = 0.0
    if out.p_on_time is not None:
        risk += 1.0 - out.p_on_time
    elif out.run.deadline is not None and out.run.is_active:
        risk += 0.5  # aimed at a cutoff with no forecast yet: unknown is not safe
    risk += 0.15 * min(len(out.flags), 3)
    if out.run.status == Run.Status.STALLED:
        risk += 0.3
    if not out.run.is_active:
        risk -= 2.0  # ended runs sink to the bottom of their lane
    return risk


def board_for_user(*, user: Any, now: datetime) -> Board:
    """The deadline board of every project the user belongs to (7 queries with session/user)."""
    memberships = list(
        Membership.objects.select_related("project").filter(user=user).order_by("project__name")
    )
    projects = [m.project for m in memberships]
    by_id = {p.pk: p for p in projects}
    runs = list(
        _annotated(
            Run.objects.select_related("deadline")
            .filter(project__in=projects)
            .filter(Q(status__in=Run.ACTIVE_STATUSES) | Q(ended_at__gte=now - RECENT_END)),
            now,
        ).order_by("-last_seen_at")[:BOARD_MAX_RUNS]
    )
    for run in runs:
        run.project = by_id[run.project_id]  # already loaded: no join per run
        if run.deadline is not None:
            run.deadline.project = run.project
    outlooks = outlooks_for(runs, now=now)
    deadlines = list(
        Deadline.objects.filter(project__in=projects, cutoff__gte=now - RECENT_END).order_by(
            "cutoff"
        )
    )
    for deadline in deadlines:
        deadline.project = by_id[deadline.project_id]
    return _arrange(now, memberships, outlooks, deadlines)


def _arrange(
    now: datetime,
    memberships: list[Membership],
    outlooks: list[RunOutlook],
    deadlines: list[Deadline],
) -> Board:
    lanes = {d.pk: DeadlineLane(deadline=d, runs=[]) for d in deadlines}
    unscheduled = []
    for o in outlooks:
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
    outlook: RunOutlook
    flag_history: list[Flag]
    loss_key: str | None
    keys: list[str]

    @property
    def other_key(self) -> str | None:
        """The metric the "other metrics" chart opens on: the first that is not the loss."""
        return next((k for k in self.keys if k != self.loss_key), self.loss_key)


def run_page(*, run: Run, now: datetime) -> RunPage:
    """Summary of one run for its page (a constant handful of queries)."""
    annotated = _annotated(Run.objects.select_related("project", "deadline"), now).get(pk=run.pk)
    outlook = outlooks_for([annotated], now=now)[0]
    keys = series_keys(run=run)
    history = list(flag_history(run=run, limit=100))
    return RunPage(outlook=outlook, flag_history=history, loss_key=loss_key_for(keys), keys=keys)


@dataclass(frozen=True)
class Marker:
    kind: str  # checkpoint, eval, resume, restart, onset, rollback
    step: float
    label: str


def run_markers(*, run: Run, limit: int = 500) -> list[Marker]:
    """Checkpoints, evaluations, resumes and divergence onsets/rollbacks, for the loss chart."""
    kinds = (Event.Kind.CHECKPOINT, Event.Kind.EVAL, Event.Kind.RESUME, Event.Kind.RESTART)
    out = [
        Marker(kind, float(step), _event_label(kind, payload))
        for kind, step, payload in Event.objects.filter(run=run, kind__in=kinds, step__isnull=False)
        .order_by("-step")
        .values_list("kind", "step", "payload")[:limit]
        if step is not None
    ]
    for number, first, prev in RunSegment.objects.filter(run=run, number__gt=1).values_list(
        "number", "first_step", "previous_last_step"
    ):
        if first is not None:
            lost = f", {prev - first:,} steps redone" if prev is not None and prev > first else ""
            out.append(Marker("resume", float(first), f"resume #{number - 1}{lost}"))
    for flag in open_flags_by_run([run.pk]).get(run.pk, []):
        if flag.kind in Flag.DIVERGENCE_KINDS and flag.onset_step is not None:
            out.append(Marker("onset", float(flag.onset_step), f"{flag.kind} onset"))
            rollback = flag.data.get("rollback_step")
            if rollback is not None:
                out.append(Marker("rollback", float(rollback), "suggested rollback"))
    return sorted(out, key=lambda m: m.step)


def _event_label(kind: str, payload: dict[str, Any]) -> str:
    detail = payload.get("path") or payload.get("name") or payload.get("reason") or ""
    return f"{kind} {detail}".strip()[:80]


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


# --- throughput ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputView:
    key: str | None
    x: np.ndarray  # step at the bucket's middle
    rate: np.ndarray  # steps/s over the bucket (steps done / time taken)
    lo: np.ndarray  # slowest interval in the bucket
    hi: np.ndarray  # fastest
    source: str  # "raw" (every point) or "chunks" (each batch's first and last point)


# Raw points are read when the range holds at most this many; otherwise each chunk's first and
# last (step, time), read by SUBSTRING so a 1M-point series costs ~2 numbers per batch.
THROUGHPUT_RAW_MAX = 200_000


def throughput_view(
    *, run: Run, buckets: int, x0: float | None = None, x1: float | None = None
) -> ThroughputView:
    """Steps per second along the run, derived from the progress series' (step, time) pairs."""
    key_list = series_keys(run=run)
    key = loss_key_for(key_list) or (key_list[0] if key_list else None)
    empty = np.empty(0)
    if key is None:
        return ThroughputView(None, empty, empty, empty, empty, "raw")
    every = list(
        MetricChunk.objects.filter(run=run, key=key).values_list(
            "id", "segment", "n", "min_step", "max_step"
        )
    )
    # Segment starts come from every chunk: a resume outside the zoomed range still decides
    # which earlier points it superseded inside it.
    firsts: dict[int, int] = {}
    for _, seg, _, low, _ in every:
        firsts[seg] = min(firsts.get(seg, low), low)
    meta = [m for m in every if (x0 is None or m[4] >= x0) and (x1 is None or m[3] <= x1)]
    if sum(m[2] for m in meta) <= THROUGHPUT_RAW_MAX:
        steps, times, segs = _throughput_raw([m[0] for m in meta], firsts)
        source = "raw"
    else:
        steps, times, segs = _throughput_endpoints(run, key, x0, x1, firsts)
        source = "chunks"
    x, rate, lo, hi = _rate_buckets(steps, times, segs, buckets=buckets, x0=x0, x1=x1)
    return ThroughputView(key, x, rate, lo, hi, source)


def _throughput_raw(
    ids: list[int], firsts: dict[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = (
        MetricChunk.objects.filter(id__in=ids)
        .order_by("segment", "min_step", "id")
        .values_list("segment", "steps", "times")
    )
    # Values are not needed: the times blob stands in for them, saving a third of the read.
    series = latest_wins(concat([(g, bytes(s), bytes(t), bytes(t)) for g, s, t in rows]), firsts)
    return series.steps.astype(float), series.times, series.segments


def _throughput_endpoints(
    run: Run, key: str, x0: float | None, x1: float | None, firsts: dict[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    qs = MetricChunk.objects.filter(run=run, key=key, n__gte=1)
    if x0 is not None:
        qs = qs.filter(max_step__gte=x0)
    if x1 is not None:
        qs = qs.filter(min_step__lte=x1)
    rows = list(
        qs.annotate(
            t_first=Substr("times", 1, 8, output_field=BinaryField()),
            t_last=Substr("times", F("n") * 8 - 7, 8, output_field=BinaryField()),
        )
        .order_by("segment", "min_step", "id")
        .values_list("segment", "first_step", "last_step", "t_first", "t_last")
    )
    if not rows:
        return np.empty(0), np.empty(0), np.empty(0, dtype=np.int64)
    segs = np.repeat(np.array([r[0] for r in rows], dtype=np.int64), 2)
    steps = np.array([(r[1], r[2]) for r in rows], dtype=float).ravel()
    times = np.frombuffer(b"".join(bytes(r[3]) + bytes(r[4]) for r in rows), dtype="<f8")
    keep = superseded_mask(segs, steps, firsts)
    return steps[keep], times[keep].astype(float), segs[keep]


def _rate_buckets(
    steps: np.ndarray,
    times: np.ndarray,
    segs: np.ndarray,
    *,
    buckets: int,
    x0: float | None,
    x1: float | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    empty = np.empty(0)
    if steps.size < 2:
        return empty, empty, empty, empty
    order = np.lexsort((times, segs))
    s, t, g = steps[order], times[order], segs[order]
    ds, dt = np.diff(s), np.diff(t)
    # Only forward progress inside one segment; a resume's rollback is not throughput.
    ok = (g[1:] == g[:-1]) & (ds > 0) & (dt > 0) & np.isfinite(dt)
    mid = (s[1:] + s[:-1])[ok] / 2
    ds, dt = ds[ok], dt[ok]
    if mid.size == 0:
        return empty, empty, empty, empty
    lo_x = float(mid.min()) if x0 is None else x0
    hi_x = float(mid.max()) if x1 is None else x1
    inside = (mid >= lo_x) & (mid <= hi_x)
    mid, ds, dt = mid[inside], ds[inside], dt[inside]
    if mid.size == 0:
        return empty, empty, empty, empty
    n = min(buckets, mid.size)
    edges = np.linspace(lo_x, hi_x if hi_x > lo_x else lo_x + 1, n + 1)
    idx = np.clip(np.searchsorted(edges, mid, side="right") - 1, 0, n - 1)
    sum_s = np.bincount(idx, weights=ds, minlength=n)
    sum_t = np.bincount(idx, weights=dt, minlength=n)
    rates = ds / dt
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    np.minimum.at(lo, idx, rates)
    np.maximum.at(hi, idx, rates)
    keep = sum_t > 0
    centres = (edges[:-1] + edges[1:]) / 2
    return centres[keep], sum_s[keep] / sum_t[keep], lo[keep], hi[keep]
