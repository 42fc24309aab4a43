"""The GPU read models: the host page, a run's GPU-hours by owner, unexplained time per day."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.utils import timezone

from forecasting.gpu.hosts import owners_of, per_second, runs_on
from tracker.gpu import selectors as store
from tracker.models import Event, GpuEpisode, Host, HostProcess, Run, RunProcess


def unexplained_gpu_seconds_by_day(*, project_id: int, days: int = 14) -> list[tuple[str, float]]:
    """Daily total of unexplained GPU time (episode length x GPUs) for a project's pages."""
    since = (timezone.now() - timedelta(days=days)).timestamp()
    totals: dict[str, float] = defaultdict(float)
    for row in GpuEpisode.objects.filter(
        host__project_id=project_id, explained=False, start__gte=since
    ):
        day = datetime.fromtimestamp(row.start, tz=UTC).strftime("%Y-%m-%d")
        totals[day] += (row.end - row.start) * max(1, len(row.gpus))
    return sorted(totals.items())


def recently_seen_host_ids(minutes: int = 10) -> list[int]:
    since = timezone.now() - timedelta(minutes=minutes)
    return list(Host.objects.filter(last_seen_at__gte=since).values_list("pk", flat=True))


# -- the host page's read model -------------------------------------------------------------

HEAT_COLUMNS = 120
COARSE_AFTER_S = 3 * 3600.0


def host_view(*, host: Host, t0: float, t1: float) -> dict[str, Any]:
    """GPU x time heat map cells, the run events on the same axis, processes, episodes."""
    if t1 - t0 > COARSE_AFTER_S:
        # Long windows from the batches' per-GPU summaries, not from every point.
        util = {
            g: (t, m) for g, (t, m, _) in store.host_util_summary(host=host, t0=t0, t1=t1).items()
        }
    else:
        util = per_second(store.host_series(host=host, t0=t0, t1=t1, prefix="gpu/"))
    width = (t1 - t0) / HEAT_COLUMNS
    rows = []
    for gpu in sorted(util):
        t, v = util[gpu]
        column = np.clip(((t - t0) / width).astype(int), 0, HEAT_COLUMNS - 1)
        sums = np.bincount(column, weights=v, minlength=HEAT_COLUMNS)
        counts = np.bincount(column, minlength=HEAT_COLUMNS)
        cells = [
            None if c == 0 else {"util": round(float(s / c)), "light": round(95 - 0.6 * s / c)}
            for s, c in zip(sums, counts, strict=True)
        ]
        rows.append({"gpu": gpu, "cells": cells})
    runs = runs_on(host)

    def pos(x: float) -> float:
        return round(100.0 * min(max((x - t0) / (t1 - t0), 0.0), 1.0), 2)

    events = []
    for r in runs:
        lo = datetime.fromtimestamp(t0, tz=UTC)
        hi = datetime.fromtimestamp(t1, tz=UTC)
        for ev in Event.objects.filter(run=r.run, time__gte=lo, time__lte=hi):
            events.append({"kind": ev.kind, "left": pos(ev.time.timestamp()), "run": str(r.run)})
    episodes = [
        {
            "row": e,
            "left": pos(e.start),
            "width": max(0.5, pos(e.end) - pos(e.start)),
        }
        for e in GpuEpisode.objects.filter(host=host, end__gte=t0, start__lte=t1)
    ]
    owners = owners_of(host, runs) if runs else {}
    processes = [
        {"proc": proc, "owner": owner, "run": rid}
        for owner, rid, proc in sorted(owners.values(), key=lambda o: o[2].first_seen)
    ] or [
        {"proc": p, "owner": "unknown", "run": None}
        for p in HostProcess.objects.filter(host=host).order_by("first_seen")
    ]
    return {
        "rows": rows,
        "events": events,
        "episodes": episodes,
        "processes": processes,
        "runs": [r.run for r in runs],
        "t0": t0,
        "t1": t1,
    }


def run_gpu_hours(*, run: Run, now: float | None = None) -> dict[str, Any] | None:
    """GPU-hours on the run's hosts during the run: its own processes, other runs', unknown.

    From the batches' per-pid SM sums: 100 SM-percent-seconds is one GPU-second. None when no
    agent reported from the run's hosts.
    """
    t0 = run.started_at.timestamp()
    t1 = run.ended_at.timestamp() if run.ended_at else (now or timezone.now().timestamp())
    boots = set(RunProcess.objects.filter(run=run).values_list("boot_id", flat=True))
    hosts = list(Host.objects.filter(project=run.project_id, boot_id__in=boots - {""}))
    if not hosts:
        return None
    hours = {"run": 0.0, "other_runs": 0.0, "unknown": 0.0}
    for host in hosts:
        runs = runs_on(host)
        ordered = [r for r in runs if r.run.pk == run.pk] + [r for r in runs if r.run.pk != run.pk]
        owners = owners_of(host, ordered)
        for pid, amount in store.host_sm_by_pid(host=host, t0=t0, t1=t1).items():
            owner = owners.get(pid, ("unknown", None, None))[0]
            bucket = {"run": "run", "other_run": "other_runs"}.get(owner, "unknown")
            hours[bucket] += amount / 100.0 / 3600.0
    return {"hours": hours, "hosts": [h.name for h in hosts]}
