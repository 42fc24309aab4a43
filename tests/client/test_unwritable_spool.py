"""A spool the client cannot write while the server is down: it says so, counts what it loses
in points, and never claims a replay that did not happen.

The unwritable directory is real: RUNCAST_DIR lies under a regular file, so creating it fails
with ENOTDIR for every user. chmod would not do: the tests may run as root, whom permission bits
do not stop, and a read-only bind mount or a tiny tmpfs needs privileges the tests do not have.
"""

from __future__ import annotations

import itertools
import logging
import socket
from pathlib import Path

import pytest
import runcast

from tests.client.conftest import MakeSettings
from tests.client.fakeserver import FakeServer
from tests.client.helpers import wait_until

UNWRITABLE = "runcast: cannot write to the spool"


def _unwritable_dir(tmp_path: Path) -> Path:
    (tmp_path / "a-file").write_text("a regular file, so nothing can be created under it")
    return tmp_path / "a-file" / "spool"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def _log_until(run: runcast.Run, done: object, start: int = 0) -> int:
    """Log a point at a time (a batch every 100) until done() holds; the steps logged."""
    step = start
    while not wait_until(done, timeout=0.02):  # type: ignore[arg-type]
        for _ in range(100):
            run.log({"loss": float(step)}, step=step)
            step += 1
        assert step - start < 200_000, "the sender never got there"
    return step - start


def test_it_warns_once_and_counts_the_points_it_loses_and_claims_no_replay(
    make_settings: MakeSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = _unwritable_dir(tmp_path)
    down = f"http://127.0.0.1:{_free_port()}"  # nothing listens: the server is down
    run = runcast.init(settings=make_settings(down, dir=spool, batch_points=100))
    assert isinstance(run, runcast.Run)
    with caplog.at_level(logging.INFO, logger="runcast"):
        # Enough for the sender to probe the closed port again and again (3 retries a try).
        logged = _log_until(run, lambda: run.stats()["retries"] >= 12)
        run.finish(timeout=0.5)
    stats = run.stats()
    assert stats["points_sent"] == 0
    assert stats["points_dropped"] == logged, "every point logged was lost, and counted"
    assert stats["batches_dropped"] >= 2
    # The server never answered: nothing was replayed, and nothing says it was.
    assert _messages(caplog, "reachable again") == []
    assert _messages(caplog, "replayed") == []
    assert len(_messages(caplog, "server unavailable")) == 1
    [warning] = _messages(caplog, UNWRITABLE)
    assert warning.levelno == logging.WARNING
    text = warning.getMessage()
    assert str(spool) in text, "it names the directory"
    assert "Not a directory" in text, "and the error"
    assert "run.stats()['points_dropped']" in text
    # And the run's end says the total, in points.
    assert len(_messages(caplog, f"run {run.id} lost {logged} points in ")) == 1


def test_it_repeats_the_warning_at_most_every_interval_with_the_count_so_far(
    make_settings: MakeSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    interval = 0.3
    settings = make_settings(
        None, mode="offline", dir=_unwritable_dir(tmp_path), spool_warning_interval=interval
    )
    run = runcast.init(settings=settings)
    assert isinstance(run, runcast.Run)
    with caplog.at_level(logging.WARNING, logger="runcast"):
        _log_until(run, lambda: len(_messages(caplog, UNWRITABLE)) >= 3)
        run.finish(timeout=0.5)
    warnings = _messages(caplog, UNWRITABLE)
    # Many batches failed in between; the warnings keep to the interval (a rate limit, so the
    # bound is on the gaps between them, which no slow machine can shrink). The records carry
    # the wall clock, the limit runs on the monotonic one: a millisecond for the difference.
    assert run.stats()["batches_dropped"] > len(warnings)
    gaps = [b.created - a.created for a, b in itertools.pairwise(warnings)]
    assert all(gap > interval - 0.001 for gap in gaps), gaps
    counts = [int(r.getMessage().split(" points in ")[0].rsplit(" ", 1)[1]) for r in warnings]
    assert counts == sorted(counts) and counts[0] < counts[-1], "each says the count so far"


def test_it_says_the_server_is_back_only_once_it_answers(
    make_settings: MakeSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()
    server = FakeServer(port).start()
    settings = make_settings(server.url, dir=_unwritable_dir(tmp_path), batch_points=100)
    run = runcast.init(settings=settings)
    assert isinstance(run, runcast.Run)
    with caplog.at_level(logging.INFO, logger="runcast"):
        logged = _log_until(run, lambda: run.stats()["points_sent"] > 0)
        server.stop()  # the server goes down for a while
        logged += _log_until(run, lambda: run.stats()["retries"] >= 12, start=logged)
        assert _messages(caplog, "server unavailable")
        assert _messages(caplog, "reachable again") == [], "said while the server was down"
        back = FakeServer(port)
        back.state = server.state  # the same server, up again
        back.start()
        try:
            logged += _log_until(
                run,
                lambda: not run.stats()["backlog"] and bool(_messages(caplog, "reachable")),
                start=logged,
            )
            run.finish()
        finally:
            back.stop()
    [message] = _messages(caplog, "reachable again")
    # Nothing could be spooled, so nothing was replayed: the message says only what happened.
    assert "replayed" not in message.getMessage()
    stats = run.stats()
    assert stats["points_dropped"] > 0
    assert stats["points_sent"] == back.state.total_points()
    assert stats["points_sent"] + stats["points_dropped"] == logged, "every point accounted for"


def test_it_says_how_many_spooled_files_it_replayed(
    make_settings: MakeSettings, spool_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()
    run = runcast.init(settings=make_settings(f"http://127.0.0.1:{port}", batch_points=100))
    assert isinstance(run, runcast.Run)
    with caplog.at_level(logging.INFO, logger="runcast"):
        _log_until(run, lambda: run.stats()["batches_spooled"] >= 3)
        server = FakeServer(port).start()
        try:
            assert wait_until(lambda: not run.stats()["backlog"])
            run.finish()
        finally:
            server.stop()
    [back] = _messages(caplog, "reachable again")
    replayed = run.stats()["files_replayed"]
    assert replayed >= 4  # the create and at least three batches
    assert f"{replayed} spooled file(s) replayed" in back.getMessage()
    assert run.stats()["points_dropped"] == 0


def test_a_create_that_could_not_be_spooled_is_sent_once_the_server_answers(
    make_settings: MakeSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server is unavailable at init and the spool cannot be written: the create was lost
    with it, and every batch after the outage met a run the server never heard of (404: the
    run was blocked for good). The create waits in memory and goes first."""
    server = FakeServer().start()
    server.script("create", (503, {"error": "database unavailable; retry later"}, {}))
    settings = make_settings(server.url, dir=_unwritable_dir(tmp_path), batch_points=100)
    try:
        run = runcast.init(settings=settings)
        assert isinstance(run, runcast.Run)
        with caplog.at_level(logging.INFO, logger="runcast"):
            _log_until(run, lambda: run.stats()["points_sent"] > 0)
            run.finish()
    finally:
        server.stop()
    stats = run.stats()
    assert not stats["blocked"]
    assert server.state.count("create") == 2  # the refused one, then the one that took
    assert stats["points_sent"] == server.state.total_points() > 0
    assert [f["status"] for f in server.run(run.id).finishes] == ["finished"]
