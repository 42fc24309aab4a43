"""The real client against the real server (pytest-django's live server, the configured DB)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import runcast
from runcast.settings import Settings

from tracker import selectors
from tracker.models import ApiToken, Membership, Project, Run
from tracker.services import token_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def live_token(django_user_model) -> str:
    user = django_user_model.objects.create_user("trainer", password="pw-trainer-123")
    project = Project.objects.create(slug="live", name="Live")
    Membership.objects.create(project=project, user=user, role=Membership.Role.OWNER)
    return token_create(project=project, name="t", scope=ApiToken.Scope.WRITE)


@pytest.fixture
def fast_settings(make_settings, live_token):
    """The client's test timings (tests/client/conftest.py), against the live server."""

    def build(url: str) -> Settings:
        return make_settings(url, token=live_token, finish_timeout=60.0, max_queue=1_000_000)

    return build


def stored(run_id: str, key: str) -> np.ndarray:
    run = Run.objects.get(public_id=run_id)
    return selectors.series_load(run=run, key=key, resolve=False).steps


def test_it_stores_100k_points_exactly_once(live_server, fast_settings):
    settings = fast_settings(live_server.url)
    run = runcast.init(
        project="live", name="big", id="big-1", total_steps=50_000, settings=settings
    )
    for step in range(50_000):
        run.log({"loss": 1.0 / (step + 1), "lr": 3e-4}, step=step)
    run.finish()
    for key in ("loss", "lr"):
        steps = stored("big-1", key)
        assert steps.size == 50_000
        assert np.array_equal(np.sort(steps), np.arange(50_000))
    db_run = Run.objects.get(public_id="big-1")
    assert (db_run.status, db_run.points_count, db_run.last_step) == ("finished", 100_000, 49_999)


