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


def test_each_attempt_keeps_the_heartbeat_interval_its_create_declared(api, write_token):
    assert create(api, write_token, heartbeat_interval=15.0).status_code == 201
    create(api, write_token, session="s2")  # a resume by a client that declares none
    segments = Run.objects.get().segments.order_by("number")
    assert list(segments.values_list("heartbeat_interval_s", flat=True)) == [15.0, None]


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
    # token, run, savepoint + batch, segment, chunks (one INSERT), latest metrics (one upsert),
    # run summary, release.
    with django_assert_max_num_queries(9):
        res = batch(api, write_token, seq=2, metrics=metrics)
    assert res.status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"metrics": {"loss": {"steps": [2**70], "values": [1.0]}}}, "metrics.loss.steps[0]"),
        ({"metrics": {"loss": {"steps": [1], "values": [1.0], "times": [1e20]}}}, None),
        ({"metrics": {"loss": {"steps": [1], "values": [1.0], "times": [-1e12]}}}, None),
        ({"events": [{"kind": "custom", "time": 1.7e12}]}, "events[0].time"),
        ({"events": [{"kind": "custom", "time": -1e15}]}, "events[0].time"),
        ({"heartbeat": 1e20}, "heartbeat"),
        ({"events": [{"kind": "custom", "payload": {"x": "a\u0000b"}}]}, "events[0].payload"),
        ({"events": [{"kind": "custom", "payload": {"a\u0000": 1}}]}, "events[0].payload"),
    ],
)
def test_it_answers_400_to_hostile_batches_naming_the_field(api, write_token, body, field):
    create(api, write_token)
    res = batch(api, write_token, **body)
    assert res.status_code == 400, res.content
    assert res.json()["field"] == (field or "metrics.loss.times[0]")
    assert MetricChunk.objects.count() == Event.objects.count() == 0


def test_it_answers_400_to_nan_in_an_event_payload(api, write_token):
    create(api, write_token)
    raw = '{"session": "s1", "seq": 1, "events": [{"kind": "custom", "payload": {"x": [1, NaN]}}]}'
    res = api("POST", "/runs/run-1/batches", write_token, raw=raw.encode())
    assert res.status_code == 400, res.content
    assert res.json()["field"] == "events[0].payload"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"started_at": 1e20}, "started_at"),
        ({"started_at": -1e15}, "started_at"),
        ({"config": {"x": "\u0000"}}, "config"),
        ({"name": "a\u0000b"}, "name"),
        ({"tags": ["ok", "a\u0000"]}, "tags[1]"),
        ({"deadline": "a\u0000"}, "deadline"),
        ({"heartbeat_interval": 0}, "heartbeat_interval"),
        ({"heartbeat_interval": limits.MAX_HEARTBEAT_INTERVAL_S + 1}, "heartbeat_interval"),
    ],
)
def test_it_answers_400_to_hostile_creates_naming_the_field(api, write_token, extra, field):
    res = create(api, write_token, **extra)
    assert res.status_code == 400, res.content
    assert res.json()["field"] == field
    assert Run.objects.count() == 0


def test_it_answers_400_to_nan_in_the_config(api, write_token):
    res = api(
        "POST", "/runs", write_token, raw=b'{"id": "r", "session": "s", "config": {"lr": NaN}}'
    )
    assert res.status_code == 400, res.content
    assert res.json()["field"] == "config"


@pytest.mark.parametrize("when", [1e20, 1.7e12, -1.0])
def test_it_answers_400_to_a_finish_time_out_of_range(api, write_token, when):
    create(api, write_token)
    res = api("POST", "/runs/run-1/finish", write_token, {"status": "finished", "time": when})
    assert res.status_code == 400, res.content
    assert res.json()["field"] == "time"
    assert Run.objects.get().status == "running"


def test_it_accepts_a_batch_up_to_the_documented_request_limit(api, write_token):
    create(api, write_token)
    n = limits.MAX_POINTS_PER_BATCH
    metrics = {
        "loss": {
            "steps": list(range(n)),
            "values": [0.12345678901234567 + i for i in range(n)],
            "times": [1764680100.1234567 + i for i in range(n)],
        }
    }
    events = [{"kind": "custom", "payload": {"note": "x" * 15_000}}] * 60
    raw = json.dumps({"session": "s1", "seq": 1, "metrics": metrics, "events": events}).encode()
    assert 3 * 1024 * 1024 < len(raw) < limits.MAX_REQUEST_BYTES
    res = api("POST", "/runs/run-1/batches", write_token, raw=raw)
    assert res.status_code == 200, res.content[:300]
    assert res.json()["accepted"] == n


def test_it_follows_the_steps_of_a_session_it_never_saw_created(api, write_token):
    create(api, write_token, session="first")
    batch(api, write_token, session="first", metrics={"loss": series(0, 500)})
    res = batch(api, write_token, session="replayed", metrics={"loss": series(300, 50)})
    assert res.status_code == 200
    run = Run.objects.get()
    assert (run.current_segment, run.last_step) == (2, 349)
    segment = run.segments.get(number=2)
    assert (segment.first_step, segment.previous_last_step, segment.lost_steps) == (300, 499, 199)


