"""End-to-end: the real client against a real in-memory HTTP server on localhost."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import runcast
from runcast.settings import Settings

from tests.client.conftest import MakeSettings
from tests.client.fakeserver import TOKEN, FakeServer
from tests.client.helpers import spool_files, wait_until


def _steps(server: FakeServer, key: str) -> list[int]:
    return sorted(step for step, _ in server.run().points.get(key, []))


def test_create_request_matches_contract(server: FakeServer, make_settings: MakeSettings) -> None:
    run = runcast.init(
        project="llm",
        name="baseline",
        total_steps=100,
        config={"lr": 3e-4, "path": Path("/data")},
        deadline="neurips",
        tags=["a", "b"],
        unit="tokens",
        settings=make_settings(server.url),
    )
    run.finish()
    body = server.run(run.id).body
    assert body["project"] == "llm"
    assert body["progress_unit"] == "tokens"
    assert body["config"] == {"lr": 3e-4, "path": "/data"}
    assert body["tags"] == ["a", "b"]
    assert body["deadline"] == "neurips"
    assert len(body["session"]) == 32
    assert len(run.id) == 32
    assert run.url == f"{server.url}/runs/{run.id}"
    assert run.attempt == 1
    assert server.run(run.id).finishes[0]["status"] == "finished"
    # The token travels only in the Authorization header.
    assert set(server.state.auth_headers) == {f"Bearer {TOKEN}"}
    assert not any(TOKEN in path for path in server.state.paths)


def test_batching_respects_point_limit(server: FakeServer, make_settings: MakeSettings) -> None:
    run = runcast.init(settings=make_settings(server.url, batch_points=1_000))
    for step in range(2_500):
        run.log({"loss": 1.0 / (step + 1), "lr": 0.1}, step=step)
    run.finish()
    batches = server.state.count("batch")
    assert batches >= 5
    assert server.state.total_points() == 5_000
    assert run.stats()["batches_sent"] == batches


def test_100k_points_delivered_exactly_once(
    server: FakeServer, make_settings: MakeSettings
) -> None:
    run = runcast.init(settings=make_settings(server.url))
    for step in range(50_000):
        run.log({"loss": float(step), "lr": 1e-3})
    run.finish()
    state = server.run()
    assert _steps(server, "loss") == list(range(50_000))
    assert _steps(server, "lr") == list(range(50_000))
    assert state.points["loss"][123] == (123, 123.0)
    assert server.state.duplicates == 0
    assert run.stats()["dropped"] == 0
    assert run.stats()["points_sent"] == 100_000


def test_server_down_then_up_loses_and_duplicates_nothing(
    make_settings: MakeSettings, spool_dir: Path
) -> None:
    port = _free_port()
    run = runcast.init(settings=make_settings(f"http://127.0.0.1:{port}"))
    for step in range(20_000):
        run.log({"loss": float(step), "acc": 0.5}, step=step)
        if step % 5_000 == 0:
            time.sleep(0.1)  # let the sender hit the closed port and spool
    assert wait_until(lambda: run.stats()["batches_spooled"] > 0)
    assert spool_files(spool_dir), "batches are spooled while the server is down"
    server = FakeServer(port).start()
    try:
        assert wait_until(lambda: not run.stats()["backlog"], timeout=10)
        for step in range(20_000, 30_000):
            run.log({"loss": float(step), "acc": 0.5}, step=step)
        run.finish()
        assert _steps(server, "loss") == list(range(30_000))
        assert _steps(server, "acc") == list(range(30_000))
        assert len(server.run().finishes) == 1
        assert run.stats()["points_sent"] == 60_000
        assert run.url == f"{server.url}/runs/{run.id}", "url arrives with the replayed create"
    finally:
        server.stop()
    assert not spool_files(spool_dir), "every spool file is deleted after its 200"


def test_log_does_not_wait_for_a_hanging_server(
    server: FakeServer, make_settings: MakeSettings
) -> None:
    # Behaviour, not wall-clock time (the per-call cost is bench/log_call.py's job): while
    # the server holds the sender's request unanswered, log() calls still all return.
    run = runcast.init(settings=make_settings(server.url, timeout=30.0, max_queue=1_000_000))
    release = server.stall("batch")
    try:
        run.log({"loss": 0.0}, step=0)
        assert wait_until(lambda: server.state.stalled == 1), "the sender's batch is held"
        trainer = threading.Thread(
            target=lambda: [run.log({"loss": 1.0}, step=step) for step in range(1, 20_001)]
        )
        trainer.start()
        trainer.join(timeout=20)  # only a "did not hang" guard; it takes milliseconds
        assert not trainer.is_alive(), "log() waited for the stalled server"
        # Every call returned while the one request was still unanswered.
        assert not release.is_set() and server.state.stalled == 1
        assert server.state.count("batch") == 0, "no batch has been answered yet"
        assert run.stats()["queued"] == 20_000
    finally:
        release.set()
    run.finish()
    assert _steps(server, "loss") == list(range(20_001))
    assert run.stats()["dropped"] == 0


def test_500_then_success_is_retried(server: FakeServer, make_settings: MakeSettings) -> None:
    server.script("batch", (500, {"error": "boom"}, {}), (503, {"error": "busy"}, {}))
    run = runcast.init(settings=make_settings(server.url))
    for step in range(100):
        run.log({"loss": 1.0}, step=step)
    run.finish()
    assert _steps(server, "loss") == list(range(100))
    assert run.stats()["retries"] == 2
    assert run.stats()["batches_spooled"] == 0


def test_429_honours_retry_after(server: FakeServer, make_settings: MakeSettings) -> None:
    server.script("batch", (429, {"error": "slow down"}, {"Retry-After": "1"}))
    run = runcast.init(settings=make_settings(server.url))
    run.log({"loss": 1.0}, step=0)
    run.finish()
    times = [when for when, kind, _ in server.state.requests if kind == "batch"]
    assert len(times) == 2
    assert times[1] - times[0] >= 0.95, "backoff_max is 0.1 s, so only Retry-After explains 1 s"
    assert _steps(server, "loss") == [0]


def test_400_batch_is_dropped_without_blocking_others(
    server: FakeServer, make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    def reject_first(body: dict) -> tuple[int, dict, dict] | None:
        return (400, {"error": "bad metric", "field": "metrics"}, {}) if body["seq"] == 1 else None

    server.state.batch_hook = reject_first
    run = runcast.init(settings=make_settings(server.url, batch_points=10))
    with caplog.at_level(logging.WARNING, logger="runcast"):
        for step in range(50):
            run.log({"loss": 1.0}, step=step)
        run.finish()
    assert _steps(server, "loss") == list(range(10, 50))
    assert run.stats()["batches_dropped"] == 1
    assert run.stats()["points_dropped"] == 10
    assert server.run().finishes, "finish still sent after a dropped batch"
    assert sum("bad metric" in r.getMessage() for r in caplog.records) == 1


def test_nan_and_inf_are_preserved(server: FakeServer, make_settings: MakeSettings) -> None:
    run = runcast.init(settings=make_settings(server.url))
    run.log({"loss": float("nan"), "grad": float("inf"), "neg": float("-inf")}, step=0)
    run.finish()
    state = server.run()
    assert math.isnan(state.points["loss"][0][1])
    assert state.points["grad"] == [(0, math.inf)]
    assert state.points["neg"] == [(0, -math.inf)]


def test_events_heartbeats_and_numeric_types(
    server: FakeServer, make_settings: MakeSettings
) -> None:
    np = pytest.importorskip("numpy")
    run = runcast.init(settings=make_settings(server.url, heartbeat_interval=0.1))
    run.log({"loss": np.float32(0.5), "tokens": np.int64(7), "flag": True}, step=np.int64(3))
    run.event("checkpoint", step=3, path=Path("/ckpt/3"))
    run.event("my-thing", note="x")  # unknown kind becomes "custom"
    assert wait_until(lambda: bool(server.run().heartbeats), timeout=5)
    run.finish()
    state = server.run()
    assert state.points["loss"] == [(3, 0.5)]
    assert state.points["tokens"] == [(3, 7.0)]
    assert state.points["flag"] == [(3, 1.0)]
    kinds = [(e["kind"], e["payload"]) for e in state.events]
    assert kinds == [
        ("checkpoint", {"path": "/ckpt/3"}),
        ("custom", {"name": "my-thing", "note": "x"}),
    ]


def test_auto_step_continues_after_explicit_step(
    server: FakeServer, make_settings: MakeSettings
) -> None:
    run = runcast.init(settings=make_settings(server.url))
    run.log({"x": 1.0})
    run.log({"x": 1.0})
    run.log({"x": 1.0}, step=10)
    run.log({"x": 1.0})
    run.finish()
    assert _steps(server, "x") == [0, 1, 10, 11]


def test_log_never_raises_on_garbage(
    server: FakeServer, make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    class Weird:
        def __float__(self) -> float:
            raise KeyError("nope")

    run = runcast.init(settings=make_settings(server.url))
    garbage: list[tuple[object, object]] = [
        (None, None),
        (42, None),
        ("loss", None),
        ([1, 2, 3], None),
        ({"loss": "high"}, None),
        ({"loss": None}, None),
        ({"loss": object()}, None),
        ({"loss": Weird()}, None),
        ({"loss": complex(1, 2)}, None),
        ({"loss": [1.0, 2.0]}, None),
        ({"loss": {"nested": 1.0}}, None),
        ({1: 1.0, "": 2.0, None: 3.0}, None),
        ({"loss": 1.0}, "abc"),
        ({"loss": 1.0}, -(2**62) - 1),  # beyond int64 storage (negative steps are fine)
        ({"loss": 1.0}, 2.5),
        ({"loss": 1.0}, object()),
        ({"loss": 10**400}, 0),
    ]
    with caplog.at_level(logging.WARNING, logger="runcast"):
        for data, step in garbage:
            run.log(data, step=step)  # type: ignore[arg-type]
            run.log(data, step=step)  # type: ignore[arg-type]
        run.event(None, step="x", payload=object())  # type: ignore[arg-type]
        run.log({"loss": 2.0, "ok": 3.0}, step=100)
        run.finish()
    assert server.run().points["loss"] == [(100, 2.0)]
    assert server.run().points["ok"] == [(100, 3.0)]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'high'" in m for m in messages) <= 1, "one warning per key, not per call"


def test_bad_token_does_not_spin(make_settings: MakeSettings, server: FakeServer) -> None:
    run = runcast.init(settings=make_settings(server.url, token="rc_bad_token"))
    for step in range(200):
        run.log({"loss": 1.0}, step=step)
        if step % 50 == 0:
            time.sleep(0.06)
    run.finish()
    assert server.state.count("create") == 1
    assert server.state.count("batch") == 0, "after a 401 the client stops calling"
    assert run.stats()["blocked"]
    assert run.stats()["batches_spooled"] >= 1


def test_token_never_logged(
    make_settings: MakeSettings, server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.script("create", (401, {"error": "invalid token"}, {}))
    with caplog.at_level(logging.DEBUG, logger="runcast"):
        run = runcast.init(settings=make_settings(server.url))
        run.log({"loss": 1.0})
        run.finish()
        repr(run.settings)
    assert caplog.records, "the 401 is reported"
    assert all(TOKEN not in r.getMessage() for r in caplog.records)
    assert TOKEN not in repr(run.settings)


def test_resume_same_id_is_new_attempt(server: FakeServer, make_settings: MakeSettings) -> None:
    first = runcast.init(id="resumable", settings=make_settings(server.url))
    first.log({"loss": 1.0}, step=0)
    first.finish("crashed")
    second = runcast.init(id="resumable", settings=make_settings(server.url))
    second.log({"loss": 0.5}, step=1)
    second.finish()
    assert (first.attempt, second.attempt) == (1, 2)
    assert _steps(server, "loss") == [0, 1]


def test_run_id_from_env(
    server: FakeServer, make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCAST_RUN_ID", "from-env")
    run = runcast.init(settings=make_settings(server.url))
    run.finish()
    assert run.id == "from-env"
    assert "from-env" in server.state.runs


def test_context_manager_marks_failed(server: FakeServer, make_settings: MakeSettings) -> None:
    run = runcast.init(settings=make_settings(server.url))

    def train() -> None:
        with run:
            run.log({"loss": 1.0}, step=0)
            raise RuntimeError("diverged")

    with pytest.raises(RuntimeError, match="diverged"):
        train()
    assert server.run().finishes[0]["status"] == "failed"
    assert _steps(server, "loss") == [0]
    run.log({"loss": 2.0})  # after finish: ignored, never raises


def test_non_zero_rank_is_noop(
    server: FakeServer, make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    run = runcast.init(settings=make_settings(server.url))
    assert isinstance(run, runcast.NoOpRun)
    with run:
        run.log({"loss": 1.0}, step=0)
        run.event("checkpoint", step=0)
    run.finish()
    assert server.state.requests == []

    everyone = runcast.init(settings=make_settings(server.url), all_ranks=True)
    assert isinstance(everyone, runcast.Run)
    everyone.finish()
    assert server.run().body["world_size"] == 8


def test_rank_zero_reports_world_size(
    server: FakeServer, make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    run = runcast.init(settings=make_settings(server.url))
    run.finish()
    assert server.run().body["world_size"] == 4
    assert server.run().body["hosts"] == [socket.gethostname()]


def test_full_queue_drops_oldest_and_counts(
    server: FakeServer, make_settings: MakeSettings
) -> None:
    server.state.delay_s = 0.3  # a slow server keeps the sender busy
    run = runcast.init(settings=make_settings(server.url, max_queue=100, batch_points=50))
    for step in range(5_000):
        run.log({"loss": 1.0}, step=step)
    run.finish()
    stats = run.stats()
    assert stats["dropped"] > 0
    assert stats["logged"] + stats["dropped"] == 5_000
    assert server.state.total_points() == stats["logged"]
    assert _steps(server, "loss")[-1] == 4_999, "the newest entries survive"


def test_oversized_batch_is_split(server: FakeServer, make_settings: MakeSettings) -> None:
    run = runcast.init(settings=make_settings(server.url, max_body_bytes=20_000))
    run.log({f"metric_{i}": float(i) for i in range(2_000)}, step=0)
    run.finish()
    assert server.state.total_points() == 2_000
    assert server.state.count("batch") > 1
    assert all(size <= 20_000 for _, kind, size in server.state.requests if kind == "batch")


def test_log_from_many_threads(server: FakeServer, make_settings: MakeSettings) -> None:
    run = runcast.init(settings=make_settings(server.url))

    def worker(name: str) -> None:
        for step in range(5_000):
            run.log({name: 1.0}, step=step)

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.finish()
    for i in range(4):
        assert _steps(server, f"t{i}") == list(range(5_000))


def test_missing_url_falls_back_to_offline(spool_dir: Path) -> None:
    run = runcast.init(settings=Settings(dir=spool_dir, flush_interval=0.05))
    run.log({"loss": 1.0}, step=0)
    run.finish()
    assert any(p.name == "create.json" for p in spool_files(spool_dir))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_it_spools_what_a_slow_server_cannot_take_before_the_finish_deadline(
    server: FakeServer, make_settings: MakeSettings, spool_dir: Path
) -> None:
    # Every request succeeds but takes 0.2 s: 40 batches need ~8 s, the finish allows 0.5 s.
    settings = make_settings(server.url, batch_points=100, flush_interval=30.0, timeout=1.0)
    run = runcast.init(settings=settings)
    server.state.delay_s = 0.2
    for step in range(4_000):
        run.log({"loss": float(step)}, step=step)
    started = time.monotonic()
    run.finish(timeout=0.5)
    assert time.monotonic() - started < 3.0
    # The process may exit now (SIGTERM, end of script): nothing may still be in memory only.
    assert not run._sender.is_alive(), "finish() returned while the sender still held batches"
    spooled = [p for p in spool_files(spool_dir) if p.name.startswith("batch-")]
    assert spooled and any(p.name == "finish.json" for p in spool_files(spool_dir))
    sent = server.state.total_points()
    on_disk = sum(len(json.loads(p.read_bytes())["metrics"]["loss"]["steps"]) for p in spooled)
    assert sent + on_disk == 4_000


def test_it_never_logs_a_token_read_with_its_newline(
    make_settings: MakeSettings, server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    # runcast.init(token=Path("token").read_text()): the file's newline comes along, and
    # http.client's "Invalid header value b'Bearer rc_…\n'" would carry the secret into a log.
    secret = TOKEN.split("_")[-1]
    with caplog.at_level(logging.DEBUG, logger="runcast"):
        run = runcast.init(settings=make_settings(server.url, token=TOKEN + "\n"))
        run.log({"loss": 1.0}, step=0)
        run.finish()
    assert all(secret not in r.getMessage() for r in caplog.records)
    assert server.run().points["loss"] == [(0, 1.0)]


def test_it_keeps_the_token_out_of_transport_errors() -> None:
    from runcast import transport

    status, payload, _ = transport.post_json("http://127.0.0.1:9/x", b"{}", "rc_a_s3cr\nt", 1)
    assert status == 0 and "s3cr" not in str(payload)


def test_a_replayed_run_ends_at_its_recorded_time(
    server: FakeServer, make_settings: MakeSettings
) -> None:
    # An importer replays a run of last month: it started and ended then, not now.
    run = runcast.init(settings=make_settings(server.url), started_at=1_700_000_000.0)
    run.log({"loss": 1.0}, step=0)
    run.finish(ended_at=1_700_003_600.0)
    assert server.run(run.id).finishes[0]["time"] == 1_700_003_600.0
    before = time.time()
    live = runcast.init(settings=make_settings(server.url))
    live.finish()
    assert server.run(live.id).finishes[0]["time"] >= before


def test_a_single_process_run_sends_no_world_size(
    server: FakeServer, make_settings: MakeSettings
) -> None:
    # Nothing says how many processes: the client does not guess (the server assumes one and
    # says so where it shows the cost).
    runcast.init(settings=make_settings(server.url)).finish()
    assert server.run().body["world_size"] is None


def test_world_size_and_rank_come_from_an_initialised_process_group(
    server: FakeServer, make_settings: MakeSettings, tmp_path: Path
) -> None:
    # mp.spawn and hand-rolled launchers set up torch.distributed without WORLD_SIZE / RANK in
    # the environment: the process group is where the world size is.
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch without distributed support")
    store = f"file://{tmp_path / 'store'}"
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, torch.distributed as dist, runcast\n"
            f"dist.init_process_group('gloo', init_method={store!r}, rank=1, world_size=2)\n"
            "print(type(runcast.init(mode='offline', dir=sys.argv[1])).__name__, flush=True)\n"
            "dist.barrier(); dist.destroy_process_group()\n",
            str(tmp_path / "rank1"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")},
    )
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=2)
    try:
        run = runcast.init(settings=make_settings(server.url), timings=False)
        run.finish()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    out, _ = other.communicate(timeout=60)
    assert server.run().body["world_size"] == 2
    assert out.strip() == "NoOpRun"  # rank 1 knew it was not rank 0


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ([{"flush_interval": 4.0}], 4.0),
        # Never later than the heartbeat interval the server judges liveness by (5 s here).
        ([{"flush_interval": 30.0}], 5.0),
        # Never sooner than the process's own setting.
        ([{"flush_interval": 0.01}], 0.05),
        # The load passed (or an older server): back to its own.
        ([{"flush_interval": 4.0}, {}], 0.05),
        ([{"flush_interval": 4.0}, {"flush_interval": "soon"}], 0.05),
        ([{"flush_interval": float("nan")}], 0.05),
        ([{"flush_interval": True}], 0.05),
    ],
)
def test_the_sender_follows_the_servers_pacing_within_its_own_bounds(
    make_settings: MakeSettings, answers: list[dict], expected: float
) -> None:
    import collections

    from runcast.sender import Sender

    settings = make_settings("http://127.0.0.1:9", heartbeat_interval=5.0)
    sender = Sender(
        run_id="r", session="s", settings=settings, queue=collections.deque(), on_created=print
    )
    for answer in answers:
        sender._follow_pacing({"accepted": 1, "duplicate": False, **answer})
    assert sender.flush_interval == expected
