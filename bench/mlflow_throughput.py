"""Per point, what logging costs through Runcast's MLflow API against its native API, and
against a real MLflow tracking server on this machine: the same workloads, one run.

Both servers run on PostgreSQL with 2 worker processes (Runcast: gunicorn, 2 workers x 4
threads; MLflow: `mlflow server --workers 2`). The clients run in this process:

  * native (Runcast only): the `runcast` client as a trainer uses it, `run.log({5 keys},
    step=i)` for STEPS steps, timed from the first log() until finish() returns (every point
    acknowledged; the client batches in its background thread);
  * log_batch: the stock `mlflow` client, STEPS steps x KEYS metrics, 1,000 metrics per
    `MlflowClient.log_batch` call (MLflow's own per-request limit), first call to last answer;
  * async log_metric: `mlflow.log_metric` per key and step (STEPS x KEYS calls) with
    `mlflow.config.enable_async_logging(True)` and MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS=1
    (docs/mlflow.md), first call until `end_run()` has flushed the queue;
  * sync log_metric: LOG_METRIC_CALLS synchronous `mlflow.log_metric` calls, one request each;
  * round trip: LOG_METRIC_CALLS GETs of the server's trivial health endpoint (Runcast's
    /healthz runs one `SELECT 1`; MLflow's /health none) over one kept-alive connection, as
    the client's session keeps it: the floor under any one-request-per-point API;
  * client floor: the synchronous `mlflow.log_metric` loop, and 20 log_batch calls of 1,000
    metrics, against a server in this process that answers at once, storing nothing: the
    MLflow client's own cost of a call, and of a point through log_batch;
  * commit (Runcast's database, the same PostgreSQL as MLflow's): LOG_METRIC_CALLS durable
    commits of nothing, the other floor under a request that stores a point before answering.

Per point: wall milliseconds, and the server's CPU milliseconds (its process tree; PostgreSQL
not counted). Every point is then counted where each server stored it (Runcast: the run's
chunks; MLflow: `get_metric_history`), so a fast but lossy server cannot win. The last line is
JSON, with `ratios`: each MLflow-API mode over native on Runcast, and Runcast over MLflow.

    .venv/bin/python -m bench.mlflow_throughput            # 20,000 steps x 5 metrics
    .venv/bin/python -m bench.mlflow_throughput --quick    # 2,000 steps x 5 metrics

BENCH_MLFLOW_DB names its databases (`<name>`, `<name>_src`; both dropped at the end) and
BENCH_MLFLOW_REDIS_DB its Redis index, so that two copies on one machine stay apart.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import throwaway_secret_key
from bench.harness import (
    PG_URL,
    REDIS_URL,
    ROOT,
    VENV_PY,
    TreeRss,
    drop_db,
    free_port,
    log,
    manage,
    recreate_db,
    start_group,
    stop_group,
    wait_http,
)

WORK = ROOT / "var" / "bench-mlflow"
# This benchmark's own databases and Redis index, apart from bench/ingest.py's and the tests'.
RUNCAST_DB = os.environ.get("BENCH_MLFLOW_DB", "runcast_mlflow_bench")
MLFLOW_DB = f"{RUNCAST_DB}_src"
REDIS_DB = int(os.environ.get("BENCH_MLFLOW_REDIS_DB", "2"))
KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "val_loss")
LOG_METRIC_CALLS = 500
MODES = ("log_batch", "async_log_metric", "sync_log_metric")

SETUP_CODE = """
from tracker.models import Project
from tracker import services
project = Project.objects.create(slug="bench", name="Bench")
print(services.token_create(project=project, name="bench", scope="write"))
"""
COUNT_CODE = """
import json
from django.db.models import Sum
from tracker.models import MetricChunk, Run
print(json.dumps({r.public_id: MetricChunk.objects.filter(run=r).aggregate(n=Sum("n"))["n"] or 0
                  for r in Run.objects.all()}))