class Relay:
    """A TCP relay in front of the live server that can go down and come back on one port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.listener: socket.socket | None = None
        self.conns: list[socket.socket] = []

    def up(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def down(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for conn in self.conns:
            conn.close()
        self.conns.clear()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def relay(live_server) -> Iterator[Relay]:
    host, port = live_server.thread.host, live_server.thread.port
    r = Relay((host, port))
    r.up()
    yield r
    r.down()


def test_it_survives_a_server_outage_without_loss_or_duplicates(relay, fast_settings):
    settings = fast_settings(f"http://127.0.0.1:{relay.port}")
    run = runcast.init(project="live", name="outage", id="outage-1", settings=settings)
    for step in range(30_000):
        if step == 10_000:
            time.sleep(0.3)  # let the first part arrive, then take the server away
            relay.down()
        if step == 25_000:
            time.sleep(2.0)  # long enough for retries to give up and spool to disk
            relay.up()
        run.log({"loss": float(step)}, step=step)
    run.finish()
    steps = stored("outage-1", "loss")
    assert steps.size == 30_000, "points lost or duplicated"
    assert np.array_equal(np.sort(steps), np.arange(30_000))
    assert Run.objects.get(public_id="outage-1").status == "finished"
    # That log() never waits on the network is asserted by behaviour, not a time bound, in
    # test_delivery.py::test_log_does_not_wait_for_a_hanging_server; bench/log_call.py
    # measures what one call costs.


@pytest.mark.parametrize("worker_runs_on", [False, True], ids=["server-down", "web-down"])
def test_a_server_outage_raises_no_crash_for_a_run_that_kept_training(
    relay, fast_settings, monkeypatch, worker_runs_on
):
    """The drill that once paged "run crashed" 4 s after the server came back: the server (web
    and worker) stops while the job trains on and spools, then comes back. Or only the web stops
    (a redeploy) while the worker sweeps on, probing it. Timings shrunk: the sweep ticks every
    0.25 s (period 0.5 s) and a run counts as silent after 1 s."""
    from django.db import connection

    from forecasting import liveness
    from forecasting.estimators import thresholds as th
    from forecasting.models import Flag

    if connection.vendor == "sqlite":
        pytest.skip("in-memory SQLite locks tables two threads write at once; CI uses PostgreSQL")
    monkeypatch.setattr(th, "STALL_MIN_S", 1.0)
    # The client's longest probe interval is 0.2 s here (tests/client/conftest.py), not 60 s.
    monkeypatch.setattr(th, "STALL_RECONNECT_GRACE_S", 0.5)
    settings = fast_settings(f"http://127.0.0.1:{relay.port}")
    run = runcast.init(project="live", name="outage", id="outage-2", settings=settings)
    db_run = None

    def sweep() -> None:
        # What forecasting.tasks.sweep_active_runs does, at the shrunk period.
        probe = f"http://127.0.0.1:{relay.port}/healthz"
        if liveness.server_listening(probe_url=probe, period_s=0.5):
            liveness.run_check_liveness(run_id=db_run.pk)

    step = 0

    def train(seconds: float, *, ticking: bool) -> None:
        nonlocal step
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            run.log({"loss": 1.0}, step=step)
            step += 1
            time.sleep(0.01)
            if ticking and step % 25 == 0:
                sweep()

    train(0.3, ticking=False)
    db_run = Run.objects.get(public_id="outage-2")
    train(1.0, ticking=True)
    relay.down()  # the web stops: no requests; the job trains on and spools
    train(3.0, ticking=worker_runs_on)  # the worker stopped too, or sweeps on
    relay.up()
    sweep()  # the worker's first tick on restart: before the client has noticed and replayed
    train(2.0, ticking=True)
    run.finish()

    assert not Flag.objects.filter(run=db_run, kind="stalled").exists()
    db_run.refresh_from_db()
    assert db_run.status == "finished"
    assert stored("outage-2", "loss").size == step


def test_a_resumed_job_keeps_its_rollback(live_server, fast_settings):
    settings = fast_settings(live_server.url)
    first = runcast.init(project="live", id="resume-1", total_steps=1000, settings=settings)
    for step in range(600):
        first.log({"loss": 2.0}, step=step)
    first.finish(status="crashed")
    second = runcast.init(project="live", id="resume-1", total_steps=1000, settings=settings)
    for step in range(500, 1000):
        second.log({"loss": 1.0}, step=step)
    second.finish()
    run = Run.objects.get(public_id="resume-1")
    assert (run.status, run.current_segment, run.last_step) == ("finished", 2, 999)
    assert run.segments.get(number=2).lost_steps == 99
    plotted = selectors.series_load(run=run, key="loss")
    assert plotted.steps.tolist() == list(range(1000))


def test_an_importer_keeps_the_original_times(live_server, fast_settings):
    settings = fast_settings(live_server.url)
    run = runcast.init(project="live", id="import-1", world_size=64, settings=settings)
    for step in range(100):
        run.log({"loss": 1.0}, step=step, time=1.7e9 + 10.0 * step)
    run.finish()
    db_run = Run.objects.get(public_id="import-1")
    assert db_run.world_size == 64
    times = selectors.series_load(run=db_run, key="loss").times
    assert times.tolist() == [1.7e9 + 10.0 * s for s in range(100)]


def test_an_importer_keeps_the_original_start(live_server, fast_settings):
    # A run replayed from history started long ago: its duration and cost count from then.
    started = time.time() - 2 * 3600
    run = runcast.init(
        project="live", id="import-2", started_at=started, settings=fast_settings(live_server.url)
    )
    for step in range(10):
        run.log({"loss": 1.0}, step=step, time=started + 600.0 * step)
    run.finish()
    db_run = Run.objects.get(public_id="import-2")
    assert db_run.started_at.timestamp() == pytest.approx(started, abs=1e-3)
    assert db_run.ended_at is not None
    assert (db_run.ended_at - db_run.started_at).total_seconds() == pytest.approx(7200, abs=60)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda run: run.log({"x" * 201: 1.0}, step=5), id="long-key"),
        pytest.param(lambda run: run.log({"loss\n": 1.0}, step=5), id="unprintable-key"),
        pytest.param(lambda run: run.log({"loss": 1.0}, step=2**63), id="int64-overflow-step"),
        pytest.param(lambda run: run.log({"loss": 1.0}, step=5, time=float("nan")), id="nan-time"),
        pytest.param(lambda run: run.log({"loss": 1.0}, step=5, time=1.7e12), id="ms-time"),
        pytest.param(lambda run: run.event("eval", step=5, blob="x" * 20_000), id="big-event"),
        pytest.param(
            lambda run: run.log({f"layer/{i}": 1.0 for i in range(1_500)}, step=5),
            id="too-many-keys",
        ),
        pytest.param(
            lambda run: [run.event("custom", step=5) for _ in range(1_500)], id="too-many-events"
        ),
    ],
)
def test_it_keeps_the_batch_when_one_entry_breaks_a_server_limit(
    live_server, fast_settings, spool_dir, bad
):
    settings = fast_settings(live_server.url)
    settings.flush_interval = 30.0  # everything below lands in one batch unless the client splits
    run = runcast.init(project="live", id="limits-1", settings=settings)
    for step in range(5):
        run.log({"loss": 1.0}, step=step)
    bad(run)
    for step in range(6, 10):
        run.log({"loss": 1.0}, step=step)
    run.finish(timeout=5)
    steps = stored("limits-1", "loss")
    assert sorted(set(steps.tolist()) - {5}) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert Run.objects.get(public_id="limits-1").status == "finished"
    assert not list(spool_dir.rglob("*.json")), "nothing left in the spool"


def test_hostile_create_values_do_not_cost_the_run(live_server, fast_settings, spool_dir):
    # Each of these alone made the server refuse the create, and the whole run with it.
    run = runcast.init(
        project="live",
        id="hostile-1",
        name="n\x00" + "x" * 300 + "\udc80",
        total_steps=0,
        config={"clip": float("inf"), "p\x00": "a\x00b", "vocab": ["w" * 100] * 5_000},
        tags=[f"t{i}\x00" for i in range(100)],
        world_size=0,
        deadline="no such deadline, not a slug",
        settings=fast_settings(live_server.url),
    )
    for step in range(10):
        run.log({"loss": 1.0}, step=step)
    run.finish(timeout=5)
    assert stored("hostile-1", "loss").tolist() == list(range(10))
    saved = Run.objects.get(public_id="hostile-1")
    assert saved.status == "finished" and len(saved.name) == 200 and len(saved.tags) == 64
    assert saved.config == {"clip": "Infinity", "p": "ab"}
    assert not list(spool_dir.rglob("*.json")), "nothing left in the spool"


def test_a_paced_client_sends_fewer_larger_batches_and_loses_nothing(
    live_server, fast_settings, settings
):
    from tracker import pacing
    from tracker.models import IngestBatch

    # One live run against a budget of half a batch a second: the server asks for 2 s.
    settings.RUNCAST_INGEST_BATCHES_PER_S = 0.5
    settings.RUNCAST_FLUSH_INTERVAL_MAX_S = 10.0
    pacing.forget()
    client_settings = fast_settings(live_server.url)  # flush_interval 0.05 s of its own
    run = runcast.init(project="live", id="paced-1", settings=client_settings)
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < 3.0:
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        step += 1
        time.sleep(0.01)
    assert run._sender.flush_interval == 2.0
    run.finish()
    pacing.forget()
    assert stored("paced-1", "loss").tolist() == list(range(step))
    # ~60 batches at its own 0.05 s; the first answer paces it, then about one per 2 s and the
    # last at finish().
    assert IngestBatch.objects.filter(run__public_id="paced-1").count() <= 5
