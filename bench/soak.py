"""Soak: N active runs logging through the real client against the whole stack on this machine.

    python -m bench.soak --runs 200 --minutes 30
    python -m bench.soak --ramp 100,200,400,700,1000 --minutes 5   # the largest N that holds

One level: a fresh PostgreSQL database, migrated; gunicorn (2 workers x 8 threads, as compose
runs it), a Celery worker (the compose queues, 2 processes), beat, PostgreSQL and Redis (a Redis
database of its own). N runs, each with a deadline, are created by the real `runcast` client in
trainer processes (`--runs-per-process` each, every run its own sender thread, as N trainers
would), and each logs 4 keys once a second: its loss is a real curve of the shared set
(interpolated onto the run's steps), lr, grad_norm and throughput, plus its own rank's step
timing. The client's defaults apply, flush pacing included (tracker/pacing.py).

Measured over the level after a warm-up minute:
- `fresh_share`: of the samples (every 10 s, every running run), the share whose newest forecast
  is at most 30 s old; `forecast_age_p99_s`;
- `ingest_p99_ms`: gunicorn's own request time (its access log, `%(D)s`) of every batch POST;
- `board_p99_ms`: a logged-in lead loading the board every 2 s; `board_server_p99_ms`: the
  same loads as gunicorn timed them (its thread's time, not the wait for a free thread);
- `cpu_s_per_run_hour` (and `_by` tree): CPU of the web, worker and beat process trees and of
  the PostgreSQL server, exited processes included, per run-hour logged; `bytes_per_run_hour`:
  the database's growth per run-hour.
A level holds when `fresh_share` >= 0.99, ingest p99 < 250 ms and board p99 < 300 ms. The last
line is one JSON object: every level's figures and `max_active_runs`, the largest N that held.
The machine must be otherwise quiet: the figures are CPU-bound.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import harness, throwaway_secret_key

ROOT = harness.ROOT
DB = os.environ.get("BENCH_DB", "runcast_soak")
REDIS_DB = int(os.environ.get("BENCH_SOAK_REDIS_DB", "12"))
DATA = ROOT.parent / "shared" / "data" / "curves"
# As docker-compose.yml runs them; gunicorn also writes each request's own time (microseconds).
WEB = [
    "gunicorn", "config.wsgi", "--workers", "2", "--threads", "8", "--preload",
    "--max-requests", "5000", "--max-requests-jitter", "500",
    "--access-logformat", "%(m)s %(U)s %(s)s %(D)s",
]  # fmt: skip
WORKER = [
    "celery", "-A", "config", "worker", "-Q", "default,forecasting,alerts", "--concurrency", "2",
    "--max-memory-per-child", "400000", "--loglevel", "WARNING",
]  # fmt: skip
BEAT = ["celery", "-A", "config", "beat", "--loglevel", "WARNING"]
FRESH_S = 30.0
INGEST_P99_MS = 250.0
BOARD_P99_MS = 300.0
FRESH_SHARE = 0.99
WARMUP_S = 60.0

# A lead with a session, and the deadline every run aims at (run with `manage.py shell -c`).
LEAD_CODE = """
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.utils import timezone
from tracker.models import Deadline, Membership, Project
project = Project.objects.get(slug="bench")
lead = get_user_model().objects.create_user("lead", password="soak-lead-pw-123")
Membership.objects.create(project=project, user=lead, role=Membership.Role.OWNER)
Deadline.objects.create(project=project, slug="cutoff", name="Cutoff",
                        cutoff=timezone.now() + timedelta(days=2))
session = SessionStore()
session["_auth_user_id"] = str(lead.pk)
from django.conf import settings
session["_auth_user_backend"] = settings.AUTHENTICATION_BACKENDS[0]
session["_auth_user_hash"] = lead.get_session_auth_hash()
session.create()
print(session.session_key)
"""

# Freshness of every running run's newest forecast, in seconds (psql, on this database).
FRESHNESS_SQL = """
SELECT COALESCE(EXTRACT(EPOCH FROM now() - MAX(f.computed_at)), 1e9)
FROM tracker_run r LEFT JOIN forecasting_forecast f ON f.run_id = r.id
WHERE r.status = 'running' GROUP BY r.id
"""


def trainer(spec: dict[str, Any]) -> None:
    """One trainer process: `spec["runs"]` runs, a step a second each, until told to stop."""
    import numpy as np
    import runcast

    from bench.capacity import real_curves

    curves = real_curves(Path(spec["data"]))
    settings = runcast.Settings(url=spec["url"], token=spec["token"], dir=Path(spec["spool"]))
    steps_total = int(spec["seconds"]) + 600
    runs = []
    for i, run_id in enumerate(spec["runs"]):
        curve = curves[(spec["offset"] + i) % len(curves)]
        loss = np.interp(np.linspace(0, len(curve) - 1, steps_total), np.arange(len(curve)), curve)
        run = runcast.init(
            project="bench",
            id=run_id,
            name=run_id,
            total_steps=steps_total,
            deadline="cutoff",
            world_size=8,
            settings=settings,
        )
        runs.append((run, loss))
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        raise SystemExit("soak trainer: no GO")
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < spec["seconds"]:
        for run, loss in runs:
            run.log(
                {
                    "loss": float(loss[step]),
                    "lr": 3e-4,
                    "grad_norm": 1.0 + 0.1 * np.sin(step / 50.0),
                    "throughput": 1000.0,
                },
                step=step,
            )
            run.timing(step, compute_s=0.9, wait_s=0.05)
        step += 1
        time.sleep(max(0.0, started + step - time.monotonic()))
    for run, _ in runs:
        run.finish(timeout=60)


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def tree_cpu_s(roots: list[int]) -> float:
    return sum(harness.tree_cpu_seconds(root, reaped=True) for root in roots)


def postmaster_pid() -> int:
    """The PostgreSQL server's own process: its tree is every backend, this bench's and any
    other client's (hence a quiet machine)."""
    data = harness.pg_query("postgres", "SHOW data_directory")[0][0]
    return int((Path(data) / "postmaster.pid").read_text().split()[0])


