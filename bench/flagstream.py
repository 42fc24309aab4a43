"""`python -m bench.flagstream DIR [--json] [--seed N] [--limit N]`: the live alert pipeline,
replayed on real curves, counted as a lead would count it.

Every run of a curve set (the shared `curves/` format) is replayed in simulated time through the
real services: ingestion (`tracker.services.batch_ingest`, batches as the client sends them:
points every few seconds, a heartbeat every 15 s), one forecast per debounce window of run time
(`forecasting.compute.forecast_compute`), the liveness sweep every minute, the alert dispatcher
with the default rules and one channel, and the run's finish. Nothing is delivered: a pending
notification is a message that would be sent.

Each run is replayed healthy, then once more with one injected fault (NaN, spike, divergence, a
slowdown that makes its deadline unreachable, a stall, a server outage the client spools
through). Healthy replays count false alerts (every message but "finished"), flip-flops (a flag
raised again within an hour of resolving) and forecast jumps; faulted replays count whether the
fault was alerted and how long after it began.

The last line with --json is one JSON object. Run from the repository root.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from forecasting.estimators import thresholds as th

# --- simulated time: set before Django loads, so every timezone.now() reads the replay's clock --


class SimClock:
    def __init__(self) -> None:
        self.t = datetime(2026, 1, 5, tzinfo=UTC).timestamp()

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.t, tz=UTC)


CLOCK = SimClock()


def _setup_django(database_url: str | None) -> None:
    import django.utils.timezone

    django.utils.timezone.now = CLOCK.now  # type: ignore[assignment]
    db = database_url or f"sqlite:///{tempfile.gettempdir()}/runcast-flagstream-{os.getpid()}.db"
    os.environ["DATABASE_URL"] = db
    # Tasks are not run by a worker here: the replay calls the services at the service's cadence.
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.flagstream_settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


# The service's cadence (forecasting.tasks.FORECAST_DEBOUNCE_S, the sweep-active-runs beat).
FORECAST_S = 15.0
SWEEP_S = 60.0
# How the client sends: points flushed every second, a heartbeat batch every 15 s when nothing
# else goes out (client/runcast/settings.py). Points are grouped here per forecast window: a
# forecast sees the same data, and a replay costs a fifteenth of the INSERTs.
BATCH_S = 15.0
HEARTBEAT_S = 15.0
# Work per replay is capped: a run longer than MAX_FORECASTS windows is replayed on a coarser
# clock (forecasts, heartbeats and sweeps every duration / MAX_FORECASTS); stated in the output.
MAX_FORECASTS = 300
# ... but never coarser than a sustained flag can be judged on: its longest window must hold
# FLAG_SUSTAIN_MIN_COMPUTATIONS forecasts. Coarser (a 97-hour run forecast every 19 min), the
# replay of a run over ~33 h could raise no trending flag at all: neither its injected
# divergence nor a false deadline alert was ever counted. Such runs cost more forecasts.
MAX_FORECAST_INTERVAL_S = th.FLAG_SUSTAIN_MAX_S / th.FLAG_SUSTAIN_MIN_COMPUTATIONS
DEADLINE_MARGIN = 1.5  # every run aims at a cutoff 1.5x its real duration after its start
GPUS = 8
FAULTS = ("nan", "spike", "divergence", "slowdown", "stall", "outage")
# Which alert rule kinds detect which fault.
DETECTED_BY = {
    "nan": {"nan"},
    "spike": {"spike", "nan"},
    "divergence": {"rise", "oscillation", "regression"},
    "slowdown": {"deadline", "slip"},
    "stall": {"stalled"},
    "outage": set(),
}
FLIP_FLOP_S = 3600.0
# Documented events that are faults (a documented early stop is a planned end, not a fault).
# Documented events that make a run not healthy (str.contains): the shared set's, and the
# divergence_onset / nan / fault rows of a generated set (bench/data/tinygpt).
FAULT_EVENTS = (
    "spike",
    "explosion",
    "failure",
    "restart",
    "rollback",
    "divergence",
    "nan",
    "fault",
)


@dataclass
class Row:
    step: int
    t: float
    loss: float | None
    val: float | None


@dataclass
class Fault:
    kind: str
    at_t: float  # run-clock seconds when it begins
    at_step: int
    duration_s: float = 0.0


@dataclass
class Replay:
    """What one replay produced."""

    name: str
    fault: Fault | None
    run_hours: float
    messages: Counter[str] = field(default_factory=Counter)  # rule kind -> raise messages
    resolves: Counter[str] = field(default_factory=Counter)
    raises: Counter[str] = field(default_factory=Counter)  # flag kind -> raised rows
    flip_flops: Counter[str] = field(default_factory=Counter)  # flag kind -> re-raises
    crash_alerts_in_outage: int = 0
    detected_after_s: float | None = None
    eta_jump: float | None = None  # largest P50 move between forecasts / time left
    loss_jump: float | None = None  # largest relative move of the final-loss P50
    forecasts: int = 0


# --- the run's rows, and faults applied to them --------------------------------------------


def load_rows(path: Path) -> tuple[list[Row], int | None] | None:
    from curveset import curve_rows, load_run_file, run_timeline

    if run_timeline(load_run_file(path)) is None:
        return None  # no clock at all: its pace would be invented
    rows, total = curve_rows(path)
    out = [Row(r.step, r.t, r.train_loss, r.val_loss) for r in rows]
    out.sort(key=lambda r: (r.t, r.step))
    if len(out) < 20 or out[-1].t - out[0].t < 60:
        return None
    t0 = out[0].t
    for r in out:
        r.t -= t0
    return out, total


def read_loss(rows: list[Row]) -> str:
    """The Row field of the loss the server reads: the train loss when the run logs one, else
    its validation loss (some log only that)."""
    return "loss" if any(r.loss is not None for r in rows) else "val"


def inject(rows: list[Row], kind: str, rng: random.Random) -> tuple[list[Row], Fault]:
    """The rows with one fault from a random point of the run's middle."""
    end = rows[-1].t
    i = next(i for i, r in enumerate(rows) if r.t >= rng.uniform(0.3, 0.7) * end)
    at = rows[i]
    fault = Fault(kind, at.t, at.step)
    out = [Row(r.step, r.t, r.loss, r.val) for r in rows]
    tail = out[i:]
    # Into the loss the run logs (some log only a validation loss).
    attr = read_loss(out)
    if kind == "nan":
        for r in tail:  # the loss goes non-finite and stays so, as a blown-up run does
            if getattr(r, attr) is not None:
                setattr(r, attr, math.nan)
    elif kind == "spike":
        hit = next((r for r in tail if getattr(r, attr) is not None), None)
        if hit is not None:
            setattr(hit, attr, getattr(hit, attr) * rng.uniform(3.0, 6.0))
    elif kind == "divergence":
        base = next((getattr(r, attr) for r in reversed(out[:i]) if getattr(r, attr)), None)
        span = max(1.0, end - at.t)
        for r in tail:
            if getattr(r, attr) is not None and base is not None:
                # Climbs back by half its level over a third of what is left, and stays there.
                setattr(
                    r, attr, getattr(r, attr) + 0.5 * base * min(1.0, (r.t - at.t) / (0.3 * span))
                )
    elif kind == "slowdown":
        for r in tail:  # from here every step takes 3x as long: the cutoff becomes unreachable
            r.t = at.t + 3.0 * (r.t - at.t)
    elif kind == "stall":
        fault.duration_s = max(900.0, 0.1 * end)
        for r in tail[1:]:  # alive (heartbeats go on) but no step for a while, then on again
            r.t += fault.duration_s
    elif kind == "outage":
        fault.duration_s = rng.uniform(60.0, 600.0)
    return out, fault