"""


def value_at(step: int, i: int) -> float:
    return 1.0 / (step + 1) + i


class Meter:
    """Wall and server-CPU time of one phase, per point."""

    def __init__(self, server: TreeRss) -> None:
        self.server = server

    def measure(self, points: int, phase: Callable[[], None]) -> dict[str, Any]:
        cpu, began = self.server.cpu_seconds(), time.perf_counter()
        phase()
        wall = time.perf_counter() - began
        cpu = self.server.cpu_seconds() - cpu
        return {
            "points": points,
            "wall_s": round(wall, 3),
            "ms_per_point": round(1000 * wall / points, 4),
            "server_cpu_ms_per_point": round(1000 * cpu / points, 4),
        }


def round_trip(url: str, path: str, meter: Meter) -> dict[str, Any]:
    """LOG_METRIC_CALLS GETs of a trivial endpoint over one kept-alive connection."""
    import requests

    with requests.Session() as session:
        session.get(url + path, timeout=30).raise_for_status()

        def phase() -> None:
            for _ in range(LOG_METRIC_CALLS):
                session.get(url + path, timeout=30).raise_for_status()

        return meter.measure(LOG_METRIC_CALLS, phase)


_NULL_RUN = {
    "run": {
        "info": {
            "run_id": "0" * 32,
            "run_uuid": "0" * 32,
            "experiment_id": "0",
            "status": "RUNNING",
            "start_time": 1,
            "lifecycle_stage": "active",
            "artifact_uri": "null",
            "run_name": "null",
            "user_id": "bench",
        },
        "data": {},
    }
}


class _NullHandler(BaseHTTPRequestHandler):
    """Answers every MLflow request at once without storing anything: a run for runs/get and
    runs/create, `{}` otherwise."""

    protocol_version = "HTTP/1.1"  # kept alive, as the client's session keeps it
    disable_nagle_algorithm = True  # headers and body in separate writes would wait 40 ms

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        run = "runs/create" in self.path or "runs/get" in self.path
        body = json.dumps(_NULL_RUN if run else {}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


def client_floor(mlflow: Any) -> dict[str, Any]:
    """LOG_METRIC_CALLS synchronous `mlflow.log_metric` calls against a server in this process
    that answers each at once: what the MLflow client itself costs per call (building and
    sending the request, reading the answer), which no server can take away."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NullHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        mlflow.set_tracking_uri(f"http://127.0.0.1:{server.server_address[1]}")
        with mlflow.start_run(run_id=_NULL_RUN["run"]["info"]["run_id"]):
            for step in range(10):
                mlflow.log_metric("warm", 1.0, step=step)
            began = time.perf_counter()
            for step in range(LOG_METRIC_CALLS):
                mlflow.log_metric("loss", value_at(step, 0), step=step)
            wall = time.perf_counter() - began
            # log_batch as the workload calls it (its Metric objects made in the loop too).
            from mlflow.entities import Metric

            client, run_id = mlflow.MlflowClient(), _NULL_RUN["run"]["info"]["run_id"]
            batches = 20
            began = time.perf_counter()
            for b in range(batches):
                metrics = [
                    Metric(key, value_at(step, i), step, step)
                    for step in range(200 * b, 200 * b + 200)
                    for i, key in enumerate(KEYS)
                ]
                client.log_batch(run_id, metrics=metrics)
            batch_wall = time.perf_counter() - began
    finally:
        server.shutdown()
        server.server_close()
    return {
        "points": LOG_METRIC_CALLS,
        "ms_per_point": round(1000 * wall / LOG_METRIC_CALLS, 4),
        "log_batch_ms_per_point": round(batch_wall / batches, 4),  # 1,000 points a batch
    }


