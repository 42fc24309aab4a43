"""The runs explorer and deadline pages: who may read them, what they show, the filter error
that points at its token, the CSV of the view, and the board's and run page's links to them."""

from __future__ import annotations

import csv
import io
import math
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from forecasting.models import Forecast
from tests.dashboard import factories
from tests.dashboard.factories import listed_run as make
from tracker.mlflow import services as mlflow_services
from tracker.mlflow.models import RunLink
from tracker.models import Deadline, Project, Run

pytestmark = pytest.mark.django_db


def _login(client: Any, who: str) -> None:
    assert client.login(username=who, password=f"pw-{who}-123")


@pytest.fixture
def deadline(project: Project) -> Deadline:
    return Deadline.objects.create(
        project=project, slug="neurips", name="NeurIPS", cutoff=timezone.now() - timedelta(days=30)
    )


@pytest.mark.parametrize(
    "path", ["/projects/llm/runs/", "/projects/llm/runs.csv", "/projects/llm/deadlines/"]
)
def test_an_outsider_gets_404(client: Any, project: Project, outsider: Any, path: str) -> None:
    _login(client, "outsider")
    assert client.get(path).status_code == 404


@pytest.mark.parametrize("path", ["/projects/llm/runs/", "/runs/", "/projects/llm/deadlines/"])
def test_a_viewer_reads_and_a_stranger_must_log_in(
    client: Any, project: Project, path: str
) -> None:
    make(project, "visible")
    assert client.get(path).status_code == 302
    _login(client, "viewer")
    resp = client.get(path)
    assert resp.status_code == 200
    if "runs" in path:
        assert b"visible" in resp.content
    assert client.post(path).status_code == 405  # the explorer only reads


def test_every_run_is_listed_with_a_link_not_only_the_last_day_s(
    client: Any, project: Project
) -> None:
    old = make(project, "last-month", day=-40)
    Run.objects.filter(pk=old.pk).update(ended_at=old.started_at + timedelta(hours=3))
    _login(client, "viewer")
    html = client.get("/projects/llm/runs/").content.decode()
    assert 'href="/runs/llm/last-month/"' in html


def test_the_all_projects_page_lists_only_the_user_s_projects(
    client: Any, project: Project, other_project: Project
) -> None:
    make(project, "ours")
    make(other_project, "theirs")
    _login(client, "member")
    html = client.get("/runs/").content.decode()
    assert "ours" in html and "theirs" not in html


def test_a_filter_error_is_shown_with_the_token_marked(client: Any, project: Project) -> None:
    _login(client, "viewer")
    resp = client.get("/projects/llm/runs/", {"q": "metrics.loss < 2 and colour = 'red'"})
    assert resp.status_code == 400
    html = resp.content.decode()
    assert "Invalid attribute key &#x27;colour&#x27;" in html
    assert (
        'metrics.loss &lt; 2 and <mark id="runs-error-token">colour = &#x27;red&#x27;</mark>'
        in html
    )


def test_a_bad_date_names_its_field(client: Any, project: Project) -> None:
    _login(client, "viewer")
    resp = client.get("/projects/llm/runs/", {"from": "last week"})
    assert (
        resp.status_code == 400
        and "from: &#x27;last week&#x27; is not a date" in resp.content.decode()
    )


def test_a_live_run_shows_its_odds_and_an_ended_one_its_outcome(
    client: Any, project: Project, deadline: Deadline
) -> None:
    now = timezone.now()
    live = make(project, "live", status=Run.Status.RUNNING)
    Run.objects.filter(pk=live.pk).update(deadline=deadline)
    factories.forecast(live, Forecast.Kind.DEADLINE, now, p_on_time=0.73)
    factories.forecast(live, Forecast.Kind.ETA, now, finish=now.timestamp() + 3600)
    ended = make(project, "late", metrics={"loss": 2.25})
    Run.objects.filter(pk=ended.pk).update(
        deadline=deadline, ended_at=deadline.cutoff + timedelta(hours=3)
    )
    _login(client, "viewer")
    html = client.get("/projects/llm/runs/").content.decode()
    assert "73%" in html and "missed by 3 h" in html
    deadlines = client.get("/projects/llm/deadlines/").content.decode()
    assert "NeurIPS" in deadlines and "missed by 3 h" in deadlines and "73%" in deadlines
    assert "2.25" in deadlines  # its final loss
    assert "1 missed" in deadlines and "made it</b>" not in deadlines


