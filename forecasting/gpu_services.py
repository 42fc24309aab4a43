"""GPU activity against the run's own events: episodes, attribution, `gpu_unexplained` flags.

`gpu_check_host` reads a host's recent agent series, finds the run(s) whose processes are on its
GPUs (tracker.RunProcess identities matched to the agent's HostProcess rows), runs
forecasting.estimators.gpu_activity on each run GPU (its other GPUs as peers) and on their mean
(foreign work on every GPU at once has no peer to stand out against), splits each episode's SM
time by owner (forecasting.estimators.gpu_attribution) and stores it. Each new unexplained
episode raises one `gpu_unexplained` flag on the run, the alerts' outbox. Idempotent: an episode
is unique on (host, start, kind), and only a newly stored one raises.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from django.db import IntegrityError, transaction
from django.utils import timezone

from forecasting.estimators import gpu_attribution as gattr
from forecasting.estimators.formatting import span, when
from forecasting.models import Flag
from tracker.gpu import selectors as store
from tracker.models import Event, GpuEpisode, Host, HostProcess, Run, RunProcess
from tracker.selectors import loss_key_for, series_keys, series_load

if TYPE_CHECKING:
    # gpu_activity pulls in pandas: the pages (host view, run cost) must not (tests/
    # test_web_imports.py); only the check, in the Celery worker, imports it.
    from forecasting.estimators import gpu_activity as ga

LOOKBACK_S = 1800.0
# Runcast events are instants (an eval logged when it ran): activity within this of one is the
# run's. The message quotes it.
EVENT_WINDOW_S = 60.0
# The estimator's settings on the server (forecasting.estimators.gpu_activity.Settings).
SETTINGS_OVERRIDES: dict[str, float] = {
    "tolerance_s": 5.0,
    "event_window_s": EVENT_WINDOW_S,
    "rel": 0.1,
}


def _ga() -> Any:
    from forecasting.estimators import gpu_activity

    return gpu_activity


_UTIL = re.compile(r"^gpu/(\d+)/util$")
_PROC_SM = re.compile(r"^gpu/(\d+)/proc/(\d+)/sm$")


@dataclass
class HostRun:
    run: Run
    keys: set[tuple[str, int, int]]


def gpu_check_host(*, host_id: int, now: float | None = None) -> list[GpuEpisode]:
    """Find and store this host's new episodes; raise a flag for each unexplained one."""
    host = Host.objects.select_related("project").get(pk=host_id)
    now = timezone.now().timestamp() if now is None else now
    series = store.host_series(host=host, t0=now - LOOKBACK_S, t1=now, prefix="gpu/")
    util = _per_second(series)
    if not util:
        return []
    runs = _runs_on(host)
    if not runs:
        return []
    host_run = runs[0]
    owners = _owners(host, runs)
    gpus = sorted(util)
    grid, matrix = _grid(util, gpus)
    events = _run_events(host_run.run, grid[0], grid[-1])
    est = _ga()
    settings = est.Settings(**SETTINGS_OVERRIDES)
    found: list[ga.Episode] = []
    episodes_gpus: list[list[int]] = []
    mean = np.nanmean(matrix, axis=0)
    for e in est.find_episodes(grid, mean, events, settings=settings):
        found.append(e)
        episodes_gpus.append(_gpus_in(matrix, gpus, e))
    for row, gpu in enumerate(gpus):
        others = np.delete(matrix, row, axis=0)
        peers = np.nanmedian(others, axis=0) if others.shape[0] >= 2 else None
        for e in est.find_episodes(grid, matrix[row], events, peers=peers, settings=settings):
            if not any(_overlap(e, f) for f in found):
                found.append(e)
                episodes_gpus.append([gpu])
    _check_hang(host, host_run.run, grid, mean, gpus)
    stored: list[GpuEpisode] = []
    for episode, on in zip(found, episodes_gpus, strict=True):
        # Still growing at the window's end: judge it once it is over (or on a later check).
        if episode.end >= grid[-1] - 2 and not episode.explained and episode.duration_s < 60:
            continue
        saved = _store(host, host_run, episode, on, series, owners)
        if saved is not None:
            stored.append(saved)
    return stored


