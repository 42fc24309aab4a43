"""Process-level behaviour, in real subprocesses: SIGTERM flush and atexit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.client.fakeserver import FakeServer
from tests.client.helpers import fast_env

TRAINER = textwrap.dedent(
    """
    import signal, sys, time
    import runcast

    mode, marker = sys.argv[1], sys.argv[2]
    if mode == "sigterm-chain":
        def previous(signum, frame):
            open(marker, "w").write("previous handler ran")
            sys.exit(3)
        signal.signal(signal.SIGTERM, previous)
    run = runcast.init(name=mode, id=mode)
    for step in range(1000):
        run.log({"loss": float(step)}, step=step)
    if mode.startswith("sigterm"):
        print("ready", flush=True)
        time.sleep(60)
    elif mode == "raise":
        raise RuntimeError("diverged")
    """
)


def _start(tmp_path: Path, server: FakeServer, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, **fast_env(server.url, tmp_path / "spool")}
    env["RUNCAST_FLUSH_INTERVAL"] = "30"  # nothing flushes on its own: exit must do it
    return subprocess.Popen(
        [sys.executable, str(script), mode, str(tmp_path / "marker")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _points(server: FakeServer, run_id: str) -> list[int]:
    return sorted(step for step, _ in server.run(run_id).points["loss"])


@pytest.mark.parametrize("mode", ["sigterm", "sigterm-chain"])
def test_sigterm_flushes_and_chains(tmp_path: Path, server: FakeServer, mode: str) -> None:
    proc = _start(tmp_path, server, mode)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    # A guard against a hang, not a time limit: the client's own budget is 10 s to flush plus
    # the joins' slack; a CI machine running a benchmark beside the suite once took over 30 s.
    _, stderr = proc.communicate(timeout=90)
    assert _points(server, mode) == list(range(1000)), stderr
    assert server.run(mode).finishes[0]["status"] == "crashed"
    if mode == "sigterm":
        assert proc.returncode == -signal.SIGTERM, "default action re-raised: killed by SIGTERM"
    else:
        assert proc.returncode == 3
        assert (tmp_path / "marker").read_text() == "previous handler ran"


@pytest.mark.parametrize(("mode", "status"), [("exit", "finished"), ("raise", "failed")])
def test_atexit_flushes(tmp_path: Path, server: FakeServer, mode: str, status: str) -> None:
    proc = _start(tmp_path, server, mode)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == (0 if mode == "exit" else 1), stderr
    assert _points(server, mode) == list(range(1000))
    assert server.run(mode).finishes[0]["status"] == status


LOCKED = textwrap.dedent(
    """
    import os, signal
    import runcast
    from runcast import lifecycle

    run = runcast.init(id="locked")
    run.log({"loss": 1.0}, step=0)
    # A signal handler runs on the main thread between two bytecodes, so SIGTERM can land
    # while that thread is inside register()/unregister() holding the run-list lock.
    with lifecycle._lock:
        os.kill(os.getpid(), signal.SIGTERM)
    """
)


def test_it_finishes_runs_when_sigterm_lands_while_the_run_list_is_locked(
    tmp_path: Path, server: FakeServer
) -> None:
    script = tmp_path / "locked.py"
    script.write_text(LOCKED)
    env = {**os.environ, **fast_env(server.url, tmp_path / "spool")}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE)
    try:
        _, stderr = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the SIGTERM handler deadlocked on the run-list lock")
    assert proc.returncode == -signal.SIGTERM, stderr
    assert server.run("locked").finishes[0]["status"] == "crashed"
    assert _points(server, "locked") == [0]
