"""Many runs at the client's default cadence: what one batch a second per active run costs the
server, and so how many cores 10,000 active runs' ingest needs.

A fresh PostgreSQL database, gunicorn (2 workers x 4 threads: this machine has 2 cores) and a
load generator playing `--runs` runs. Each run POSTs, once a second and staggered over the
second like independent trainers, the exact bytes the client's Batcher builds for one step of
4 keys (loss, lr, grad_norm, tokens_per_s) with a heartbeat, through the client's own HTTP seam
(runcast.transport.post_json) to /api/v1/runs/{id}/batches. Every batch enqueues the run's
debounced forecast to Redis, as on a server; no worker consumes them here (forecasting is
`bench.capacity`). Measured over `--seconds` of sustained load, from /proc: CPU of the gunicorn
process tree and of the PostgreSQL backends serving the bench database, per batch; the last
line printed is one JSON object.

    .venv/bin/python -m bench.fleet_ingest                     # 200 runs, 40 s
    .venv/bin/python -m bench.fleet_ingest --runs 100 --seconds 30
    .venv/bin/python -m bench.fleet_ingest --runs 1000 --seconds 40 --interval 10
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "client"))
sys.path.insert(0, str(ROOT))

from runcast.batcher import Batcher  # noqa: E402

from bench import ranks_ingest  # noqa: E402
from bench.harness import (  # noqa: E402
    WORK,
    Cleanup,
    TreeRss,
    free_port,
    log,
    post_on_schedule,
    recreate_db,
    start_group,
    stop_group,
    wait_http,
)

DB = "runcast_fleet_bench_replica"
REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
KEYS = ("loss", "lr", "grad_norm", "tokens_per_s")
ACTIVE_RUNS = 10_000

SETUP = """
from tracker.models import Project
from tracker import services
project = Project.objects.create(slug="fleet", name="Fleet")
token = services.token_create(project=project, name="bench", scope="write")
for i in range(RUNS):
    services.run_start(project=project, public_id=f"fleet-{i}", session=f"s{i}",
        started_at=services.from_epoch(1.7e9), fields={"total_steps": 10**6})
print(token)
"""


def django_env() -> dict[str, str]:
    env = ranks_ingest.django_env()
    env.update(DATABASE_URL=env["DATABASE_URL"].rsplit("/", 1)[0] + f"/{DB}")
    env.update(CELERY_BROKER_URL=REDIS, CACHE_URL=REDIS)
    # gunicorn keeps its connections for the whole measurement: a backend that closed during it
    # would take its CPU time out of the count read from /proc.
    env.update(CONN_MAX_AGE="3600")
    return env


def body_for(run: int, seq: int, interval: int) -> bytes:
    """`interval` seconds of a run logging a step of 4 keys a second, and a heartbeat: what the
    client sends with RUNCAST_FLUSH_INTERVAL=`interval` (1 by default)."""
    batcher = Batcher(f"s{run}", batch_points=10_000, max_body_bytes=8 * 1024**2)
    batcher.seq = seq - 1
    now = time.time()
    for step in range((seq - 1) * interval, seq * interval):
        batcher.add(step, now, {k: 1.0 / (step + i + 1) for i, k in enumerate(KEYS)})
    batcher.seal(heartbeat=now)
    return batcher.take_sealed()[0].body


def load(
    url: str, token: str, *, runs: int, seconds: float, first_seq: int, interval: int
) -> dict[str, Any]:
    """Each run posts every `interval` s (staggered over it) for `seconds`."""
    sends = max(1, int(seconds / interval))
    schedule = sorted(
        (interval * (run / runs + k), run, first_seq + k)
        for run in range(runs)
        for k in range(sends)
    )
    posted = post_on_schedule(
        [
            (at, f"{url}/api/v1/runs/fleet-{run}/batches", body_for(run, seq, interval))
            for at, run, seq in schedule
        ],
        token,
        workers=64,
    )
    errors = sum(1 for status, _ in posted.answers if status != 200)
    return {
        "batches": len(schedule),
        "errors": errors,
        "offered_per_s": runs / interval,
        "acked_per_s": (len(schedule) - errors) / max(posted.wall_s, 1e-9),
        **posted.summary(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--interval", type=int, default=1, help="the client's flush interval, s")
    args = parser.parse_args(argv)
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    cleanup = Cleanup()
    try:
        env = django_env()
        ranks_ingest.DB = DB  # its postgres_cpu() counts the backends of this database
        cleanup.databases.append(DB)
        recreate_db(DB)
        log("migrating a fresh database")
        ranks_ingest.manage(env, "migrate", "--noinput")
        token = ranks_ingest.manage(env, "shell", "-c", SETUP.replace("RUNS", str(args.runs)))
        port = free_port()
        logfile = WORK / "logs" / "fleet-gunicorn.log"
        gunicorn = [str(ROOT / ".venv" / "bin" / "gunicorn"), "config.wsgi"]
        server = start_group(
            [*gunicorn, "--workers", "2", "--threads", "4", "--bind", f"127.0.0.1:{port}"],
            env,
            logfile,
        )
        cleanup.groups.append(server)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", server, logfile, timeout=60)
        tree = TreeRss(server.pid)
        tree.wait_idle(timeout=60)
        log("warm-up: 5 s")
        warm = max(1, int(5 / args.interval))
        load(
            url,
            token,
            runs=args.runs,
            seconds=warm * args.interval,
            first_seq=1,
            interval=args.interval,
        )
        log(f"load: {args.runs} runs, a batch every {args.interval} s, for {args.seconds:.0f} s")
        cpu0, pg0 = tree.cpu_seconds(), ranks_ingest.postgres_cpu()
        out = load(
            url,
            token,
            runs=args.runs,
            seconds=args.seconds,
            first_seq=warm + 1,
            interval=args.interval,
        )
        cpu1, pg1 = tree.cpu_seconds(), ranks_ingest.postgres_cpu()
        stop_group(server)
    finally:
        cleanup.run()
    done = max(1, out["batches"] - out["errors"])
    server_s, pg_s = cpu1 - cpu0, ranks_ingest.postgres_delta(pg0, pg1)
    out.update(
        runs=args.runs,
        seconds=args.seconds,
        interval_s=args.interval,
        server_cpu_ms_per_batch=1000 * server_s / done,
        postgres_cpu_ms_per_batch=1000 * pg_s / done,
        # A batch every `interval` s per run: cores = CPU seconds per batch x batches a second.
        web_cores_for_10k_runs=ACTIVE_RUNS / args.interval * server_s / done,
        postgres_cores_for_10k_runs=ACTIVE_RUNS / args.interval * pg_s / done,
        load_average=os.getloadavg()[0],
    )
    print(json.dumps(out))
    return 0 if out["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
