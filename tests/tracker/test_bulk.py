"""Bulk actions on runs (tracker.bulk): tag and untag, the soft delete that hides a run from the
explorer, the board and MLflow's search alike, restore, and ids of another project refused."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from config.celery import beat_schedule
from forecasting.board import board_runs
from tests.dashboard.factories import listed_run as make
from tracker import bulk, explorer, tasks
from tracker.explorer import RunFilter
from tracker.mlflow import search as mlflow_search
from tracker.mlflow import services as mlflow_services
from tracker.mlflow.models import RunLink
from tracker.mlflow.parsing import KeyValue
from tracker.models import LatestMetric, Project, Run
from tracker.services import NotFound, ServiceError

pytestmark = pytest.mark.django_db


def listed(project: Project, *, deleted: bool = False, text: str = "") -> list[str]:
    where = RunFilter(text=text, deleted=deleted)
    page = explorer.run_search(projects=[project], where=where, after=None, limit=100)
    return sorted(r.public_id for r in page.runs)


def mlflow_listed(project: Project, view: str = "ACTIVE_ONLY") -> list[str]:
    experiment = mlflow_services.experiment_default(project=project)
    links, _ = mlflow_search.runs(
        project=project,
        experiment_ids=[experiment.public_id],
        view=view,
        search=mlflow_search.read("", []),
        limit=100,
        page_token="",
    )
    return sorted(link.run.public_id for link in links)


def mlflow_run(project: Project, run_id: str) -> RunLink:
    return mlflow_services.run_create(
        project=project,
        experiment=mlflow_services.experiment_default(project=project),
        user_id="ada",
        start_time_ms=None,
        tags=[],
        run_name=run_id,
        run_id=run_id,
    )


def test_a_tag_is_added_once_and_removed_and_the_filter_finds_it(project: Project) -> None:
    make(project, "a", tags=["baseline"])
    make(project, "b", tags=["team:nlp"])
    make(project, "c")
    n = bulk.runs_tag(project=project, run_ids=["a", "b"], tag=" team:nlp ")
    assert n == 1  # b had it already
    assert listed(project, text="tags.team = 'nlp'") == ["a", "b"]
    assert Run.objects.get(public_id="a").tags == ["baseline", "team:nlp"]
    n = bulk.runs_tag(project=project, run_ids=["a", "b", "c"], tag="team:nlp", remove=True)
    assert n == 2
    assert listed(project, text="tags.team = 'nlp'") == []
    assert Run.objects.get(public_id="a").tags == ["baseline"]


def test_an_mlflow_run_s_tag_is_set_where_mlflow_reports_it(project: Project) -> None:
    link = mlflow_run(project, "m1")
    bulk.runs_tag(project=project, run_ids=["m1"], tag="team:nlp")
    link.refresh_from_db()
    assert link.tags["team"] == "nlp"
    bulk.runs_tag(project=project, run_ids=["m1"], tag="team:nlp", remove=True)
    link.refresh_from_db()
    assert "team" not in link.tags


@pytest.mark.parametrize("tag", ["", "   ", "x" * 101, "bad\ttag"])
def test_a_bad_tag_is_refused_naming_the_field(project: Project, tag: str) -> None:
    make(project, "a")
    with pytest.raises(ServiceError) as caught:
        bulk.runs_tag(project=project, run_ids=["a"], tag=tag)
    assert caught.value.field == "tag"
    assert Run.objects.get(public_id="a").tags == []


def test_delete_hides_a_run_from_explorer_board_and_mlflow_and_restore_brings_it_back(
    project: Project,
) -> None:
    now = timezone.now()
    for name in ("keep", "gone"):
        mlflow_run(project, name)  # running: the board lists both
    assert {v.run.public_id for v in board_runs(projects=[project], now=now)} == {"keep", "gone"}

    assert bulk.runs_delete(project=project, run_ids=["gone"], now=now) == 1

    assert listed(project) == ["keep"]
    assert listed(project, deleted=True) == ["gone"]
    assert [v.run.public_id for v in board_runs(projects=[project], now=now)] == ["keep"]
    assert mlflow_listed(project) == ["keep"]
    assert mlflow_listed(project, "DELETED_ONLY") == ["gone"]
    assert Run.objects.get(public_id="gone").deleted_at == now

    # A second delete keeps the first time: the keep is not extended.
    later = now + timedelta(days=1)
    assert bulk.runs_delete(project=project, run_ids=["gone"], now=later) == 0
    assert Run.objects.get(public_id="gone").deleted_at == now

    assert bulk.runs_restore(project=project, run_ids=["gone"]) == 1
    assert listed(project) == ["gone", "keep"]
    assert listed(project, deleted=True) == []
    assert mlflow_listed(project) == ["gone", "keep"]
    assert {v.run.public_id for v in board_runs(projects=[project], now=now)} == {"keep", "gone"}


def test_mlflow_s_own_delete_run_is_the_same_soft_delete(project: Project) -> None:
    link = mlflow_run(project, "m1")
    mlflow_services.run_set_stage(link=link, stage=RunLink.Stage.DELETED)
    assert listed(project) == []
    assert listed(project, deleted=True) == ["m1"]
    bulk.runs_restore(project=project, run_ids=["m1"])
    link.refresh_from_db()
    assert link.lifecycle_stage == RunLink.Stage.ACTIVE


def test_deleting_an_mlflow_experiment_soft_deletes_its_runs_and_restoring_it_restores_them(
    project: Project,
) -> None:
    """MLflow's experiment delete marked its runs deleted for MLflow only: they stayed on the
    board and in the explorer, and the purge never saw them. A run deleted on its own before
    keeps its own deletion time."""
    experiment = mlflow_services.experiment_create(project=project, name="sweep", tags={})
    for run_id in ("e1", "e2"):
        mlflow_services.run_create(
            project=project,
            experiment=experiment,
            user_id="ada",
            start_time_ms=None,
            tags=[],
            run_name=run_id,
            run_id=run_id,
        )
    earlier = timezone.now() - timedelta(days=3)
    Run.objects.filter(public_id="e2").update(deleted_at=earlier)
    mlflow_services.experiment_set_stage(experiment=experiment, stage="deleted")
    assert listed(project) == []
    assert Run.objects.get(public_id="e2").deleted_at == earlier
    experiment.refresh_from_db()
    mlflow_services.experiment_set_stage(experiment=experiment, stage="active")
    assert listed(project) == ["e1", "e2"]


def test_keep_until_is_the_setting_s_days_after_the_delete(settings: object) -> None:
    settings.RUNCAST_DELETED_RUN_KEEP_DAYS = 7  # type: ignore[attr-defined]
    at = timezone.now()
    assert bulk.keep_until(at) - at == timedelta(days=7)


@pytest.mark.parametrize("action", ["tag", "delete", "restore"])
def test_another_project_s_run_is_refused_and_nothing_changes(
    project: Project, other_project: Project, action: str
) -> None:
    make(project, "ours")
    theirs = make(other_project, "theirs")
    Run.objects.filter(pk=theirs.pk).update(deleted_at=timezone.now())
    ids = ["ours", "theirs"]
    call = {
        "tag": lambda: bulk.runs_tag(project=project, run_ids=ids, tag="x"),
        "delete": lambda: bulk.runs_delete(project=project, run_ids=ids, now=timezone.now()),
        "restore": lambda: bulk.runs_restore(project=project, run_ids=ids),
    }[action]
    with pytest.raises(NotFound) as caught:
        call()
    assert caught.value.field == "run_ids" and "theirs" in caught.value.message
    ours, theirs = Run.objects.get(public_id="ours"), Run.objects.get(public_id="theirs")
    assert ours.tags == [] and ours.deleted_at is None
    assert theirs.deleted_at is not None


def test_no_selection_is_refused(project: Project) -> None:
    with pytest.raises(ServiceError) as caught:
        bulk.runs_delete(project=project, run_ids=[], now=timezone.now())
    assert caught.value.field == "run_ids"


# --- the purge of runs deleted longer ago than the keep ---------------------------------------


def _deleted(project: Project, name: str, *, days_ago: float | None, now: datetime) -> Run:
    run = make(project, name, metrics={"loss": 1.0})
    if days_ago is not None:
        bulk.runs_delete(project=project, run_ids=[name], now=now - timedelta(days=days_ago))
    return run


def test_the_purge_deletes_runs_past_the_keep_and_keeps_the_others(
    project: Project, other_project: Project
) -> None:
    now = timezone.now()
    _deleted(project, "old", days_ago=31, now=now)
    _deleted(project, "recent", days_ago=29, now=now)
    _deleted(project, "live", days_ago=None, now=now)
    _deleted(other_project, "theirs-old", days_ago=31, now=now)
    link = mlflow_run(project, "m-old")
    bulk.runs_delete(project=project, run_ids=["m-old"], now=now - timedelta(days=31))

    assert bulk.runs_purge(now=now) == 3

    assert sorted(Run.objects.values_list("public_id", flat=True)) == ["live", "recent"]
    # The rows go with the run: its latest values, its MLflow link.
    assert not LatestMetric.objects.exclude(run__public_id__in=["live", "recent"]).exists()
    assert not RunLink.objects.filter(pk=link.pk).exists()
    assert listed(project, deleted=True) == ["recent"]  # still restorable
    assert bulk.runs_purge(now=now) == 0  # a second pass: nothing more


def test_the_purge_follows_the_setting_and_works_in_batches(
    project: Project, settings: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.RUNCAST_DELETED_RUN_KEEP_DAYS = 7  # type: ignore[attr-defined]
    monkeypatch.setattr(bulk, "PURGE_BATCH", 2)
    now = timezone.now()
    for i in range(5):
        _deleted(project, f"old{i}", days_ago=8, now=now)
    _deleted(project, "recent", days_ago=6, now=now)
    assert bulk.runs_purge(now=now) == 5
    assert list(Run.objects.values_list("public_id", flat=True)) == ["recent"]


def test_with_nothing_to_purge_it_is_one_query(
    project: Project, django_assert_num_queries: Any
) -> None:
    now = timezone.now()
    _deleted(project, "recent", days_ago=29, now=now)
    _deleted(project, "live", days_ago=None, now=now)
    with django_assert_num_queries(1):
        assert bulk.runs_purge(now=now) == 0


REFUSE_STUCK = {
    "postgresql": "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'no'; "
    "END $$ LANGUAGE plpgsql; CREATE TRIGGER refuse BEFORE DELETE ON tracker_run FOR EACH ROW "
    "WHEN (OLD.public_id = 'stuck') EXECUTE FUNCTION refuse()",
    "sqlite": "CREATE TRIGGER refuse BEFORE DELETE ON tracker_run FOR EACH ROW "
    "WHEN OLD.public_id = 'stuck' BEGIN SELECT RAISE(ABORT, 'no'); END",
}


def test_a_run_that_cannot_be_deleted_holds_back_no_other(
    project: Project, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(bulk, "PURGE_BATCH", 2)
    now = timezone.now()
    for name in ("a", "stuck", "b", "c"):
        _deleted(project, name, days_ago=31, now=now)
    # A real failure in the database: deleting the row "stuck" raises (a trigger, which goes
    # with the test's transaction).
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_STUCK[connection.vendor])
    assert bulk.runs_purge(now=now) == 3
    assert list(Run.objects.values_list("public_id", flat=True)) == ["stuck"]
    assert "purge of deleted runs" in caplog.text


@pytest.mark.eager
def test_the_purge_task_runs_twice_and_beat_schedules_it(project: Project) -> None:
    now = timezone.now()
    _deleted(project, "old", days_ago=31, now=now)
    _deleted(project, "recent", days_ago=29, now=now)
    tasks.runs_purge.delay()
    tasks.runs_purge.delay()
    assert list(Run.objects.values_list("public_id", flat=True)) == ["recent"]
    entry = beat_schedule(sweep_period_s=60.0)["purge-deleted-runs"]
    assert entry["task"] == "tracker.tasks.runs_purge"
    assert entry["options"]["expires"] < entry["schedule"]


# --- move to an experiment ---------------------------------------------------------------------


def mlflow_search_ids(project: Project, experiment_id: str) -> list[str]:
    links, _ = mlflow_search.runs(
        project=project,
        experiment_ids=[experiment_id],
        view="ACTIVE_ONLY",
        search=mlflow_search.read("", []),
        limit=100,
        page_token="",
    )
    return sorted(link.run.public_id for link in links)


def test_runs_move_to_another_experiment_where_explorer_and_mlflow_see_them(
    project: Project,
) -> None:
    default = mlflow_services.experiment_default(project=project)
    vision = mlflow_services.experiment_create(project=project, name="vision", tags={})
    nlp = mlflow_services.experiment_create(project=project, name="nlp", tags={})
    mlflow_run(project, "m1")
    mlflow_run(project, "m2")
    bulk.runs_tag(project=project, run_ids=["m1"], tag="baseline")

    assert (
        bulk.runs_move(project=project, run_ids=["m1", "m2"], experiment_id=vision.public_id) == 2
    )
    assert mlflow_search_ids(project, vision.public_id) == ["m1", "m2"]
    assert mlflow_search_ids(project, default.public_id) == []
    assert listed(project, text="experiment = 'vision'") == ["m1", "m2"]
    assert Run.objects.get(public_id="m1").tags == ["experiment: vision", "baseline"]

    assert bulk.runs_move(project=project, run_ids=["m1", "m2"], experiment_id=nlp.public_id) == 2
    assert Run.objects.get(public_id="m1").tags == ["experiment: nlp", "baseline"]
    # Again to the same one: nothing changes; back to Default: no experiment chip.
    assert bulk.runs_move(project=project, run_ids=["m2"], experiment_id=nlp.public_id) == 0
    assert bulk.runs_move(project=project, run_ids=["m1"], experiment_id="0") == 1
    assert Run.objects.get(public_id="m1").tags == ["baseline"]
    # A later MLflow write rebuilds the labels from the new experiment, as the move left them.
    link = RunLink.objects.get(run__public_id="m2")
    mlflow_services.run_log(link=link, metrics=[], params=[], tags=[KeyValue("team", "nlp")])
    assert Run.objects.get(public_id="m2").tags == ["experiment: nlp", "team: nlp"]


def test_move_refuses_another_project_s_experiment_or_run_and_changes_nothing(
    project: Project, other_project: Project
) -> None:
    mlflow_run(project, "m1")
    mlflow_run(other_project, "theirs")
    ours = mlflow_services.experiment_create(project=project, name="vision", tags={})
    other = mlflow_services.experiment_create(project=other_project, name="vision", tags={})
    for experiment_id, field in (
        (other.public_id, "experiment_id"),
        ("", "experiment_id"),
        ("nope", "experiment_id"),
    ):
        with pytest.raises(NotFound) as caught:
            bulk.runs_move(project=project, run_ids=["m1"], experiment_id=experiment_id)
        assert caught.value.field == field
    with pytest.raises(NotFound) as caught:
        bulk.runs_move(project=project, run_ids=["m1", "theirs"], experiment_id=ours.public_id)
    assert caught.value.field == "run_ids" and "theirs" in caught.value.message
    assert RunLink.objects.get(run__public_id="m1").experiment.public_id == "0"
    assert RunLink.objects.get(run__public_id="theirs").experiment.public_id == "0"


def test_move_refuses_a_deleted_experiment_and_a_runcast_client_run(project: Project) -> None:
    mlflow_run(project, "m1")
    make(project, "client-run")
    gone = mlflow_services.experiment_create(project=project, name="gone", tags={})
    mlflow_services.experiment_set_stage(experiment=gone, stage="deleted")
    with pytest.raises(ServiceError) as caught:
        bulk.runs_move(project=project, run_ids=["m1"], experiment_id=gone.public_id)
    assert caught.value.field == "experiment_id" and "deleted" in caught.value.message
    vision = mlflow_services.experiment_create(project=project, name="vision", tags={})
    with pytest.raises(ServiceError) as caught:
        bulk.runs_move(
            project=project, run_ids=["m1", "client-run"], experiment_id=vision.public_id
        )
    assert caught.value.field == "run_ids" and "client-run" in caught.value.message
    assert RunLink.objects.get(run__public_id="m1").experiment.public_id == "0"
    assert not RunLink.objects.filter(run__public_id="client-run").exists()
