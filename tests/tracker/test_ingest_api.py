from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tracker import limits, selectors
from tracker.models import ApiToken, Event, MetricChunk, Run

pytestmark = pytest.mark.django_db


def create(api, token, run_id="run-1", session="s1", **extra):
    body = {"id": run_id, "session": session, "name": "pretrain", "total_steps": 1000, **extra}
    return api("POST", "/runs", token, body)


def batch(api, token, run_id="run-1", session="s1", seq=1, metrics=None, **extra):
    body = {"session": session, "seq": seq, "metrics": metrics or {}, **extra}
    return api("POST", f"/runs/{run_id}/batches", token, body)


def series(start, n, value=1.0):
    steps = list(range(start, start + n))
    return {"steps": steps, "values": [value] * n, "times": [1.7e9 + s for s in steps]}


def test_it_creates_a_run_once_per_session(api, write_token):
    first = create(api, write_token)
    again = create(api, write_token)
    assert first.status_code == 201, first.content
    assert again.status_code == 200
    assert first.json()["segment"] == again.json()["segment"] == 1
    assert Run.objects.count() == 1
    assert "/runs/llm/run-1/" in first.json()["url"]


def test_it_stores_a_batch_and_updates_the_summary(api, write_token):
    create(api, write_token)
    res = batch(api, write_token, metrics={"loss": series(0, 100), "lr": series(0, 100, 3e-4)})
    assert res.status_code == 200, res.content
    assert res.json() == {"accepted": 200, "duplicate": False}
    run = Run.objects.get()
    assert run.last_step == 99
    assert run.points_count == 200
    loss = selectors.series_load(run=run, key="loss")
    assert loss.steps.tolist() == list(range(100))


def test_it_ignores_a_retried_batch(api, write_token):
    create(api, write_token)
    batch(api, write_token, metrics={"loss": series(0, 10)})
    retry = batch(api, write_token, metrics={"loss": series(0, 10)})
    assert retry.json() == {"accepted": 0, "duplicate": True}
    assert len(selectors.series_load(run=Run.objects.get(), key="loss")) == 10
    assert Run.objects.get().points_count == 10


def test_it_keeps_nan_and_inf(api, write_token):
    create(api, write_token)
    raw = (
        '{"session": "s1", "seq": 1, "metrics": {"loss": {"steps": [1, 2, 3, 4],'
        ' "values": [NaN, Infinity, -Infinity, 2.5], "times": [1, 2, 3, 4]}}}'
    )
    res = api("POST", "/runs/run-1/batches", write_token, raw=raw.encode())
    assert res.status_code == 200, res.content
    values = selectors.series_load(run=Run.objects.get(), key="loss").values
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf
    chunk = MetricChunk.objects.get()
    assert (chunk.nonfinite, chunk.min_value, chunk.max_value) == (3, 2.5, 2.5)


def test_it_keeps_a_rewind_as_a_new_segment(api, write_token):
    create(api, write_token, session="first")
    batch(api, write_token, session="first", metrics={"loss": series(0, 500, 2.0)})
    resumed = create(api, write_token, session="second")
    assert resumed.json()["segment"] == 2
    batch(api, write_token, session="second", metrics={"loss": series(400, 200, 1.0)})
    run = Run.objects.get()
    assert run.last_step == 599
    plotted = selectors.series_load(run=run, key="loss")
    assert plotted.steps.tolist() == list(range(600))
    assert (plotted.values[400:] == 1.0).all() and (plotted.values[:400] == 2.0).all()
    history = selectors.series_load(run=run, key="loss", resolve=False)
    assert len(history) == 700  # the rolled-back points stay visible
    segment = run.segments.get(number=2)
    assert (segment.first_step, segment.previous_last_step, segment.lost_steps) == (400, 499, 99)


def test_it_stores_events(api, write_token):
    create(api, write_token)
    events = [{"kind": "checkpoint", "step": 100, "time": 1.7e9, "payload": {"path": "/ck/100"}}]
    assert batch(api, write_token, events=events, heartbeat=1.7e9).status_code == 200
    event = Event.objects.get()
    assert (event.kind, event.step, event.payload) == ("checkpoint", 100, {"path": "/ck/100"})


def test_it_refuses_a_missing_or_wrong_token(api, write_token):
    create(api, write_token)
    assert create(api, None).status_code == 401
    assert create(api, "rc_nope_nope").status_code == 401
    prefix = write_token.split("_")[1]
    assert create(api, f"rc_{prefix}_wrongsecret").status_code == 401
    res = create(api, write_token[:-2] + "xx")
    assert res.status_code == 401 and "token" in res.json()["error"]


def test_it_never_accepts_a_token_in_the_query_string(client, write_token):
    res = client.post(
        f"/api/v1/runs?token={write_token}",
        data=json.dumps({"id": "r", "session": "s"}),
        content_type="application/json",
    )
    assert res.status_code == 401


def test_it_refuses_a_revoked_token(api, write_token):
    ApiToken.objects.update(revoked_at="2026-01-01T00:00:00Z")
    assert create(api, write_token).status_code == 401


def test_it_stores_only_a_hash_of_the_token(write_token):
    token = ApiToken.objects.get()
    secret = write_token.split("_", 2)[2]
    assert secret not in token.hashed and token.prefix in write_token


def test_it_separates_read_and_write_scopes(api, write_token, read_token):
    create(api, write_token)
    assert create(api, read_token, run_id="r2").status_code == 403
    assert api("GET", "/runs/run-1", write_token).status_code == 403
    res = api("GET", "/runs/run-1", read_token)
    assert res.status_code == 200 and res.json()["id"] == "run-1"
    assert [r["id"] for r in api("GET", "/runs", read_token).json()] == ["run-1"]


