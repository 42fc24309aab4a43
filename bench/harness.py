"""The harness the benchmarks share: throwaway PostgreSQL databases, servers started and stopped
as process groups, peak RSS of a process tree, the trainer processes (bench/trainers.py) started
together, and one cleanup that stops whatever was started.

Needs PostgreSQL (BENCH_PG_URL) and, for the benches that start Celery or a server with a cache,
Redis (BENCH_REDIS_URL). Run the benches from the repository root as `python -m bench.X`.
"""

from __future__ import annotations

import json
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
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.trainers import PROTOCOL

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "var" / "bench"
VENV_PY = ROOT / ".venv" / "bin" / "python"

PG_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")


class BenchError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants (children are listed per thread in /proc: a worker may be
    forked from any of them)."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        with suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
    return pids


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
    # CREATE/DROP DATABASE cannot run inside a transaction.
    pg_admin_db("postgres", *statements)


def pg_admin_db(db: str, *statements: str) -> None:
    """Statements outside a transaction (VACUUM) on database `db`."""
    import psycopg2

    conn = psycopg2.connect(f"{PG_URL}/{db}")
    conn.autocommit = True
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


def flush_redis(*dbs: int) -> None:
    import redis

    for db in dbs:
        client = redis.Redis.from_url(f"{REDIS_URL}/{db}")
        try:
            client.flushdb()
        finally:
            client.close()


def tree_cpu_seconds(root: int, *, reaped: bool = False) -> float:
    """CPU seconds used by `root` and its live descendants; with `reaped`, also by descendants
    that exited and were waited for (each process's cutime/cstime: recycled gunicorn workers,
    closed PostgreSQL backends)."""
    last = 15 if reaped else 13
    total = 0
    for pid in process_tree(root):
        with suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/stat") as fh:
            # utime, stime, cutime, cstime: fields 14-17, counted after the ")" ending the name.
            fields = fh.read().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:last])
    return total / os.sysconf("SC_CLK_TCK")


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
        return process_tree(self.root)

    def sample(self) -> int:
        total = 0
        for pid in self.tree():
            with suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * self._page
        return total

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.root)

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
    redis_dbs: tuple[int, ...] = ()  # Redis databases (at REDIS_URL) to flush

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
        if self.redis_dbs:
            try:
                flush_redis(*self.redis_dbs)
            except Exception as exc:
                dbs = "/".join(str(db) for db in self.redis_dbs)
                log(f"could not flush redis dbs {dbs}: {exc}")
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
                [str(python), "-m", "bench.trainers", kind, json.dumps(spec)],
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


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(VENV_PY), "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise BenchError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


# A project "bench" and a write token for it, printed (run with `manage.py shell -c`).
SETUP_CODE = """
from tracker.models import Project
from tracker import services
project = Project.objects.create(slug="bench", name="Bench")
print(services.token_create(project=project, name="bench", scope="write"))
"""


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


@dataclass
class Posted:
    """What a scheduled load got: per request (in schedule order of completion) its latency,
    how late it left against its schedule, and the server's (status, answer)."""

    latencies: list[float]
    behind: list[float]
    answers: list[tuple[int, dict[str, Any]]]
    wall_s: float

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.latencies)
        return {
            "wall_s": self.wall_s,
            "latency_p50_ms": 1000 * statistics.median(ordered),
            "latency_p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
            "max_behind_s": max(self.behind),
        }


def post_on_schedule(
    schedule: list[tuple[float, str, bytes]], token: str, *, workers: int
) -> Posted:
    """POST each (seconds after the start, url, body) at its time through the client's HTTP
    seam (runcast.transport), from a pool of `workers` threads, as independent clients would."""
    from concurrent.futures import ThreadPoolExecutor

    from runcast import transport

    out = Posted([], [], [], 0.0)
    lock = threading.Lock()
    start = time.time() + 0.5

    def send(item: tuple[float, str, bytes]) -> None:
        at, url, body = item
        wait = start + at - time.time()
        if wait > 0:
            time.sleep(wait)
        t0 = time.time()
        status, payload, _ = transport.post_json(url, body, token, 30.0)
        t1 = time.time()
        with lock:
            out.latencies.append(t1 - t0)
            out.behind.append(max(0.0, t0 - (start + at)))
            out.answers.append((status, payload if isinstance(payload, dict) else {}))

    began = time.time()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(send, sorted(schedule, key=lambda item: item[0])))
    out.wall_s = time.time() - max(began, start)
    return out
