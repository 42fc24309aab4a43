"""The live mirror of an MLflow server (tracker.mlflow.mirror) against a real `mlflow server`
(SQLite backend) with trainings logging to it through the stock client while the mirror syncs."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from forecasting.compute import forecast_compute
from forecasting.models import Forecast
from tracker import selectors
from tracker.mlflow import mirror as mirror_module
from tracker.mlflow.mirror import mirror_configure, mirror_sync_one
from tracker.mlflow.models import Experiment, Mirror, MirroredRun
from tracker.models import Project, Run

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
T0 = 1_760_000_000_000


@pytest.fixture
def source(mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The stock client on the MLflow server, as a trainer has it."""
    from mlflow import MlflowClient

    for name in [k for k in os.environ if k.startswith("MLFLOW_")]:
        monkeypatch.delenv(name)
    return MlflowClient(tracking_uri=mlflow_server)


def _log(client: Any, run_id: str, key: str, steps: range, t0: int = T0) -> None:
    from mlflow.entities import Metric

    metrics = [Metric(key, 1.0 / (s + 1), t0 + s, s) for s in steps]
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])


def _stored(run_id: str, key: str) -> Any:
    return selectors.series_load(run=Run.objects.get(public_id=run_id), key=key, resolve=False)


def _mirror(project: Project, url: str, experiment: str) -> Mirror:
    # The command's path (an operator's URL): the test server listens on loopback.
    return mirror_configure(project=project, url=url, experiment_name=experiment, operator=True)


def _sync(mirror: Mirror, **kwargs: Any) -> mirror_module.SyncSummary:
    summary = mirror_sync_one(mirror_id=mirror.pk, **kwargs)
    mirror.refresh_from_db()
    assert summary is not None, mirror.last_error
    return summary


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """What the forecasting receivers enqueue after ingestion commits (run pk, immediate)."""
    from forecasting import receivers

    calls: list[tuple[int, bool]] = []
    monkeypatch.setattr(
        receivers,
        "forecast_enqueue",
        lambda *, run_id, immediate=False: calls.append((run_id, immediate)),
    )
    return calls