def test_the_page_s_queries_do_not_grow_with_its_runs(client: Any, project: Project) -> None:
    _login(client, "viewer")

    def count(n: int) -> int:
        for i in range(n):
            make(
                project,
                f"n{n}-{i}",
                metrics={"loss": float(i)},
                tags=["team:nlp"],
                config={"lr": "1"},
            )
        with CaptureQueriesContext(connection) as ctx:
            assert (
                client.get("/projects/llm/runs/", {"p": "lr", "q": "tags.team = 'nlp'"}).status_code
                == 200
            )
        return len(ctx.captured_queries)

    assert count(2) == count(20)


def test_the_csv_is_the_view_every_page_of_it(client: Any, project: Project) -> None:
    for i in range(7):
        make(
            project,
            f"r{i}",
            day=i,
            metrics={"loss": math.nan if i == 3 else float(i)},
            config={"lr": "3e-4" if i % 2 else "1e-3"},
        )
    _login(client, "viewer")
    # Pages of 500 in the CSV whatever the page size asked: n=2 must not cut it.
    resp = client.get(
        "/projects/llm/runs.csv",
        {
            "q": "params.lr = '3e-4'",
            "sort": "m:loss",
            "dir": "desc",
            "p": "lr",
            "m": "loss",
            "n": "2",
        },
    )
    assert resp.status_code == 200 and resp["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(b"".join(resp.streaming_content).decode())))
    assert [r["name"] for r in rows] == ["r5", "r1", "r3"]
    assert [r["metrics.loss"] for r in rows] == ["5.0", "1.0", "nan"]
    assert {r["params.lr"] for r in rows} == {"3e-4"}


def test_a_bad_filter_refuses_the_csv_before_any_byte(client: Any, project: Project) -> None:
    _login(client, "viewer")
    resp = client.get("/projects/llm/runs.csv", {"q": "metrics.loss ~ 3"})
    assert resp.status_code == 400 and b"position 13" in resp.content


def test_the_board_and_the_run_page_link_to_the_runs_and_deadlines(
    client: Any, project: Project, deadline: Deadline
) -> None:
    make(project, "r")
    _login(client, "viewer")
    board = client.get("/").content.decode()
    assert 'href="/projects/llm/runs/"' in board
    assert 'href="/projects/llm/deadlines/#deadline-neurips"' in board  # a past cutoff, listed
    run_page = client.get("/runs/llm/r/").content.decode()
    assert 'href="/projects/llm/runs/"' in run_page


def test_compare_takes_a_run_beyond_the_picker_s_newest_200(client: Any, project: Project) -> None:
    old = make(project, "old-one", day=-400)
    Run.objects.filter(pk=old.pk).update(last_seen_at=old.started_at)
    for i in range(200):
        make(project, f"new{i}")
    _login(client, "viewer")
    html = client.get("/projects/llm/compare/", {"run": "old-one"}).content.decode()
    assert '"id": "old-one"' in html


def test_the_default_order_s_header_turns_it_and_chosen_keys_stay_offered(
    client: Any, project: Project
) -> None:
    make(project, "r", metrics={"loss": 1.0})
    _login(client, "viewer")
    html = client.get("/projects/llm/runs/").content.decode()
    # The default order is the newest start first: its header asks for the oldest first.
    assert 'href="?sort=started&amp;dir=asc">Started' in html
    html = client.get("/projects/llm/runs/", {"m": "val_loss", "p": "lr"}).content.decode()
    # No run on the page logs val_loss or sets lr: the choice is still ticked, so it survives
    # the next submit of the form.
    assert 'name="m" value="val_loss" checked' in html
    assert 'name="p" value="lr" checked' in html


def test_a_group_links_to_the_view_narrowed_to_it(client: Any, project: Project) -> None:
    make(project, "a", config={"lr": "3e-4"}, metrics={"loss": 2.0})
    make(project, "b", config={"lr": "3e-4"}, metrics={"loss": 1.0})
    make(project, "c", config={"lr": "it's"}, metrics={"loss": 4.0})
    _login(client, "viewer")
    resp = client.get("/projects/llm/runs/", {"group": "p:lr", "q": "metrics.loss < 5"})
    html = resp.content.decode()
    assert '<tr data-group="3e-4">' in html and '<td class="num">1.5</td>' in html
    link = re.search(r'data-group="it&#x27;s">\s*<td><a href="\?([^"]+)"', html)
    assert link is not None
    narrowed = client.get("/projects/llm/runs/?" + link.group(1).replace("&amp;", "&"))
    assert narrowed.status_code == 200
    assert re.findall(r'<tr data-run="([^"]+)"', narrowed.content.decode()) == ["c"]


def test_a_member_saves_a_view_that_every_member_opens(client: Any, project: Project) -> None:
    make(project, "a", config={"lr": "3e-4"})
    make(project, "b", config={"lr": "1e-3"})
    _login(client, "member")
    query = "q=params.lr+%3D+%273e-4%27&sort=name&dir=asc&after=abc"
    resp = client.post("/projects/llm/runs/views/", {"name": " lr 3e-4 ", "query": query})
    assert resp.status_code == 302
    # Where the page stood is not part of the view.
    assert resp["Location"] == "/projects/llm/runs/?q=params.lr+%3D+%273e-4%27&sort=name&dir=asc"
    client.logout()
    _login(client, "viewer")
    html = client.get("/projects/llm/runs/").content.decode()
    link = re.search(r'<span class="saved-view"><a href="\?([^"]+)">lr 3e-4</a>', html)
    assert link is not None and 'id="view-save"' not in html  # a viewer opens, never saves
    opened = client.get("/projects/llm/runs/?" + link.group(1).replace("&amp;", "&"))
    assert re.findall(r'<tr data-run="([^"]+)"', opened.content.decode()) == ["a"]


def test_viewers_and_outsiders_cannot_save_or_delete_views(
    client: Any, project: Project, outsider: Any
) -> None:
    from tracker.saved_views import saved_view_save

    view = saved_view_save(project=project, user=None, name="mine", query="q=")
    _login(client, "viewer")
    assert client.post("/projects/llm/runs/views/", {"name": "x"}).status_code == 403
    assert client.post(f"/projects/llm/runs/views/{view.pk}/delete/").status_code == 403
    client.logout()
    _login(client, "outsider")
    assert client.post("/projects/llm/runs/views/", {"name": "x"}).status_code == 404
    assert client.post(f"/projects/llm/runs/views/{view.pk}/delete/").status_code == 404
    client.logout()
    _login(client, "member")
    bad = client.post("/projects/llm/runs/views/", {"name": "  ", "query": ""})
    assert bad.status_code == 400 and bad.content.decode().startswith("name: ")
    assert client.post(f"/projects/llm/runs/views/{view.pk}/delete/").status_code == 302
    assert client.post(f"/projects/llm/runs/views/{view.pk}/delete/").status_code == 404


# --- bulk actions ----------------------------------------------------------------------------

BULK = "/projects/llm/runs/bulk/"


def test_a_member_tags_and_deletes_the_selected_runs_and_returns_to_the_same_view(
    client: Any, project: Project
) -> None:
    make(project, "a")
    make(project, "b")
    _login(client, "member")
    view = "status=finished&sort=name&after=xyz"
    resp = client.post(BULK, {"action": "tag", "tag": "team:nlp", "run": ["a"], "view": view})
    assert resp.status_code == 302
    # The same view, less its page position.
    assert resp["Location"] == "/projects/llm/runs/?status=finished&sort=name"
    assert Run.objects.get(public_id="a").tags == ["team:nlp"]

    resp = client.post(BULK, {"action": "delete", "run": ["a", "b"], "view": view}, follow=True)
    html = resp.content.decode()
    assert "Deleted 2 runs" in html and "restorable until" in html and "Show deleted" in html
    assert 'data-run="a"' not in html and "No run matches." in html
    deleted = client.get("/projects/llm/runs/?deleted=1").content.decode()
    assert 'data-run="a"' in deleted and 'id="bulk-restore"' in deleted

    resp = client.post(BULK, {"action": "restore", "run": ["a"], "view": "deleted=1"}, follow=True)
    assert "Restored 1 run." in resp.content.decode()
    assert Run.objects.get(public_id="a").deleted_at is None
    assert Run.objects.get(public_id="b").deleted_at is not None


def test_a_viewer_may_not_act_and_an_outsider_learns_nothing(
    client: Any, project: Project, outsider: Any
) -> None:
    make(project, "a")
    _login(client, "viewer")
    assert client.post(BULK, {"action": "delete", "run": ["a"]}).status_code == 403
    page = client.get("/projects/llm/runs/").content.decode()
    assert 'id="bulk-delete"' not in page
    assert '<form method="get" action="/projects/llm/compare/" id="runs-compare">' in page
    client.logout()
    _login(client, "outsider")
    assert client.post(BULK, {"action": "delete", "run": ["a"]}).status_code == 404
    assert Run.objects.get(public_id="a").deleted_at is None


def test_another_project_s_run_id_is_a_404_and_a_bad_tag_is_said(
    client: Any, project: Project, other_project: Project
) -> None:
    make(project, "a")
    make(other_project, "theirs")
    _login(client, "member")
    resp = client.post(BULK, {"action": "delete", "run": ["a", "theirs"]})
    assert resp.status_code == 404
    assert not Run.objects.filter(deleted_at__isnull=False).exists()
    resp = client.post(BULK, {"action": "tag", "tag": "", "run": ["a"]}, follow=True)
    assert "tag: a tag is 1 to 100 characters" in resp.content.decode()
    assert client.post(BULK, {"action": "explode", "run": ["a"]}).status_code == 400


def test_compare_from_a_member_s_selection_forwards_the_runs(client: Any, project: Project) -> None:
    make(project, "a")
    make(project, "b")
    _login(client, "member")
    resp = client.post(BULK, {"action": "compare", "run": ["a", "b"]})
    assert resp.status_code == 302
    assert resp["Location"] == "/projects/llm/compare/?run=a&run=b"


def test_a_member_moves_mlflow_runs_to_an_experiment_of_the_project(
    client: Any, project: Project, other_project: Project
) -> None:
    link = mlflow_services.run_create(
        project=project,
        experiment=mlflow_services.experiment_default(project=project),
        user_id="ada",
        start_time_ms=None,
        tags=[],
        run_name="m1",
        run_id="m1",
    )
    vision = mlflow_services.experiment_create(project=project, name="vision", tags={})
    theirs = mlflow_services.experiment_create(project=other_project, name="theirs", tags={})
    _login(client, "member")
    page = client.get("/projects/llm/runs/").content.decode()
    assert (
        'id="bulk-move"' in page and f'<option value="{vision.public_id}">vision</option>' in page
    )
    assert "theirs" not in page

    form = {"action": "move", "run": ["m1"], "view": "sort=name"}
    resp = client.post(BULK, {**form, "experiment_id": vision.public_id}, follow=True)
    assert "Moved 1 run to another experiment." in resp.content.decode()
    link.refresh_from_db()
    assert link.experiment_id == vision.pk
    # Another project's experiment is a 404 and moves nothing.
    assert client.post(BULK, {**form, "experiment_id": theirs.public_id}).status_code == 404
    link.refresh_from_db()
    assert link.experiment_id == vision.pk

    # A viewer may not (and sees no move), an outsider learns nothing.
    client.logout()
    _login(client, "viewer")
    assert 'id="bulk-move"' not in client.get("/projects/llm/runs/").content.decode()
    assert client.post(BULK, {**form, "experiment_id": "0"}).status_code == 403
    client.logout()
    _login(client, "outsider")
    assert client.post(BULK, {**form, "experiment_id": "0"}).status_code == 404
    link.refresh_from_db()
    assert link.experiment_id == vision.pk


def test_moving_a_runcast_client_run_is_said_and_changes_nothing(
    client: Any, project: Project
) -> None:
    make(project, "client-run")
    mlflow_services.experiment_default(project=project)
    _login(client, "member")
    form = {"action": "move", "run": ["client-run"], "experiment_id": "0"}
    resp = client.post(BULK, form, follow=True)
    assert "run_ids: only MLflow runs belong to an experiment" in resp.content.decode()
    assert not RunLink.objects.exists()
