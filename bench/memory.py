"""Server memory: the web tree (gunicorn) and the Celery worker tree, idle and under ingest.

For each configuration: a fresh PostgreSQL database, migrated; gunicorn and a Celery worker
started with the commands docker-compose.yml runs (or, for the baseline, the ones it ran before),
each in its own process group; then, measured on both process trees (each master and every
process it forked):

* boot: once both have gone idle after starting;
* idle: idle again after a warm-up round of small concurrent runs (every web worker has served
  requests, the Celery worker has forecast them);
* peak: sampled every 100 ms while `--clients` real `runcast` clients (bench/trainers.py's trainer
  processes) each log `--keys` x `--steps` points, then while the worker forecasts those runs
  (the trainers end their runs, which stops forecasting: the bench reopens them and enqueues
  one forecast each, as the debounced task does every 15 s while a run is live).

RSS counts a page shared by forked processes once per process; PSS divides it among them, so
the PSS sum is what the machine really spends. Throughput is all points over the time from the
first client's first log() to the last client's finish().

    .venv/bin/python bench/memory.py                       # baseline (main) vs this tree
    .venv/bin/python bench/memory.py --baseline 5248e36 --configs before,after-old-flags,after

The baseline is the tree of a git commit (`git archive` into var/bench/, run with this .venv).
Needs PostgreSQL and Redis as bench/harness.py does (BENCH_PG_URL, BENCH_REDIS_URL); the
database is BENCH_DB (default runcast_membench), the Redis db BENCH_REDIS_DB (default 13,
used for the broker and the cache, flushed before and after). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness, throwaway_secret_key

ROOT = harness.ROOT
WORK = harness.WORK
VENV_BIN = ROOT / ".venv" / "bin"
DB = os.environ.get("BENCH_DB", "runcast_membench")
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "13"))

QUEUES = "default,forecasting,alerts"
# docker-compose.yml before this change, and now (see docs/deployment.md for the reasons).
OLD_WEB = "gunicorn config.wsgi --workers 4 --threads 4"
OLD_WORKER = f"celery -A config worker -Q {QUEUES} --concurrency 4 --loglevel WARNING"
NEW_WEB = (
    "gunicorn config.wsgi --workers 2 --threads 8 --preload"
    " --max-requests 5000 --max-requests-jitter 500"
)
NEW_WORKER = (
    f"celery -A config worker -Q {QUEUES} --concurrency 2 --max-memory-per-child 400000"
    " --loglevel WARNING"
)


@dataclass(frozen=True)
class Config:
    name: str
    tree: str  # "baseline" or "current"
    web: str
    worker: str


CONFIGS = {
    "before": Config("before", "baseline", OLD_WEB, OLD_WORKER),
    "after-old-flags": Config("after-old-flags", "current", OLD_WEB, OLD_WORKER),
    "after": Config("after", "current", NEW_WEB, NEW_WORKER),
}


class Tree(harness.TreeRss):
    """A process tree's summed RSS (sampled by the thread, peak kept) and PSS."""

    def __init__(self, root: int) -> None:
        super().__init__(root)
        self.peak: int = 0
        self.peak_pss = 0

    def pss(self) -> int:
        total = 0
        for pid in self.tree():
            with suppress(OSError, ValueError), open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        return total

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, self.sample())
            self.peak_pss = max(self.peak_pss, self.pss())
            self.samples += 1
            self._stop_event.wait(self.interval)

    def heavy(self) -> int:
        """How many processes of the tree have scipy or pandas loaded (their
        compiled extensions show in the memory map)."""
        count = 0
        for pid in self.tree():
            with suppress(OSError), open(f"/proc/{pid}/maps") as fh:
                maps = fh.read()
            if any(f"/{name}/" in maps for name in ("scipy", "pandas")):
                count += 1
        return count

    def snapshot(self) -> dict[str, float]:
        return {
            "rss_mb": self.sample() / 2**20,
            "pss_mb": self.pss() / 2**20,
            "processes": len(self.tree()),
            "with_stack": self.heavy(),
        }