def test_it_follows_a_live_training(
    source: Any,
    ml_project: Project,
    mlflow_server: str,
    enqueued: list[tuple[int, bool]],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    exp_id = source.create_experiment("live", tags={"team": "nlp"})
    mirror = _mirror(ml_project, mlflow_server, "live")
    run = source.create_run(exp_id, run_name="bert")
    run_id = run.info.run_id
    source.log_param(run_id, "max_steps", "600")
    logged = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    def train() -> None:
        # The trainer: the stock client, points at its own pace with real timestamps.
        from mlflow.entities import Metric

        try:
            for start in range(0, 600, 20):
                now = int(time.time() * 1000)
                batch = [Metric("loss", 2.0 / (s + 1), now, s) for s in range(start, start + 20)]
                batch += [Metric("lr", 3e-4, now, s) for s in range(start, start + 20)]
                source.log_batch(run_id, metrics=batch)
                logged.set()
                if stop.wait(0.05):
                    return
            source.set_terminated(run_id, "FINISHED")
        except BaseException as e:  # surfaced by the test, not lost in the thread
            errors.append(e)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        assert logged.wait(30)
        with django_capture_on_commit_callbacks(execute=True):
            first = _sync(mirror)
        assert first.runs_created == 1 and first.points_copied > 0
        copied = Run.objects.get(public_id=run_id)
        # Live here while it is RUNNING on MLflow, under its MLflow name and experiment.
        assert copied.status == "running" and copied.name == "bert"
        assert copied.mlflow.experiment.name == "live"
        assert copied.total_steps == 600
        assert Experiment.objects.get(project=ml_project, name="live").tags == {"team": "nlp"}
        # Imported points go through the ingestion that triggers forecasts.
        assert (copied.pk, False) in enqueued
        forecast_compute(run_id=copied.pk)  # what the worker runs for the enqueued forecast
        eta = Forecast.objects.filter(run=copied, kind=Forecast.Kind.ETA).order_by("-id").first()
        assert eta is not None and eta.input_last_step == _stored(run_id, "loss").steps.max()
        assert eta.finish_p50 is not None
        syncs = 1
        with django_capture_on_commit_callbacks(execute=True):
            while trainer.is_alive() and syncs < 200:
                _sync(mirror)
                syncs += 1
        trainer.join(60)
    finally:
        stop.set()
        trainer.join(60)
    assert not errors, errors
    assert syncs > 2, "the training ended before the mirror saw it live"
    with django_capture_on_commit_callbacks(execute=True):
        last = _sync(mirror)
    copied.refresh_from_db()
    # The end propagates as the API's own end_run: finished, and a forecast at once.
    assert copied.status == "finished"
    assert copied.mlflow.end_time_ms == source.get_run(run_id).info.end_time
    assert (copied.pk, True) in enqueued
    for key in ("loss", "lr"):
        steps = _stored(run_id, key).steps
        assert np.array_equal(np.sort(steps), np.arange(600)), key
    assert copied.points_count == 1200
    assert MirroredRun.objects.get(mirror=mirror).complete
    assert mirror.points_copied == 1200 and mirror.runs_created == 1 and not mirror.last_error
    assert last.runs_seen == 1

    # Idempotent, and an ended run wholly copied is not fetched again.
    again = _sync(mirror)
    assert (again.points_copied, again.runs_created, again.pages) == (0, 0, 0)
    assert again.runs_unchanged == 1


def test_a_live_key_is_fetched_from_its_cursor_not_from_the_start(
    source: Any, ml_project: Project, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror_module, "HISTORY_PAGE", 500)
    exp_id = source.create_experiment("cursor")
    mirror = _mirror(ml_project, mlflow_server, "cursor")
    run_id = source.create_run(exp_id).info.run_id
    _log(source, run_id, "loss", range(2200))
    first = _sync(mirror)
    assert (first.points_copied, first.pages) == (2200, 5)

    # Nothing new: MLflow's latest point is the one the cursor saw, no history is read.
    idle = _sync(mirror)
    assert (idle.points_copied, idle.pages, idle.keys_fetched) == (0, 0, 0)

    _log(source, run_id, "loss", range(2200, 2300))
    tick = _sync(mirror)
    # One page from where the copy stood (its 200 copied points and the 100 new), not five.
    assert (tick.points_copied, tick.points_present, tick.pages) == (100, 0, 1)

    # A point logged later with an older timestamp lands before the cursor in MLflow's order:
    # the page no longer starts where it did, so the key is walked again and only it is new.
    source.log_metric(run_id, "loss", 0.5, timestamp=T0 - 1000, step=5000)
    rewalk = _sync(mirror)
    assert rewalk.rewalks == 1 and rewalk.points_copied == 1
    steps = _stored(run_id, "loss").steps
    assert steps.size == 2301 and 5000 in steps.tolist()


def test_an_interrupted_sync_resumes(
    source: Any, ml_project: Project, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror_module, "HISTORY_PAGE", 1000)
    exp_id = source.create_experiment("interrupted")
    mirror = _mirror(ml_project, mlflow_server, "interrupted")
    run_id = source.create_run(exp_id).info.run_id
    _log(source, run_id, "loss", range(2500))
    source.set_terminated(run_id, "FAILED")

    real = mirror_module.services.run_log
    calls = 0

    def crash_on_second_page(**kwargs: Any) -> Any:
        nonlocal calls
        if kwargs["metrics"]:
            calls += 1
            if calls == 2:
                raise KeyboardInterrupt  # a worker killed mid-sync
        return real(**kwargs)

    monkeypatch.setattr(mirror_module.services, "run_log", crash_on_second_page)
    with pytest.raises(KeyboardInterrupt):
        mirror_sync_one(mirror_id=mirror.pk)
    mirror.refresh_from_db()
    assert mirror.lease_until is None  # released: the next tick may go on
    assert _stored(run_id, "loss").steps.size == 1000
    assert Run.objects.get(public_id=run_id).status == "running"  # not ended half-copied

    monkeypatch.setattr(mirror_module.services, "run_log", real)
    resumed = _sync(mirror)
    assert (resumed.points_copied, resumed.runs_created) == (1500, 0)
    assert np.array_equal(np.sort(_stored(run_id, "loss").steps), np.arange(2500))
    assert Run.objects.get(public_id=run_id).status == "failed"

    # A sync out of time leaves the rest to the next tick.
    late = source.create_run(exp_id).info.run_id
    _log(source, late, "loss", range(10))
    partial = _sync(mirror, budget_s=0.0)
    assert not partial.complete and partial.points_copied == 0
    assert _sync(mirror).points_copied == 10


def test_a_resumed_mlflow_run_is_live_again(
    source: Any, ml_project: Project, mlflow_server: str
) -> None:
    exp_id = source.create_experiment("resumed")
    mirror = _mirror(ml_project, mlflow_server, "resumed")
    run_id = source.create_run(exp_id).info.run_id
    _log(source, run_id, "loss", range(100))
    source.set_terminated(run_id, "KILLED")
    _sync(mirror)
    assert Run.objects.get(public_id=run_id).status == "crashed"
    source.update_run(run_id, status="RUNNING")  # start_run(run_id=...) on the trainer's side
    _log(source, run_id, "loss", range(100, 150), t0=T0 + 10_000)
    _sync(mirror)
    run = Run.objects.get(public_id=run_id)
    assert run.status == "running" and run.mlflow.attempt == 2
    assert _stored(run_id, "loss").steps.size == 150


class _Relay:
    """A TCP relay in front of the MLflow server that a test can take down and bring back,
    as a server restart or a network cut would (the server itself keeps its data)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.up = True
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self._stop = False
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            if not self.up:
                client.close()  # refused as a dead server's port is
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        self.listener.close()
        # Open connections would hold the MLflow server's graceful shutdown.
        for sock in self._open:
            sock.close()


@pytest.fixture
def relay(mlflow_server: str) -> Iterator[_Relay]:
    r = _Relay(int(mlflow_server.rsplit(":", 1)[1]))
    yield r
    r.close()


def test_a_dead_server_is_recorded_without_the_token_and_the_next_tick_recovers(
    source: Any, ml_project: Project, relay: _Relay, caplog: pytest.LogCaptureFixture
) -> None:
    token = "mirror-secret-token-0123456789"
    exp_id = source.create_experiment("outage")
    url = f"http://127.0.0.1:{relay.port}"
    mirror = mirror_configure(
        project=ml_project, url=url, experiment_name="outage", token=token, operator=True
    )
    run_id = source.create_run(exp_id).info.run_id
    _log(source, run_id, "loss", range(300))
    assert _sync(mirror).points_copied == 300

    relay.up = False
    _log(source, run_id, "loss", range(300, 400))
    with caplog.at_level(logging.INFO):
        assert mirror_sync_one(mirror_id=mirror.pk) is None
    mirror.refresh_from_db()
    assert mirror.last_error.startswith(f"MLflow server {url}: ")
    assert mirror.failures == 1 and mirror.lease_until is None
    assert token not in mirror.last_error and token not in caplog.text
    assert url in caplog.text

    relay.up = True
    assert _sync(mirror).points_copied == 100
    assert mirror.last_error == "" and mirror.failures == 1
    assert _stored(run_id, "loss").steps.size == 400


def test_an_address_that_is_not_mlflow_is_named(
    source: Any, ml_project: Project, mlflow_server: str
) -> None:
    mirror = mirror_configure(
        project=ml_project, url=f"{mlflow_server}/not-mlflow", operator=True, token="t" * 20
    )
    assert mirror_sync_one(mirror_id=mirror.pk) is None
    mirror.refresh_from_db()
    # An address that is not a tracking server says so (the token is never part of it).
    assert "404" in mirror.last_error and "t" * 20 not in mirror.last_error


def test_a_missing_experiment_is_recorded(
    source: Any, ml_project: Project, mlflow_server: str
) -> None:
    mirror = _mirror(ml_project, mlflow_server, "no-such-experiment")
    assert mirror_sync_one(mirror_id=mirror.pk) is None
    mirror.refresh_from_db()
    assert "no-such-experiment" in mirror.last_error


def test_a_claimed_mirror_is_not_synced_twice(
    source: Any, ml_project: Project, mlflow_server: str
) -> None:
    mirror = _mirror(ml_project, mlflow_server, "")
    held = mirror_module.mirror_claim(mirror_id=mirror.pk)
    assert held is not None
    assert mirror_module.mirror_claim(mirror_id=mirror.pk) is None
    assert mirror_sync_one(mirror_id=mirror.pk) is None  # the tick leaves it to the holder
    mirror_module.mirror_release(mirror=held)
    Mirror.objects.filter(pk=mirror.pk).update(enabled=False)
    assert mirror_module.mirror_claim(mirror_id=mirror.pk) is None
    assert mirror_module.mirror_ids_enabled() == []


@pytest.mark.eager
def test_the_beat_task_syncs_every_enabled_mirror_and_a_second_run_copies_nothing(
    source: Any, ml_project: Project, mlflow_server: str
) -> None:
    from config.celery import beat_schedule
    from tracker.mlflow import tasks

    exp_id = source.create_experiment("beat")
    mirror = _mirror(ml_project, mlflow_server, "beat")
    run_id = source.create_run(exp_id).info.run_id
    _log(source, run_id, "loss", range(50))
    tasks.mirrors_sync.delay()
    tasks.mirrors_sync.delay()
    mirror.refresh_from_db()
    assert _stored(run_id, "loss").steps.size == 50
    assert (mirror.syncs, mirror.points_copied, mirror.runs_created) == (2, 50, 1)
    entry = beat_schedule(sweep_period_s=60.0)["sync-mlflow-mirrors"]
    assert entry["task"] == "tracker.mlflow.tasks.mirrors_sync"
    assert entry["options"]["expires"] < entry["schedule"] <= 15.0
