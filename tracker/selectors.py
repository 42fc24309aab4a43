"""Reads of tracked data. Pages and tasks call these; none of them writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db.models import QuerySet

from tracker.models import Membership, MetricChunk, Project, Run
from tracker.series import (
    ROLLUP_BLOCK,
    Series,
    concat,
    latest_wins,
    minmax_buckets,
    rollup_buckets,
    rollup_concat,
    rollup_latest_wins,
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


def projects_for_user(*, user: Any) -> QuerySet[Project]:
    return Project.objects.filter(memberships__user=user).order_by("name")


def membership_get(*, user: Any, project_slug: str) -> Membership | None:
    if not user.is_authenticated:
        return None
    return (
        Membership.objects.select_related("project")
        .filter(user=user, project__slug=project_slug)
        .first()
    )


def run_list_for_user(*, user: Any) -> QuerySet[Run]:
    return (
        Run.objects.select_related("project", "deadline")
        .filter(project__memberships__user=user)
        .order_by("-last_seen_at")
    )


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
