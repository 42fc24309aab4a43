"""Hostile bodies against /api/v1/: each is refused with a 4xx naming the field (or the limit)
and stores nothing, or is stored exactly once. Run on PostgreSQL in CI (.ci/run): jsonb is where
a lone surrogate used to answer 500 ("invalid input syntax for type json").

The older cases (out-of-range times and steps, NUL, NaN, the 50 MB body, 1,001 keys) live in
tests/tracker/test_ingest_api.py; this module holds the rest of the hostile set.
"""

from __future__ import annotations

import gzip
import json

import pytest

from tracker import limits
from tracker.models import Event, Host, IngestBatch, MetricChunk, Run

pytestmark = pytest.mark.django_db

# A JSON escape, as a client would send it: json.loads turns it into an unpaired code point.
LONE = "\\udc00"


def post_raw(api, token: str, path: str, raw: str | bytes):
    data = raw.encode() if isinstance(raw, str) else raw
    return api("POST", path, token, raw=data)


def create(api, token: str, run_id: str = "run-1", **extra):
    body = {"id": run_id, "session": "s1", "name": "pretrain", "total_steps": 1000, **extra}
    return api("POST", "/runs", token, body)


@pytest.mark.parametrize(
    ("fragment", "field"),
    [
        (f'"tags": ["ok", "{LONE}"]', "tags[1]"),
        ('"tags": ["\\ud800"]', "tags[0]"),
        (f'"name": "a{LONE}b"', "name"),
        (f'"hosts": ["{LONE}"]', "hosts[0]"),
        (f'"deadline": "{LONE}"', "deadline"),
        (f'"project": "{LONE}"', "project"),
        (f'"config": {{"lr": "{LONE}"}}', "config"),
        (f'"config": {{"{LONE}": 1}}', "config"),
        (f'"config": {{"deep": [{{"x": ["{LONE}"]}}]}}', "config"),
    ],
)
def test_it_refuses_a_lone_surrogate_on_create_naming_the_field(api, write_token, fragment, field):
    raw = '{"id": "r", "session": "s", ' + fragment + "}"
    res = post_raw(api, write_token, "/runs", raw)
    assert res.status_code == 400, res.content
    assert res.json()["field"] == field
    assert "surrogate" in res.json()["error"]
    assert Run.objects.count() == 0


def test_a_valid_surrogate_pair_is_an_ordinary_character(api, write_token):
    # "\ud83d\ude80" is one code point (a rocket): text, stored and read back as sent.
    raw = (
        '{"id": "r", "session": "s", "tags": ["\\ud83d\\ude80"], "config": {"k": "\\ud83d\\ude80"}}'
    )
    res = post_raw(api, write_token, "/runs", raw)
    assert res.status_code == 201, res.content
    run = Run.objects.get()
    assert run.tags == ["\U0001f680"] and run.config == {"k": "\U0001f680"}


@pytest.mark.parametrize(
    ("fragment", "field"),
    [
        (f'"events": [{{"kind": "custom", "payload": {{"note": "{LONE}"}}}}]', "events[0].payload"),
        (f'"events": [{{"kind": "custom", "payload": {{"{LONE}": 1}}}}]', "events[0].payload"),
        (f'"metrics": {{"{LONE}": {{"steps": [1], "values": [1.0]}}}}', "metrics"),
    ],
)
def test_it_refuses_a_lone_surrogate_in_a_batch_naming_the_field(api, write_token, fragment, field):
    create(api, write_token)
    raw = '{"session": "s1", "seq": 1, ' + fragment + "}"
    res = post_raw(api, write_token, "/runs/run-1/batches", raw)
    assert res.status_code == 400, res.content
    assert res.json()["field"] == field
    assert MetricChunk.objects.count() == Event.objects.count() == IngestBatch.objects.count() == 0


def test_it_refuses_a_lone_surrogate_in_a_finish_session(api, write_token):
    create(api, write_token)
    res = post_raw(api, write_token, "/runs/run-1/finish", f'{{"session": "{LONE}"}}')
    assert res.status_code == 400, res.content
    assert res.json()["field"] == "session"
    assert Run.objects.get().status == "running"


def test_it_does_not_inflate_a_gzip_bomb(api, write_token):
    """The API takes plain JSON only: a gzip body is never inflated, so 10 MB of zeros packed
    into ~10 kB costs the server the 10 kB it reads and a parse error."""
    create(api, write_token)
    bomb = gzip.compress(b"0" * 10_000_000, compresslevel=9)
    assert len(bomb) < 20_000
    res = api(
        "POST",
        "/runs/run-1/batches",
        write_token,
        raw=bomb,
    )
    assert res.status_code == 400, res.content
    assert "error" in res.json()
    assert IngestBatch.objects.count() == 0


def test_it_ignores_a_content_encoding_header(client, write_token):
    bomb = gzip.compress(json.dumps({"id": "r", "session": "s"}).encode())
    res = client.post(
        "/api/v1/runs",
        data=bomb,
        content_type="application/json",
        HTTP_CONTENT_ENCODING="gzip",
        HTTP_AUTHORIZATION=f"Bearer {write_token}",
    )
    assert res.status_code == 400, res.content
    assert Run.objects.count() == 0


@pytest.mark.parametrize("depth", [limits.MAX_JSON_DEPTH + 1, 100_000])
def test_it_refuses_deep_nesting_in_the_config(api, write_token, depth):
    raw = '{"id": "r", "session": "s", "config": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    res = post_raw(api, write_token, "/runs", raw)
    assert res.status_code == 400, res.content[:300]
    assert Run.objects.count() == 0


