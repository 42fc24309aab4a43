"""MLflow's runs/search and experiments/search: where MLflow's entities live in Runcast's models
(the schemas of the query module, tracker.query), and its errors in MLflow's error JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from tracker import query
from tracker.mlflow import parsing
from tracker.mlflow.errors import invalid
from tracker.mlflow.models import Experiment, LoggedModel, RunLink
from tracker.models import Project

RUNS = query.Schema(
    noun="Runs",
    attributes={
        "run_id": query.Attribute("run__public_id"),
        "run_name": query.Attribute("run__name"),
        "status": query.Attribute("status"),
        "start_time": query.Attribute("run__started_at", query.Kind.MILLIS),
        "end_time": query.Attribute("end_time_ms", query.Kind.NUMBER),
        "user_id": query.Attribute("user_id"),
        "lifecycle_stage": query.Attribute("lifecycle_stage"),
        "experiment_id": query.Attribute("experiment__public_id"),
    },
    aliases={"created": "start_time", "Created": "start_time"},
    tags="tags",
    params="run__config",
    metrics="run",
    tie="run__public_id",
)
EXPERIMENTS = query.Schema(
    noun="Experiments",
    attributes={
        "name": query.Attribute("name"),
        "experiment_id": query.Attribute("public_id"),
        "creation_time": query.Attribute("created_at", query.Kind.MILLIS),
        "last_update_time": query.Attribute("updated_at", query.Kind.MILLIS),
        "lifecycle_stage": query.Attribute("lifecycle_stage"),
    },
    tags="tags",
    tie="public_id",
)

LOGGED_MODELS = query.Schema(
    noun="Logged models",
    attributes={
        "name": query.Attribute("name"),
        "model_id": query.Attribute("model_id"),
        "model_type": query.Attribute("model_type"),
        "status": query.Attribute("status"),
        "source_run_id": query.Attribute("source_run_id"),
        "creation_timestamp": query.Attribute("created_at", query.Kind.MILLIS),
        "last_updated_timestamp": query.Attribute("updated_at", query.Kind.MILLIS),
    },
    aliases={"creation_time": "creation_timestamp", "last_updated_time": "last_updated_timestamp"},
    tags="tags",
    params="params",
    tie="model_id",
)


@dataclass(frozen=True)
class Search:
    comparisons: list[query.Comparison]
    order: list[query.OrderKey]


def read(filter_string: str, order_by: list[str]) -> Search:
    """A request's filter and order, or INVALID_PARAMETER_VALUE naming what is wrong."""
    try:
        return Search(query.parse(filter_string), query.parse_order_by(order_by))
    except query.QueryError as exc:
        raise invalid(str(exc)) from exc


def runs(
    *,
    project: Project,
    experiment_ids: list[str],
    view: str,
    search: Search,
    limit: int,
    page_token: str,
) -> tuple[list[RunLink], str | None]:
    """One page of the project's runs in these experiments that match, and the next token.
    Newest first after the requested order, then by run id (MLflow's tie-breaks)."""
    links = RunLink.objects.select_related("run", "experiment").filter(
        run__project=project, experiment__public_id__in=experiment_ids
    )
    if view != "ALL":
        active = links.filter(lifecycle_stage=RunLink.Stage.ACTIVE)
        links = active if view == "ACTIVE_ONLY" else links.exclude(pk__in=active.values("pk"))
    order = [*search.order, query.OrderKey("attributes", "start_time", ascending=False)]
    return _page(links, RUNS, Search(search.comparisons, order), limit, page_token)


def experiments(
    *, project: Project, view: str, search: Search, limit: int, page_token: str
) -> tuple[list[Experiment], str | None]:
    """One page of the project's experiments that match, newest first unless ordered."""
    found = Experiment.objects.filter(project=project)
    if view != "ALL":
        active = found.filter(lifecycle_stage=Experiment.Stage.ACTIVE)
        found = active if view == "ACTIVE_ONLY" else found.exclude(pk__in=active.values("pk"))
    order = search.order or [query.OrderKey("attributes", "creation_time", ascending=False)]
    return _page(found, EXPERIMENTS, Search(search.comparisons, order), limit, page_token)


def logged_models(
    *, project: Project, experiment_ids: list[str], search: Search, limit: int, page_token: str
) -> tuple[list[LoggedModel], str | None]:
    """One page of the project's active logged models in these experiments, newest first
    unless ordered."""
    found = LoggedModel.objects.select_related("experiment").filter(
        project=project,
        experiment__public_id__in=experiment_ids,
        lifecycle_stage=LoggedModel.Stage.ACTIVE,
    )
    order = [*search.order, query.OrderKey("attributes", "creation_timestamp", ascending=False)]
    return _page(found, LOGGED_MODELS, Search(search.comparisons, order), limit, page_token)


def _page(
    rows: QuerySet[Any], schema: query.Schema, search: Search, limit: int, page_token: str
) -> tuple[list[Any], str | None]:
    try:
        matched = query.apply(rows, schema, search.comparisons, search.order)
    except query.QueryError as exc:
        raise invalid(str(exc)) from exc
    try:
        return query.page(matched, token=page_token, limit=limit)
    except query.QueryError as exc:
        raise parsing.invalid_value("page_token", page_token, str(exc)) from exc
