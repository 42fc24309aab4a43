"""The hand-written lookups (tracker.rows) give the instances the ORM's querysets give."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import Model

from tracker import services as tracker_services
from tracker.mlflow import selectors
from tracker.mlflow import services as mlflow_services
from tracker.mlflow.models import RunLink
from tracker.mlflow.parsing import KeyValue
from tracker.models import ApiToken, Project

pytestmark = pytest.mark.django_db


def _fields(obj: Model) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_it_authenticates_as_the_orm_reads_a_token(project: Project, write_token: str) -> None:
    # The first use records last_used_at; the second (within a minute) writes nothing.
    tracker_services.token_authenticate(raw=write_token)
    token = tracker_services.token_authenticate(raw=write_token)
    assert token is not None and token.last_used_at is not None
    orm = ApiToken.objects.select_related("project").get(pk=token.pk)
    assert _fields(token) == _fields(orm)
    assert _fields(token.project) == _fields(orm.project)
    assert tracker_services.token_authenticate(raw=write_token[:-1] + "x") is None
    tracker_services.token_revoke(token=token)
    assert tracker_services.token_authenticate(raw=write_token) is None


def test_it_reads_a_run_link_as_select_related_does(project: Project) -> None:
    experiment = mlflow_services.experiment_create(
        project=project, name="bert", tags={"team": "nlp"}
    )
    made = mlflow_services.run_create(
        project=project,
        experiment=experiment,
        user_id="ada",
        start_time_ms=1_700_000_000_000,
        tags=[KeyValue("note", "héllo {json}")],
        run_name="r1",
    )
    link = selectors.run_link(project=project, run_id=made.run.public_id)
    assert link is not None
    orm = RunLink.objects.select_related("run", "run__project", "experiment").get(pk=made.pk)
    assert link.tags["note"] == "héllo {json}"  # JSON read back as objects, not text
    assert _fields(link) == _fields(orm)
    assert _fields(link.run) == _fields(orm.run)
    assert _fields(link.run.project) == _fields(orm.run.project)
    assert _fields(link.experiment) == _fields(orm.experiment)
    other = Project.objects.create(slug="other", name="Other")
    assert selectors.run_link(project=other, run_id=made.run.public_id) is None
    assert selectors.run_link(project=project, run_id="0" * 32) is None
