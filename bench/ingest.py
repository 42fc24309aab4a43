"""Ingest throughput of Runcast vs a real MLflow tracking server, on this machine.

Runcast: a fresh PostgreSQL database, migrations, a project and a write token, gunicorn
(4 workers x 4 threads), and the real `runcast` client in separate trainer processes, timed
from the first log() until finish() returns (every point acknowledged); the stored count is
then checked against `Run.points_count` and the chunks. MLflow: `mlflow server` (4 workers) on
its own PostgreSQL database, fed the same points with `MlflowClient.log_batch` of 1,000 metrics
per call from processes running in a separate venv (var/bench/mlflow-venv, created on first
use), also checked against the database. Both servers' process trees are sampled every 100 ms
for peak RSS. The last line printed is one JSON object.

    .venv/bin/python bench/ingest.py            # 4 keys x 50,000 steps; then 8 clients
    .venv/bin/python bench/ingest.py --quick    # 4 keys x 5,000 steps; then 2 clients
    .venv/bin/python bench/ingest.py --skip-mlflow

Only the orchestrator needs .venv; the `--worker` modes use the standard library plus either
`runcast` or `mlflow`, so this one file also runs as the MLflow venv's trainer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import throwaway_secret_key

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "var" / "bench"
VENV_PY = ROOT / ".venv" / "bin" / "python"
MLFLOW_VENV = WORK / "mlflow-venv"
MLFLOW_PY = MLFLOW_VENV / "bin" / "python"

PG_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432")
# Databases 14/15, not 0/1: the forecast tasks the server enqueues are never consumed here, and
# a developer's Celery worker on db 0 must not pick them up later. Both are flushed at the end.
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")
BROKER_DB, CACHE_DB = 14, 15
RUNCAST_DB, MLFLOW_DB = "runcast_bench", "mlflow_bench"

KEY_NAMES = ("loss", "lr", "grad_norm", "tokens_per_s")
MLFLOW_BATCH = 1_000  # metrics per log_batch call (MLflow's own limit per request is 1,000)
LOG_METRIC_CALLS = 200
# Every server worker must have served a request before anything is timed: Runcast's workers
# import the forecasting stack (scipy, pandas) on their first batch, MLflow's are still booting
# when /health first answers. The slowest warm-up run is reported as the cold-start cost. Both
# servers run 4 workers; max(4, clients) concurrent runs reach them all in practice.
WARMUP_STEPS = 100
# Marks the lines of the orchestrator <-> worker protocol on a worker's stdout.
PROTOCOL = "@@bench "


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


# ---------------------------------------------------------------------------------------------
# Worker side: runs in a trainer process (.venv for Runcast, the MLflow venv for MLflow).
# ---------------------------------------------------------------------------------------------


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
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import log_call
    from runcast.settings import Settings

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


def worker_main(kind: str, spec_json: str) -> None:
    result = WORKERS[kind](json.loads(spec_json))
    print(f"{PROTOCOL}RESULT {json.dumps(result)}", flush=True)


# ---------------------------------------------------------------------------------------------
# Orchestrator side (.venv).
# ---------------------------------------------------------------------------------------------


class BenchError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def pg_admin(*statements: str) -> None:
    import psycopg2

    conn = psycopg2.connect(f"{PG_URL}/postgres")
    conn.autocommit = True  # CREATE/DROP DATABASE cannot run inside a transaction
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def pg_query(db: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg2

    conn = psycopg2.connect(f"{PG_URL}/{db}")
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def recreate_db(name: str) -> None:
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')


def drop_db(name: str) -> None:
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def flush_redis() -> None:
    import redis

    for db in (BROKER_DB, CACHE_DB):
        client = redis.Redis.from_url(f"{REDIS_URL}/{db}")
        try:
            client.flushdb()
        finally:
            client.close()


class TreeRss(threading.Thread):
    """Peak of the summed RSS of a process and all its descendants, sampled every 100 ms."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        super().__init__(name=f"rss-{root}", daemon=True)
        self.root = root
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop_event = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")

    def tree(self) -> list[int]:
        pids, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            # Children are listed per thread; a worker may be forked from any of them.
            with suppress(OSError):
                for task in os.listdir(f"/proc/{pid}/task"):
                    with suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as fh:
                        todo.extend(int(c) for c in fh.read().split())
        return pids

    def sample(self) -> int:
        total = 0
        for pid in self.tree():
            with suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * self._page
        return total

    def cpu_seconds(self) -> float:
        total = 0
        for pid in self.tree():
            with suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/stat") as fh:
                # utime and stime: fields 14 and 15, counted after the ")" ending the name.
                fields = fh.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def wait_idle(self, timeout: float, busy: float = 0.1) -> float:
        """Wait until the tree uses under `busy` of a core; return the seconds waited.

        /health answers as soon as the first worker is up while the others are still
        importing; a measurement started then would share the CPUs with their boot.
        """
        began = time.time()
        last = self.cpu_seconds()
        while time.time() - began < timeout:
            time.sleep(0.5)
            now = self.cpu_seconds()
            if now - last < busy * 0.5:
                break
            last = now
        return time.time() - began

    def run(self) -> None:
        while not self._stop_event.is_set():
            current = self.sample()
            self.peak = max(self.peak, current)
            self.samples += 1
            self._stop_event.wait(self.interval)

    def stop(self) -> float:
        self._stop_event.set()
        self.join(5)
        return self.peak / 2**20


