"""Reads of tracked data. Pages and tasks call these; none of them writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.db.models import BinaryField, F, Q, QuerySet
from django.db.models.functions import Substr

from tracker.models import Deadline, Event, Membership, MetricChunk, Project, Run, RunSegment
from tracker.series import (
    ROLLUP_BLOCK,
    Series,
    concat,
    latest_wins,
    minmax_buckets,
    rollup_buckets,
    rollup_concat,
    rollup_latest_wins,
    superseded_mask,
)


def run_get(*, project: Project, public_id: str) -> Run | None:
    if "\x00" in public_id:
        # No run id holds NUL (a URL's %00), and PostgreSQL refuses it in a query: not found.
        return None
    return (
        Run.objects.select_related("project", "deadline")
        .filter(project=project, public_id=public_id)
        .first()
    )


def run_list(*, project: Project, status: str | None = None) -> QuerySet[Run]:
    qs = Run.objects.select_related("project", "deadline").filter(project=project)
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("-last_seen_at")


def membership_get(*, user: Any, project_slug: str) -> Membership | None:
    if not user.is_authenticated:
        return None
    return (
        Membership.objects.select_related("project")
        .filter(user=user, project__slug=project_slug)
        .first()
    )


def membership_list_for_user(*, user: Any) -> list[Membership]:
    """The user's memberships with their projects, by project name (one query)."""
    return list(
        Membership.objects.select_related("project").filter(user=user).order_by("project__name")
    )


def run_list_recent(
    *, projects: list[Project], ended_since: datetime, crashed_since: datetime
) -> QuerySet[Run]:
    """Runs of these projects that are active, ended since `ended_since`, or crashed and were
    last heard from since `crashed_since`, with their deadlines; deleted runs never."""
    return (
        Run.objects.select_related("deadline")
        .filter(project__in=projects, deleted_at__isnull=True)
        .filter(
            Q(status__in=Run.ACTIVE_STATUSES)
            | Q(ended_at__gte=ended_since)
            # A crash the server inferred has no end time: its last word dates it.
            | Q(status=Run.Status.CRASHED, last_seen_at__gte=crashed_since)
        )
    )


def deadline_list_for_projects(
    *, projects: list[Project], cutoff_since: datetime
) -> list[Deadline]:
    """Deadlines of these projects whose cutoff is not before `cutoff_since`, soonest first, each
    given its project from `projects` (one query, no join)."""
    by_id = {p.pk: p for p in projects}
    deadlines = list(
        Deadline.objects.filter(project__in=projects, cutoff__gte=cutoff_since).order_by("cutoff")
    )
    for deadline in deadlines:
        deadline.project = by_id[deadline.project_id]
    return deadlines


def deadline_choices(*, project: Project) -> list[tuple[str, str]]:
    """(slug, name) of the project's deadlines, as a run's plan form offers them."""
    return list(project.deadlines.values_list("slug", "name"))


# The series a run's loss (and, failing that, its progress) is read from, in order of preference.
LOSS_KEYS = ("loss", "train_loss", "train/loss", "val_loss", "eval_loss")


def loss_key_for(keys: list[str]) -> str | None:
    return next((k for k in LOSS_KEYS if k in keys), None)


def series_keys(*, run: Run) -> list[str]:
    return list(
        MetricChunk.objects.filter(run=run).order_by("key").values_list("key", flat=True).distinct()
    )


def series_load(*, run: Run, key: str, resolve: bool = True) -> Series:
    """Every point of one key, in storage order; `resolve` applies latest-segment-wins."""
    rows = (
        MetricChunk.objects.filter(run=run, key=key)
        .order_by("segment", "min_step", "id")
        .values_list("segment", "steps", "values", "times")
    )
    series = concat([(seg, bytes(s), bytes(v), bytes(t)) for seg, s, v, t in rows])
    return latest_wins(series) if resolve else series


def series_last(*, run: Run, key: str, points: int = 50) -> tuple[float, float] | None:
    """(step, median value) of the last `points` finite points of one key, or None: what a
    finished run ended at, reading only the newest chunks of its latest segment (2 queries).

    A median, not the last point: one noisy batch is not what the run reached."""
    meta = list(
        MetricChunk.objects.filter(run=run, key=key)
        .order_by("-segment", "-max_step", "-id")
        .values_list("id", "segment", "n", "nonfinite")
    )
    if not meta:
        return None
    latest, ids, finite = meta[0][1], [], 0
    for chunk_id, segment, n, nonfinite in meta:
        if segment != latest or finite >= points:
            break
        ids.append(chunk_id)
        finite += n - nonfinite
    series = _load_chunks(ids, {})
    ok = np.isfinite(series.values)
    if not ok.any():
        return None
    order = np.argsort(series.steps[ok], kind="stable")
    steps, values = series.steps[ok][order][-points:], series.values[ok][order][-points:]
    return float(steps[-1]), float(np.median(values))