# --- one replay ----------------------------------------------------------------------------


def _windows(rows: list[Row], scale: float) -> Iterator[tuple[float, list[Row]]]:
    """(send time, rows) per client batch: points grouped per window, heartbeats between."""
    end, step, beat = rows[-1].t, BATCH_S * scale, HEARTBEAT_S * scale
    i, t, last_sent = 0, 0.0, -math.inf
    while t <= end + step:
        batch = []
        while i < len(rows) and rows[i].t <= t:
            batch.append(rows[i])
            i += 1
        if batch or t - last_sent >= beat:
            yield t, batch
            last_sent = t
        t += step


def replay(
    path: Path, rows: list[Row], total: int | None, fault: Fault | None, seed: int
) -> Replay:
    from alerts import services as alerts_services
    from alerts.models import Channel, Notification
    from forecasting import compute, liveness
    from forecasting.models import Flag, Forecast
    from tracker import services as tr
    from tracker.models import Deadline, Project

    start = CLOCK.t
    end = rows[-1].t
    project, _ = Project.objects.get_or_create(slug="flagstream", defaults={"name": "flagstream"})
    if not Channel.objects.filter(project=project).exists():
        Channel.objects.create(project=project, kind="email", name="lead", target="lead@x.test")
    clean_end = end if fault is None or fault.kind not in ("slowdown", "stall") else None
    duration = clean_end if clean_end is not None else _clean_duration(rows, fault)
    total_steps = total or max(r.step for r in rows)
    last = max(r.step for r in rows)
    if 0 < last < total_steps:
        # Stopped early (a wall-clock cap): the cutoff is set for the plan, not the cut.
        duration *= total_steps / last
    deadline = Deadline.objects.create(
        project=project,
        slug=f"d{Deadline.objects.count()}",
        name="cutoff",
        cutoff=datetime.fromtimestamp(start + DEADLINE_MARGIN * duration, tz=UTC),
    )
    # Unique per file: many files share a long prefix (one record's seeds).
    tag = f"{zlib.crc32(path.name.encode()):08x}"
    name = f"{path.stem[:40]}-{tag}-{fault.kind if fault else 'healthy'}-{seed}"
    run = tr.run_start(
        project=project,
        public_id=name[:64],
        session="s1",
        started_at=CLOCK.now(),
        fields={"total_steps": total_steps, "world_size": GPUS},
        deadline_slug=deadline.slug,
    ).run
    out = Replay(name=name, fault=fault, run_hours=end / 3600.0)
    scale = max(1.0, min(end / (MAX_FORECASTS * FORECAST_S), MAX_FORECAST_INTERVAL_S / FORECAST_S))
    every, sweep_every = FORECAST_S * scale, SWEEP_S * scale
    next_forecast, next_sweep, seq = every, sweep_every, 0
    outage = (
        (fault.at_t, fault.at_t + fault.duration_s) if fault and fault.kind == "outage" else None
    )
    spooled: list[tuple[float, list[Row]]] = []
    rng = random.Random(seed)
    reconnect_at = outage[1] + rng.uniform(2.0, 60.0) if outage else None

    def server_up(t: float) -> bool:
        return outage is None or not (outage[0] <= t < outage[1])

    def send(t_sent: float, batch: list[Row]) -> None:
        nonlocal seq
        seq += 1
        series = []
        for key, attr in (("loss", "loss"), ("val_loss", "val")):
            pts = [(r.step, getattr(r, attr), r.t) for r in batch if getattr(r, attr) is not None]
            if pts:
                a = np.array(pts, dtype=float)
                series.append(tr.SeriesIn(key, a[:, 0].astype(np.int64), a[:, 1], start + a[:, 2]))
        tr.batch_ingest(
            run=run,
            session="s1",
            seq=seq,
            series=series,
            events=[],
            heartbeat=datetime.fromtimestamp(start + t_sent, tz=UTC),
        )

    def tick(t: float) -> None:
        nonlocal next_forecast, next_sweep
        while next_sweep <= t or next_forecast <= t:
            if next_sweep <= next_forecast:
                at, next_sweep = next_sweep, next_sweep + sweep_every
                if server_up(at):
                    CLOCK.t = start + at
                    liveness.server_tick(period_s=sweep_every)
                    liveness.run_check_liveness(run_id=run.pk)
                    _dispatch(alerts_services)
            else:
                at, next_forecast = next_forecast, next_forecast + every
                if server_up(at):
                    CLOCK.t = start + at
                    compute.forecast_compute(run_id=run.pk)
                    out.forecasts += 1
                    _dispatch(alerts_services)

    for t_sent, batch in _windows(rows, scale):
        tick(t_sent)
        CLOCK.t = start + t_sent
        if outage is not None and reconnect_at is not None and outage[0] <= t_sent < reconnect_at:
            spooled.append((t_sent, batch))  # the client spools until it reaches us again
            continue
        for old_t, old_batch in spooled:  # the spool replays first, in order
            send(old_t, old_batch)
        spooled.clear()
        send(t_sent, batch)
    tick(end + BATCH_S * scale)
    CLOCK.t = start + end + BATCH_S * scale
    tr.run_finish(run=run, status="finished", ended_at=CLOCK.now(), session="s1")
    compute.forecast_compute(run_id=run.pk)
    liveness.run_check_liveness(run_id=run.pk)
    alerts_services.run_end_dispatch(run_id=run.pk)
    _dispatch(alerts_services)

    _count(out, run, Flag, Notification, Forecast, start)
    CLOCK.t = start + end + 86400.0  # the next run starts on another day
    return out


