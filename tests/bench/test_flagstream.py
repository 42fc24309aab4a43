"""bench/flagstream.py: its spawned workers can import it however the bench was started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import flagstream


def test_spawned_workers_find_the_repository_without_pythonpath(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A spawned worker is a fresh interpreter that imports bench.flagstream (to find its
    # initializer) before running anything of ours: only its start-up path can make that work.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    probe = [sys.executable, "-c", "import bench.flagstream"]
    before = subprocess.run(probe, cwd=tmp_path, env=dict(os.environ), capture_output=True)
    assert before.returncode != 0  # elsewhere, with no PYTHONPATH, `bench` is not importable
    flagstream._repo_root_on_path()
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(flagstream.REPO_ROOT)
    after = subprocess.run(probe, cwd=tmp_path, env=dict(os.environ), capture_output=True)
    assert after.returncode == 0, after.stderr.decode()
    flagstream._repo_root_on_path()  # idempotent: the root is not added twice
    assert os.environ["PYTHONPATH"].split(os.pathsep).count(str(flagstream.REPO_ROOT)) == 1