def db_bytes() -> int:
    return int(harness.pg_query("postgres", f"SELECT pg_database_size('{DB}')")[0][0])


class Prober(threading.Thread):
    """The lead's board every 2 s, and every run's forecast freshness every 10 s."""

    def __init__(self, url: str, session: str, warm_until: float) -> None:
        super().__init__(daemon=True)
        self.url, self.session, self.warm_until = url, session, warm_until
        self.board_ms: list[float] = []
        self.board_errors = 0
        self.board_error = ""  # the last one, for the JSON line
        self.ages: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        next_fresh = 0.0
        while not self.stop.wait(2.0):
            if time.time() < self.warm_until:
                continue
            request = urllib.request.Request(
                f"{self.url}/", headers={"Cookie": f"sessionid={self.session}"}
            )
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    body = response.read()
                    landed = response.geturl()
                elapsed = 1000 * (time.perf_counter() - began)
                # The board itself, not the login page a lost session is sent to.
                if landed.rstrip("/") == self.url and b"soak-" in body:
                    self.board_ms.append(elapsed)
                else:
                    self.board_errors += 1
                    self.board_error = f"{landed}: {body[:200]!r}"
            except OSError as exc:
                self.board_errors += 1
                self.board_error = repr(exc)
            if time.time() >= next_fresh:
                next_fresh = time.time() + 10.0
                self.ages += [float(row[0]) for row in harness.pg_query(DB, FRESHNESS_SQL)]


BATCH_LINE = re.compile(r"^POST /api/v1/runs/[^/]+/batches 200 (\d+)$")
# The board as the prober loads it: the time gunicorn's thread spent on it, apart from the wait
# for a free thread before it (which the prober's own clock adds).
BOARD_LINE = re.compile(r"^GET / 200 (\d+)$")


def batch_latencies_ms(
    logfile: Path, since_line: int, pattern: re.Pattern[str] = BATCH_LINE
) -> list[float]:
    out = []
    for line in logfile.read_text(errors="replace").splitlines()[since_line:]:
        match = pattern.match(line.strip())
        if match:
            out.append(int(match.group(1)) / 1000.0)
    return out