def _clean_duration(rows: list[Row], fault: Fault | None) -> float:
    # The deadline is set from the run as it would have gone without the fault.
    assert fault is not None
    end = rows[-1].t
    if fault.kind == "slowdown":
        return fault.at_t + (end - fault.at_t) / 3.0
    return end - fault.duration_s


def _dispatch(alerts_services: Any) -> None:
    from alerts.models import Notification

    alerts_services.flags_dispatch()
    # A prompt worker: what is due goes out now (nothing leaves this process).
    Notification.objects.filter(status="pending").update(
        status="sent", tries=1, sent_at=CLOCK.now()
    )


def _count(
    out: Replay, run: Any, Flag: Any, Notification: Any, Forecast: Any, start: float
) -> None:
    flags = list(Flag.objects.filter(run=run).order_by("created_at", "id"))
    last_resolved: dict[str, float] = {}
    for f in flags:
        at = f.created_at.timestamp() - start
        if f.state == "raised":
            out.raises[f.kind] += 1
            if f.kind in last_resolved and at - last_resolved[f.kind] <= FLIP_FLOP_S:
                out.flip_flops[f.kind] += 1
        elif f.state == "resolved":
            last_resolved[f.kind] = at
    fault = out.fault
    for n in Notification.objects.filter(run=run, status="sent").order_by("created_at", "id"):
        at = n.created_at.timestamp() - start
        if n.event == "resolved":
            out.resolves[n.rule_kind] += 1
            continue
        if n.rule_kind == "finished":
            continue
        out.messages[n.kind] += 1
        if fault is not None and fault.kind == "outage" and n.kind == "stalled":
            out.crash_alerts_in_outage += 1
        if (
            fault is not None
            and n.kind in DETECTED_BY[fault.kind]
            and at >= fault.at_t
            and out.detected_after_s is None
        ):
            out.detected_after_s = at - fault.at_t
    etas = list(
        Forecast.objects.filter(run=run, kind="eta", finish_p50__isnull=False)
        .order_by("computed_at", "id")
        .values_list("computed_at", "finish_p50")
    )
    jumps = [
        abs(b[1] - a[1]) / max(60.0, b[1] - b[0].timestamp()) for a, b in itertools.pairwise(etas)
    ]
    out.eta_jump = max(jumps) if jumps else None
    losses = [
        d.get("p50")
        for d in Forecast.objects.filter(run=run, kind="loss")
        .order_by("computed_at", "id")
        .values_list("data", flat=True)
    ]
    losses = [v for v in losses if isinstance(v, int | float) and math.isfinite(v) and v > 0]
    ljumps = [abs(b - a) / a for a, b in itertools.pairwise(losses)]
    out.loss_jump = max(ljumps) if ljumps else None


