"""The trainer processes the benchmarks start: real `runcast` (or `mlflow`) clients logging.

One process per run, started by `bench.harness.run_workers` as
`python -m bench.trainers KIND SPEC` from the repository root. It sets up, says READY on stdout,
waits for GO on stdin (so that every trainer starts together), logs, and prints its RESULT line.
Only the standard library plus either `runcast` or `mlflow` is imported, so the same module also
runs in the MLflow venv that bench/ingest.py creates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KEY_NAMES = ("loss", "lr", "grad_norm", "tokens_per_s")
MLFLOW_BATCH = 1_000  # metrics per log_batch call (MLflow's own limit per request is 1,000)
# Marks the lines of the orchestrator <-> worker protocol on a worker's stdout.
PROTOCOL = "@@bench "


def key_names(count: int) -> list[str]:
    return [KEY_NAMES[k] if k < len(KEY_NAMES) else f"metric_{k}" for k in range(count)]


def values_at(step: int, count: int) -> list[float]:
    # Deterministic and cheap, so neither side pays for a random generator in its timed loop.
    base = 2.0 / (1.0 + step * 1e-3)
    return [base * (k + 1) + (step % 7) * 1e-4 for k in range(count)]


def handshake() -> None:
    """Tell the orchestrator setup is done, then wait for the common start signal."""
    print(f"{PROTOCOL}READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        raise SystemExit("worker: no GO from the orchestrator")


def worker_runcast(spec: dict[str, Any]) -> dict[str, Any]:
    import runcast

    keys = key_names(spec["keys"])
    settings = runcast.Settings(
        url=spec["url"],
        token=spec["token"],
        dir=Path(spec["spool"]),
        # The default 30 s is a trainer-exit policy; here every point must be acknowledged,
        # so a slow drain is measured as slow instead of ending up in the spool.
        finish_timeout=900.0,
    )
    run = runcast.init(
        project=spec["project"],
        name=spec["run_id"],
        id=spec["run_id"],
        total_steps=spec["steps"],
        settings=settings,
    )
    handshake()
    started = time.time()
    for step in range(spec["steps"]):
        run.log(dict(zip(keys, values_at(step, len(keys)), strict=True)), step=step)
    logged = time.time()
    run.finish()
    ended = time.time()
    return {"started": started, "logged": logged, "ended": ended, "stats": run.stats()}


def worker_log_call(spec: dict[str, Any]) -> dict[str, Any]:
    # bench/log_call.py owns the definition of "one log() call"; reuse it against the live server.
    from runcast.settings import Settings

    from bench import log_call

    settings = Settings(
        url=spec["url"], token=spec["token"], dir=Path(spec["spool"]), finish_timeout=900.0
    )
    costs, stats = log_call.measure(settings, spec["calls"])
    return {
        "median_us": statistics.median(costs),
        "p99_us": sorted(costs)[int(len(costs) * 0.99)],
        "timer_overhead_us": log_call.timer_overhead_us(),
        "stats": stats,
    }


def worker_mlflow(spec: dict[str, Any]) -> dict[str, Any]:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=spec["url"])
    run_id = client.create_run("0", run_name=spec["run_id"]).info.run_id
    keys = key_names(spec["keys"])
    handshake()
    started = time.time()
    pending: list[Metric] = []
    for step in range(spec["steps"]):
        stamp = int(time.time() * 1000)
        for key, value in zip(keys, values_at(step, len(keys)), strict=True):
            pending.append(Metric(key, value, stamp, step))
        if len(pending) >= MLFLOW_BATCH:
            client.log_batch(run_id, metrics=pending)
            pending = []
    if pending:
        client.log_batch(run_id, metrics=pending)
    logged = time.time()
    # The counterpart of finish(): the run is closed once this returns.
    client.set_terminated(run_id)
    ended = time.time()
    return {"started": started, "logged": logged, "ended": ended, "run_id": run_id}


def worker_mlflow_log_metric(spec: dict[str, Any]) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=spec["url"])
    run_id = client.create_run("0", run_name="log-metric").info.run_id
    for step in range(10):  # warm up connections and the server's caches
        client.log_metric(run_id, "warmup", 1.0, step=step)
    costs = []
    for step in range(spec["calls"]):
        began = time.perf_counter()
        client.log_metric(run_id, "loss", values_at(step, 1)[0], step=step)
        costs.append((time.perf_counter() - began) * 1000)
    client.set_terminated(run_id)
    return {"median_ms": statistics.median(costs), "p90_ms": sorted(costs)[len(costs) * 9 // 10]}


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "runcast": worker_runcast,
    "log-call": worker_log_call,
    "mlflow": worker_mlflow,
    "mlflow-log-metric": worker_mlflow_log_metric,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(WORKERS))
    parser.add_argument("spec", help="the run's JSON spec, from harness.run_workers")
    args = parser.parse_args(argv)
    result = WORKERS[args.kind](json.loads(args.spec))
    print(f"{PROTOCOL}RESULT {json.dumps(result)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