def level(runs: int, minutes: float, per_process: int, data: Path) -> dict[str, Any]:
    cleanup = harness.Cleanup(databases=[DB], redis_dbs=(REDIS_DB,))
    work = harness.WORK / "soak"
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cleanup.paths.append(work / "spool")
    try:
        harness.recreate_db(DB)
        port = harness.free_port()
        url = f"http://127.0.0.1:{port}"
        env = dict(
            os.environ,
            DATABASE_URL=f"{harness.PG_URL}/{DB}",
            CELERY_BROKER_URL=f"{harness.REDIS_URL}/{REDIS_DB}",
            CACHE_URL=f"{harness.REDIS_URL}/{REDIS_DB}",
            SECRET_KEY=throwaway_secret_key(),
            RUNCAST_WEB_PROBE_URL=f"{url}/healthz",
            PYTHONPATH=f"{ROOT}:{ROOT / 'client'}",
            LOG_LEVEL="WARNING",
        )
        harness.manage(env, "migrate", "--noinput")
        token = harness.manage(env, "shell", "-c", harness.SETUP_CODE).strip().splitlines()[-1]
        session = harness.manage(env, "shell", "-c", LEAD_CODE).strip().splitlines()[-1]
        bin_dir = harness.VENV_PY.parent
        access = logs / "soak-access.log"
        access.write_text("")
        web = harness.start_group(
            [str(bin_dir / WEB[0]), *WEB[1:], "--access-logfile", str(access),
             "--bind", f"127.0.0.1:{port}"],
            env, logs / "soak-web.log",
        )  # fmt: skip
        cleanup.groups.append(web)
        worker = harness.start_group(
            [str(bin_dir / WORKER[0]), *WORKER[1:]], env, logs / "soak-worker.log"
        )
        cleanup.groups.append(worker)
        beat_schedule = work / "celerybeat-schedule"
        beat = harness.start_group(
            [str(bin_dir / BEAT[0]), *BEAT[1:], "--schedule", str(beat_schedule)],
            env,
            logs / "soak-beat.log",
        )
        cleanup.groups.append(beat)
        cleanup.paths.append(beat_schedule)
        harness.wait_http(f"{url}/healthz", web, logs / "soak-web.log", timeout=120)

        seconds = minutes * 60.0
        ids = [f"soak-{i:05d}" for i in range(runs)]
        procs = []
        for n, lo in enumerate(range(0, runs, per_process)):
            spec = {
                "url": url,
                "token": token,
                "spool": str(work / "spool"),
                "data": str(data),
                "runs": ids[lo : lo + per_process],
                "offset": lo,
                "seconds": seconds,
            }
            proc = subprocess.Popen(
                [str(harness.VENV_PY), "-m", "bench.soak", "--trainer", json.dumps(spec)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                stderr=open(logs / f"soak-trainer-{n}.log", "wb"),  # noqa: SIM115
            )
            cleanup.workers.append(proc)
            procs.append(proc)
        for proc in procs:
            if proc.stdout is None or proc.stdout.readline().strip() != "READY":
                raise harness.BenchError("a trainer did not get ready; see var/bench/soak/logs")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()
        began = time.time()
        prober = Prober(url, session, warm_until=began + WARMUP_S)
        prober.start()
        time.sleep(WARMUP_S)
        access_from = len(access.read_text(errors="replace").splitlines())
        trees = {
            "web": [web.pid],
            "worker": [worker.pid],
            "beat": [beat.pid],
            "db": [postmaster_pid()],
        }
        cpu0 = {name: tree_cpu_s(pids) for name, pids in trees.items()}
        bytes0 = db_bytes()
        measured_from = time.time()
        for proc in procs:
            proc.wait(timeout=seconds + 900)
        measured_s = time.time() - measured_from
        prober.stop.set()
        prober.join(30)
        cpu_by = {name: tree_cpu_s(pids) - cpu0[name] for name, pids in trees.items()}
        cpu = sum(cpu_by.values())
        grown = db_bytes() - bytes0
        ingest = batch_latencies_ms(access, access_from)
        board_server = batch_latencies_ms(access, access_from, BOARD_LINE)
        run_hours = runs * measured_s / 3600.0
        fresh = (
            sum(age <= FRESH_S for age in prober.ages) / len(prober.ages) if prober.ages else 0.0
        )
        figures: dict[str, Any] = {
            "runs": runs,
            "minutes": minutes,
            "measured_s": round(measured_s, 1),
            "fresh_share": round(fresh, 4),
            "forecast_age_p99_s": p99(prober.ages),
            "ingest_batches": len(ingest),
            "ingest_batches_per_s": round(len(ingest) / measured_s, 1),
            "ingest_p50_ms": round(statistics.median(ingest), 1) if ingest else None,
            "ingest_p99_ms": p99(ingest),
            "board_loads": len(prober.board_ms),
            "board_errors": prober.board_errors,
            "board_error": prober.board_error,
            "board_p50_ms": (
                round(statistics.median(prober.board_ms), 1) if prober.board_ms else None
            ),
            "board_p99_ms": None if not prober.board_ms else round(p99(prober.board_ms) or 0, 1),
            "board_server_p50_ms": (
                round(statistics.median(board_server), 1) if board_server else None
            ),
            "board_server_p99_ms": round(p99(board_server) or 0, 1) if board_server else None,
            "cpu_s_per_run_hour": round(cpu / run_hours, 2) if run_hours else None,
            "cpu_s_per_run_hour_by": {
                name: round(value / run_hours, 2) for name, value in cpu_by.items()
            }
            if run_hours
            else None,
            "bytes_per_run_hour": round(grown / run_hours) if run_hours else None,
        }
        figures["held"] = bool(
            fresh >= FRESH_SHARE
            and (figures["ingest_p99_ms"] or 1e9) < INGEST_P99_MS
            and (figures["board_p99_ms"] or 1e9) < BOARD_P99_MS
            and not prober.board_errors
        )
        return figures
    finally:
        cleanup.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ramp", help="comma-separated run counts, smallest first")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--runs-per-process", type=int, default=100)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--trainer", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trainer:
        trainer(json.loads(args.trainer))
        return 0
    counts = [int(n) for n in args.ramp.split(",")] if args.ramp else [args.runs]
    levels = []
    with harness.sigterm_as_interrupt():
        for count in counts:
            harness.log(f"soak: {count} runs for {args.minutes:g} min")
            figures = level(count, args.minutes, args.runs_per_process, args.data)
            harness.log(json.dumps(figures))
            levels.append(figures)
            if not figures["held"]:
                break
    held = [f["runs"] for f in levels if f["held"]]
    print(json.dumps({"max_active_runs": max(held, default=0), "levels": levels}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
