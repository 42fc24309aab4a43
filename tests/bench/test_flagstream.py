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


def test_jobs_keep_the_rotation_when_only_some_faults_or_the_healthy_replays_run() -> None:
    curves = Path(__file__).resolve().parents[2] / "bench" / "data" / "tinygpt"
    every = flagstream.select_jobs(curves, seed=0)
    some = flagstream.select_jobs(
        curves, seed=0, rotation_faults=["spike", "nan"], faults_only=True
    )
    assert some and {j.fault for j in some} == {"spike", "nan"}
    # The same runs get the same faults as in the full rotation.
    assert [(j.path, j.fault) for j in some] == [
        (j.path, j.fault) for j in every if j.fault in ("spike", "nan")
    ]
    assert not any(j.healthy for j in some)
    healthy = flagstream.select_jobs(curves, seed=0, healthy_only=True)
    assert healthy and all(j.fault == "none" and j.healthy for j in healthy)
    assert len(healthy) == sum(j.healthy for j in every) < len(every)
    with pytest.raises(ValueError, match="no fault typo"):
        flagstream.select_jobs(curves, seed=0, rotation_faults=["typo"])
