"""Throwaway dependencies a benchmark or a test owns: a PostgreSQL cluster and a redis-server,
each on a free port of 127.0.0.1, that it may stop, kill -9 and start again.

The machine's shared PostgreSQL (5432) and Redis (6379) are never touched: other sessions and the
suite run on them. PostgreSQL refuses to run as root: as root the cluster belongs to `postgres`.
Only the standard library (and bench.harness, itself stdlib-only) here, so tests
(tests/servers.py) and benches share it.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import suppress
from pathlib import Path

from bench.harness import free_port, process_tree


def postgres_bin() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, or Debian's /usr/lib/postgresql/<v>/bin."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    if versions:
        return Path(versions[0]).parent
    # A lone pg_ctl on PATH may be a symlink into the folder that holds the rest.
    found = shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


def kill_tree(root: int) -> list[int]:
    """SIGKILL `root` first (so it forks nothing more), then every descendant it had."""
    pids = process_tree(root)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


class LocalPostgres:
    """One throwaway cluster (trust auth, no fsync) on 127.0.0.1:<free port>."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="runcast-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=120)

    def init(self) -> LocalPostgres:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        return self

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def start(self) -> None:
        """Start the cluster, if it is not running (a crash is recovered from the WAL)."""
        if self.running():
            return
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c full_page_writes=off"
        result = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60",
            "start", check=False,
        )  # fmt: skip
        if result.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"postgres did not start: {result.stderr}\n{log[-2000:]}")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the cluster. `immediate` drops every connection at once and skips the shutdown
        checkpoint, as a crash does (the next start recovers from the WAL)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> int:
        """kill -9 of the postmaster and every backend it had, as the OOM killer or a power cut
        would: no shutdown, no goodbye to clients; the next start recovers from the WAL.
        Returns how many processes were killed."""
        pid = self.postmaster_pid()
        if pid is None:
            return 0
        killed = kill_tree(pid)
        # The next start must not find a backend of the old cluster still attached to its memory.
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(killed)

    def standby(self) -> LocalPostgres:
        """A streaming replica of this running cluster on a port of its own, not yet started:
        `pg_basebackup -R` writes standby.signal and the primary's address into its folder.
        initdb's trust rules already admit replication connections from 127.0.0.1."""
        replica = LocalPostgres(self.bin)
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
            "-D", str(replica.data), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync",
        )  # fmt: skip
        return replica

    def sql(self, query: str, db: str = "postgres") -> str:
        """One query through psql; its unaligned output."""
        return self._run(
            "psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db,
            "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", query,
        ).stdout.strip()  # fmt: skip

    def createdb(self, name: str) -> None:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)

    def url(self, db: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _alive(pid: int) -> bool:
    # A killed child of ours stays a zombie until reaped; /proc says so ("Z" after the name).
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class LocalRedis:
    """One redis-server on 127.0.0.1:<free port> with its data in a folder of its own,
    append-only as in docker-compose.yml (fsync every second), so what it held survives a
    kill -9 as it does there. Started again on the same port and folder."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="runcast-redis-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = self.root / "redis.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> str | None:
        return shutil.which("redis-server")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 30.0) -> None:
        binary = self.binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes", "--dir", str(self.root), "--logfile", str(self.log)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{_tail(self.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer PING in {timeout:.0f} s")
            time.sleep(0.05)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """kill -9: no shutdown, no goodbye to its clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
