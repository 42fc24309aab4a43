"""Ingest throughput of Runcast vs a real MLflow tracking server, on this machine.

Runcast: a fresh PostgreSQL database, migrations, a project and a write token, gunicorn
(4 workers x 4 threads), and the real `runcast` client in separate trainer processes, timed
from the first log() until finish() returns (every point acknowledged); the stored count is
then checked against `Run.points_count` and the chunks. MLflow: `mlflow server` (4 workers) on
its own PostgreSQL database, fed the same points with `MlflowClient.log_batch` of 1,000 metrics
per call from processes running in a separate venv (var/bench/mlflow-venv, created on first
use), also checked against the database. Both servers' process trees are sampled every 100 ms
for peak RSS. The last line printed is one JSON object.

    .venv/bin/python -m bench.ingest            # 4 keys x 50,000 steps; then 8 clients
    .venv/bin/python -m bench.ingest --quick    # 4 keys x 5,000 steps; then 2 clients
    .venv/bin/python -m bench.ingest --skip-mlflow

Only the orchestrator needs .venv; the trainers (bench/trainers.py) use the standard library
plus either `runcast` or `mlflow`, so the MLflow venv runs them too. Servers, databases and
trainer processes are started and stopped through bench/harness.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from bench import throwaway_secret_key
from bench.harness import (
    PG_URL,
    REDIS_URL,
    ROOT,
    SETUP_CODE,
    VENV_PY,
    WORK,
    BenchError,
    Cleanup,
    TreeRss,
    flush_redis,
    free_port,
    log,
    manage,
    pg_query,
    recreate_db,
    run_workers,
    sigterm_as_interrupt,
    start_group,
    stop_group,
    throughput,
    wait_http,
)
from bench.trainers import MLFLOW_BATCH

MLFLOW_VENV = WORK / "mlflow-venv"
MLFLOW_PY = MLFLOW_VENV / "bin" / "python"

# Databases 14/15, not 0/1: the forecast tasks the server enqueues are never consumed here, and
# a developer's Celery worker on db 0 must not pick them up later. Both are flushed at the end.
BROKER_DB, CACHE_DB = 14, 15
RUNCAST_DB, MLFLOW_DB = "runcast_bench", "mlflow_bench"

LOG_METRIC_CALLS = 200
# Every server worker must have served a request before anything is timed: Runcast's workers
# import the forecasting stack (scipy, pandas) on their first batch, MLflow's are still booting
# when /health first answers. The slowest warm-up run is reported as the cold-start cost. Both
# servers run 4 workers; max(4, clients) concurrent runs reach them all in practice.
WARMUP_STEPS = 100


@dataclass(frozen=True)
class Workload:
    keys: int
    steps: int
    clients: int
    log_calls: int = 200_000

    @property
    def points(self) -> int:
        return self.keys * self.steps

    @property
    def warmup_clients(self) -> int:
        return max(4, self.clients)


# --- Runcast ---------------------------------------------------------------------------------


def django_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"{PG_URL}/{RUNCAST_DB}",
        DJANGO_SETTINGS_MODULE="config.settings.base",
        SECRET_KEY=throwaway_secret_key(),
        CELERY_BROKER_URL=f"{REDIS_URL}/{BROKER_DB}",
        CACHE_URL=f"{REDIS_URL}/{CACHE_DB}",
        LOG_LEVEL="WARNING",
    )
    return env


VERIFY_CODE = """
import json
from django.db.models import Sum
from tracker.models import MetricChunk, Run
print(json.dumps({
    r.public_id: [r.points_count, MetricChunk.objects.filter(run=r).aggregate(n=Sum("n"))["n"] or 0]
    for r in Run.objects.all()
}))
"""


def bench_runcast(cleanup: Cleanup, work: Workload) -> dict[str, Any]:
    env = django_env()
    cleanup.databases.append(RUNCAST_DB)
    cleanup.redis_dbs = (BROKER_DB, CACHE_DB)
    recreate_db(RUNCAST_DB)
    flush_redis(BROKER_DB, CACHE_DB)
    log("runcast: migrating a fresh database")
    manage(env, "migrate", "--noinput")
    token = manage(env, "shell", "-c", SETUP_CODE).strip().splitlines()[-1]

    port = free_port()
    logfile = WORK / "logs" / "gunicorn.log"
    server = start_group(
        [
            str(ROOT / ".venv" / "bin" / "gunicorn"),
            "config.wsgi",
            "--workers",
            "4",
            "--threads",
            "4",
            "--bind",
            f"127.0.0.1:{port}",
        ],
        env,
        logfile,
    )
    cleanup.groups.append(server)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", server, logfile, timeout=60)
    rss = TreeRss(server.pid)
    rss.wait_idle(timeout=60)
    idle_mb = rss.sample() / 2**20
    rss.start()

    client_env = dict(os.environ, PYTHONUNBUFFERED="1")
    base = {"url": url, "token": token, "project": "bench", "spool": str(WORK / "spool")}
    cleanup.paths.append(WORK / "spool")

    def specs(prefix: str, count: int, steps: int = work.steps) -> list[dict[str, Any]]:
        return [
            {**base, "run_id": f"{prefix}-{i}", "keys": work.keys, "steps": steps}
            for i in range(count)
        ]

    log(f"runcast: warm-up, {work.warmup_clients} concurrent small runs")
    warm = run_workers(
        cleanup, VENV_PY, "runcast", specs("warm", work.warmup_clients, WARMUP_STEPS), client_env
    )
    log(f"runcast: log() cost over {work.log_calls:,} calls")
    call = run_workers(
        cleanup, VENV_PY, "log-call", [{**base, "calls": work.log_calls}], client_env
    )[0]

    log(f"runcast: 1 client, {work.points:,} points")
    single = run_workers(cleanup, VENV_PY, "runcast", specs("single", 1), client_env)
    log(f"runcast: {work.clients} clients, {work.points:,} points each")
    multi = run_workers(cleanup, VENV_PY, "runcast", specs("multi", work.clients), client_env)
    peak_mb = rss.stop()

    stored = json.loads(manage(env, "shell", "-c", VERIFY_CODE).strip().splitlines()[-1])
    expected = {"single-0": work.points}
    expected.update({f"multi-{i}": work.points for i in range(work.clients)})
    wrong = {
        run_id: stored.get(run_id)
        for run_id, points in expected.items()
        if stored.get(run_id) != [points, points]
    }
    stop_group(server)
    stats = [r["stats"] for r in single + multi]
    return {
        "single": throughput(single, work.points),
        "multi": throughput(multi, work.points),
        "log_call": call,
        "warmup_s": max(r["ended"] - r["started"] for r in warm),
        "peak_rss_mb": peak_mb,
        "idle_rss_mb": idle_mb,
        "rss_samples": rss.samples,
        "verified": not wrong,
        "wrong": wrong,
        "retries": sum(s.get("retries", 0) for s in stats),
        "batches": sum(s.get("batches_sent", 0) for s in stats),
        "spooled": sum(s.get("batches_spooled", 0) for s in stats),
    }


# --- MLflow ----------------------------------------------------------------------------------


def ensure_mlflow_venv() -> None:
    check = [str(MLFLOW_PY), "-c", "import mlflow, psycopg2"]
    if MLFLOW_PY.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return
    log(f"mlflow: creating {MLFLOW_VENV.relative_to(ROOT)} (pip install mlflow psycopg2-binary)")
    steps = [
        ["python3", "-m", "venv", str(MLFLOW_VENV)],
        [str(MLFLOW_PY), "-m", "pip", "install", "--quiet", "mlflow", "psycopg2-binary"],
    ]
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise BenchError(
                f"{' '.join(cmd[:4])} failed (no PyPI? use --skip-mlflow):\n{done.stderr[-2000:]}"
            )


def bench_mlflow(cleanup: Cleanup, work: Workload) -> dict[str, Any]:
    ensure_mlflow_venv()
    cleanup.databases.append(MLFLOW_DB)
    recreate_db(MLFLOW_DB)
    artifacts = WORK / "mlflow-artifacts"
    cleanup.paths.append(artifacts)
    port = free_port()
    logfile = WORK / "logs" / "mlflow-server.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log("mlflow: starting the server (it migrates its schema first)")
    server = start_group(
        [
            str(MLFLOW_VENV / "bin" / "mlflow"),
            "server",
            "--backend-store-uri",
            f"{PG_URL.replace('postgres://', 'postgresql+psycopg2://')}/{MLFLOW_DB}",
            "--default-artifact-root",
            artifacts.as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env,
        logfile,
    )
    cleanup.groups.append(server)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", server, logfile, timeout=180)
    rss = TreeRss(server.pid)
    rss.wait_idle(timeout=120)
    idle_mb = rss.sample() / 2**20
    rss.start()

    def specs(prefix: str, count: int, steps: int = work.steps) -> list[dict[str, Any]]:
        return [
            {"url": url, "run_id": f"{prefix}-{i}", "keys": work.keys, "steps": steps}
            for i in range(count)
        ]

    log(f"mlflow: warm-up, {work.warmup_clients} concurrent small runs")
    warm = run_workers(
        cleanup, MLFLOW_PY, "mlflow", specs("warm", work.warmup_clients, WARMUP_STEPS), env
    )
    log(f"mlflow: log_metric cost over {LOG_METRIC_CALLS} calls")
    metric = run_workers(
        cleanup, MLFLOW_PY, "mlflow-log-metric", [{"url": url, "calls": LOG_METRIC_CALLS}], env
    )[0]

    log(f"mlflow: 1 client, {work.points:,} points")
    single = run_workers(cleanup, MLFLOW_PY, "mlflow", specs("single", 1), env)
    log(f"mlflow: {work.clients} clients, {work.points:,} points each")
    multi = run_workers(cleanup, MLFLOW_PY, "mlflow", specs("multi", work.clients), env)
    peak_mb = rss.stop()

    counts = dict(pg_query(MLFLOW_DB, "SELECT run_uuid, count(*) FROM metrics GROUP BY run_uuid"))
    wrong = {
        r["run_id"]: counts.get(r["run_id"], 0)
        for r in single + multi
        if counts.get(r["run_id"], 0) != work.points
    }
    stop_group(server)
    return {
        "single": throughput(single, work.points),
        "multi": throughput(multi, work.points),
        "log_metric": metric,
        "warmup_s": max(r["ended"] - r["started"] for r in warm),
        "peak_rss_mb": peak_mb,
        "idle_rss_mb": idle_mb,
        "verified": not wrong,
        "wrong": wrong,
    }


# --- report ----------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def fmt(value: float | None, spec: str) -> str:
    if value is None or math.isnan(value):
        return "-"
    return format(value, spec)


def report(work: Workload, rc: dict[str, Any], ml: dict[str, Any] | None) -> dict[str, Any]:
    call = rc["log_call"]

    def mlflow_at(*path: str) -> float | None:
        """MLflow's figure at `path`, or None when MLflow was not measured."""
        value: Any = ml
        for key in path:
            if value is None:
                return None
            value = value[key]
        return None if value is None else float(value)

    mls = mlflow_at("single", "points_per_s")
    mlm = mlflow_at("multi", "points_per_s")
    metric_ms = mlflow_at("log_metric", "median_ms")
    n = work.clients
    rows = [
        ("points per s, 1 client", rc["single"]["points_per_s"], mls, ",.0f"),
        (f"points per s, {n} clients", rc["multi"]["points_per_s"], mlm, ",.0f"),
        ("seconds, 1 client", rc["single"]["seconds"], mlflow_at("single", "seconds"), ".2f"),
        (f"seconds, {n} clients", rc["multi"]["seconds"], mlflow_at("multi", "seconds"), ".2f"),
        ("slowest cold run (s)", rc["warmup_s"], mlflow_at("warmup_s"), ".2f"),
        ("server idle RSS (MB)", rc["idle_rss_mb"], mlflow_at("idle_rss_mb"), ",.0f"),
        ("server peak RSS (MB)", rc["peak_rss_mb"], mlflow_at("peak_rss_mb"), ",.0f"),
    ]
    print(
        f"\nIngest: {work.keys} keys x {work.steps:,} steps = {work.points:,} points per client; "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'':28s} {'Runcast':>12s} {'MLflow':>12s} {'Runcast wins':>15s}")
    for label, ours, theirs, spec in rows:
        # Higher is better for throughput, lower for the rest; a cold start is not a contest.
        better = ratio(ours, theirs) if "points" in label else ratio(theirs, ours)
        if "cold" in label:
            better = None
        ours_s, theirs_s, better_s = fmt(ours, spec), fmt(theirs, spec), fmt(better, ".1f")
        print(f"{label:28s} {ours_s:>12s} {theirs_s:>12s} {better_s:>14s}x")
    cheaper = fmt(ratio(metric_ms and metric_ms * 1000, call["median_us"]), ",.0f")
    print(
        f"{'cost of one log call':28s} {call['median_us']:>10.2f}us "
        f"{fmt(metric_ms, '.2f'):>10s}ms {cheaper:>14s}x"
    )
    print(
        f"  Runcast log(): p99 {call['p99_us']:.2f} us, timer overhead "
        f"{call['timer_overhead_us']:.3f} us included; {work.log_calls:,} calls of "
        '{"loss", "lr"} against the live server'
    )
    if ml:
        print(
            f"  MLflow log_metric: median of {LOG_METRIC_CALLS} synchronous calls, "
            f"p90 {ml['log_metric']['p90_ms']:.2f} ms; ingest via log_batch of {MLFLOW_BATCH:,}"
        )
    print(
        f"  Runcast client: {rc['batches']} batches, {rc['retries']} retries, "
        f"{rc['spooled']} spooled; stored counts verified: {rc['verified']}"
        + (f"; MLflow verified: {ml['verified']}" if ml else "")
    )
    for name, side in (("Runcast", rc), ("MLflow", ml)):
        if side and side["wrong"]:
            print(f"  {name} stored counts differ: {side['wrong']}")

    def rounded(value: float | None, digits: int) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "runcast_points_per_s": rounded(rc["single"]["points_per_s"], 0),
        "mlflow_points_per_s": rounded(mls, 0),
        "ratio": rounded(ratio(rc["single"]["points_per_s"], mls), 2),
        "log_call_us_median": rounded(call["median_us"], 3),
        "server_peak_rss_mb": rounded(rc["peak_rss_mb"], 1),
        "mlflow_log_metric_ms_median": rounded(metric_ms, 3),
        "mlflow_peak_rss_mb": rounded(mlflow_at("peak_rss_mb"), 1),
        "runcast_points_per_s_8_clients": rounded(rc["multi"]["points_per_s"], 0),
        "mlflow_points_per_s_8_clients": rounded(mlm, 0),
        "ratio_8_clients": rounded(ratio(rc["multi"]["points_per_s"], mlm), 2),
        "log_call_ratio": rounded(ratio(metric_ms and metric_ms * 1000, call["median_us"]), 0),
        "runcast_cold_run_s": rounded(rc["warmup_s"], 2),
        "mlflow_cold_run_s": rounded(mlflow_at("warmup_s"), 2),
        "points": work.points,
        "clients": work.clients,
        "keys": work.keys,
        "steps": work.steps,
        "verified": rc["verified"] and (ml is None or ml["verified"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 keys x 5,000 steps, 2 clients")
    parser.add_argument("--skip-mlflow", action="store_true", help="Runcast only (no PyPI)")
    parser.add_argument("--keys", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--clients", type=int)
    args = parser.parse_args(argv)

    default = Workload(4, 5_000, 2, 20_000) if args.quick else Workload(4, 50_000, 8)
    work = Workload(
        args.keys or default.keys,
        args.steps or default.steps,
        args.clients or default.clients,
        default.log_calls,
    )
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    cleanup = Cleanup()
    with sigterm_as_interrupt():
        try:
            rc = bench_runcast(cleanup, work)
            ml = None if args.skip_mlflow else bench_mlflow(cleanup, work)
            summary = report(work, rc, ml)
        except BenchError as exc:
            log(f"bench failed: {exc}")
            return 1
        except KeyboardInterrupt:
            log("interrupted; cleaning up")
            return 130
        finally:
            cleanup.run()
    print(json.dumps(summary))
    return 0 if summary["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
