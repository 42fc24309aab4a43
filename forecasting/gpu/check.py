"""GPU activity against the run's own events: episodes, attribution, `gpu_unexplained` flags.

`gpu_check_host` reads a host's recent agent series, finds the run(s) whose processes are on its
GPUs (tracker.RunProcess identities matched to the agent's HostProcess rows) and holds the GPUs
against the events of the one that used them most: forecasting.estimators.gpu_activity.host
finds the episodes on their mean and on each GPU (its other GPUs as peers) and splits each by
the process that moved its GPUs (a process of no run makes its GPUs' part unexplained whatever
the run logged). Each part is stored with its SM time by owner, the process and the event that
explain it. Each new unexplained part raises one `gpu_unexplained` flag on the run, through the
one flag writer (forecasting.flags). Idempotent: an episode is unique on (host, start, kind,
gpus), and only a newly stored one raises.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from django.db import IntegrityError, transaction
from django.utils import timezone

from forecasting.conditions import Condition
from forecasting.estimators import gpu_attribution as gattr
from forecasting.estimators import thresholds as th
from forecasting.estimators.formatting import span, stamp
from forecasting.flags import flag_event
from forecasting.gpu.hosts import (
    HostRun,
    busiest_first,
    owners_of,
    runs_on,
)
from forecasting.models import Flag
from tracker.gpu import selectors as store
from tracker.models import Event, GpuEpisode, Host, HostProcess, Run
from tracker.selectors import loss_key_for, series_keys, series_load

if TYPE_CHECKING:
    # gpu_activity pulls in pandas: the pages (host view, run cost) must not (tests/
    # test_web_imports.py); only the check, in the Celery worker, imports it.
    from forecasting.estimators import gpu_activity as ga


def _ga() -> Any:
    from forecasting.estimators import gpu_activity

    return gpu_activity


def gpu_check_host(*, host_id: int, now: float | None = None) -> list[GpuEpisode]:
    """Find and store this host's new episodes; raise a flag for each unexplained one."""
    host = Host.objects.select_related("project").get(pk=host_id)
    now = timezone.now().timestamp() if now is None else now
    series = store.host_series(host=host, t0=now - th.GPU_CHECK_LOOKBACK_S, t1=now, prefix="gpu/")
    util = gattr.per_second(series)
    if not util:
        return []
    processes = gattr.process_series(series)
    sm_by_pid: dict[int, float] = defaultdict(float)
    for (_gpu, pid), (_t, v) in processes.items():
        sm_by_pid[pid] += float(np.clip(v, 0, 100).sum())
    runs = busiest_first(runs_on(host), host, sm_by_pid)
    if not runs:
        return []
    host_run = runs[0]
    owners = owners_of(host, runs)
    gpus = sorted(util)
    from forecasting.estimators.gpu_activity import host as ga_host

    grid, matrix = ga_host.grid_of(util, gpus)
    found = ga_host.host_episodes(
        grid,
        matrix,
        gpus,
        _run_events(host_run.run, grid[0], grid[-1]),
        processes=processes,
        owners={pid: (owner, rid) for pid, (owner, rid, _) in owners.items()},
    )
    _check_hang(host, host_run.run, grid, np.nanmean(matrix, axis=0), gpus)
    # The readings reach back to the window's start: what starts there began before it, and a
    # check whose window still held its start judged it (a stranger busy for hours would be
    # stored again at every sweep, its start the window's).
    cut = grid[0] <= now - th.GPU_CHECK_LOOKBACK_S + th.GPU_MERGE_GAP_S
    stored: list[GpuEpisode] = []
    for found_on in found:
        episode, parts = found_on.episode, found_on.parts
        if cut and episode.start <= grid[0] + th.GPU_MERGE_GAP_S:
            continue
        # Still growing at the window's end: judge it once it is over (or on a later check).
        growing = episode.end >= grid[-1] - 2 and episode.duration_s < 60
        if growing and not all(p.explained for p in parts):
            continue
        for part in parts:
            observed = _observed(grid, matrix, gpus, part.gpus, episode)
            saved = _store(host, host_run, episode, part, processes, owners, observed)
            if saved is not None:
                stored.append(saved)
    return stored