def test_it_hides_another_projects_run(api, write_token, other_write_token):
    create(api, write_token)
    res = batch(api, other_write_token, metrics={"loss": series(0, 3)})
    assert res.status_code == 404
    assert create(api, other_write_token, project="llm").status_code == 404
    assert MetricChunk.objects.count() == 0


@pytest.mark.parametrize(
    ("metrics", "field"),
    [
        ({"loss": {"steps": [1, 2], "values": ["a", 1.0]}}, "metrics.loss.values[0]"),
        ({"loss": {"steps": [1, "x"], "values": [1.0, 1.0]}}, "metrics.loss.steps[1]"),
        ({"loss": {"steps": [1, 2], "values": [1.0]}}, "metrics.loss.values"),
        ({"loss": {"steps": [1], "values": [1.0], "times": [1.0, 2.0]}}, "metrics.loss.times"),
        ({"loss": {"values": [1.0]}}, "metrics.loss.steps"),
    ],
)
def test_it_rejects_a_bad_batch_whole_naming_the_field(api, write_token, metrics, field):
    create(api, write_token)
    metrics = {"ok": series(0, 5), **metrics}
    res = batch(api, write_token, metrics=metrics)
    assert res.status_code == 400, res.content
    assert res.json()["field"] == field
    assert MetricChunk.objects.count() == 0  # the valid key was not stored half-way


def test_it_rejects_bad_json(api, write_token):
    create(api, write_token)
    res = api("POST", "/runs/run-1/batches", write_token, raw=b'{"session": "s1", "seq": 1,')
    assert res.status_code == 400
    assert "error" in res.json()


def test_it_rejects_wrong_types_on_create(api, write_token):
    res = create(api, write_token, total_steps="many")
    assert res.status_code == 400 and res.json()["field"] == "total_steps"
    res = api("POST", "/runs", write_token, {"id": "../etc", "session": "s"})
    assert res.status_code == 400 and res.json()["field"] == "id"


def test_it_rejects_an_unknown_deadline(api, write_token):
    res = create(api, write_token, deadline="neurips")
    assert res.status_code == 400 and res.json()["field"] == "deadline"


def test_it_refuses_too_many_points_naming_the_limit(api, write_token):
    create(api, write_token)
    n = limits.MAX_POINTS_PER_BATCH // 2 + 1
    res = batch(api, write_token, metrics={"a": series(0, n), "b": series(0, n)})
    assert res.status_code == 413
    assert "MAX_POINTS_PER_BATCH" in res.json()["error"]


def test_it_refuses_a_50_mb_body(api, write_token):
    create(api, write_token)
    raw = b'{"session": "s1", "seq": 1, "metrics": {}, "pad": "' + b"x" * 50_000_000 + b'"}'
    res = api("POST", "/runs/run-1/batches", write_token, raw=raw)
    assert res.status_code == 413
    assert "MAX_REQUEST_BYTES" in res.json()["error"]


def test_it_refuses_too_many_keys_and_large_payloads(api, write_token):
    create(api, write_token)
    keys = {f"k{i}": series(0, 1) for i in range(limits.MAX_KEYS_PER_BATCH + 1)}
    assert batch(api, write_token, metrics=keys).status_code == 413
    big = {"kind": "custom", "payload": {"blob": "x" * (limits.MAX_EVENT_PAYLOAD_BYTES + 1)}}
    res = batch(api, write_token, seq=2, events=[big])
    assert res.status_code == 413 and res.json()["field"] == "events[0].payload"
    res = create(api, write_token, run_id="r2", config={"x": "y" * limits.MAX_CONFIG_BYTES})
    assert res.status_code == 400 and res.json()["field"] == "config"


def test_it_finishes_a_run(api, write_token):
    create(api, write_token)
    res = api("POST", "/runs/run-1/finish", write_token, {"status": "failed", "time": 1.7e9})
    assert res.status_code == 200 and res.json()["status"] == "failed"
    res = api("POST", "/runs/run-1/finish", write_token, {"status": "paused"})
    assert res.status_code == 400 and res.json()["field"] == "status"


def test_it_accepts_data_from_a_session_it_never_saw_created(api, write_token):
    create(api, write_token, session="first")
    res = batch(api, write_token, session="replayed", metrics={"loss": series(0, 5)})
    assert res.status_code == 200
    assert Run.objects.get().current_segment == 2


def test_it_publishes_an_openapi_schema(client):
    schema = client.get("/api/v1/openapi.json").json()
    assert "/api/v1/runs/{run_id}/batches" in schema["paths"]


def test_chunks_hold_the_points_as_sent():
    from tracker.series import concat, pack_floats, pack_steps

    steps = np.arange(5)
    s = concat([(1, pack_steps(steps), pack_floats(steps * 0.5), pack_floats(steps + 1e9))])
    assert s.values.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_a_stalled_run_that_sends_again_is_running_and_a_finished_one_stays_finished(
    api, write_token
):
    create(api, write_token)
    Run.objects.update(status=Run.Status.STALLED)
    batch(api, write_token, metrics={"loss": series(0, 3)})
    assert Run.objects.get().status == "running"
    Run.objects.update(status=Run.Status.FINISHED)
    batch(api, write_token, seq=2, metrics={"loss": series(3, 3)})
    assert Run.objects.get().status == "finished"


def test_a_batch_costs_a_bounded_number_of_queries(api, write_token, django_assert_max_num_queries):
    create(api, write_token)
    batch(api, write_token, metrics={"loss": series(0, 3)})
    metrics = {f"k{i}": series(3, 100) for i in range(20)}
    # token, run, savepoint + batch, segment, chunks (one INSERT), run summary, release.
    with django_assert_max_num_queries(8):
        res = batch(api, write_token, seq=2, metrics=metrics)
    assert res.status_code == 200
