"""On-disk spool: one folder per run, one sub-folder per session (process).

Layout under the spool root (RUNCAST_DIR or ~/.cache/runcast)::

    <run-id>/<session>/meta.json           who wrote it, server URL (never the token)
    <run-id>/<session>/lock                host:pid while a live process owns the folder
    <run-id>/<session>/create.json         the create request, if not yet acknowledged
    <run-id>/<session>/batch-0000000007.json   exact request bodies, named by seq
    <run-id>/<session>/finish.json         the finish request, if not yet acknowledged
    <run-id>/<session>/timings-0000000003.json  a rank's step timings (a rank's own session)

Files hold the exact bytes that would be POSTed, so a replay repeats the same session
and seq and the server deduplicates it. Every write goes to a temp file first and is
renamed into place, so a reader (or a crash) never sees half a batch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

CREATE = "create.json"
FINISH = "finish.json"
META = "meta.json"
LOCK = "lock"
_BATCH_RE = re.compile(r"^(?:batch|timings)-(\d+)\.json$")
TIMINGS_PREFIX = "timings-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def batch_name(seq: int, kind: str = "batch") -> str:
    return f"{kind}-{seq:010d}.json"


def safe_name(value: str) -> str:
    """Run ids are user-supplied; keep them from escaping the spool root."""
    cleaned = _UNSAFE.sub("_", value).strip(".") or "_"
    return cleaned[:128]


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            # fsync so a power loss cannot leave a renamed-but-empty batch behind.
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(Path(tmp))
        raise


class SessionSpool:
    """The spool folder of one (run, session)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Bytes of request files here, as last counted plus what this process wrote since: an
        # upper bound (a replay deletes files without telling), recounted when it nears a cap.
        self._bytes: int | None = None

    @classmethod
    def for_session(cls, root: Path, run_id: str, session: str) -> SessionSpool:
        return cls(root / safe_name(run_id) / safe_name(session))

    def meta(self) -> dict:
        try:
            meta = json.loads((self.path / META).read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def claim(self, run_id: str, session: str, url: str | None) -> None:
        """Create the folder and mark it as owned by this live process."""
        self.path.mkdir(parents=True, exist_ok=True)
        meta = {"run_id": run_id, "session": session, "url": url, "created_at": time.time()}
        if not (self.path / META).exists():
            write_atomic(self.path / META, json.dumps(meta).encode("utf-8"))
        write_atomic(self.path / LOCK, _owner_tag().encode("utf-8"))

    def release(self) -> None:
        """Drop the live-owner mark; remove the folder if nothing is left to send."""
        _unlink(self.path / LOCK)
        if not self.has_pending():
            self.remove_if_empty()

    def _lock_owner(self) -> tuple[str, int] | None:
        """(host, pid) of the lock, or None without a readable one."""
        try:
            host, _, pid_text = (self.path / LOCK).read_text("utf-8").rpartition(":")
            return host, int(pid_text)
        except (OSError, ValueError):
            return None

    def owned_by_live_process(self) -> bool:
        """True when another live process on this host still writes here."""
        owner = self._lock_owner()
        if owner is None:
            return False
        host, pid = owner
        if host != socket.gethostname():
            # Cannot check a pid on another machine; assume the owner is alive there.
            return True
        return pid != os.getpid() and _pid_alive(pid)

    def owner_is_dead(self) -> bool:
        """True when the lock names a process of this host that no longer runs: one killed
        before it could release the folder. False for a live owner, this process, an owner on
        another host (its pid cannot be checked from here), and a lock that cannot be read."""
        owner = self._lock_owner()
        if owner is None:
            return False
        host, pid = owner
        return host == socket.gethostname() and pid != os.getpid() and not _pid_alive(pid)

    def remove_delivered(self) -> bool:
        """After `runcast sync` delivered everything here: remove the folder, with the lock a
        dead owner left. A folder whose owner may still write (or whose lock cannot be read) is
        left as it is, meta.json included, so what it writes later is still found. True when
        the folder is gone."""
        if self.has_pending():
            return False
        if (self.path / LOCK).exists():
            if not self.owner_is_dead():
                return False
            _unlink(self.path / LOCK)
        self.remove_if_empty()
        return not self.path.exists()

    def write(self, name: str, data: bytes) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.path / name
        write_atomic(target, data)
        if self._bytes is not None:
            self._bytes += len(data)
        return target

    def make_room(self, incoming: int, cap: int) -> tuple[list[Path], int, bool]:
        """Delete the oldest batch files until `incoming` more bytes fit under `cap`.

        Returns (files dropped, bytes dropped, whether it fits now). Only batches are dropped:
        the create and finish requests are small and without them the rest cannot be replayed.
        It frees down to 90% of the cap, so a spool at its cap recounts its folder once per
        tenth of the cap written, not on every batch.
        """
        if self._bytes is not None and self._bytes + incoming <= cap:
            return [], 0, True
        sizes = [(path, _size(path)) for path in self.pending()]
        self._bytes = sum(size for _, size in sizes)
        if self._bytes + incoming <= cap:
            return [], 0, True
        target = max(0, int(cap * 0.9) - incoming)
        dropped: list[Path] = []
        freed = 0
        for path, size in sizes:
            if self._bytes <= target:
                break
            if kind_of(path) != "batch":
                continue
            _unlink(path)
            self._bytes -= size
            dropped.append(path)
            freed += size
        return dropped, freed, self._bytes + incoming <= cap

    def pending(self) -> list[Path]:
        """Files still to deliver, in the order they must be sent."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        batches = sorted((int(m.group(1)), n) for n in names if (m := _BATCH_RE.match(n)))
        ordered = [CREATE] if CREATE in names else []
        ordered += [name for _, name in batches]
        if FINISH in names:
            ordered.append(FINISH)
        return [self.path / name for name in ordered]

    def has_pending(self) -> bool:
        return bool(self.pending())

    def remove_if_empty(self) -> None:
        _unlink(self.path / META)
        for leftover in self.path.glob(".tmp-*"):
            _unlink(leftover)
        for folder in (self.path, self.path.parent):
            try:
                folder.rmdir()
            except OSError:
                # Not empty (another session of the same run) or already gone: fine.
                return


def iter_sessions(root: Path) -> Iterator[SessionSpool]:
    """All session folders under a spool root, oldest first (replay order across restarts)."""
    if not root.is_dir():
        return
    found = [SessionSpool(meta.parent) for meta in root.glob(f"*/*/{META}")]
    found.sort(key=lambda spool: (spool.meta().get("created_at") or 0.0, str(spool.path)))
    yield from found


def kind_of(path: Path) -> str:
    if path.name == CREATE:
        return "create"
    if path.name == FINISH:
        return "finish"
    if path.name.startswith(TIMINGS_PREFIX):
        return "timings"
    return "batch"


def remove(path: Path) -> None:
    _unlink(path)


def _owner_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # delivered and removed meanwhile


def _unlink(path: Path) -> None:
    # A concurrent `runcast sync` may have delivered and removed it first.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