def _run_events(run: Run, t0: float, t1: float) -> ga.RunEvents:
    est = _ga()
    start = run.started_at.timestamp()
    end = run.ended_at.timestamp() if run.ended_at else t1 + 1.0
    marks = []
    lo = datetime.fromtimestamp(t0 - th.GPU_EVENT_WINDOW_S, tz=UTC)
    hi = datetime.fromtimestamp(t1 + th.GPU_EVENT_WINDOW_S, tz=UTC)
    for event in Event.objects.filter(run=run, time__gte=lo, time__lte=hi):
        marks.append(est.Mark(event.time.timestamp(), event.kind, before_s=_before_s(event)))
    result: ga.RunEvents = est.RunEvents(phases=[est.Phase(start, end, "train")], marks=marks)
    return result


def _before_s(event: Event) -> float:
    """How long before its time an event covers: its `duration_s` (a checkpoint logged once
    written), else 0."""
    duration = event.payload.get("duration_s") if isinstance(event.payload, dict) else None
    return float(duration) if isinstance(duration, int | float) and duration > 0 else 0.0


# -- hang -----------------------------------------------------------------------------------


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
    events = _run_events(run, float(grid[0]) - th.GPU_CHECK_LOOKBACK_S, float(grid[-1]))
    events.step_times, events.steps = points.times, points.steps.astype(float)
    busy = max(float(np.nanpercentile(mean, 75)), th.GPU_HANG_BUSY_FLOOR)
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
    cond = Condition(
        Flag.Kind.HANG,
        text,
        severity=hang.end - hang.start,
        onset_step=step,
        data={
            "since": hang.start,
            "host": host.name,
            "gpus": gpus,
            "silent_s": hang.end - hang.start,
        },
    )
    return flag_event(run=run, condition=cond, now=timezone.now())


# -- storing and flagging -------------------------------------------------------------------


def _attribution(
    processes: gattr.ProcessSeries,
    owners: dict[int, tuple[str, str | None, HostProcess]],
    on: list[int],
    start: float,
    end: float,
) -> dict[str, Any]:
    by_pid: dict[int, float] = defaultdict(float)
    totals = {"run": 0.0, "other_runs": 0.0, "unknown": 0.0}
    for (gpu, pid), (t, v) in processes.items():
        if gpu not in on:
            continue
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
        top = {**_process(pid, owners), "share": amount / total if total else 0.0}
    return {
        "sm_seconds": totals,
        "fractions": {k: (v / total if total else 0.0) for k, v in totals.items()},
        "top": top,
    }


def _process(pid: int, owners: dict[int, tuple[str, str | None, HostProcess]]) -> dict[str, Any]:
    owner, rid, proc = owners.get(pid, ("unknown", None, None))
    return {
        "pid": pid,
        "owner": owner,
        "run": rid,
        "cmdline": proc.cmdline if proc else "",
        "user": proc.user if proc else "",
        "container": proc.container if proc else "",
    }


def _event_near(run: Run, reason: str, start: float, end: float) -> dict[str, Any] | None:
    """The run's logged event the estimator's reason names (its kinds), nearest the episode."""
    kinds = [k.strip() for k in reason.split(",") if k.strip()]
    if not kinds:
        return None
    window = th.GPU_EVENT_WINDOW_S
    lo = datetime.fromtimestamp(start - window, tz=UTC)
    # A checkpoint is logged once written, its duration before it: as late as the check reads.
    hi = datetime.fromtimestamp(end + window + th.GPU_CHECK_LOOKBACK_S, tz=UTC)
    rows = Event.objects.filter(run=run, kind__in=kinds, time__gte=lo, time__lte=hi)

    # Those whose window (as the estimator's marks: the duration before, the event window
    # either side) reaches the episode; of those the nearest.
    reaching = [
        ev
        for ev in rows
        if ev.time.timestamp() - _before_s(ev) - window <= end
        and ev.time.timestamp() + window >= start
    ]
    best = min(reaching, key=lambda ev: abs(ev.time.timestamp() - start), default=None)
    if best is None:
        return None
    return {"kind": best.kind, "time": best.time.timestamp(), "step": best.step}


