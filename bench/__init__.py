"""Benchmarks: scripts that print figures, run from the repository root as `python -m bench.X`."""

from __future__ import annotations

import os


def throwaway_secret_key() -> str:
    """The SECRET_KEY of a throwaway local server a benchmark starts (settings refuse to start
    without one off the embedded mode); one set in the environment wins."""
    return os.environ.get("SECRET_KEY", "runcast-bench-only-" + "x" * 50)
