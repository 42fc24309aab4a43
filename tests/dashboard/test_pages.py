from __future__ import annotations

import numpy as np
import pytest
from django.test import Client

from tracker.models import Run
from tracker.services import SeriesIn, batch_ingest, from_epoch, run_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(project) -> Run:
    started = run_start(
        project=project,
        public_id="r1",
        session="s",
        started_at=from_epoch(1.7e9),
        fields={"name": "pretrain", "total_steps": 100_000},
    )
    steps = np.arange(50_000)
    values = 3.0 + np.exp(-steps / 5000)
    values[31_337] = 40.0  # one spike in 50k points
    values[40_000] = np.nan
    batch_ingest(
        run=started.run,
        session="s",
        seq=1,
        series=[SeriesIn("loss", steps, values, 1.7e9 + steps.astype(float))],
        events=[],
        heartbeat=None,
    )
    return started.run


def login(client: Client, user) -> Client:
    client.force_login(user)
    return client


def test_it_asks_anonymous_users_to_log_in(client, run):
    assert client.get("/").status_code == 302
    assert client.get("/runs/llm/r1/").status_code == 302
    assert client.get("/runs/llm/r1/series.json?key=loss").status_code == 302


def test_it_lists_the_members_runs(client, member, run):
    res = login(client, member).get("/")
    assert res.status_code == 200 and b"pretrain" in res.content


def test_it_lists_nothing_to_an_outsider(client, outsider, run):
    res = login(client, outsider).get("/")
    assert res.status_code == 200 and b"pretrain" not in res.content


def test_it_shows_a_run_to_a_viewer(client, viewer, run):
    res = login(client, viewer).get("/runs/llm/r1/")
    assert res.status_code == 200 and b"loss" in res.content


def test_it_hides_a_run_from_an_outsider(client, outsider, run):
    login(client, outsider)
    assert client.get("/runs/llm/r1/").status_code == 404
    assert client.get("/runs/llm/r1/series.json?key=loss").status_code == 404


def test_series_keeps_every_spike_and_reports_nan(
    client, member, run, django_assert_max_num_queries
):
    login(client, member)
    # session, user, membership, run, chunk ranges, the NaN's chunk, the rollups: constant.
    with django_assert_max_num_queries(7):
        data = client.get("/runs/llm/r1/series.json?key=loss&buckets=500").json()
    assert data["points"] == 50_000
    assert len(data["x"]) <= 500
    assert max(v for v in data["max"] if v is not None) == 40.0
    assert data["nonfinite_steps"] == [40_000]


def test_health_endpoint_answers(client):
    assert client.get("/healthz").json() == {"ok": True}


def test_series_zoom_reads_raw_points_in_range(client, member, run):
    login(client, member)
    data = client.get("/runs/llm/r1/series.json?key=loss&buckets=1000&x0=31000&x1=31500").json()
    assert data["source"] == "raw"
    assert data["points"] == 501
    assert 40.0 in data["max"]
    assert (data["x_min"], data["x_max"]) == (0, 49_999)


def test_series_overview_uses_rollups_and_keeps_the_spike(client, member, run):
    login(client, member)
    data = client.get("/runs/llm/r1/series.json?key=loss&buckets=100").json()
    assert data["source"] == "rollup"
    assert max(v for v in data["max"] if v is not None) == 40.0
    assert min(v for v in data["min"] if v is not None) == pytest.approx(
        3.0 + np.exp(-9.9998), rel=1e-6
    )