def _reason(host: Host, part: gattr.EpisodePart, event: dict[str, Any] | None) -> str:
    """'checkpoint at ⟦stamp⟧ (step 1200), pid 4121 `python train.py`': the event and the
    process that explain it (200 characters at most: the row's field)."""
    text = part.reason
    if event is not None and part.explained and part.reason == event["kind"]:
        text = f"{event['kind']} at {stamp(event['time'])}"
        text += f" (step {event['step']})" if event["step"] is not None else ""
    driver = part.driver
    if part.explained and driver is not None and driver.pid is not None:
        proc = HostProcess.objects.filter(host=host, pid=driver.pid).order_by("-first_seen")
        first = proc.first()
        command = short_command(first.cmdline, 60) if first else ""
        text += f", pid {driver.pid}" + (f" `{command}`" if command else "")
    return text[:200]


def _observed(
    grid: np.ndarray, matrix: np.ndarray, gpus: list[int], on: list[int], e: ga.Episode
) -> float:
    """The median utilisation of these GPUs over the episode (the episode's own figure is of
    the series it was found on: the GPUs' mean, for an episode split by process)."""
    inside = (grid >= e.start) & (grid < e.end)
    rows = matrix[[gpus.index(g) for g in on]][:, inside]
    finite = np.isfinite(rows)
    counts = finite.sum(axis=0)
    values = np.where(finite, rows, 0.0).sum(axis=0)[counts > 0] / counts[counts > 0]
    return float(np.median(values)) if values.size else e.observed


def _store(
    host: Host,
    host_run: HostRun,
    e: ga.Episode,
    part: gattr.EpisodePart,
    processes: gattr.ProcessSeries,
    owners: dict[int, tuple[str, str | None, HostProcess]],
    observed: float,
) -> GpuEpisode | None:
    attribution = _attribution(processes, owners, part.gpus, e.start, e.end)
    driver = part.driver
    attribution["driver"] = (
        {**_process(driver.pid, owners), "sm_seconds": driver.sm_seconds}
        if driver is not None and driver.pid is not None
        else None
    )
    # The run's event near it: what explains it, or (for another process's work over it) what
    # did not.
    event = _event_near(host_run.run, e.reason, e.start, e.end) if e.explained else None
    attribution["event"] = event
    try:
        with transaction.atomic():
            row = GpuEpisode.objects.create(
                host=host,
                run=host_run.run,
                gpus=part.gpus,
                start=e.start,
                end=e.end,
                kind=e.kind,
                explained=part.explained,
                reason=_reason(host, part, event),
                expected=e.expected,
                observed=observed,
                attribution=attribution,
                text="",
            )
            if not part.explained:
                row.text = message(host, row)
                row.save(update_fields=["text"])
                _flag(host_run.run, row)
    except IntegrityError:
        return None  # stored by an earlier check
    return row


def message(host: Host, row: GpuEpisode) -> str:
    gpus = _gpu_range(row.gpus)
    direction = "near" if row.kind != "drop" else "down to"
    delta = row.observed - row.expected
    text = (
        f"{gpus} on {host.name} {direction} {row.observed:.0f}% for {span(row.end - row.start)}"
        # A stamp, not the project's clock without its zone: each reader writes it in its own.
        f" at {stamp(row.start)} ({delta:+.0f} points over the run's training"
        f" level); "
    )
    event = row.attribution.get("event")
    if event:
        # The run's own event at that time explains the run's work, not another process's.
        text += f"not the run's own work (its {event['kind']} then explains only its processes)"
    else:
        text += f"no logged event within ±{th.GPU_EVENT_WINDOW_S:.0f} s"
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
    cond = Condition(
        Flag.Kind.GPU_UNEXPLAINED,
        row.text,
        severity=row.end - row.start,
        data={
            "episode": row.pk,
            "host": row.host.name,
            "gpus": row.gpus,
            "start": row.start,
            "duration_s": row.end - row.start,
            "top": row.attribution.get("top"),
        },
    )
    return flag_event(run=run, condition=cond, now=timezone.now())