# --- the whole set ------------------------------------------------------------------------


def documented_faults(root: Path) -> set[str]:
    import pandas as pd

    path = root / "EVENTS.csv"
    if not path.exists():
        return set()
    events = pd.read_csv(path, dtype=str).fillna("")
    documented = events[events["origin"] == "documented"]
    faulty = documented[documented["event_type"].str.contains("|".join(FAULT_EVENTS))]
    return {Path(f).name for f in faulty["file"]}


def run_files(root: Path) -> list[Path]:
    import pandas as pd

    index = root / "INDEX.csv"
    if index.exists():
        files = pd.read_csv(index, dtype=str)["file"].tolist()
        return [root / f for f in files]
    return sorted((root / "runs").glob("*.csv"))


def summarise(healthy: list[Replay], faulted: list[Replay], skipped: int) -> dict[str, Any]:
    hours = sum(r.run_hours for r in healthy)
    per_kind: Counter[str] = Counter()
    for r in healthy:
        per_kind.update(r.messages)
    per100 = {k: round(100 * v / hours, 3) for k, v in sorted(per_kind.items())} if hours else {}
    recall: dict[str, float | None] = {}
    delay: dict[str, float | None] = {}
    by_fault: dict[str, list[Replay]] = defaultdict(list)
    for r in faulted:
        assert r.fault is not None
        by_fault[r.fault.kind].append(r)
    for kind, reps in sorted(by_fault.items()):
        if kind == "outage":
            continue
        found = [r.detected_after_s for r in reps if r.detected_after_s is not None]
        recall[kind] = round(len(found) / len(reps), 3) if reps else None
        delay[kind] = round(float(np.median(found)), 1) if found else None
    # A lead wants one message per fault, not one per cooldown: what each faulted replay sent
    # (every kind, "finished" aside), median and most.
    sent = {
        kind: [sum(r.messages.values()) for r in reps] for kind, reps in sorted(by_fault.items())
    }
    fault_messages = {
        kind: {"median": float(np.median(n)), "max": max(n)} for kind, n in sent.items() if n
    }
    jumps = [r.eta_jump for r in healthy if r.eta_jump is not None]
    ljumps = [r.loss_jump for r in healthy if r.loss_jump is not None]
    return {
        "runs": len(healthy),
        "skipped_runs": skipped,
        "run_hours": round(hours, 2),
        "false_alerts": sum(per_kind.values()),
        "false_alerts_per_100_run_hours": {
            "total": round(100 * sum(per_kind.values()) / hours, 3) if hours else None,
            **per100,
        },
        "flip_flops": sum(sum(r.flip_flops.values()) for r in healthy + faulted),
        "flip_flops_by_kind": dict(sum((r.flip_flops for r in healthy + faulted), Counter())),
        "outage_false_crash": sum(r.crash_alerts_in_outage for r in by_fault.get("outage", [])),
        "outage_replays": len(by_fault.get("outage", [])),
        "fault_detection_recall": recall,
        "fault_detection_delay_s": delay,
        "faulted_replays": {k: len(v) for k, v in sorted(by_fault.items())},
        "fault_messages_per_replay": fault_messages,
        "eta_jump_max": round(max(jumps), 3) if jumps else None,
        "eta_jump_median": round(float(np.median(jumps)), 3) if jumps else None,
        "loss_jump_max": round(max(ljumps), 3) if ljumps else None,
        "loss_jump_median": round(float(np.median(ljumps)), 3) if ljumps else None,
        "cadence": {
            "forecast_s": FORECAST_S,
            "sweep_s": SWEEP_S,
            "max_forecasts_per_run": MAX_FORECASTS,
            "max_forecast_interval_s": MAX_FORECAST_INTERVAL_S,
            "deadline_margin": DEADLINE_MARGIN,
        },
    }


