"""scripts/supervise: what restarts the worker (and its beat) of scripts/dev when it dies, as
compose's `restart: unless-stopped` does for the team install (issue 24)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUPERVISE = str(ROOT / "scripts" / "supervise")

Start = Callable[..., subprocess.Popen[bytes]]
# Restarts 0.2 s apart, and no giving up unless a test asks for it.
QUICK = {"SUPERVISE_RESTART_S": "0.2", "SUPERVISE_GIVE_UP_AFTER": "1000"}


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Start]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*command: str, **env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [SUPERVISE, "worker", str(tmp_path / "worker.log"), *command],
            env={**os.environ, **QUICK, **env},
            stderr=subprocess.PIPE,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_it_starts_the_command_again_each_time_it_exits(supervise: Start, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    proc = supervise("sh", "-c", f"echo start >> {starts}; exit 3")
    wait_until(lambda: len(lines(starts)) >= 3, "not started three times")
    assert proc.poll() is None
    log = (tmp_path / "worker.log").read_text()
    assert "scripts/supervise: worker exited (status 3); starting it again in 0.2 s" in log
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_stopping_it_stops_the_command(supervise: Start, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    proc = supervise("sh", "-c", f"echo $$ > {pidfile}; exec sleep 300")
    wait_until(lambda: bool(lines(pidfile)), "the command did not start")
    child = int(lines(pidfile)[0])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # gone, not left running without its supervisor


def test_it_gives_up_on_a_command_that_cannot_start(supervise: Start, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    proc = supervise("sh", "-c", f"echo start >> {starts}; exit 7", SUPERVISE_GIVE_UP_AFTER="3")
    assert proc.wait(timeout=30) == 7
    assert len(lines(starts)) == 3
    assert proc.stderr is not None
    said = proc.stderr.read().decode()
    assert "worker exited 3 times within 60 s of its start (status 7); giving up" in said


def test_a_command_that_ran_a_while_is_not_counted_towards_giving_up(
    supervise: Start, tmp_path: Path
) -> None:
    starts = tmp_path / "starts"
    # "A while" is 1 s here: each run is long enough, so five exits are five restarts.
    proc = supervise(
        "sh",
        "-c",
        f"echo start >> {starts}; sleep 1.2; exit 1",
        SUPERVISE_GIVE_UP_AFTER="2",
        SUPERVISE_MIN_UP_S="1",
    )
    wait_until(lambda: len(lines(starts)) >= 4, "not started four times")
    assert proc.poll() is None


def test_what_the_command_left_running_is_stopped_before_it_starts_again(
    supervise: Start, tmp_path: Path
) -> None:
    """A worker killed with -9 left its embedded beat running: two beats ticked after the
    restart. The command's process group goes with it."""
    leftover = tmp_path / "leftover"
    proc = supervise(
        "sh", "-c", f"[ -e {leftover} ] || {{ sleep 300 & echo $! > {leftover}; }}; exit 1"
    )
    wait_until(lambda: bool(lines(leftover)), "the command did not start")
    orphan = int(lines(leftover)[0])

    def gone() -> bool:
        try:
            os.kill(orphan, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, "what the command left running outlived it")
    assert proc.poll() is None
