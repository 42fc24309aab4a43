"""Small helpers shared by the client tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.client.fakeserver import TOKEN


def spool_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def fast_env(url: str | None, spool_dir: Path) -> dict[str, str]:
    """The same shrunk timings, as environment variables (for subprocess tests)."""
    env = {
        "RUNCAST_TOKEN": TOKEN,
        "RUNCAST_DIR": str(spool_dir),
        "RUNCAST_FLUSH_INTERVAL": "0.05",
        "RUNCAST_TIMEOUT": "2",
        "RUNCAST_MAX_RETRIES": "3",
        "RUNCAST_BACKOFF_BASE": "0.02",
        "RUNCAST_BACKOFF_MAX": "0.1",
        "RUNCAST_PROBE_INTERVAL": "0.05",
        "RUNCAST_FINISH_TIMEOUT": "10",
    }
    if url:
        env["RUNCAST_URL"] = url
    return env


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