@dataclass(frozen=True)
class SeriesView:
    """A chart's worth of one key over a step range: per-bucket mean, min and max."""

    key: str
    points: int  # points in the range (before downsampling)
    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    nonfinite_steps: np.ndarray
    source: str  # "raw" or "rollup"
    x_min: float | None  # the whole series' step range, for the zoom-out control
    x_max: float | None


# Read raw points when a bucket would hold fewer than this many; rollups otherwise. Rollup
# blocks hold 64 points, so below ~16 per bucket they would blur neighbouring buckets.
RAW_POINTS_PER_BUCKET = ROLLUP_BLOCK // 4


def series_view(
    *, run: Run, key: str, buckets: int, x0: float | None = None, x1: float | None = None
) -> SeriesView:
    """Downsample one key for a chart, reading only the chunks the range needs."""
    meta = list(
        MetricChunk.objects.filter(run=run, key=key).values_list(
            "id", "segment", "n", "min_step", "max_step", "nonfinite"
        )
    )
    empty = np.empty(0)
    if not meta:
        return SeriesView(key, 0, empty, empty, empty, empty, empty, "raw", None, None)
    firsts: dict[int, int] = {}
    for _, seg, _, low, _, _ in meta:
        firsts[seg] = min(firsts.get(seg, low), low)
    x_min = float(min(m[3] for m in meta))
    x_max = float(max(m[4] for m in meta))
    lo_x = x_min if x0 is None else x0
    hi_x = x_max if x1 is None else x1
    chosen = [m for m in meta if m[4] >= lo_x and m[3] <= hi_x]
    # Points in range, assuming points spread evenly over each chunk's step span.
    n = int(sum(m[2] * (min(m[4], hi_x) - max(m[3], lo_x) + 1) / (m[4] - m[3] + 1) for m in chosen))
    ids = [m[0] for m in chosen]
    nonfinite = _nonfinite_steps(run, key, [m[0] for m in chosen if m[5]], firsts, lo_x, hi_x)
    if n > buckets * RAW_POINTS_PER_BUCKET:
        rows = MetricChunk.objects.filter(id__in=ids).order_by("segment", "min_step", "id")
        r = rollup_latest_wins(
            rollup_concat([(seg, bytes(b)) for seg, b in rows.values_list("segment", "rollup")]),
            firsts,
        )
        inside = (r.first >= lo_x) & (r.first <= hi_x)
        r = type(r)(*(a[inside] for a in (r.first, r.last, r.lo, r.hi, r.mean, r.segments)))
        x, mean, lo, hi = rollup_buckets(r, x0=lo_x, x1=hi_x, buckets=buckets)
        return SeriesView(key, n, x, mean, lo, hi, nonfinite, "rollup", x_min, x_max)
    series = _load_chunks(ids, firsts)
    inside = (series.steps >= lo_x) & (series.steps <= hi_x)
    x, mean, lo, hi = minmax_buckets(
        series.steps[inside].astype(float), series.values[inside], buckets=buckets
    )
    return SeriesView(key, int(inside.sum()), x, mean, lo, hi, nonfinite, "raw", x_min, x_max)


def _load_chunks(ids: list[int], firsts: dict[int, int]) -> Series:
    rows = (
        MetricChunk.objects.filter(id__in=ids)
        .order_by("segment", "min_step", "id")
        .values_list("segment", "steps", "values", "times")
    )
    return latest_wins(concat([(g, bytes(s), bytes(v), bytes(t)) for g, s, v, t in rows]), firsts)


def _nonfinite_steps(
    run: Run, key: str, ids: list[int], firsts: dict[int, int], x0: float, x1: float
) -> np.ndarray:
    # NaN/Inf are the signal a chart must never lose: read their chunks raw, whatever the zoom.
    if not ids:
        return np.empty(0, dtype=np.int64)
    series = _load_chunks(ids[:200], firsts)
    mask = ~np.isfinite(series.values) & (series.steps >= x0) & (series.steps <= x1)
    return series.steps[mask][:1000]


# --- markers: what happened along the run, for the charts --------------------------------------


@dataclass(frozen=True)
class Marker:
    kind: str  # checkpoint, eval, resume, restart (and, from forecasting, onset, rollback)
    step: float
    label: str


MARKER_EVENT_KINDS = (Event.Kind.CHECKPOINT, Event.Kind.EVAL, Event.Kind.RESUME, Event.Kind.RESTART)


def run_markers(*, run: Run, limit: int = 500) -> list[Marker]:
    """Checkpoints, evaluations and resumes (with the steps each resume redid), by step."""
    out = [
        Marker(kind, float(step), _event_label(kind, payload))
        for kind, step, payload in Event.objects.filter(
            run=run, kind__in=MARKER_EVENT_KINDS, step__isnull=False
        )
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
    return sorted(out, key=lambda m: m.step)


def _event_label(kind: str, payload: dict[str, Any]) -> str:
    detail = payload.get("path") or payload.get("name") or payload.get("reason") or ""
    return f"{kind} {detail}".strip()[:80]


# --- throughput -------------------------------------------------------------------------------


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
