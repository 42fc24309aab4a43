"""The client's copy of the server contract equals the server's.

The client is a separate, Django-free package, so it keeps its own constants
(runcast.batcher, runcast.run, runcast.settings). These tests import both sides and fail
when one side moves without the other: a limit the client does not know costs a whole
batch (400/413, dropped), a value the client refuses but the server takes is data lost.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import time
import uuid
from pathlib import Path
from typing import Any, get_args

import pytest
import runcast
from pydantic import TypeAdapter, ValidationError
from runcast import batcher
from runcast import create as create_module
from runcast.run import RUN_ID_PATTERN, STATUSES, UNITS
from runcast.settings import DEFAULT_BATCH_POINTS, DEFAULT_MAX_BODY_BYTES, Settings, resolve

from tracker import limits
from tracker.api import schemas
from tracker.api.parsing import events_from_batch, json_check, series_from_batch
from tracker.models import Event, Run
from tracker.services import ServiceError


def _literal(schema: type, field: str) -> set[str]:
    return set(get_args(schema.model_fields[field].annotation))


# -- enumerations -------------------------------------------------------------------


def test_event_kinds_are_the_servers() -> None:
    assert set(batcher.EVENT_KINDS) == set(Event.Kind.values)
    assert set(batcher.EVENT_KINDS) == _literal(schemas.EventPayload, "kind")


def test_finish_statuses_are_the_servers() -> None:
    assert set(STATUSES) == _literal(schemas.FinishIn, "status")
    assert set(STATUSES) <= set(Run.Status.values)


def test_progress_units_are_the_servers() -> None:
    assert set(UNITS) == _literal(schemas.RunCreateIn, "progress_unit")
    assert set(UNITS) == set(Run.Unit.values)


def test_run_id_pattern_is_the_servers() -> None:
    assert f"^{RUN_ID_PATTERN.pattern}$" == schemas.RUN_ID_PATTERN


# -- limits -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "MAX_ABS_STEP",
        "MIN_EPOCH_S",
        "MAX_EPOCH_S",
        "MAX_KEY_LENGTH",
        "MAX_KEYS_PER_BATCH",
        "MAX_EVENTS_PER_BATCH",
        "MAX_EVENT_PAYLOAD_BYTES",
    ],
)
def test_shared_limit_equals_the_servers(name: str) -> None:
    assert getattr(batcher, name, None) == getattr(limits, name)


def test_batches_are_split_below_the_servers_limits() -> None:
    assert DEFAULT_BATCH_POINTS <= limits.MAX_POINTS_PER_BATCH
    # Whatever RUNCAST_BATCH_POINTS asks for is clamped below the server's limit.
    assert resolve(Settings(batch_points=10**9), {}).batch_points <= limits.MAX_POINTS_PER_BATCH
    assert DEFAULT_MAX_BODY_BYTES <= limits.MAX_REQUEST_BYTES


# -- the same values accepted on both sides -------------------------------------------


def _client_takes_step(step: int) -> bool:
    return batcher.Batcher("s", 10, 10**6)._step(step) is not None


def _server_takes(adapter: TypeAdapter, value: Any) -> bool:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(
    "step",
    [
        -(2**62) - 1,
        -(2**62),
        -1,
        0,
        1,
        2**62,
        2**62 + 1,
        2**63,
    ],
)
def test_steps_are_accepted_alike(step: int) -> None:
    assert _client_takes_step(step) == _server_takes(TypeAdapter(schemas.Step), step)


@pytest.mark.parametrize(
    "when",
    [-1.0, -0.0, 0.0, 1.7e9, 2.0**32, 2.0**32 + 1, 1.7e12, math.nan, math.inf, -math.inf],
)
def test_times_are_accepted_alike(when: float) -> None:
    client = batcher.Batcher("s", 10, 10**6)._valid_time(when)
    assert client == _server_takes(TypeAdapter(schemas.EpochSeconds), when)


def _server_takes_key(key: str) -> bool:
    try:
        schemas.BatchIn(session="s", seq=1, metrics={key: {"steps": [], "values": []}})
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(
    "key",
    ["", "loss", "x" * limits.MAX_KEY_LENGTH, "x" * (limits.MAX_KEY_LENGTH + 1), "a\nb", "a\x00b"],
)
def test_metric_keys_are_accepted_alike(key: str) -> None:
    client = batcher.Batcher("s", 10, 10**6)._valid_key(key)
    assert client == _server_takes_key(key)


def _server_takes_event(event: dict) -> bool:
    try:
        payload = schemas.BatchIn(session="s", seq=1, events=[event])
        events_from_batch(payload)
    except (ValidationError, ServiceError):
        return False
    return True


def _client_event(kind: str, payload: dict, step: int | None = 1) -> dict | None:
    """What the client puts on the wire for run.event(kind, step, **payload); None if skipped."""
    client = batcher.Batcher("s", 10, 10**6)
    client.add(step, 1.7e9, batcher.Event(kind, payload))
    client.seal()
    (sealed,) = client.take_sealed() or [None]
    if sealed is None:
        return None
    (event,) = json.loads(sealed.body)["events"]
    return event


@pytest.mark.parametrize("kind", sorted(Event.Kind.values))
def test_every_server_kind_is_sent_as_itself(kind: str) -> None:
    event = _client_event(kind, {"x": 1})
    assert event is not None and event["kind"] == kind and event["payload"] == {"x": 1}
    assert _server_takes_event(event)


_NEAR_LIMIT = "x" * (limits.MAX_EVENT_PAYLOAD_BYTES - len('{"blob": ""}'))


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({"path": "/ckpt/100"}, id="plain"),
        pytest.param({"blob": _NEAR_LIMIT}, id="at-size-limit"),
        pytest.param({"blob": _NEAR_LIMIT + "x"}, id="over-size-limit"),
        pytest.param({"loss": math.nan}, id="nan-value"),
        pytest.param({"loss": [1.0, math.inf]}, id="nested-inf"),
        pytest.param({"path": "a\x00b"}, id="nul-in-string"),
        pytest.param({"a\x00b": 1}, id="nul-in-key"),
        pytest.param({"nested": {"deep": ["ok", {"x": "fine"}]}}, id="nested-ok"),
    ],
)
def test_event_payloads_are_accepted_alike(payload: dict) -> None:
    event = _client_event("eval", payload)
    server = _server_takes_event({"kind": "eval", "step": 1, "time": 1.7e9, "payload": payload})
    assert (event is not None) == server
    if event is not None:
        assert _server_takes_event(event)


# -- whole requests the client builds validate as the server's schemas ----------------


def test_a_client_batch_validates_as_the_servers() -> None:
    client = batcher.Batcher(uuid.uuid4().hex, 10_000, DEFAULT_MAX_BODY_BYTES)
    for step in (-5, 0, 1, 2**62):
        client.add(step, 1.7e9 + step % 7, {"loss": 0.5, "acc": math.nan, "x" * 200: 1})
    for kind in [*sorted(Event.Kind.values), "user_kind"]:
        client.add(3, 1.7e9, batcher.Event(kind, {"path": Path("/a")}))
    client.seal(heartbeat=1.7e9)
    (sealed,) = client.take_sealed()
    payload = schemas.BatchIn.model_validate_json(sealed.body)
    series = series_from_batch(payload)
    events = events_from_batch(payload)
    assert sum(s.steps.size for s in series) == 12
    assert [e.kind for e in events] == [*sorted(Event.Kind.values), "custom"]
    assert client.skipped == 0


@pytest.mark.parametrize("status", STATUSES)
def test_create_and_finish_bodies_validate_as_the_servers(tmp_path: Path, status: str) -> None:
    run = runcast.init(
        project="llm",
        name="n",
        total_steps=100,
        config={"lr": 3e-4, "path": Path("/d")},
        tags=["a"],
        unit="tokens",
        world_size=8,
        mode="offline",
        dir=tmp_path,
    )
    assert isinstance(run, runcast.Run)
    run.finish(status=status)
    (folder,) = (p.parent for p in tmp_path.rglob("create.json"))
    create = schemas.RunCreateIn.model_validate_json((folder / "create.json").read_bytes())
    finish = schemas.FinishIn.model_validate_json((folder / "finish.json").read_bytes())
    assert create.id == run.id and create.session == run.session
    assert finish.status == status and finish.session == run.session


# -- a create the server would refuse blocks the whole run: init() must never send one --


def _server_takes_create(body: bytes) -> bool:
    """Every check tracker.api.views.run_create makes before it writes (bar the token's project
    and whether the deadline exists, which only the database knows)."""
    try:
        create = schemas.RunCreateIn.model_validate_json(body)
        json_check(create.config, field="config")
        if len(json.dumps(create.config, default=str)) > limits.MAX_CONFIG_BYTES:
            return False
    except (ValidationError, ServiceError):
        return False
    # Deadline slugs are only ever made by slugify(): anything else can never be found.
    return create.deadline is None or bool(re.fullmatch(r"[-a-zA-Z0-9_]{1,64}", create.deadline))


def _client_create(tmp_path: Path, **kwargs: Any) -> dict:
    """The create body runcast.init(**kwargs) puts on the wire, checked against the server."""
    run = runcast.init(id="contract-1", mode="offline", dir=tmp_path, **kwargs)
    assert isinstance(run, runcast.Run), "a bad optional value must not cost the run"
    run.finish()
    (path,) = tmp_path.rglob("create.json")
    body = path.read_bytes()
    assert _server_takes_create(body), body[:300]
    return json.loads(body)


def test_create_limits_are_the_servers() -> None:
    assert create_module.MAX_TAGS == limits.MAX_TAGS
    assert create_module.MAX_HOSTS == limits.MAX_HOSTS
    assert create_module.MAX_CONFIG_BYTES == limits.MAX_CONFIG_BYTES
    assert create_module.MAX_HEARTBEAT_INTERVAL_S == limits.MAX_HEARTBEAT_INTERVAL_S


def test_an_online_run_declares_the_heartbeat_it_sends_and_an_offline_one_none(
    server: Any, make_settings: Any, tmp_path: Path
) -> None:
    # Online, the sender beats every RUNCAST_HEARTBEAT_INTERVAL s while the process lives: the
    # server may take a young run silent for several of them for dead.
    run = runcast.init(settings=make_settings(server.url, heartbeat_interval=15.0))
    run.finish()
    body = server.state.runs[run.id].body
    assert body["heartbeat_interval"] == 15.0
    assert _server_takes_create(json.dumps(body).encode())
    # Offline, nothing beats: `runcast sync` delivers the spool whenever it is run.
    assert _client_create(tmp_path / "offline", settings=Settings())["heartbeat_interval"] is None
    # An interval the server would refuse is not declared (the run is judged without one).
    for interval in (0.0, -1.0, math.nan, limits.MAX_HEARTBEAT_INTERVAL_S * 2):
        assert create_module.heartbeat_interval(interval, online=True) is None


_CONFIG_AT_LIMIT = {"blob": "x" * (limits.MAX_CONFIG_BYTES - len('{"blob": ""}'))}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"name": "n" * 200}, {"name": "n" * 200}, id="name-at-limit"),
        pytest.param({"tags": [str(i) for i in range(64)]}, {"tags": [str(i) for i in range(64)]}),
        pytest.param({"world_size": 10_000_000}, {"world_size": 10_000_000}, id="world-at-limit"),
        pytest.param({"total_steps": 2**62}, {"total_steps": 2**62}, id="steps-at-limit"),
        pytest.param({"deadline": "d" * 64}, {"deadline": "d" * 64}, id="deadline-at-limit"),
        pytest.param({"config": _CONFIG_AT_LIMIT}, {"config": _CONFIG_AT_LIMIT}, id="config-limit"),
        pytest.param({"started_at": 1.7e9}, {"started_at": 1.7e9}, id="started-at"),
        pytest.param({"started_at": 2.0**32}, {"started_at": 2.0**32}, id="started-at-limit"),
        pytest.param({"started_at": 1_700_000_000}, {"started_at": 1.7e9}, id="started-at-int"),
    ],
)
def test_values_the_server_takes_are_sent_unchanged(
    tmp_path: Path, kwargs: dict, expected: dict
) -> None:
    body = _client_create(tmp_path, **kwargs)
    assert {key: body[key] for key in expected} == expected


_CONVERTED_QUIETLY = {"name-not-str", "world-size-text", "tags-one-string"}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"total_steps": 0}, {"total_steps": None}, id="total-steps-zero"),
        pytest.param({"total_steps": -5}, {"total_steps": None}, id="total-steps-negative"),
        pytest.param({"total_steps": 2**62 + 1}, {"total_steps": None}, id="total-steps-huge"),
        pytest.param({"total_steps": math.inf}, {"total_steps": None}, id="total-steps-inf"),
        pytest.param({"total_steps": "lots"}, {"total_steps": None}, id="total-steps-text"),
        pytest.param({"name": "n" * 201}, {"name": "n" * 200}, id="name-too-long"),
        pytest.param({"name": "a\x00b"}, {"name": "ab"}, id="name-nul"),
        pytest.param({"name": 7}, {"name": "7"}, id="name-not-str"),
        pytest.param(
            {"tags": [str(i) for i in range(100)]},
            {"tags": [str(i) for i in range(64)]},
            id="too-many-tags",
        ),
        pytest.param({"tags": ["a\x00b", "c"]}, {"tags": ["ab", "c"]}, id="tag-nul"),
        pytest.param({"tags": ["t" * 10_000]}, {"tags": ["t" * 200]}, id="tag-too-long"),
        pytest.param({"tags": "baseline"}, {"tags": ["baseline"]}, id="tags-one-string"),
        pytest.param({"world_size": 0}, {"world_size": None}, id="world-size-zero"),
        pytest.param({"world_size": 10_000_001}, {"world_size": None}, id="world-size-huge"),
        pytest.param({"world_size": "8"}, {"world_size": 8}, id="world-size-text"),
        pytest.param({"world_size": "many"}, {"world_size": None}, id="world-size-junk"),
        pytest.param({"deadline": "d" * 65}, {"deadline": None}, id="deadline-too-long"),
        pytest.param({"deadline": "a\x00b"}, {"deadline": None}, id="deadline-nul"),
        pytest.param({"deadline": "Neurips 2026!"}, {"deadline": None}, id="deadline-not-slug"),
        pytest.param(
            {"config": {"lr": 0.1, "clip": math.inf, "bad": [math.nan, -math.inf]}},
            {"config": {"lr": 0.1, "clip": "Infinity", "bad": ["NaN", "-Infinity"]}},
            id="config-nan-inf",
        ),
        pytest.param(
            {"config": {"lr": 0.1, "p\x00th": {"x": "a\x00b"}}},
            {"config": {"lr": 0.1, "pth": {"x": "ab"}}},
            id="config-nul",
        ),
        pytest.param(
            {"config": {"lr": 0.1, "vocab": ["w" * 100] * 5_000, "opt": "adam"}},
            {"config": {"lr": 0.1, "opt": "adam"}},
            id="config-too-big",
        ),
        pytest.param(
            # Measured as the server measures it: json.dumps escapes non-ASCII (6 bytes each).
            {"config": {"lr": 0.1, "text": "é" * 50_000}},
            {"config": {"lr": 0.1}},
            id="config-too-big-escaped",
        ),
        pytest.param({"name": "ok\ud800"}, {"name": "ok?"}, id="name-lone-surrogate"),
    ],
)
def test_init_sends_what_the_server_takes_and_keeps_the_run(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
    kwargs: dict,
    expected: dict,
) -> None:
    base = {"name": "n", "total_steps": 10, "tags": ["keep"], "config": {"lr": 0.1}}
    body = _client_create(tmp_path, **{**base, **kwargs})
    assert {key: body[key] for key in expected} == expected
    # Everything else is sent as given.
    for key, value in base.items():
        if key not in kwargs:
            assert body[key] == value
    # One warning naming the field, unless the value was only converted (7 -> "7").
    (field,) = kwargs
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if request.node.callspec.id not in _CONVERTED_QUIETLY:
        assert [m for m in warnings if field in m], warnings
    assert len(warnings) <= 1, warnings


@pytest.mark.parametrize(
    "when",
    [-1.0, 0.0, 1.7e9, 2.0**32, 2.0**32 + 1, 1.7e12, math.nan, math.inf, -math.inf, 10**400],
    ids=lambda when: str(when)[:20],
)
def test_start_times_are_accepted_alike(when: float) -> None:
    now = 1.8e9
    client = create_module.started_at(when, now=now)
    server = _server_takes(TypeAdapter(schemas.EpochSeconds), when)
    assert client == (when if server else now)


@pytest.mark.parametrize(
    "started_at",
    [math.nan, math.inf, -1.0, 1.7e12, 2.0**32 + 1, "yesterday", [1.7e9]],
    ids=["nan", "inf", "negative", "milliseconds", "after-2106", "text", "list"],
)
def test_a_start_the_server_refuses_is_sent_as_now(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, started_at: Any
) -> None:
    before = time.time()
    body = _client_create(tmp_path, started_at=started_at)
    assert before <= body["started_at"] <= time.time()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "started_at" in warnings[0], warnings


def test_hosts_are_sent_as_the_server_takes_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "node\x00" + "x" * 300)
    body = _client_create(tmp_path)
    assert body["hosts"] == [("node" + "x" * 300)[:255]]


@pytest.mark.parametrize("project", ["a\x00b", "p" * 65, "my project", "llm\n"])
def test_init_refuses_a_project_that_cannot_exist(tmp_path: Path, project: str) -> None:
    # The project decides where the data goes: guessing another would misfile the run, so
    # init() refuses it the way it refuses a bad run id, before training starts.
    with pytest.raises(ValueError, match="project"):
        runcast.init(project=project, mode="offline", dir=tmp_path)
    assert not list(tmp_path.rglob("create.json"))
