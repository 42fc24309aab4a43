"""Process-level hooks: finish live runs at interpreter exit and on SIGTERM."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from typing import Any, Protocol

logger = logging.getLogger("runcast")

# Schedulers (Kubernetes, SLURM) usually allow ~30 s between SIGTERM and SIGKILL; leave
# room for the previous handler, and spool whatever cannot be sent by then.
SIGTERM_FINISH_TIMEOUT_S = 10.0


class Finishable(Protocol):
    def finish(self, status: str = "finished", timeout: float | None = None) -> None: ...


# Reentrant: the SIGTERM handler runs on the main thread, possibly while that thread is
# inside register()/unregister() holding this lock.
_lock = threading.RLock()
_live: list[Finishable] = []
_atexit_installed = False
_sigterm_installed = False
_previous_sigterm: Any = None


def register(run: Finishable) -> None:
    global _atexit_installed
    with _lock:
        _live.append(run)
        if not _atexit_installed:
            atexit.register(_at_exit)
            _atexit_installed = True
    _install_sigterm()


def unregister(run: Finishable) -> None:
    with _lock:
        if run in _live:
            _live.remove(run)


def _snapshot() -> list[Finishable]:
    with _lock:
        return list(_live)


def _at_exit() -> None:
    # An uncaught exception has already been printed (and stored in sys.last_value) by the
    # time atexit handlers run, so a crashed script is reported as failed, not finished.
    crashed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    status = "failed" if crashed is not None else "finished"
    for run in _snapshot():
        _finish_quietly(run, status, None)


def _install_sigterm() -> None:
    """Install once, from the main thread only (signal.signal raises elsewhere)."""
    global _sigterm_installed, _previous_sigterm
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        return
    _sigterm_installed = True


def _on_sigterm(signum: int, frame: Any) -> None:
    for run in _snapshot():
        _finish_quietly(run, "crashed", SIGTERM_FINISH_TIMEOUT_S)
    _chain(signum, frame)


def _chain(signum: int, frame: Any) -> None:
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # SIG_DFL (or a handler installed outside Python): terminate the way the process
    # would have without us, so the exit status still says "killed by SIGTERM".
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _finish_quietly(run: Finishable, status: str, timeout: float | None) -> None:
    try:
        run.finish(status=status, timeout=timeout)
    except Exception:
        logger.exception("runcast: finishing a run at shutdown failed")
