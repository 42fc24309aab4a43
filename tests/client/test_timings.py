"""Per-rank step timings in the client: what ranks get from init(), what they send, and that
timings keep the spool and replay guarantees of metrics."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import runcast
from runcast import spool as spool_mod
from runcast.timing import StepTimer, TimingBatcher

from tests.client.fakeserver import TOKEN, FakeServer


def rank_env(monkeypatch: pytest.MonkeyPatch, rank: int, world: int = 4, **extra: str) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank % 2))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


def wait_until(check, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return False


def steps_sent(server: FakeServer, run_id: str, rank: int) -> list[int]:
    bodies = [b for b in server.run(run_id).timings if b["rank"] == rank]
    return sorted(s for b in bodies for s in b["steps"])


# --- the batcher: what one request holds ---------------------------------------------------


def test_the_batcher_builds_the_servers_body_and_skips_bad_values(caplog):
    batcher = TimingBatcher("sess", rank=17, local_rank=1, host="node-3", max_steps=100)
    batcher.add(41_200, 0.0, (0.81, 0.02, None))
    batcher.add(41_201, 0.0, (float("nan"), "x", None))  # nothing valid: skipped, warned
    batcher.add(41_202, 0.0, (-1.0, 0.03, None))  # the negative part is left out
    batcher.add("step", 0.0, (0.8, None, None))
    batcher.seal()
    (sealed,) = batcher.take_sealed()
    body = json.loads(sealed.body)
    assert body == {
        "session": "sess",
        "seq": 1,
        "rank": 17,
        "local_rank": 1,
        "host": "node-3",
        "steps": [41_200, 41_202],
        "compute_s": [0.81, None],
        "wait_s": [0.02, 0.03],
    }
    assert batcher.skipped == 4
    assert "not 0..86400 seconds" in caplog.text and "invalid step" in caplog.text


def test_the_batcher_seals_no_empty_batch_and_splits_at_max_steps():
    batcher = TimingBatcher("s", rank=0, local_rank=None, host="h", max_steps=3)
    batcher.seal(heartbeat=123.0)
    assert batcher.take_sealed() == []
    for step in range(7):
        batcher.add(step, 0.0, (None, None, 1.0))
    batcher.seal()
    assert [s.points for s in batcher.take_sealed()] == [3, 3, 1]


def test_the_step_timer_splits_compute_and_wait():
    recorded = []

    class Channel:
        def record(self, step, compute_s=None, wait_s=None, total_s=None):
            recorded.append((step, compute_s, wait_s, total_s))

    with StepTimer(Channel(), 5) as t:  # type: ignore[arg-type]
        time.sleep(0.02)
        t.wait()
        time.sleep(0.01)
    with StepTimer(Channel(), 6):  # type: ignore[arg-type]
        time.sleep(0.005)
    with pytest.raises(RuntimeError), StepTimer(Channel(), 7):  # type: ignore[arg-type]
        raise RuntimeError("a failed step records nothing")
    (s5, compute, wait, total), (s6, c6, w6, t6) = recorded
    assert (s5, s6) == (5, 6)
    assert compute >= 0.02 and wait >= 0.01 and total == pytest.approx(compute + wait)
    assert c6 is None and w6 is None and t6 >= 0.005


# --- init(): which ranks get what ------------------------------------------------------------


def test_other_ranks_get_a_rank_run_under_the_same_id(monkeypatch, make_settings, server):
    rank_env(monkeypatch, 3, RUNCAST_RUN_ID="job-7")
    run = runcast.init(project="llm", settings=make_settings(server.url))
    assert isinstance(run, runcast.RankRun) and run.id == "job-7" and run.rank == 3
    run.finish()
    assert server.state.count("create") == 0  # rank 0 creates the run, nobody else


def test_torchruns_run_id_names_the_run_on_every_rank(monkeypatch, make_settings, server):
    rank_env(monkeypatch, 0, TORCHELASTIC_RUN_ID="abc/42")
    zero = runcast.init(project="llm", settings=make_settings(server.url))
    rank_env(monkeypatch, 2, TORCHELASTIC_RUN_ID="abc/42")
    two = runcast.init(project="llm", settings=make_settings(server.url))
    assert zero.id == two.id == "torchrun-abc_42"
    two.finish()
    zero.finish()


def test_without_a_shared_id_other_ranks_warn_and_send_nothing(
    monkeypatch, make_settings, server, caplog
):
    rank_env(monkeypatch, 1)
    with caplog.at_level(logging.WARNING, logger="runcast"):
        run = runcast.init(project="llm", settings=make_settings(server.url))
    assert type(run) is runcast.NoOpRun
    warned = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "runcast"]
    assert warned == [
        (
            logging.WARNING,
            "runcast: rank 1 sends no step timings: every rank needs the same run id"
            " (init(id=...), RUNCAST_RUN_ID or torchrun's TORCHELASTIC_RUN_ID)",
        )
    ]
    run.timing(1, compute_s=0.5)  # the whole surface exists
    with run.step_timer(2) as t:
        t.wait()


@pytest.mark.parametrize("off", [{"RUNCAST_TIMINGS": "0"}, {}])
def test_timings_can_be_turned_off(monkeypatch, make_settings, server, off):
    rank_env(monkeypatch, 1, world=4 if off else 1, RUNCAST_RUN_ID="job", **off)
    assert type(runcast.init(project="llm", settings=make_settings(server.url))) is runcast.NoOpRun


# --- what reaches the server -----------------------------------------------------------------


def test_every_rank_sends_its_timings_once_with_its_identity(monkeypatch, make_settings, server):
    settings = make_settings(server.url, timing_interval=0.05)
    rank_env(monkeypatch, 0, RUNCAST_RUN_ID="job-1")
    zero = runcast.init(project="llm", total_steps=100, settings=settings)
    rank_env(monkeypatch, 1, RUNCAST_RUN_ID="job-1")
    one = runcast.init(project="llm", settings=settings, host="node-1")
    for step in range(50):
        zero.timing(step, compute_s=0.5, wait_s=0.1)
        zero.log({"loss": 1.0}, step=step)
        with one.step_timer(step) as t:
            t.wait()
        one.log({"loss": 2.0}, step=step)  # a RankRun sends no metrics
    one.finish()
    zero.finish()
    state = server.run("job-1")
    assert steps_sent(server, "job-1", 0) == list(range(50))
    assert steps_sent(server, "job-1", 1) == list(range(50))
    ones = [b for b in state.timings if b["rank"] == 1]
    assert {b["host"] for b in ones} == {"node-1"} and {b["local_rank"] for b in ones} == {1}
    assert len({b["session"] for b in state.timings}) == 2  # a session per process
    assert [p for p, _ in state.points["loss"]] == list(range(50))  # rank 0's only
    assert zero.stats()["timings"]["points_sent"] == 50


def test_the_automatic_mode_times_the_interval_between_log_calls(
    monkeypatch, make_settings, server
):
    settings = make_settings(server.url, timing_interval=0.05)
    rank_env(monkeypatch, 0, RUNCAST_RUN_ID="auto")
    zero = runcast.init(project="llm", settings=settings)
    rank_env(monkeypatch, 2, RUNCAST_RUN_ID="auto")
    two = runcast.init(project="llm", settings=settings)
    for step in range(6):
        time.sleep(0.02)
        two.log({}, step=step)
        two.log({}, step=step)  # a second call in the same step is no new interval
    two.finish()
    zero.finish()
    bodies = [b for b in server.run("auto").timings if b["rank"] == 2]
    totals = [t for b in bodies for t in b["total_s"]]
    assert sorted(s for b in bodies for s in b["steps"]) == [1, 2, 3, 4, 5]
    assert all(t >= 0.02 for t in totals) and "compute_s" not in bodies[0]


def test_timings_before_the_run_exists_are_kept_and_delivered(monkeypatch, make_settings, server):
    """Rank 1 speaks before rank 0 has created the run: the 404 is retried, never dropped."""
    settings = make_settings(server.url, timing_interval=0.02)
    rank_env(monkeypatch, 1, RUNCAST_RUN_ID="late")
    one = runcast.init(project="llm", settings=settings)
    for step in range(20):
        one.timing(step, compute_s=0.3)
    assert wait_until(lambda: one.stats()["timings"].get("batches_spooled", 0) > 0)
    rank_env(monkeypatch, 0, RUNCAST_RUN_ID="late")
    zero = runcast.init(project="llm", settings=settings)
    assert wait_until(lambda: steps_sent(server, "late", 1) == list(range(20)))
    one.finish()
    zero.finish()
    assert server.state.duplicates == 0


def test_offline_timings_are_spooled_per_rank_and_synced(monkeypatch, make_settings, server):
    settings = make_settings(None, mode="offline", timing_interval=0.02)
    rank_env(monkeypatch, 0, RUNCAST_RUN_ID="off")
    zero = runcast.init(project="llm", settings=settings)
    rank_env(monkeypatch, 3, RUNCAST_RUN_ID="off")
    three = runcast.init(project="llm", settings=settings)
    for step in range(30):
        three.timing(step, compute_s=0.4, wait_s=0.05)
    three.finish()
    zero.finish()
    root = Path(settings.dir)  # type: ignore[arg-type]
    files = sorted(p.name for p in root.glob("off/*/*.json") if p.name != spool_mod.META)
    assert any(n.startswith("timings-") for n in files) and "create.json" in files
    from runcast.cli import main

    monkeypatch.setenv("RUNCAST_TOKEN", TOKEN)
    assert main(["sync", "--url", server.url, "--dir", str(root)]) == 0
    assert steps_sent(server, "off", 3) == list(range(30))
    assert not list(root.glob("off/*/timings-*.json"))