# -- hang -----------------------------------------------------------------------------------

# Below this mean utilisation the GPUs are not "busy": a silent run on idle GPUs is the liveness
# sweep's stall, not a hang.
BUSY_FLOOR = 20.0


def _check_hang(
    host: Host, run: Run, grid: np.ndarray, mean: np.ndarray, gpus: list[int]
) -> Flag | None:
    """Raise `hang` once per silent stretch: busy GPUs, no step or event for many step times."""
    if not run.is_active:
        return None
    keys = series_keys(run=run)
    key = loss_key_for(keys) or (keys[0] if keys else None)
    if key is None:
        return None
    points = series_load(run=run, key=key)
    events = _run_events(run, float(grid[0]) - LOOKBACK_S, float(grid[-1]))
    events.step_times, events.steps = points.times, points.steps.astype(float)
    busy = max(float(np.nanpercentile(mean, 75)), BUSY_FLOOR)
    hang = _ga().find_hang(grid, mean, events, busy_level=busy, now=float(grid[-1]))
    if hang is None:
        return None
    last = Flag.objects.filter(run=run, kind=Flag.Kind.HANG).first()
    if last is not None and last.data.get("since") == hang.start:
        return None  # this stretch was flagged already
    step = int(points.steps.max()) if len(points) else None
    text = (
        f"{_gpu_range(gpus)} on {host.name} busy at {hang.observed:.0f}% while the run has made"
        f" no progress (step {step}) for {span(hang.end - hang.start)}; {hang.reason}."
        " A hang (a deadlocked collective, like BLOOM-176B's eval) burns the GPUs until killed."
    )
    return Flag.objects.create(
        run=run,
        kind=Flag.Kind.HANG,
        state=Flag.State.RAISED,
        previous_state=last.state if last else "",
        severity=hang.end - hang.start,
        explanation=text,
        onset_step=step,
        data={
            "since": hang.start,
            "host": host.name,
            "gpus": gpus,
            "silent_s": hang.end - hang.start,
        },
    )


# -- inputs ---------------------------------------------------------------------------------


def _per_second(series: store.Series) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each GPU's utilisation in 1-s bins (NVML's sub-second samples averaged)."""
    out = {}
    for key, (t, v) in series.items():
        match = _UTIL.match(key)
        if match and t.size:
            seconds = np.floor(t)
            keys, inverse = np.unique(seconds, return_inverse=True)
            sums = np.bincount(inverse, weights=v)
            counts = np.bincount(inverse)
            out[int(match.group(1))] = (keys, sums / counts)
    return out


def _grid(
    util: dict[int, tuple[np.ndarray, np.ndarray]], gpus: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    t0 = min(t[0] for t, _ in util.values())
    t1 = max(t[-1] for t, _ in util.values())
    grid = np.arange(t0, t1 + 1.0)
    matrix = np.full((len(gpus), grid.size), np.nan)
    for row, gpu in enumerate(gpus):
        t, v = util[gpu]
        matrix[row, (t - t0).astype(int)] = v
    return grid, matrix


def _runs_on(host: Host) -> list[HostRun]:
    """Runs whose registered process identity lives on this host's kernel, newest first."""
    rows = RunProcess.objects.filter(boot_id=host.boot_id, run__project=host.project)
    runs: dict[int, HostRun] = {}
    for rp in rows.select_related("run").order_by("-run__started_at"):
        entry = runs.setdefault(rp.run_id, HostRun(rp.run, set()))
        if rp.ns_pid is not None and rp.start_ticks is not None:
            entry.keys.add((rp.boot_id, rp.ns_pid, rp.start_ticks))
        launcher = rp.launcher
        if isinstance(launcher, list) and len(launcher) == 3:
            entry.keys.add((str(launcher[0]), int(launcher[1]), int(launcher[2])))
    return list(runs.values())