@dataclass
class Cleanup:
    """Everything started, so that one finally block can stop it whatever happened."""

    groups: list[subprocess.Popen] = field(default_factory=list)
    workers: list[subprocess.Popen] = field(default_factory=list)
    databases: list[str] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    redis: bool = False

    def run(self) -> None:
        # A second Ctrl-C (or kill) must not leave servers or databases behind half-way.
        previous = {
            sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
                with suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        for proc in self.groups:
            stop_group(proc)
        for name in self.databases:
            try:
                drop_db(name)
            except Exception as exc:  # report it and go on cleaning the rest
                log(f"could not drop database {name}: {exc}")
        if self.redis:
            try:
                flush_redis()
            except Exception as exc:
                log(f"could not flush redis dbs {BROKER_DB}/{CACHE_DB}: {exc}")
        for path in self.paths:
            shutil.rmtree(path, ignore_errors=True)


def start_group(cmd: list[str], env: dict[str, str], logfile: Path) -> subprocess.Popen:
    # A session of its own: Ctrl-C in the terminal must not kill a server before we stop it,
    # and killpg then stops the master with every worker it forked, and nothing else.
    with open(logfile, "wb") as out:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None and not _group_alive(proc.pid):
        return
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + 15
    while time.time() < deadline and _group_alive(proc.pid):
        with suppress(subprocess.TimeoutExpired):
            proc.wait(0.2)
    if _group_alive(proc.pid):
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_http(url: str, proc: subprocess.Popen, logfile: Path, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"server exited ({proc.returncode}):\n{tail(logfile)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.3)
    raise BenchError(f"{url} not ready after {timeout:.0f}s:\n{tail(logfile)}")


def run_workers(
    cleanup: Cleanup, python: Path, kind: str, specs: list[dict[str, Any]], env: dict[str, str]
) -> list[dict[str, Any]]:
    """Start one process per spec, let each set up, start them together, collect results."""
    procs = []
    for i, spec in enumerate(specs):
        logfile = WORK / "logs" / f"{kind}-{spec.get('run_id', i)}.log"
        with open(logfile, "wb") as err:
            proc = subprocess.Popen(
                [str(python), str(Path(__file__).resolve()), "--worker", kind, json.dumps(spec)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        cleanup.workers.append(proc)
        procs.append((proc, logfile))
    handshaking = kind in ("runcast", "mlflow")
    if handshaking:
        for proc, logfile in procs:
            if _read_line(proc) != "READY":
                raise BenchError(f"{kind} worker failed to start:\n{tail(logfile)}")
        for proc, _ in procs:
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()
    results = []
    for proc, logfile in procs:
        line = _read_line(proc)
        proc.wait()
        if not line.startswith("RESULT "):
            raise BenchError(f"{kind} worker failed ({proc.returncode}):\n{tail(logfile)}")
        results.append(json.loads(line[len("RESULT ") :]))
    return results


def _read_line(proc: subprocess.Popen) -> str:
    """The next protocol line; "" at EOF. Libraries print too (MLflow: "View run ... at")."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(PROTOCOL):
            return line[len(PROTOCOL) :].strip()
    return ""


def throughput(results: list[dict[str, Any]], points_each: int) -> dict[str, float]:
    # One clock for all processes (time.time on one machine): the window runs from the first
    # client's first call to the last client's finish.
    window = max(r["ended"] for r in results) - min(r["started"] for r in results)
    logging = statistics.median(r["logged"] - r["started"] for r in results)
    return {
        "points": points_each * len(results),
        "seconds": window,
        "points_per_s": points_each * len(results) / window,
        "log_loop_s_median": logging,
    }


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


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(VENV_PY), "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise BenchError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


SETUP_CODE = """
from tracker.models import Project
from tracker import services
project = Project.objects.create(slug="bench", name="Bench")
print(services.token_create(project=project, name="bench", scope="write"))
"""

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
    cleanup.redis = True
    recreate_db(RUNCAST_DB)
    flush_redis()
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


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    # `kill` of the bench should clean up exactly like Ctrl-C does.
    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 keys x 5,000 steps, 2 clients")
    parser.add_argument("--skip-mlflow", action="store_true", help="Runcast only (no PyPI)")
    parser.add_argument("--keys", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--clients", type=int)
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(*args.worker)
        return 0

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