def test_it_keeps_last_step_on_the_newest_segment_when_an_old_session_sends_late(api, write_token):
    create(api, write_token, session="first")
    batch(api, write_token, session="first", metrics={"loss": series(0, 500)})
    create(api, write_token, session="second")
    batch(api, write_token, session="second", metrics={"loss": series(400, 10)})
    # The dead process's spool replays a batch it never got an answer for.
    batch(api, write_token, session="first", seq=2, metrics={"loss": series(500, 100)})
    assert Run.objects.get().last_step == 409


def test_it_keeps_last_step_on_the_newest_segment_when_a_resume_lands_mid_batch(write_token):
    from tracker import services

    run = Run.objects.get(
        pk=services.run_start(
            project=ApiToken.objects.get().project,
            public_id="r",
            session="first",
            started_at=services.from_epoch(1.7e9),
            fields={},
        ).run.pk
    )
    stale = Run.objects.get(pk=run.pk)  # what a batch request of "first" had loaded ...
    services.run_start(  # ... when the resumed job's create committed
        project=run.project,
        public_id="r",
        session="second",
        started_at=services.from_epoch(1.7e9),
        fields={},
    )
    steps = np.arange(500, 600)
    services.batch_ingest(
        run=stale,
        session="first",
        seq=1,
        series=[services.SeriesIn("loss", steps, steps * 1.0, steps + 1.7e9)],
        events=[],
        heartbeat=None,
    )
    assert Run.objects.get().last_step is None  # segment 2 has logged nothing yet


def test_a_run_the_sweeper_took_for_crashed_runs_again_when_it_speaks(api, write_token):
    create(api, write_token)
    Run.objects.update(status=Run.Status.CRASHED)  # heartbeat lost: no ended_at
    batch(api, write_token, metrics={"loss": series(0, 3)})
    assert Run.objects.get().status == "running"
    api("POST", "/runs/run-1/finish", write_token, {"status": "crashed", "time": 1.7e9})
    batch(api, write_token, seq=2, metrics={"loss": series(3, 3)})
    assert Run.objects.get().status == "crashed"  # the client said so: it stays ended


@pytest.mark.django_db(transaction=True)
def test_it_takes_concurrent_first_batches_of_an_unannounced_session(write_token):
    import threading
    import time

    from django.db import connection, transaction

    from tracker import services

    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers (BEGIN IMMEDIATE): there is no race to lose")
    project = ApiToken.objects.get().project
    services.run_start(
        project=project,
        public_id="r",
        session="first",
        started_at=services.from_epoch(1.7e9),
        fields={},
    )

    def ingest(seq: int) -> services.IngestResult:
        steps = np.arange(seq * 10, seq * 10 + 10)
        return services.batch_ingest(
            run=Run.objects.get(),
            session="replayed",
            seq=seq,
            series=[services.SeriesIn("loss", steps, steps * 1.0, steps + 1.7e9)],
            events=[],
            heartbeat=None,
        )

    opened, results, errors = threading.Event(), [], []

    def first() -> None:
        try:
            with transaction.atomic():  # holds the new segment uncommitted for a while
                results.append(ingest(1))
                opened.set()
                time.sleep(0.5)
        except Exception as e:  # reported by the assertion below
            errors.append(e)
            opened.set()
        finally:
            connection.close()

    def second() -> None:
        opened.wait()
        try:
            results.append(ingest(2))
        except Exception as e:  # reported by the assertion below
            errors.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert sorted(r.accepted for r in results) == [10, 10]
    run = Run.objects.get()
    assert run.segments.count() == 2 and run.points_count == 20


def test_it_answers_401_to_a_token_with_a_nul_or_a_malformed_prefix(api, write_token):
    prefix = write_token.split("_")[1]
    for token in ["rc_ab\x00cd_secret", f"rc_{prefix.upper()}_x", f"rc_{prefix}0_x"]:
        assert api("GET", "/runs", token).status_code == 401


def test_it_answers_404_to_a_run_id_with_a_nul(api, read_token):
    assert api("GET", "/runs/a%00b", read_token).status_code == 404
    assert api("GET", "/runs/a%00b/forecast", read_token).status_code == 404


def test_it_answers_400_to_an_unknown_status_filter(api, read_token):
    from typing import get_args

    from tracker.api.views import RunStatus

    assert set(get_args(RunStatus)) == set(Run.Status.values)
    res = api("GET", "/runs?status=a%00b", read_token)
    assert res.status_code == 400 and res.json()["field"] == "status"
    assert api("GET", "/runs?status=stalled", read_token).status_code == 200


def test_the_api_docs_need_no_cdn(client):
    html = client.get("/api/v1/docs").content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower()