def _owners(host: Host, runs: list[HostRun]) -> dict[int, tuple[str, str | None, HostProcess]]:
    """pid -> (owner, run id, process) for every process seen on the host."""
    own = runs[0]
    others = {k: r.run.public_id for r in runs[1:] for k in r.keys}
    out = {}
    for proc in HostProcess.objects.filter(host=host):
        sample = gattr.ProcessSample(
            time=0.0,
            gpu=0,
            pid=proc.pid,
            sm=0.0,
            key=(host.boot_id, proc.ns_pid, proc.start_ticks),
            ancestors=tuple(tuple(a) for a in proc.ancestors),  # type: ignore[misc]
            env_run=proc.env_run_id or None,
        )
        owner, rid = gattr.owner_of(sample, own.keys, others, own.run.public_id)
        out[proc.pid] = (owner, rid, proc)
    return out


def _run_events(run: Run, t0: float, t1: float) -> ga.RunEvents:
    est = _ga()
    start = run.started_at.timestamp()
    end = run.ended_at.timestamp() if run.ended_at else t1 + 1.0
    marks = []
    lo = datetime.fromtimestamp(t0 - EVENT_WINDOW_S, tz=UTC)
    hi = datetime.fromtimestamp(t1 + EVENT_WINDOW_S, tz=UTC)
    for event in Event.objects.filter(run=run, time__gte=lo, time__lte=hi):
        duration = event.payload.get("duration_s") if isinstance(event.payload, dict) else None
        before = float(duration) if isinstance(duration, int | float) and duration > 0 else 0.0
        marks.append(est.Mark(event.time.timestamp(), event.kind, before_s=before))
    result: ga.RunEvents = est.RunEvents(phases=[est.Phase(start, end, "train")], marks=marks)
    return result


def _gpus_in(matrix: np.ndarray, gpus: list[int], e: ga.Episode) -> list[int]:
    return list(gpus)


def _overlap(a: ga.Episode, b: ga.Episode) -> bool:
    return a.start < b.end and b.start < a.end


# -- storing and flagging -------------------------------------------------------------------


def _attribution(
    series: store.Series,
    owners: dict[int, tuple[str, str | None, HostProcess]],
    on: list[int],
    start: float,
    end: float,
) -> dict[str, Any]:
    by_pid: dict[int, float] = defaultdict(float)
    totals = {"run": 0.0, "other_runs": 0.0, "unknown": 0.0}
    for key, (t, v) in series.items():
        match = _PROC_SM.match(key)
        if not match or int(match.group(1)) not in on:
            continue
        pid = int(match.group(2))
        inside = (t >= start) & (t < end)
        amount = float(np.clip(v[inside], 0, 100).sum())
        owner = owners.get(pid, ("unknown", None, None))[0]
        totals[{"run": "run", "other_run": "other_runs"}.get(owner, "unknown")] += amount
        by_pid[pid] += amount
    total = sum(totals.values())
    top = None
    unknown = [(a, p) for p, a in by_pid.items() if owners.get(p, ("unknown",))[0] != "run"]
    if unknown:
        amount, pid = max(unknown)
        owner, rid, proc = owners.get(pid, ("unknown", None, None))
        top = {
            "pid": pid,
            "share": amount / total if total else 0.0,
            "owner": owner,
            "run": rid,
            "cmdline": proc.cmdline if proc else "",
            "user": proc.user if proc else "",
            "container": proc.container if proc else "",
        }
    return {
        "sm_seconds": totals,
        "fractions": {k: (v / total if total else 0.0) for k, v in totals.items()},
        "top": top,
    }


