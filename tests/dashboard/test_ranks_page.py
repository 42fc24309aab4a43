"""The run page's straggler parts: the summary card with the what-if finish, the ranks heat map
data (per host, drill-down to a host's ranks), the onset marker, and the board's what-if."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from tests.forecasting.test_services import at, compute_sustained, healthy_loss, make_run, send
from tests.forecasting.test_straggler_service import send_timings
from tracker.models import Deadline

pytestmark = pytest.mark.django_db

URL = "/runs/llm/r1/"


@pytest.fixture
def straggling(project):
    Deadline.objects.create(
        project=project, slug="eval", name="blind eval", cutoff=at(9500), buffer=timedelta(0)
    )
    run = make_run(project, deadline="eval")
    steps = np.arange(4000)
    send(run, steps, healthy_loss(steps), seq=1)
    send_timings(run, 0, 4000, slow_rank=5, slow_from=3000)
    compute_sustained(run, 4000)
    return run


def test_the_run_page_shows_the_straggler_and_its_whatif_finish(client, member, straggling):
    client.force_login(member)
    html = client.get(URL).content.decode()
    assert 'id="straggler-card"' in html
    assert "rank 5 on node-1" in html
    assert "Without it: finish" in html and "P on time" in html
    assert 'id="ranks-panel"' in html and "dashboard/ranks.js" in html


def test_ranks_json_lists_every_rank_of_a_small_job_and_the_slowest_first(
    client, member, straggling
):
    client.force_login(member)
    d = client.get(URL + "ranks.json?buckets=50").json()
    assert d["mode"] == "ranks" and d["ranks"] == 8
    assert d["rows"] == [f"rank {r}" for r in range(8)]
    assert d["hosts"] == ["node-0", "node-1"]
    assert d["slowest"][0]["rank"] == 5 and d["slowest"][0]["host"] == "node-1"
    late = [row[-1] for row in d["values"]]
    assert late[5] == pytest.approx(1.3, abs=0.05)
    assert max(v for i, v in enumerate(late) if i != 5) < 1.05


def test_ranks_json_drills_down_to_one_hosts_ranks(client, member, straggling):
    client.force_login(member)
    d = client.get(URL + "ranks.json?host=node-1").json()
    assert d["rows"] == ["rank 4", "rank 5", "rank 6", "rank 7"]


def test_large_jobs_aggregate_per_host_keeping_the_slowest_rank(straggling, monkeypatch):
    from dashboard import pages

    monkeypatch.setattr(pages, "RANK_ROWS_MAX", 4)
    view = pages.ranks_view(run=straggling, host=None, buckets=40, last_steps=5000)
    assert view.mode == "hosts" and view.heatmap.rows == ["node-0", "node-1"]
    node0, node1 = view.heatmap.values[:, -1]
    assert node1 == pytest.approx(1.3, abs=0.05) and node0 < 1.05


def test_the_throughput_chart_gets_the_straggler_onset(client, member, straggling):
    client.force_login(member)
    markers = client.get(URL + "overview.json").json()["markers"]
    onset = [m for m in markers if m["kind"] == "straggler"]
    assert len(onset) == 1 and "rank 5 on node-1" in onset[0]["label"]


def test_the_board_shows_the_whatif_finish_beside_the_forecast(client, member, straggling):
    client.force_login(member)
    html = client.get("/").content.decode()
    assert "without straggler:" in html


def test_ranks_json_is_404_for_an_outsider(client, outsider, other_project, straggling):
    client.force_login(outsider)
    assert client.get(URL + "ranks.json").status_code == 404
    assert client.get(URL + "ranks.json?host=node-1").status_code == 404


def test_a_run_without_rank_timings_has_no_ranks_panel(client, member, project):
    run = make_run(project, run_id="plain")
    steps = np.arange(500)
    send(run, steps, healthy_loss(steps), seq=1)
    client.force_login(member)
    html = client.get("/runs/llm/plain/").content.decode()
    assert 'id="ranks-panel"' not in html and 'id="straggler-card"' not in html


def test_ranks_json_queries_are_bounded(client, member, straggling, django_assert_max_num_queries):
    client.force_login(member)
    with django_assert_max_num_queries(7):
        assert client.get(URL + "ranks.json").status_code == 200
