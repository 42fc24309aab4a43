"""Per-rank step timings at scale: can one server on this machine take 1,024 ranks x 1 step/s?

A fresh PostgreSQL database, gunicorn (2 workers x 4 threads: this machine has 2 cores), and a
load generator that plays 1,024 ranks. Each rank batches `--interval` seconds of steps (20 by
default, as the client does) and POSTs the exact bytes the client's TimingBatcher builds
through the client's own HTTP seam (runcast.transport.post_json) to /api/v1/runs/{id}/timings;
the ranks' sends are staggered over the interval, as independent processes' would be. Measured
over `--seconds` of sustained load:

* whether the server kept up (rank-steps acknowledged per second against the 1,024 offered,
  how far behind the send schedule fell, request latency P50/P99),
* CPU per rank-step: the gunicorn process tree and PostgreSQL's processes (the whole cluster's,
  so other work on the machine counts against us), from /proc,
* the reads on that data: every rank over the detector's window (2,000 steps), one rank over
  the run, and one forecast's straggler detection on 1,024 ranks.

The baseline in the same process is the same load at 64 ranks (a small job): CPU per rank-step
should not grow with the world size. The last line printed is one JSON object.

    .venv/bin/python bench/ranks_ingest.py                 # 1,024 ranks, 60 s
    .venv/bin/python bench/ranks_ingest.py --seconds 30 --ranks 256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from bench import throwaway_secret_key

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "client"))
sys.path.insert(0, str(ROOT))

from runcast.timing import TimingBatcher  # noqa: E402

from bench.harness import (  # noqa: E402
    PG_URL,
    VENV_PY,
    WORK,
    BenchError,
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

DB = "runcast_ranks_bench"
REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")
RUN_ID = "ranks-bench"
HOSTS_PER_NODE = 8

SETUP = """
from tracker.models import Project
from tracker import services
project = Project.objects.create(slug="bench", name="Bench")
token = services.token_create(project=project, name="bench", scope="write")
services.run_start(project=project, public_id="ranks-bench", session="rank0",
    started_at=services.from_epoch(1.7e9), fields={"world_size": WORLD, "total_steps": 10**6})
print(token)
"""

# The history the reads run on: 2,000 steps of every rank (rank 17 20% slower from step 1,500),
# stored as the client would have sent it (20-step batches), inserted directly.
PREFILL = """
import numpy as np
from tracker.models import RankTimingChunk, Run
from tracker.series import pack_steps, pack_timings
run = Run.objects.get(public_id="ranks-bench")
rng = np.random.default_rng(0)
rows = []
for first in range(0, 2000, 20):
    steps = np.arange(first, first + 20)
    for rank in range(WORLD):
        c = 0.8 * (1 + rng.normal(0, 0.01, 20)) * (1.2 if rank == 17 and first >= 1500 else 1.0)
        rows.append(RankTimingChunk(run=run, session=f"pre-{rank}", seq=first // 20 + 1,
            rank=rank, local_rank=rank % 8, host=f"node-{rank // 8}", n=20, min_step=first,
            max_step=first + 19, steps=pack_steps(steps), compute=pack_timings(c),
            wait=pack_timings(1 - c), total=pack_timings(np.full(20, np.nan))))
    if len(rows) >= 5000:
        RankTimingChunk.objects.bulk_create(rows)
        rows = []
RankTimingChunk.objects.bulk_create(rows)
print(RankTimingChunk.objects.count())
"""

READS = """
import json, time
import numpy as np
from django.db.models import Sum
from django.utils import timezone
from tracker import rank_timings
from tracker.models import RankTimingChunk, Run
from forecasting.estimators.straggler_detect import detect_stragglers
run = Run.objects.get(public_id="ranks-bench")
out = {"rows": RankTimingChunk.objects.filter(run=run).count(),
       "rank_steps": RankTimingChunk.objects.filter(run=run).aggregate(n=Sum("n"))["n"]}