def table(healthy: list[Replay], faulted: list[Replay], summary: dict[str, Any]) -> str:
    lines = [
        f"runs {summary['runs']} ({summary['skipped_runs']} skipped: no clock), "
        f"{summary['run_hours']} run-hours",
        "",
        "healthy replays: messages that would be sent, per kind (per 100 run-hours)",
    ]
    for kind, v in summary["false_alerts_per_100_run_hours"].items():
        lines.append(f"  {kind:<12} {v}")
    noisy = sorted(healthy, key=lambda r: -sum(r.messages.values()))[:8]
    for r in noisy:
        if r.messages:
            lines.append(f"    {r.name}: {dict(r.messages)}")
    flippers = [f"{r.name} {dict(r.flip_flops)}" for r in healthy + faulted if r.flip_flops]
    lines += [
        "",
        f"flip-flops {summary['flip_flops']}: {'; '.join(flippers[:10])}",
        f"crash alerts caused by an outage "
        f"{summary['outage_false_crash']} in {summary['outage_replays']} outages",
        "",
        "fault       replays  recall  median delay (s)  messages per replay (median / max)",
    ]
    for kind in FAULTS:
        if kind == "outage":
            continue
        n = summary["faulted_replays"].get(kind, 0)
        msgs = summary["fault_messages_per_replay"].get(kind, {})
        lines.append(
            f"  {kind:<10} {n:>7}  {summary['fault_detection_recall'].get(kind)!s:>6}  "
            f"{summary['fault_detection_delay_s'].get(kind)!s:>16}  "
            f"{msgs.get('median')} / {msgs.get('max')}"
        )
    chatty = sorted(faulted, key=lambda r: -sum(r.messages.values()))[:5]
    lines += [f"    {r.name}: {dict(r.messages)}" for r in chatty if sum(r.messages.values()) > 2]
    missed = [
        r.name
        for r in faulted
        if r.fault and r.fault.kind != "outage" and r.detected_after_s is None
    ]
    if missed:
        lines.append(f"  missed ({len(missed)}): {', '.join(missed)}")
    lines += [
        "",
        f"largest ETA jump between forecasts (x time left): median {summary['eta_jump_median']}, "
        f"max {summary['eta_jump_max']}; final-loss jump: median {summary['loss_jump_median']}, "
        f"max {summary['loss_jump_max']}",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Job:
    index: int
    path: Path
    fault: str
    healthy: bool
    seed: int


REPO_ROOT = Path(__file__).resolve().parents[1]


def _repo_root_on_path() -> None:
    """Let spawned workers import `bench` however this was started: a spawned process imports
    this module (to find `_worker_init`) before any initializer runs, so the repository root must
    already be on its path; PYTHONPATH is read by the child's interpreter at start-up."""
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def _worker_init(database_url: str | None) -> None:
    _setup_django(database_url if database_url and not database_url.startswith("sqlite") else None)


def _run_job(job: Job) -> tuple[int, list[Replay], bool]:
    loaded = load_rows(job.path)
    if loaded is None:
        return job.index, [], False
    rows, total = loaded
    out = [replay(job.path, rows, total, None, job.seed)] if job.healthy else []
    if job.fault == "none":
        return job.index, out, True
    rng = random.Random(f"{job.seed}:{job.path.name}")
    bad_rows, fault = inject(rows, job.fault, rng)
    out.append(replay(job.path, bad_rows, total, fault, job.seed))
    return job.index, out, True


def select_jobs(
    directory: Path,
    *,
    seed: int,
    limit: int | None = None,
    only: str | None = None,
    fault: str | None = None,
    faults_only: bool = False,
    healthy_only: bool = False,
    rotation_faults: list[str] | None = None,
) -> list[Job]:
    """A job per run file: its healthy replay (unless documented faulty) and one fault, by
    rotation unless `fault` names one; `rotation_faults` keeps the rotation's runs of those
    faults; `healthy_only` drops the faults (fault "none")."""
    documented = documented_faults(directory)
    files = [f for f in run_files(directory) if not only or only in f.name]
    jobs = [
        Job(i, path, fault or FAULTS[i % len(FAULTS)], path.name not in documented, seed)
        for i, path in enumerate(files[:limit])
    ]
    if rotation_faults:
        if unknown := set(rotation_faults) - set(FAULTS):
            raise ValueError(f"--rotation-faults: no fault {', '.join(sorted(unknown))}")
        jobs = [j for j in jobs if j.fault in rotation_faults]
    if faults_only:
        jobs = [replace(j, healthy=False) for j in jobs]
    if healthy_only:
        jobs = [replace(j, fault="none") for j in jobs if j.healthy]
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N runs")
    parser.add_argument("--only", default=None, help="replay only runs whose file contains this")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--fault", choices=FAULTS, default=None, help="inject only this fault")
    parser.add_argument("--faults-only", action="store_true", help="skip the healthy replays")
    parser.add_argument(
        "--healthy-only", action="store_true", help="only the healthy replays (false alerts)"
    )
    parser.add_argument(
        "--rotation-faults",
        default=None,
        help="comma-separated: keep the fault rotation, replay only the runs it gives these "
        "(the full run's sample of those faults, in a fraction of its time)",
    )
    parser.add_argument("--database-url", default=None, help="default: a SQLite file per process")
    args = parser.parse_args(argv)

    try:
        jobs = select_jobs(
            args.directory,
            seed=args.seed,
            limit=args.limit,
            only=args.only,
            fault=args.fault,
            faults_only=args.faults_only,
            healthy_only=args.healthy_only,
            rotation_faults=args.rotation_faults.split(",") if args.rotation_faults else None,
        )
    except ValueError as e:
        parser.error(str(e))
    # Longest first, so the last process does not start the longest run alone.
    jobs.sort(key=lambda j: -j.path.stat().st_size)
    healthy: list[Replay] = []
    faulted: list[Replay] = []
    skipped = 0
    began = time.monotonic()
    import multiprocessing

    _repo_root_on_path()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.processes, _worker_init, (args.database_url,)) as pool:
        for done, (_, replays, ok) in enumerate(pool.imap_unordered(_run_job, jobs), 1):
            skipped += not ok
            for r in replays:
                (faulted if r.fault else healthy).append(r)
            print(f"[{done}/{len(jobs)}] {time.monotonic() - began:.0f}s", file=sys.stderr)
    healthy.sort(key=lambda r: r.name)
    faulted.sort(key=lambda r: r.name)
    summary = summarise(healthy, faulted, skipped)
    print(table(healthy, faulted, summary))
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
