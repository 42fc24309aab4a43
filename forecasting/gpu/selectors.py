"""The GPU read models: the host page, a run's GPU-hours by owner, unexplained time per day."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.utils import timezone

from forecasting.estimators.gpu_attribution import per_second, process_series
from forecasting.gpu.hosts import owners_of, runs_on, runs_seen
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


def run_host_pages(*, run: Run, agent_hosts: list[str]) -> list[tuple[str, bool]]:
    """The run's hosts, each with whether it has a host page: the names its client reported
    (linked where an agent reports under the same name) and `agent_hosts`, the agents' hosts
    its processes were matched on by the kernel's boot id (run_gpu_hours' `hosts`: `runcast
    agent --host` may name a machine otherwise). One query, none without reported names."""
    reported = list(run.hosts or [])
    named = Host.objects.filter(project=run.project_id, name__in=reported)
    pages = set(named.values_list("name", flat=True)) if reported else set()
    # The page's URL takes a name without "/" (a host registered so never sends a batch).
    pages = {name for name in pages | set(agent_hosts) if "/" not in name}
    return [(name, name in pages) for name in reported] + [
        (name, True) for name in sorted(pages - set(reported))
    ]


def hosts_for_projects(*, project_ids: list[int], since_s: float) -> list[Host]:
    """The hosts an agent reported from in the last `since_s` seconds, for the board."""
    since = timezone.now() - timedelta(seconds=since_s)
    rows = Host.objects.filter(project_id__in=project_ids, last_seen_at__gte=since)
    rows = rows.exclude(name__contains="/")  # no page: its URL takes a name without "/"
    return list(rows.select_related("project").order_by("project__name", "name"))


def recently_seen_host_ids(minutes: int = 10) -> list[int]:
    since = timezone.now() - timedelta(minutes=minutes)
    return list(Host.objects.filter(last_seen_at__gte=since).values_list("pk", flat=True))


# -- the host page's read model -------------------------------------------------------------

HEAT_COLUMNS = 120
COARSE_AFTER_S = 3 * 3600.0


def host_view(*, host: Host, t0: float, t1: float) -> dict[str, Any]:
    """GPU x time heat map cells, the events of the runs seen on the host in the window (those
    with a process sampled on its GPUs), the processes seen, the episodes."""
    if t1 - t0 > COARSE_AFTER_S:
        # Long windows from the batches' per-GPU summaries, not from every point.
        util = {
            g: (t, m) for g, (t, m, _) in store.host_util_summary(host=host, t0=t0, t1=t1).items()
        }
        pids = set(store.host_sm_by_pid(host=host, t0=t0, t1=t1))
    else:
        series = store.host_series(host=host, t0=t0, t1=t1, prefix="gpu/")
        util = per_second(series)
        pids = {pid for _gpu, pid in process_series(series)}
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
    # Every run started on this machine shares its kernel's boot id: only those with a process
    # on its GPUs in the window were seen on it.
    runs = runs_on(host)
    owners = owners_of(host, runs) if runs else {}
    seen = runs_seen(runs, owners, pids)

    def pos(x: float) -> float:
        return round(100.0 * min(max((x - t0) / (t1 - t0), 0.0), 1.0), 2)

    lo = datetime.fromtimestamp(t0, tz=UTC)
    hi = datetime.fromtimestamp(t1, tz=UTC)
    events = [
        {"kind": ev.kind, "left": pos(ev.time.timestamp()), "run": str(ev.run)}
        for ev in Event.objects.filter(run__in=seen, time__gte=lo, time__lte=hi).select_related(
            "run"
        )
    ]
    episodes = [
        {
            "row": e,
            "left": pos(e.start),
            "width": max(0.5, pos(e.end) - pos(e.start)),
            # The process that moved its GPUs; for an unexplained one without it (power
            # alone), the largest share not the run's.
            "process": e.attribution.get("driver")
            or (None if e.explained else e.attribution.get("top")),
        }
        for e in GpuEpisode.objects.filter(host=host, end__gte=t0, start__lte=t1).select_related(
            "run"
        )
    ]
    processes = [
        {
            "proc": p,
            "owner": owners[p.pid][0] if p.pid in owners else "unknown",
            "run": owners[p.pid][1] if p.pid in owners else None,
        }
        for p in HostProcess.objects.filter(host=host, pid__in=pids, first_seen__lte=t1).order_by(
            "first_seen"
        )
    ]
    return {
        "rows": rows,
        "events": events,
        "episodes": episodes,
        "processes": processes,
        "runs": seen,
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