def timed(fn, repeat=3):
    # CPU time of this process (the unpacking and numpy work; the database's share is not in
    # it): wall time on a shared machine measures the neighbours as much as the code.
    best = None
    for _ in range(repeat):
        t = time.process_time(); value = fn(); dt = time.process_time() - t
        best = dt if best is None else min(best, dt)
    return best, value
wall = time.perf_counter()
out["window_s"], w = timed(lambda: rank_timings.rank_timings_window(run=run, last_steps=2000))
out["window_shape"] = list(w.compute.shape)
out["one_rank_s"], r = timed(lambda: rank_timings.rank_history(run=run, rank=17))
out["one_rank_steps"] = int(r[0].size)
out["detect_s"], _ = timed(lambda: detect_stragglers(w.steps, w.signal(), hosts=w.hosts,
    wait_s=w.wait), repeat=1)
out["heatmap_s"], _ = timed(lambda: rank_timings.heatmap(w, buckets=200), repeat=1)
out["reads_wall_s"] = time.perf_counter() - wall
print(json.dumps(out))
"""


def django_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"{PG_URL}/{DB}",
        DJANGO_SETTINGS_MODULE="config.settings.base",
        SECRET_KEY=throwaway_secret_key(),
        CELERY_BROKER_URL=REDIS,
        CACHE_URL=REDIS,
        LOG_LEVEL="WARNING",
    )
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(VENV_PY), "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise BenchError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving the bench database (gunicorn keeps its
    connections, CONN_MAX_AGE): other databases' work on this shared machine is not counted."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if DB.encode() not in fh.read():
                    continue
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out[int(pid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def postgres_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def body_for(tag: str, rank: int, seq: int, first_step: int, steps: int, slow: bool) -> bytes:
    """What a rank's client posts: TimingBatcher's bytes for `steps` steps."""
    batcher = TimingBatcher(
        f"{tag}-rank-{rank}",
        rank=rank,
        local_rank=rank % HOSTS_PER_NODE,
        host=f"node-{rank // HOSTS_PER_NODE}",
        max_steps=10_000,
    )
    batcher.seq = seq - 1
    for step in range(first_step, first_step + steps):
        compute = 0.80 * (1.25 if slow else 1.0) + 0.004 * ((step * 7 + rank * 13) % 5)
        batcher.add(step, time.time(), (compute, 1.0 - compute if not slow else 0.01, None))
    batcher.seal()
    return batcher.take_sealed()[0].body


def load(
    url: str, token: str, *, ranks: int, seconds: float, interval: float, tag: str
) -> dict[str, Any]:
    """Offer `ranks` x 1 step/s for `seconds`, each rank posting every `interval` seconds."""
    target = f"{url}/api/v1/runs/{RUN_ID}/timings"
    schedule = []
    for rank in range(ranks):
        offset = interval * rank / ranks  # staggered like independent processes
        k = 0
        while offset + k * interval < seconds:
            schedule.append((offset + k * interval, rank, k))
            k += 1
    steps_per = int(interval)
    slow_rank = min(17, ranks - 1)
    posted = post_on_schedule(
        [
            (
                at,
                target,
                body_for(tag, rank, k + 1, 2_000 + k * steps_per, steps_per, rank == slow_rank),
            )
            for at, rank, k in schedule
        ],
        token,
        workers=48,
    )
    ok = [answer for status, answer in posted.answers if status == 200]
    rank_steps = sum(int(answer.get("accepted", 0)) for answer in ok)
    return {
        "requests": len(schedule),
        "errors": len(posted.answers) - len(ok),
        "rank_steps": rank_steps,
        "offered_per_s": ranks,
        "acked_per_s": rank_steps / max(posted.wall_s, 1e-9),
        **posted.summary(),
    }


def phase(url: str, token: str, server: TreeRss, **kw: Any) -> dict[str, Any]:
    cpu0, pg0 = server.cpu_seconds(), postgres_cpu()
    out = load(url, token, **kw)
    cpu1, pg1 = server.cpu_seconds(), postgres_cpu()
    steps = max(1, out["rank_steps"])
    pg = postgres_delta(pg0, pg1)
    out["server_cpu_s"] = cpu1 - cpu0
    out["postgres_cpu_s"] = pg
    out["server_cpu_us_per_rank_step"] = 1e6 * (cpu1 - cpu0) / steps
    out["total_cpu_us_per_rank_step"] = 1e6 * ((cpu1 - cpu0) + pg) / steps
    # Cores one server needs for 1,024 rank-steps a second, from CPU time (not wall time,
    # which on a shared machine measures the neighbours too).
    out["cores_for_1024_per_s"] = 1024 * ((cpu1 - cpu0) + pg) / steps
    out["server_cores_busy"] = (cpu1 - cpu0) / max(out["wall_s"], 1e-9)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=20.0, help="seconds a rank batches")
    args = parser.parse_args(argv)
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    cleanup = Cleanup()
    try:
        env = django_env()
        cleanup.databases.append(DB)
        recreate_db(DB)
        log("migrating a fresh database")
        manage(env, "migrate", "--noinput")
        token = manage(env, "shell", "-c", SETUP.replace("WORLD", str(args.ranks)))
        port = free_port()
        logfile = WORK / "logs" / "ranks-gunicorn.log"
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
        log(f"prefill: 2,000 steps of {args.ranks} ranks, inserted directly")
        manage(env, "shell", "-c", PREFILL.replace("WORLD", str(args.ranks)))
        log("warm-up: 64 ranks, 10 s")
        load(url, token, ranks=64, seconds=10, interval=5, tag="warm")
        log(f"baseline: 64 ranks x 1 step/s for {args.seconds:.0f} s")
        small = phase(
            url, token, tree, ranks=64, seconds=args.seconds, interval=args.interval, tag="small"
        )
        log(f"load: {args.ranks} ranks x 1 step/s for {args.seconds:.0f} s")
        big = phase(
            url,
            token,
            tree,
            ranks=args.ranks,
            seconds=args.seconds,
            interval=args.interval,
            tag="big",
        )
        log("reads on what was stored")
        reads = json.loads(manage(env, "shell", "-c", READS))
        stop_group(server)
    finally:
        cleanup.run()
    # Kept up: nothing refused, and the CPU the load needs fits in this machine's cores with
    # room to spare (the wall-clock lag is printed too, but neighbours on a shared machine set it).
    kept_up = big["errors"] == 0 and big["cores_for_1024_per_s"] * args.ranks / 1024 < (
        0.75 * (os.cpu_count() or 1)
    )
    print(f"{'':28} {'64 ranks':>12} {args.ranks:>8} ranks")
    for key in (
        "acked_per_s",
        "latency_p50_ms",
        "latency_p99_ms",
        "max_behind_s",
        "server_cores_busy",
        "server_cpu_us_per_rank_step",
        "total_cpu_us_per_rank_step",
        "cores_for_1024_per_s",
    ):
        print(f"{key:28} {small[key]:12.1f} {big[key]:14.1f}")
    print(
        f"reads ({reads['rows']:,} rows, {reads['rank_steps']:,} rank-steps): all ranks x 2,000"
        f" steps {1000 * reads['window_s']:.0f} ms CPU {reads['window_shape']}, one rank over"
        f" the run"
        f" {1000 * reads['one_rank_s']:.1f} ms ({reads['one_rank_steps']} steps), detection"
        f" {1000 * reads['detect_s']:.0f} ms, heat map {1000 * reads['heatmap_s']:.0f} ms"
    )
    result = {
        "ranks": args.ranks,
        "seconds": args.seconds,
        "interval_s": args.interval,
        "kept_up": kept_up,
        "baseline_64": small,
        "load": big,
        "cpu_ratio_vs_64_ranks": big["total_cpu_us_per_rank_step"]
        / max(small["total_cpu_us_per_rank_step"], 1e-9),
        "reads": reads,
    }
    print(json.dumps(result))
    return 0 if kept_up else 1


if __name__ == "__main__":
    sys.exit(main())