def _store(
    host: Host,
    host_run: HostRun,
    e: ga.Episode,
    on: list[int],
    series: store.Series,
    owners: dict[int, tuple[str, str | None, HostProcess]],
) -> GpuEpisode | None:
    attribution = _attribution(series, owners, on, e.start, e.end)
    try:
        with transaction.atomic():
            row = GpuEpisode.objects.create(
                host=host,
                run=host_run.run,
                gpus=on,
                start=e.start,
                end=e.end,
                kind=e.kind,
                explained=e.explained,
                reason=e.reason,
                expected=e.expected,
                observed=e.observed,
                attribution=attribution,
                text="",
            )
            if not e.explained:
                row.text = message(host, row)
                row.save(update_fields=["text"])
                _flag(host_run.run, row)
    except IntegrityError:
        return None  # stored by an earlier check
    return row


def message(host: Host, row: GpuEpisode) -> str:
    tz = host.project.tzinfo
    gpus = _gpu_range(row.gpus)
    direction = "near" if row.kind != "drop" else "down to"
    delta = row.observed - row.expected
    text = (
        f"{gpus} on {host.name} {direction} {row.observed:.0f}% for {span(row.end - row.start)}"
        f" at {when(row.start, tz, zone=False)} ({delta:+.0f} points over the run's training"
        f" level); no logged event within ±{EVENT_WINDOW_S:.0f} s"
    )
    top = row.attribution.get("top")
    if top:
        who = "not part of any run" if top["owner"] == "unknown" else f"run {top['run']}"
        text += (
            f"; {100 * top['share']:.0f}% of the SM time was pid {top['pid']}"
            f" `{short_command(top['cmdline'])}` (user {top['user'] or '?'}), {who}"
        )
    count, seconds = _today(host, row)
    text += f". Today: {count} such burst{'s' if count != 1 else ''}, {span(seconds)} in total."
    return text


def short_command(cmdline: str, limit: int = 80) -> str:
    """'python sweep.py --trial 7' from '/opt/venv/bin/python3.11 /home/ge/sweep.py --trial 7'."""
    words = [w.rsplit("/", 1)[-1] if "/" in w else w for w in cmdline.split()]
    if words:
        words[0] = re.sub(r"^(python)[\d.]*$", r"\1", words[0])
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _gpu_range(gpus: list[int]) -> str:
    if len(gpus) == 1:
        return f"GPU {gpus[0]}"
    if gpus == list(range(gpus[0], gpus[-1] + 1)):
        return f"GPUs {gpus[0]}\u2013{gpus[-1]}"  # an en dash, as in "GPUs 0-7"
    return "GPUs " + ", ".join(map(str, gpus))


def _today(host: Host, row: GpuEpisode) -> tuple[int, float]:
    day_start = row.start - row.start % 86400
    rows = GpuEpisode.objects.filter(
        host=host, explained=False, start__gte=day_start, start__lte=row.start
    )
    return rows.count(), float(sum(r.end - r.start for r in rows))


def _flag(run: Run, row: GpuEpisode) -> Flag:
    previous = Flag.objects.filter(run=run, kind=Flag.Kind.GPU_UNEXPLAINED).first()
    return Flag.objects.create(
        run=run,
        kind=Flag.Kind.GPU_UNEXPLAINED,
        state=Flag.State.RAISED,
        previous_state=previous.state if previous else "",
        severity=row.end - row.start,
        explanation=row.text,
        data={
            "episode": row.pk,
            "host": row.host.name,
            "gpus": row.gpus,
            "start": row.start,
            "duration_s": row.end - row.start,
            "top": row.attribution.get("top"),
        },
    )


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
        util = _per_second(store.host_series(host=host, t0=t0, t1=t1, prefix="gpu/"))
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
    runs = _runs_on(host)

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
    owners = _owners(host, runs) if runs else {}
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
        runs = _runs_on(host)
        ordered = [r for r in runs if r.run.pk == run.pk] + [r for r in runs if r.run.pk != run.pk]
        owners = _owners(host, ordered)
        for pid, amount in store.host_sm_by_pid(host=host, t0=t0, t1=t1).items():
            owner = owners.get(pid, ("unknown", None, None))[0]
            bucket = {"run": "run", "other_run": "other_runs"}.get(owner, "unknown")
            hours[bucket] += amount / 100.0 / 3600.0
    return {"hours": hours, "hosts": [h.name for h in hosts]}
