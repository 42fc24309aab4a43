"""GPU activity against the run's own events: episodes, attribution, `gpu_unexplained` flags.

`gpu_check_host` reads a host's recent agent series, finds the run(s) whose processes are on its
GPUs (tracker.RunProcess identities matched to the agent's HostProcess rows), runs
forecasting.estimators.gpu_activity on each run GPU (its other GPUs as peers) and on their mean
(foreign work on every GPU at once has no peer to stand out against), splits each episode's SM
time by owner (forecasting.estimators.gpu_attribution) and stores it. Each new unexplained
episode raises one `gpu_unexplained` flag on the run, through the one flag writer
(forecasting.flags). Idempotent: an episode is unique on (host, start, kind), and only a newly
stored one raises.
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
from forecasting.estimators import thresholds as th
from forecasting.estimators.formatting import span, stamp
from forecasting.flags import flag_event
from forecasting.gpu.hosts import HostRun, owners_of, per_second, runs_on
from forecasting.models import Flag
from tracker.gpu import selectors as store
from tracker.gpu.selectors import Series
from tracker.models import Event, GpuEpisode, Host, HostProcess, Run
from tracker.selectors import loss_key_for, series_keys, series_load

if TYPE_CHECKING:
    # gpu_activity pulls in pandas: the pages (host view, run cost) must not (tests/
    # test_web_imports.py); only the check, in the Celery worker, imports it.
    from forecasting.estimators import gpu_activity as ga

# The estimator's settings on the server (forecasting.estimators.gpu_activity.Settings).
SETTINGS_OVERRIDES: dict[str, float] = {
    "tolerance_s": th.GPU_CHECK_TOLERANCE_S,
    "event_window_s": th.GPU_EVENT_WINDOW_S,
    "rel": th.GPU_CHECK_REL,
}


def _ga() -> Any:
    from forecasting.estimators import gpu_activity

    return gpu_activity


_PROC_SM = re.compile(r"^gpu/(\d+)/proc/(\d+)/sm$")


def gpu_check_host(*, host_id: int, now: float | None = None) -> list[GpuEpisode]:
    """Find and store this host's new episodes; raise a flag for each unexplained one."""
    host = Host.objects.select_related("project").get(pk=host_id)
    now = timezone.now().timestamp() if now is None else now
    series = store.host_series(host=host, t0=now - th.GPU_CHECK_LOOKBACK_S, t1=now, prefix="gpu/")
    util = per_second(series)
    if not util:
        return []
    runs = runs_on(host)
    if not runs:
        return []
    host_run = runs[0]
    owners = owners_of(host, runs)
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


def _run_events(run: Run, t0: float, t1: float) -> ga.RunEvents:
    est = _ga()
    start = run.started_at.timestamp()
    end = run.ended_at.timestamp() if run.ended_at else t1 + 1.0
    marks = []
    lo = datetime.fromtimestamp(t0 - th.GPU_EVENT_WINDOW_S, tz=UTC)
    hi = datetime.fromtimestamp(t1 + th.GPU_EVENT_WINDOW_S, tz=UTC)
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
    series: Series,
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
    series: Series,
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
    gpus = _gpu_range(row.gpus)
    direction = "near" if row.kind != "drop" else "down to"
    delta = row.observed - row.expected
    text = (
        f"{gpus} on {host.name} {direction} {row.observed:.0f}% for {span(row.end - row.start)}"
        # A stamp, not the project's clock without its zone: each reader writes it in its own.
        f" at {stamp(row.start)} ({delta:+.0f} points over the run's training"
        f" level); no logged event within ±{th.GPU_EVENT_WINDOW_S:.0f} s"
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