def commit_floor(db: str) -> dict[str, Any]:
    """LOG_METRIC_CALLS durable commits of nothing (`SELECT txid_current()` in autocommit
    writes a commit record, which PostgreSQL flushes to disk before answering) on one open
    connection: the floor under any API that stores each request before it answers."""
    import psycopg2

    with psycopg2.connect(f"{PG_URL}/{db}") as conn:
        conn.autocommit = True
        with conn.cursor() as cursor:
            began = time.perf_counter()
            for _ in range(LOG_METRIC_CALLS):
                cursor.execute("SELECT txid_current()")
            wall = time.perf_counter() - began
    conn.close()
    return {"points": LOG_METRIC_CALLS, "ms_per_point": round(1000 * wall / LOG_METRIC_CALLS, 4)}


def mlflow_workload(mlflow: Any, url: str, steps: int, meter: Meter) -> dict[str, Any]:
    """The three MLflow-API modes against `url` (env already carries any token)."""
    from mlflow.entities import Metric

    mlflow.set_tracking_uri(url)
    client = mlflow.MlflowClient()
    mlflow.set_experiment("bench")
    with mlflow.start_run(run_name="warm-up") as warm:  # first requests load server code
        client.log_batch(warm.info.run_id, metrics=[Metric("loss", 1.0, 0, 0)])
        for step in range(10):
            mlflow.log_metric("warm", 1.0, step=step)
    points = steps * len(KEYS)
    t0 = int(time.time() * 1000)
    result: dict[str, Any] = {}
    runs: dict[str, str] = {}

    run = mlflow.start_run(run_name="log-batch")
    runs["log_batch"] = run.info.run_id

    def batches() -> None:
        pending: list[Any] = []
        for step in range(steps):
            for i, key in enumerate(KEYS):
                pending.append(Metric(key, value_at(step, i), t0 + step, step))
            if len(pending) >= 1000:
                client.log_batch(run.info.run_id, metrics=pending[:1000])
                pending = pending[1000:]
        if pending:
            client.log_batch(run.info.run_id, metrics=pending)

    result["log_batch"] = meter.measure(points, batches)
    mlflow.end_run()

    mlflow.config.enable_async_logging(True)
    try:
        run = mlflow.start_run(run_name="async-log-metric")
        runs["async_log_metric"] = run.info.run_id

        calls_s = 0.0

        def queued() -> None:
            nonlocal calls_s
            began = time.perf_counter()
            for step in range(steps):
                for i, key in enumerate(KEYS):
                    mlflow.log_metric(key, value_at(step, i), step=step)
            calls_s = time.perf_counter() - began
            mlflow.end_run()  # waits until the queue is sent

        result["async_log_metric"] = meter.measure(points, queued)
        # The client's own cost of a call (queueing it), before anything waits for a server.
        result["async_log_metric"]["calls_ms_per_point"] = round(1000 * calls_s / points, 4)
    finally:
        mlflow.config.enable_async_logging(False)

    with mlflow.start_run(run_name="sync-log-metric") as single:
        runs["sync_log_metric"] = single.info.run_id

        def one_by_one() -> None:
            for step in range(LOG_METRIC_CALLS):
                mlflow.log_metric("loss", value_at(step, 0), step=step)

        result["sync_log_metric"] = meter.measure(LOG_METRIC_CALLS, one_by_one)
    result["stored_via_api"] = {
        "log_batch": sum(len(client.get_metric_history(runs["log_batch"], k)) for k in KEYS),
        "async_log_metric": sum(
            len(client.get_metric_history(runs["async_log_metric"], k)) for k in KEYS
        ),
        "sync_log_metric": len(client.get_metric_history(runs["sync_log_metric"], "loss")),
    }
    result["run_ids"] = runs
    return result


def native_workload(url: str, token: str, steps: int, meter: Meter) -> dict[str, Any]:
    """The runcast client, default settings, as a trainer calls it."""
    import runcast

    with tempfile.TemporaryDirectory(prefix="bench-mlflow-native-") as spool:
        settings = runcast.Settings(url=url, token=token, dir=Path(spool), finish_timeout=900.0)
        run = runcast.init(project="bench", name="native", id="native", settings=settings)

        calls_s = 0.0

        def logged() -> None:
            nonlocal calls_s
            began = time.perf_counter()
            for step in range(steps):
                run.log({k: value_at(step, i) for i, k in enumerate(KEYS)}, step=step)
            calls_s = time.perf_counter() - began
            run.finish()

        result = meter.measure(steps * len(KEYS), logged)
        result["calls_ms_per_point"] = round(1000 * calls_s / (steps * len(KEYS)), 4)
    result["stats"] = run.stats()
    return result