def test_it_keeps_moderate_nesting_in_the_config(api, write_token):
    raw = '{"id": "r", "session": "s", "config": ' + '{"a": ' * 20 + "1" + "}" * 20 + "}"
    assert post_raw(api, write_token, "/runs", raw).status_code == 201


def test_it_refuses_deep_nesting_in_an_event_payload(api, write_token):
    create(api, write_token)
    depth = 100_000
    payload = "[" * depth + "]" * depth
    raw = '{"session": "s1", "seq": 1, "events": [{"kind": "custom", "payload": {"x": ' + payload
    raw += "}}]}"
    res = post_raw(api, write_token, "/runs/run-1/batches", raw)
    assert res.status_code == 400, res.content[:300]
    assert IngestBatch.objects.count() == 0


def test_it_refuses_10000_metric_keys_naming_the_limit(api, write_token):
    create(api, write_token)
    metrics = {f"k{i}": {"steps": [1], "values": [1.0]} for i in range(10_000)}
    res = api(
        "POST", "/runs/run-1/batches", write_token, {"session": "s1", "seq": 1, "metrics": metrics}
    )
    assert res.status_code == 413
    assert "MAX_KEYS_PER_BATCH" in res.json()["error"] and res.json()["field"] == "metrics"
    assert MetricChunk.objects.count() == 0


def test_it_refuses_10000_keys_in_a_config_over_its_size_limit(api, write_token):
    config = {f"key-{i:05d}-{'x' * 20}": i for i in range(10_000)}
    assert len(json.dumps(config)) > limits.MAX_CONFIG_BYTES
    res = create(api, write_token, config=config)
    assert res.status_code == 400 and res.json()["field"] == "config"
    assert "MAX_CONFIG_BYTES" in res.json()["error"]


def test_it_refuses_10000_keys_in_an_event_payload_over_its_size_limit(api, write_token):
    create(api, write_token)
    payload = {f"k{i}": i for i in range(10_000)}
    body = {"session": "s1", "seq": 1, "events": [{"kind": "custom", "payload": payload}]}
    res = api("POST", "/runs/run-1/batches", write_token, body)
    assert res.status_code == 413 and res.json()["field"] == "events[0].payload"
    assert Event.objects.count() == 0


def test_a_duplicate_seq_with_other_content_changes_nothing(api, write_token):
    """(session, seq) is the batch's identity: a second body under it, whatever it holds, is a
    retry and is acknowledged without storing anything (a replayed spool never doubles data)."""
    create(api, write_token)
    first = {
        "session": "s1",
        "seq": 7,
        "metrics": {"loss": {"steps": [1, 2], "values": [3.0, 2.5]}},
    }
    res = api("POST", "/runs/run-1/batches", write_token, first)
    assert res.json() == {"accepted": 2, "duplicate": False}
    other = {
        "session": "s1",
        "seq": 7,
        "metrics": {
            "loss": {"steps": [3], "values": [9.0]},
            "acc": {"steps": [3], "values": [1.0]},
        },
        "events": [{"kind": "checkpoint", "step": 3}],
        "heartbeat": 1.8e9,
    }
    res = api("POST", "/runs/run-1/batches", write_token, other)
    assert res.status_code == 200
    assert res.json() == {"accepted": 0, "duplicate": True}
    run = Run.objects.get()
    assert run.last_step == 2 and run.points_count == 2
    assert list(MetricChunk.objects.values_list("key", flat=True)) == ["loss"]
    assert Event.objects.count() == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe{not utf-8}",
        b'{"session": "s1", "seq": 1e400}',
        b'{"session": "s1", "seq": -1}',
        b'{"session": "s1", "seq": 18446744073709551616}',
        b"[]",
        b"null",
        b'"just a string"',
    ],
)
def test_it_answers_400_to_malformed_batches(api, write_token, raw):
    create(api, write_token)
    res = api("POST", "/runs/run-1/batches", write_token, raw=raw)
    assert res.status_code == 400, res.content[:300]
    assert "error" in res.json()
    assert IngestBatch.objects.count() == 0


def test_it_refuses_a_lone_surrogate_in_a_hosts_gpu_list_naming_the_field(api, write_token):
    # Found by the fuzzer: the agent's free-form GPU descriptions went to jsonb unchecked (500).
    raw = f'{{"host": "node-1", "session": "a1", "gpus": [{{"name": "{LONE}"}}]}}'
    res = post_raw(api, write_token, "/hosts", raw)
    assert res.status_code == 400, res.content
    assert res.json()["field"] == "gpus"
    assert not Host.objects.exists()


def test_it_refuses_a_lone_surrogate_in_a_host_batch_event_naming_the_field(api, write_token):
    assert (
        post_raw(api, write_token, "/hosts", '{"host": "node-1", "session": "a1"}').status_code
        == 201
    )
    raw = (
        '{"session": "a1", "seq": 1, "events": [{"kind": "custom", "payload": '
        f'{{"name": "process", "pid": 7, "key": ["b", 7, 9], "cmdline": "{LONE}"}}}}]}}'
    )
    res = post_raw(api, write_token, "/hosts/node-1/batches", raw)
    assert res.status_code == 400, res.content
    assert res.json()["field"] == "events[0].payload"