def baseline_tree(commit: str) -> Path:
    """The project at `commit`, unpacked under var/bench (never a checkout of this repo)."""
    target = WORK / f"baseline-{commit}"
    if (target / "manage.py").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def env_for(tree: Path) -> dict[str, str]:
    redis = f"{harness.REDIS_URL}/{REDIS_DB}"
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"{harness.PG_URL}/{DB}",
        DJANGO_SETTINGS_MODULE="config.settings.base",
        SECRET_KEY=throwaway_secret_key(),
        CELERY_BROKER_URL=redis,
        CACHE_URL=redis,
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
        PATH=f"{VENV_BIN}:{env.get('PATH', '')}",
        # The tree under test first: .venv's editable install points at this checkout.
        PYTHONPATH=str(tree),
    )
    return env


def flush_redis() -> None:
    import redis

    client = redis.Redis.from_url(f"{harness.REDIS_URL}/{REDIS_DB}")
    try:
        client.flushdb()
    finally:
        client.close()


def manage(tree: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(VENV_BIN / "python"), "manage.py", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise harness.BenchError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def start(cmd: str, tree: Path, env: dict[str, str], logfile: Path) -> subprocess.Popen:
    argv = shlex.split(cmd)
    argv[0] = str(VENV_BIN / argv[0])
    with open(logfile, "wb") as out:
        return subprocess.Popen(
            argv, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_idle(trees: list[Tree], timeout: float = 120.0) -> None:
    for tree in trees:
        tree.wait_idle(timeout)
    time.sleep(1.0)


# The trainers finish their runs, and an ended run is not forecast: reopen them and enqueue one
# forecast each, as the debounced task does every 15 s while a run is live.
REOPEN_CODE = """
from forecasting.tasks import forecast_enqueue
from tracker.models import Run
runs = Run.objects.filter(public_id__startswith="PREFIX-")
ids = list(runs.values_list("pk", flat=True))
runs.update(status="running", ended_at=None)
for pk in ids:
    forecast_enqueue(run_id=pk, immediate=True)
print(len(ids))
"""
ETA_CODE = """
from forecasting.models import Forecast
print(Forecast.objects.filter(kind="eta", run__public_id__startswith="PREFIX-")
      .values("run").distinct().count())
"""


def forecast_all(env: dict[str, str], tree: Path, prefix: str, timeout: float = 300.0) -> float:
    """Reopen the runs named prefix-*, forecast each once; seconds until every one has an ETA."""
    began = time.time()
    code = REOPEN_CODE.replace("PREFIX", prefix)
    count = int(manage(tree, env, "shell", "-c", code).strip().splitlines()[-1])
    check = ETA_CODE.replace("PREFIX", prefix)
    while time.time() - began < timeout:
        if int(manage(tree, env, "shell", "-c", check).strip().splitlines()[-1]) >= count:
            return time.time() - began
        time.sleep(1.0)
    raise harness.BenchError(f"forecasts of {prefix}-* not done after {timeout:.0f}s")


def measure(config: Config, trees: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    tree = trees[config.tree]
    env = env_for(tree)
    cleanup = harness.Cleanup()
    try:
        harness.recreate_db(DB)
        cleanup.databases.append(DB)
        flush_redis()
        harness.log(f"{config.name}: migrating {DB}")
        manage(tree, env, "migrate", "--noinput")
        token = manage(tree, env, "shell", "-c", harness.SETUP_CODE).strip().splitlines()[-1]
        port = harness.free_port()
        logs = WORK / "logs"
        web = start(f"{config.web} --bind 127.0.0.1:{port}", tree, env, logs / "memory-web.log")
        cleanup.groups.append(web)
        worker = start(config.worker, tree, env, logs / "memory-worker.log")
        cleanup.groups.append(worker)
        url = f"http://127.0.0.1:{port}"
        harness.wait_http(f"{url}/healthz", web, logs / "memory-web.log", timeout=120)
        web_t, worker_t = Tree(web.pid), Tree(worker.pid)
        wait_idle([web_t, worker_t])
        boot = {"web": web_t.snapshot(), "worker": worker_t.snapshot()}

        base = {"url": url, "token": token, "project": "bench", "spool": str(WORK / "spool")}
        cleanup.paths.append(WORK / "spool")
        client_env = dict(os.environ, PYTHONUNBUFFERED="1")

        def specs(prefix: str, count: int, steps: int) -> list[dict[str, Any]]:
            return [
                {**base, "run_id": f"{prefix}-{i}", "keys": args.keys, "steps": steps}
                for i in range(count)
            ]

        harness.log(f"{config.name}: warm-up (8 small runs), then their forecasts")
        py = VENV_BIN / "python"
        harness.run_workers(cleanup, py, "runcast", specs("warm", 8, 2_000), client_env)
        forecast_all(env, tree, "warm")
        wait_idle([web_t, worker_t])
        idle = {"web": web_t.snapshot(), "worker": worker_t.snapshot()}

        web_t.start()
        worker_t.start()
        harness.log(f"{config.name}: {args.clients} clients x {args.keys * args.steps:,} points")
        results = harness.run_workers(
            cleanup, py, "runcast", specs("load", args.clients, args.steps), client_env
        )
        harness.log(f"{config.name}: forecasting the {args.clients} load runs")
        forecast_s = forecast_all(env, tree, "load")
        web_t.stop()
        worker_t.stop()
        points = args.keys * args.steps
        speed = harness.throughput(results, points)
        return {
            "config": config.name,
            "web_cmd": config.web,
            "worker_cmd": config.worker,
            "boot": boot,
            "idle": idle,
            "peak": {
                "web": {"rss_mb": web_t.peak / 2**20, "pss_mb": web_t.peak_pss / 2**20},
                "worker": {"rss_mb": worker_t.peak / 2**20, "pss_mb": worker_t.peak_pss / 2**20},
            },
            "points_per_s": speed["points_per_s"],
            "points": speed["points"],
            "forecast_all_s": forecast_s,
        }
    finally:
        cleanup.run()
        with suppress(Exception):
            flush_redis()


def total(side: dict[str, dict[str, float]], metric: str) -> float:
    return side["web"][metric] + side["worker"][metric]


def report(rows: list[dict[str, Any]]) -> None:
    print(f"\nMemory (MB, summed over each process tree); {os.cpu_count()} CPUs")
    head = (
        f"{'config':16s} {'phase':6s} {'web RSS':>8s} {'web PSS':>8s} {'wkr RSS':>8s} "
        f"{'wkr PSS':>8s} {'sum RSS':>8s} {'sum PSS':>8s}"
    )
    print(head)
    for row in rows:
        for phase in ("boot", "idle", "peak"):
            side = row[phase]
            print(
                f"{row['config']:16s} {phase:6s} {side['web']['rss_mb']:8.0f} "
                f"{side['web']['pss_mb']:8.0f} {side['worker']['rss_mb']:8.0f} "
                f"{side['worker']['pss_mb']:8.0f} {total(side, 'rss_mb'):8.0f} "
                f"{total(side, 'pss_mb'):8.0f}"
            )
    first = rows[0]
    print(f"\n{'config':16s} {'points/s':>10s} {'vs first':>9s} {'idle PSS vs first':>18s}")
    for row in rows:
        speed = row["points_per_s"] / first["points_per_s"]
        mem = total(row["idle"], "pss_mb") / total(first["idle"], "pss_mb")
        print(f"{row['config']:16s} {row['points_per_s']:10,.0f} {speed:8.2f}x {mem:17.2f}x")
    for row in rows:
        idle = row["idle"]
        print(
            f"  {row['config']}: web `{row['web_cmd']}`; worker `{row['worker_cmd']}`; processes"
            f" with scipy/pandas loaded at idle: web {idle['web']['with_stack']}/"
            f"{idle['web']['processes']}, worker {idle['worker']['with_stack']}/"
            f"{idle['worker']['processes']}; forecasting the load runs took"
            f" {row['forecast_all_s']:.1f} s"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git commit of the 'before' tree")
    parser.add_argument("--configs", default="before,after", help=",".join(CONFIGS))
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args(argv)
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    trees = {"current": ROOT}
    if any(CONFIGS[n].tree == "baseline" for n in names):
        trees["baseline"] = baseline_tree(args.baseline)
    rows = []
    with harness.sigterm_as_interrupt():
        try:
            for name in names:
                rows.append(measure(CONFIGS[name], trees, args))
        except harness.BenchError as exc:
            harness.log(f"bench failed: {exc}")
            return 1
        except KeyboardInterrupt:
            harness.log("interrupted; cleaned up")
            return 130
        finally:
            if "baseline" in trees:
                shutil.rmtree(trees["baseline"], ignore_errors=True)
    report(rows)
    print(json.dumps({"baseline": args.baseline, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