@contextmanager
def runcast_on(db: str) -> Iterator[tuple[str, str, dict[str, str], TreeRss]]:
    """gunicorn (2 workers x 4 threads) on a fresh database `db`; yields (url, token, env,
    its process tree). The database is dropped on exit."""
    env = dict(
        os.environ,
        DATABASE_URL=f"{PG_URL}/{db}",
        DJANGO_SETTINGS_MODULE="config.settings.base",
        SECRET_KEY=throwaway_secret_key(),
        CELERY_BROKER_URL=f"{REDIS_URL}/{REDIS_DB}",
        CACHE_URL=f"{REDIS_URL}/{REDIS_DB}",
        LOG_LEVEL="WARNING",
    )
    recreate_db(db)
    log("runcast: migrating a fresh database")
    manage(env, "migrate", "--noinput")
    token = manage(env, "shell", "-c", SETUP_CODE).strip().splitlines()[-1]
    port, logfile = free_port(), WORK / "gunicorn.log"
    server = start_group(
        [
            str(VENV_PY.parent / "gunicorn"),
            "config.wsgi",
            "--workers",
            "2",
            "--threads",
            "4",
            "--bind",
            f"127.0.0.1:{port}",
        ],
        env,
        logfile,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", server, logfile, timeout=60)
        tree = TreeRss(server.pid)
        tree.wait_idle(60)
        yield url, token, env, tree
    finally:
        stop_group(server)
        drop_db(db)


def runcast(mlflow: Any, steps: int) -> dict[str, Any]:
    with runcast_on(RUNCAST_DB) as (url, token, env, tree):
        meter = Meter(tree)
        result: dict[str, Any] = {
            "round_trip": round_trip(url, "/healthz", meter),
            "commit": commit_floor(RUNCAST_DB),
        }
        log("runcast: the native client")
        result["native"] = native_workload(url, token, steps, meter)
        os.environ["MLFLOW_TRACKING_TOKEN"] = token
        try:
            log("runcast: the MLflow API")
            result |= mlflow_workload(mlflow, url, steps, meter)
        finally:
            os.environ.pop("MLFLOW_TRACKING_TOKEN", None)
        counts = json.loads(manage(env, "shell", "-c", COUNT_CODE).strip().splitlines()[-1])
        runs = result.pop("run_ids")
        result["stored_in_db"] = {
            "native": counts.get("native"),
            **{mode: counts.get(run_id) for mode, run_id in runs.items()},
        }
        return result


@contextmanager
def mlflow_server_on(db: str) -> Iterator[tuple[str, TreeRss]]:
    """A real `mlflow server` (2 workers) on a fresh PostgreSQL database `db`; yields its URL
    and process tree. The database is dropped on exit."""
    WORK.mkdir(parents=True, exist_ok=True)
    recreate_db(db)
    port, logfile = free_port(), WORK / "mlflow-server.log"
    server = start_group(
        [
            str(VENV_PY.parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"{PG_URL.replace('postgres://', 'postgresql+psycopg2://')}/{db}",
            "--default-artifact-root",
            (WORK / "artifacts").as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "2",
        ],
        dict(os.environ),
        logfile,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", server, logfile, timeout=180)
        tree = TreeRss(server.pid)
        tree.wait_idle(60)
        yield url, tree
    finally:
        stop_group(server)
        drop_db(db)


def mlflow_server(mlflow: Any, steps: int) -> dict[str, Any]:
    with mlflow_server_on(MLFLOW_DB) as (url, tree):
        meter = Meter(tree)
        log("mlflow: the same workloads against `mlflow server`")
        result: dict[str, Any] = {"round_trip": round_trip(url, "/health", meter)}
        result |= mlflow_workload(mlflow, url, steps, meter)
        result.pop("run_ids")
        return result


def ratios(rc: dict[str, Any], ml: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    """Wall ms per point: each MLflow-API mode over native on Runcast (the goal: at most 2);
    Runcast over MLflow; the bounds: what the MLflow client itself costs per call (sync: the
    null server's loop; async: queueing the calls) over native, and sync log_metric on each
    server over the client's floor."""
    native = rc["native"]["ms_per_point"]
    out = {f"runcast_{m}_over_native": rc[m]["ms_per_point"] / native for m in MODES}
    out |= {
        f"{m}_runcast_over_mlflow": rc[m]["ms_per_point"] / ml[m]["ms_per_point"] for m in MODES
    }
    out["bound_sync_client_floor_over_native"] = floor["ms_per_point"] / native
    out["bound_log_batch_client_floor_over_native"] = floor["log_batch_ms_per_point"] / native
    out["bound_async_client_calls_over_native"] = (
        rc["async_log_metric"]["calls_ms_per_point"] / native
    )
    for name, r in (("runcast", rc), ("mlflow", ml)):
        out[f"{name}_sync_log_metric_over_client_floor"] = (
            r["sync_log_metric"]["ms_per_point"] / floor["ms_per_point"]
        )
    return {k: round(v, 2) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 steps instead of 20,000")
    args = parser.parse_args()
    steps = 2_000 if args.quick else 20_000
    WORK.mkdir(parents=True, exist_ok=True)
    for name in [k for k in os.environ if k.startswith("MLFLOW_")]:
        del os.environ[name]
    # The async mode merges the calls queued within a second into log-batch requests
    # (docs/mlflow.md); without it, it sends one request per call.
    os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] = "1"
    import mlflow

    floor = client_floor(mlflow)
    rc = runcast(mlflow, steps)
    ml = mlflow_server(mlflow, steps)
    print(
        f"workload: {steps:,} steps x {len(KEYS)} metrics (native, log_batch, async "
        f"log_metric); {LOG_METRIC_CALLS} synchronous log_metric calls and health GETs; "
        f"mlflow {mlflow.__version__}"
    )
    print(
        f"{'ms per point (server CPU)':28}"
        + "".join(f"{m:>24}" for m in ("round_trip", "commit", "native", *MODES))
    )
    for name, r in (("runcast", rc), ("mlflow server", ml)):
        cells = []
        for mode in ("round_trip", "commit", "native", *MODES):
            m = r.get(mode)
            cpu = (
                f"({m['server_cpu_ms_per_point']:7.3f})"
                if m and "server_cpu_ms_per_point" in m
                else ""
            )
            cells.append(f"{m['ms_per_point']:>12.3f} {cpu:>9}" if m else f"{'-':>24}")
        print(f"{name:28}" + "".join(f"{c:>24}" for c in cells))
    print(
        f"MLflow client floor (sync log_metric, a server that answers at once): "
        f"{floor['ms_per_point']:.3f} ms/call; log_batch {floor['log_batch_ms_per_point']:.4f} "
        "ms/point"
    )
    print("stored: runcast", rc["stored_in_db"], "mlflow", ml["stored_via_api"])
    points = steps * len(KEYS)
    expected = {
        "native": points,
        "log_batch": points,
        "async_log_metric": points,
        "sync_log_metric": LOG_METRIC_CALLS,
    }
    exact = rc["stored_in_db"] == expected and ml["stored_via_api"] == {
        k: v for k, v in expected.items() if k != "native"
    }
    print(
        json.dumps(
            {
                "steps": steps,
                "ratios": ratios(rc, ml, floor),
                "client_floor": floor,
                "runcast": rc,
                "mlflow": ml,
                "exact": exact,
            }
        )
    )
    if not exact:
        raise SystemExit(
            f"stored {rc['stored_in_db']} / {ml['stored_via_api']}, expected {expected}"
        )


if __name__ == "__main__":
    main()
