"""The MLflow tracking REST API (`/api/2.0/mlflow/...`, `/ajax-api/2.0/mlflow/...`).

One view dispatches on the path: authenticate (the Runcast token in `Authorization: Bearer`),
read the request, check it by MLflow's rules, call one service or selector, answer MLflow's
JSON. Every failure, an unknown or unsupported endpoint included, answers MLflow's error JSON.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import Error as DatabaseDriverError
from django.http import HttpRequest, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from config import errors
from tracker import query
from tracker import services as tracker_services
from tracker.limits import echo
from tracker.mlflow import artifacts as mlflow_artifacts
from tracker.mlflow import parsing, search, selectors, services
from tracker.mlflow.errors import MlflowError, invalid, not_found, run_not_found
from tracker.mlflow.models import DEFAULT_EXPERIMENT_ID, Experiment, LoggedModel, RunLink
from tracker.models import ApiToken

logger = logging.getLogger(__name__)
Data = dict[str, Any]
# Query-string fields that are lists even when sent once.
_REPEATED = frozenset(("run_ids", "experiment_ids", "order_by"))


@dataclass(frozen=True)
class Call:
    token: ApiToken
    data: Data
    raw: bytes
    # A GET's fields as lists (get-history-bulk repeats `run_id`, which is one id elsewhere).
    lists: dict[str, list[str]] = field(default_factory=dict)

    @property
    def project(self) -> Any:
        return self.token.project


# --- lookups shared by handlers --------------------------------------------------------------


def _experiment(call: Call, experiment_id: str) -> Experiment:
    if experiment_id in ("", DEFAULT_EXPERIMENT_ID):
        return services.experiment_default(project=call.project)
    parsing.experiment_id_checked(experiment_id, "experiment_id")
    experiment = selectors.experiment_find(project=call.project, public_id=experiment_id)
    if experiment is None:
        # Another project's experiment is indistinguishable from a missing one.
        raise not_found(f"No Experiment with id={echo(experiment_id)} exists")
    return experiment


def _link(call: Call, *, active: bool = False) -> RunLink:
    run_id = parsing.run_id_of(call.data)
    link = selectors.run_link(project=call.project, run_id=run_id)
    if link is None:
        raise run_not_found(run_id)
    if active and link.lifecycle_stage != RunLink.Stage.ACTIVE:
        raise invalid(
            f"The run {echo(run_id)} must be in the 'active' state. "
            f"Current state is {link.lifecycle_stage}."
        )
    return link


# --- experiments -----------------------------------------------------------------------------


def experiment_get_by_name(call: Call) -> Data:
    name = parsing.experiment_name(call.data, "experiment_name")
    services.experiment_default(project=call.project)
    experiment = selectors.experiment_by_name(project=call.project, name=name)
    if experiment is None:
        raise not_found(f"Could not find experiment with name '{echo(name)}'")
    return {"experiment": selectors.experiment_json(experiment)}


def experiment_create(call: Call) -> Data:
    name = parsing.experiment_name(call.data, "name")
    # Checked as MLflow checks it, then not used: Runcast places every experiment's artifacts
    # in its own store (tracker.artifacts).
    parsing.string(call.data, "artifact_location")
    tags = parsing.tags_of(parsing.array(call.data, "tags"))
    experiment = services.experiment_create(
        project=call.project, name=name, tags={t.key: t.value for t in tags}
    )
    return {"experiment_id": experiment.public_id}


def experiment_get(call: Call) -> Data:
    experiment_id = parsing.string(call.data, "experiment_id", required=True)
    return {"experiment": selectors.experiment_json(_experiment(call, experiment_id))}


def experiment_search(call: Call) -> Data:
    services.experiment_default(project=call.project)
    view = _view_type(call.data.get("view_type"), "view_type")
    wanted = search.read(parsing.string(call.data, "filter"), _order_by(call.data))
    page, token = search.experiments(
        project=call.project,
        view=view,
        search=wanted,
        limit=_max_results(call.data, default=1000),
        page_token=parsing.string(call.data, "page_token"),
    )
    return _paged("experiments", [selectors.experiment_json(e) for e in page], token)


def experiment_update(call: Call) -> Data:
    experiment = _experiment(call, parsing.string(call.data, "experiment_id", required=True))
    name = parsing.experiment_name(call.data, "new_name")
    services.experiment_rename(experiment=experiment, name=name)
    return {}


def _experiment_stage(stage: str) -> Callable[[Call], Data]:
    def handler(call: Call) -> Data:
        experiment_id = parsing.string(call.data, "experiment_id", required=True)
        experiment = _experiment(call, experiment_id)
        if experiment.lifecycle_stage == stage:
            # MLflow's store looks for the experiment among the active ones to delete it and
            # among the deleted ones to restore it: deleting twice finds nothing.
            raise not_found(f"The experiment with id={echo(experiment_id)} is already {stage}")
        services.experiment_set_stage(experiment=experiment, stage=stage)
        return {}

    return handler


def experiment_set_tag(call: Call) -> Data:
    experiment = _experiment(call, parsing.string(call.data, "experiment_id", required=True))
    key = parsing.string(call.data, "key", required=True)
    parsing.check_name(key, "key")
    value = parsing.string(call.data, "value")
    if len(value) > parsing.MAX_EXPERIMENT_TAG_VAL_LENGTH:
        raise parsing.too_long("value", parsing.MAX_EXPERIMENT_TAG_VAL_LENGTH)
    services.experiment_set_tag(experiment=experiment, key=key, value=value)
    return {}


def experiment_delete_tag(call: Call) -> Data:
    experiment = _experiment(call, parsing.string(call.data, "experiment_id", required=True))
    key = parsing.string(call.data, "key", required=True)
    services.experiment_set_tag(experiment=experiment, key=key, value=None)
    return {}


# --- runs ------------------------------------------------------------------------------------


def run_create(call: Call) -> Data:
    experiment = _experiment(call, parsing.string(call.data, "experiment_id"))
    start = parsing.integer(call.data.get("start_time"), "start_time")
    if start is not None and not 0 <= start <= parsing.MAX_TIMESTAMP_MS:
        raise parsing.invalid_value("start_time", start, "milliseconds since the epoch")
    link = services.run_create(
        project=call.project,
        experiment=experiment,
        user_id=parsing.string(call.data, "user_id"),
        start_time_ms=start,
        tags=parsing.tags_of(parsing.array(call.data, "tags")),
        run_name=parsing.string(call.data, "run_name"),
    )
    return {"run": selectors.run_json(link, latest={})}


def run_update(call: Call) -> Data:
    link = _link(call, active=True)
    status = parsing.string(call.data, "status") or None
    if status is not None and status not in services.STATUSES:
        raise parsing.invalid_value("status", status, f"must be one of {list(services.STATUSES)}")
    end = parsing.integer(call.data.get("end_time"), "end_time")
    if end is not None and not 0 <= end <= parsing.MAX_TIMESTAMP_MS:
        raise parsing.invalid_value("end_time", end, "milliseconds since the epoch")
    link = services.run_update(
        link=link,
        status=status,
        end_time_ms=end,
        run_name=parsing.string(call.data, "run_name") or None,
    )
    return {"run_info": selectors.run_info_json(link)}


def _run_stage(stage: str) -> Callable[[Call], Data]:
    def handler(call: Call) -> Data:
        services.run_set_stage(link=_link(call), stage=stage)
        return {}

    return handler


def run_get(call: Call) -> Data:
    return {"run": selectors.run_json(_link(call))}


def log_batch(call: Call) -> Data:
    if len(call.raw) > parsing.MAX_BATCH_LOG_REQUEST_SIZE:
        raise invalid(
            f"Batched logging API requests must be at most "
            f"{parsing.MAX_BATCH_LOG_REQUEST_SIZE} bytes, got a request of size {len(call.raw)}."
        )
    metrics = parsing.array(call.data, "metrics")
    params = parsing.array(call.data, "params")
    tags = parsing.array(call.data, "tags")
    parsing.batch_limits(metrics, params, tags)
    parsed_metrics = [parsing.metric_of(m, f"metrics[{i}]") for i, m in enumerate(metrics)]
    parsed_params = parsing.params_of(params)
    parsed_tags = parsing.tags_of(tags)
    services.run_log(
        link=_link(call, active=True),
        metrics=parsed_metrics,
        params=parsed_params,
        tags=parsed_tags,
    )
    return {}


def log_metric(call: Call) -> Data:
    metric = parsing.metric_of(call.data, "")
    services.run_log(link=_link(call, active=True), metrics=[metric], params=[], tags=[])
    return {}


def _string_value(call: Call) -> None:
    # MLflow's server asserts a string here (handlers._log_param, _set_tag); inside log-batch
    # its proto parser is lenient, and so is key_value.
    parsing.string(call.data, "value")


def log_param(call: Call) -> Data:
    _string_value(call)
    param = parsing.key_value(call.data, "", value_limit=parsing.MAX_PARAM_VAL_LENGTH)
    services.run_log(link=_link(call, active=True), metrics=[], params=[param], tags=[])
    return {}


def set_tag(call: Call) -> Data:
    _string_value(call)
    tag = parsing.key_value(call.data, "", value_limit=parsing.MAX_TAG_VAL_LENGTH)
    services.run_log(link=_link(call, active=True), metrics=[], params=[], tags=[tag])
    return {}


def delete_tag(call: Call) -> Data:
    key = parsing.string(call.data, "key", required=True)
    services.run_delete_tag(link=_link(call, active=True), key=key)
    return {}


def log_inputs(call: Call) -> Data:
    datasets = parsing.dataset_inputs_of(parsing.array(call.data, "datasets"))
    model_ids = []
    for i, item in enumerate(parsing.array(call.data, "models")):
        if not isinstance(item, dict):
            raise parsing.invalid_value(f"models[{i}]", item, "must be an object")
        path = f"models[{i}].model_id"
        model_ids.append(parsing.string(item, "model_id", required=True, path=path))
    services.run_log_inputs(link=_link(call, active=True), datasets=datasets, model_ids=model_ids)
    return {}


def log_outputs(call: Call) -> Data:
    outputs = []
    for i, item in enumerate(parsing.array(call.data, "models")):
        if not isinstance(item, dict):
            raise parsing.invalid_value(f"models[{i}]", item, "must be an object")
        model_id = parsing.string(item, "model_id", required=True, path=f"models[{i}].model_id")
        step = parsing.integer(item.get("step"), f"models[{i}].step", default=0)
        outputs.append((model_id, step or 0))
    services.run_log_outputs(link=_link(call, active=True), outputs=outputs)
    return {}


def log_model_accepted(call: Call) -> Data:
    """runs/log-model (MLflow 2's record of a model in a run's tags): MLflow 3's log_model uses
    logged models instead; accepted so an older client's training goes on."""
    _link(call)
    return {}


def search_datasets(call: Call) -> Data:
    experiment_ids = parsing.string_list(call.data, "experiment_ids")
    if not experiment_ids:
        raise invalid("SearchDatasets request must specify at least one experiment_id.")
    if len(experiment_ids) > MAX_EXPERIMENTS_SEARCH_DATASETS:
        raise invalid(
            f"SearchDatasets request cannot specify more than {MAX_EXPERIMENTS_SEARCH_DATASETS}"
            f" experiment_ids. Received {len(experiment_ids)} experiment_ids."
        )
    for i, experiment_id in enumerate(experiment_ids):
        parsing.experiment_id_checked(experiment_id, f"experiment_ids[{i}]")
    summaries = selectors.dataset_summaries(project=call.project, experiment_ids=experiment_ids)
    return {"dataset_summaries": summaries} if summaries else {}


MAX_EXPERIMENTS_SEARCH_DATASETS = 20


def metric_history(call: Call) -> Data:
    key = parsing.string(call.data, "metric_key", required=True)
    run_id = parsing.run_id_of(call.data)
    link = selectors.run_link(project=call.project, run_id=run_id)
    if link is None:
        return {"metrics": []}  # as MLflow's store answers a run it does not have
    points = selectors.metric_history(run=link.run, key=key)
    if call.data.get("max_results") in (None, ""):
        if not parsing.string(call.data, "page_token"):
            return {"metrics": points}
        # A token without max_results is still a token: checked, and the rest from it.
        return {"metrics": _page(points, call.data, max(len(points), 1))[0]}
    limit = parsing.integer(call.data.get("max_results"), "max_results")
    if limit is None or limit <= 0:
        raise parsing.invalid_value("max_results", limit, "It must be a positive integer.")
    page, token = _page(points, call.data, limit)
    body: Data = {"metrics": page}
    if token:
        body["next_page_token"] = token
    return body


MAX_RUNS_BULK = 100
MAX_RESULTS_BULK = 2500


def metric_history_bulk_interval(call: Call) -> Data:
    run_ids = parsing.string_list(call.data, "run_ids")
    if not run_ids:
        raise parsing.missing("run_ids")
    if len(run_ids) > MAX_RUNS_BULK:
        raise invalid(
            f"GetMetricHistoryBulkInterval request must specify at most {MAX_RUNS_BULK} "
            f"run_ids. Received {len(run_ids)} run_ids."
        )
    key = parsing.string(call.data, "metric_key", required=True)
    start = parsing.integer(call.data.get("start_step"), "start_step")
    end = parsing.integer(call.data.get("end_step"), "end_step")
    if (start is None) != (end is None):
        raise invalid("start_step and end_step must be given together, or neither.")
    if start is not None and end is not None and start > end:
        raise invalid(
            f"end_step must be greater than start_step. Found start_step={start} "
            f"and end_step={end}."
        )
    limit = parsing.integer(call.data.get("max_results"), "max_results", default=MAX_RESULTS_BULK)
    if limit is None or not 1 <= limit <= MAX_RESULTS_BULK:
        raise invalid(f"max_results must be between 1 and {MAX_RESULTS_BULK}.")
    out: list[Data] = []
    for i, run_id in enumerate(run_ids):
        parsing.id_checked(run_id, f"run_ids[{i}]", parsing.MAX_RUN_ID_LENGTH)
    for run_id in run_ids:
        link = selectors.run_link(project=call.project, run_id=run_id)
        if link is None:
            raise run_not_found(run_id)
        out += selectors.metric_history_sampled(
            run=link.run, key=key, start=start, end=end, max_results=limit
        )
    return {"metrics": out}


MAX_RESULTS_HISTORY_BULK = 25000


def metric_history_bulk(call: Call) -> Data:
    """`metrics/get-history-bulk` (MLflow's UI charts): each run's history of one key, runs in
    id order, each in logging order, at most max_results points in all."""
    run_ids = call.lists.get("run_id") or parsing.string_list(call.data, "run_id")
    if not run_ids:
        raise invalid("GetMetricHistoryBulk request must specify at least one run_id.")
    if len(run_ids) > MAX_RUNS_BULK:
        raise invalid(
            f"GetMetricHistoryBulk request cannot specify more than {MAX_RUNS_BULK} run_ids. "
            f"Received {len(run_ids)} run_ids."
        )
    key = parsing.string(call.data, "metric_key")
    if not key:
        raise invalid("GetMetricHistoryBulk request must specify a metric_key.")
    limit = parsing.integer(call.data.get("max_results"), "max_results")
    limit = min(limit or MAX_RESULTS_HISTORY_BULK, MAX_RESULTS_HISTORY_BULK)
    out: list[Data] = []
    for i, run_id in enumerate(sorted(run_ids)):
        parsing.id_checked(run_id, f"run_id[{i}]", parsing.MAX_RUN_ID_LENGTH)
        link = selectors.run_link(project=call.project, run_id=run_id)
        if link is None:
            raise run_not_found(run_id)
        out += [{**m, "run_id": run_id} for m in selectors.metric_history(run=link.run, key=key)]
        if len(out) >= limit:
            break
    return {"metrics": out[:limit]}


def run_search(call: Call) -> Data:
    experiment_ids = parsing.string_list(call.data, "experiment_ids")
    for i, experiment_id in enumerate(experiment_ids):
        parsing.experiment_id_checked(experiment_id, f"experiment_ids[{i}]")
    view = _view_type(call.data.get("run_view_type"), "run_view_type")
    wanted = search.read(parsing.string(call.data, "filter"), _order_by(call.data))
    page, token = search.runs(
        project=call.project,
        experiment_ids=experiment_ids,
        view=view,
        search=wanted,
        limit=_max_results(call.data, default=1000),
        page_token=parsing.string(call.data, "page_token"),
    )
    latest = selectors.latest_metrics_many(run_ids=[lk.run_id for lk in page])
    return _paged("runs", [selectors.run_json(lk, latest=latest[lk.run_id]) for lk in page], token)


# --- logged models (MLflow 3) ----------------------------------------------------------------

_MODEL_STATUSES = {
    1: LoggedModel.Status.PENDING,
    2: LoggedModel.Status.READY,
    3: LoggedModel.Status.FAILED,
}


def _model(call: Call, model_id: str, *, allow_deleted: bool = False) -> LoggedModel:
    parsing.id_checked(model_id, "model_id", parsing.MAX_RUN_ID_LENGTH)
    model = selectors.logged_model_find(
        project=call.project, model_id=model_id, allow_deleted=allow_deleted
    )
    if model is None:
        raise not_found(f"Logged model with ID '{echo(model_id)}' not found.")
    return model


def logged_model_create(call: Call) -> Data:
    experiment_id = parsing.string(call.data, "experiment_id", required=True)
    experiment = _experiment(call, experiment_id)
    source_run_id = parsing.string(call.data, "source_run_id")
    if source_run_id:
        parsing.id_checked(source_run_id, "source_run_id", parsing.MAX_RUN_ID_LENGTH)
        if selectors.run_link(project=call.project, run_id=source_run_id) is None:
            raise run_not_found(source_run_id)
    name = parsing.string(call.data, "name")
    if len(name) > parsing.MAX_EXPERIMENT_NAME_LENGTH:
        raise parsing.too_long("name", parsing.MAX_EXPERIMENT_NAME_LENGTH)
    model = services.logged_model_create(
        project=call.project,
        experiment=experiment,
        name=name,
        model_type=parsing.string(call.data, "model_type")[:500],
        source_run_id=source_run_id,
        params=parsing.params_of(parsing.array(call.data, "params")),
        tags=parsing.tags_of(parsing.array(call.data, "tags")),
    )
    return {"model": selectors.logged_model_json(model)}


def logged_model_get(call: Call, model_id: str) -> Data:
    allow_deleted = str(call.data.get("allow_deleted", "")).lower() == "true"
    model = _model(call, model_id, allow_deleted=allow_deleted)
    return {"model": selectors.logged_model_json(model)}


def logged_model_finalize(call: Call, model_id: str) -> Data:
    raw = call.data.get("status")
    if raw in (None, ""):
        raise parsing.missing("status")
    statuses = {s.value: s for s in _MODEL_STATUSES.values()}
    status = statuses.get(raw) if isinstance(raw, str) else None
    if status is None:
        number = parsing.integer(raw, "status")
        if number not in _MODEL_STATUSES:
            raise parsing.invalid_value("status", raw, f"must be one of {sorted(statuses)}")
        status = _MODEL_STATUSES[number]
    model = services.logged_model_finalize(model=_model(call, model_id), status=status)
    return {"model": selectors.logged_model_json(model)}


def logged_model_delete(call: Call, model_id: str) -> Data:
    services.logged_model_delete(model=_model(call, model_id))
    return {}


def logged_model_set_tags(call: Call, model_id: str) -> Data:
    tags = parsing.tags_of(parsing.array(call.data, "tags"))
    services.logged_model_update(model=_model(call, model_id), tags=tags)
    return {}


def logged_model_delete_tag(call: Call, model_id: str, key: str) -> Data:
    services.logged_model_update(model=_model(call, model_id), delete_tag=key)
    return {}


def logged_model_log_params(call: Call, model_id: str) -> Data:
    params = parsing.params_of(parsing.array(call.data, "params"))
    services.logged_model_update(model=_model(call, model_id), params=params)
    return {}


def logged_model_artifacts(call: Call, model_id: str) -> Data:
    """`logged-models/<id>/artifacts/directories`: a folder of the model's files."""
    root = mlflow_artifacts.model_artifact_uri(_model(call, model_id))
    return _folder(call, root, parsing.string(call.data, "artifact_directory_path"))


def logged_model_search(call: Call) -> Data:
    experiment_ids = parsing.string_list(call.data, "experiment_ids")
    if not experiment_ids:
        raise parsing.missing("experiment_ids")
    for i, experiment_id in enumerate(experiment_ids):
        parsing.experiment_id_checked(experiment_id, f"experiment_ids[{i}]")
    order_by = []
    for i, item in enumerate(parsing.array(call.data, "order_by")):
        if not isinstance(item, dict):
            raise parsing.invalid_value(f"order_by[{i}]", item, "must be an object")
        name = parsing.string(item, "field_name", required=True, path=f"order_by[{i}].field_name")
        ascending = item.get("ascending", True) not in (False, "false")
        order_by.append(f"{name} {'ASC' if ascending else 'DESC'}")
    wanted = search.read(parsing.string(call.data, "filter"), order_by)
    page, token = search.logged_models(
        project=call.project,
        experiment_ids=experiment_ids,
        search=wanted,
        limit=_max_results(call.data, default=100),
        page_token=parsing.string(call.data, "page_token"),
    )
    return _paged("models", [selectors.logged_model_json(m) for m in page], token)


# --- artifacts through the tracking API ------------------------------------------------------


def artifact_list_of_run(call: Call) -> Data:
    """`artifacts/list?run_id=&path=` (MLflow's UI): a folder of the run's files, paths
    relative to the run's artifact root."""
    root = mlflow_artifacts.run_artifact_uri(_link(call))
    return _folder(call, root, parsing.string(call.data, "path"))


def _folder(call: Call, root: str, relative: str) -> Data:
    """A folder below an artifact root, its entries' paths relative to the root."""
    place = mlflow_artifacts.place_of(
        project=call.project, path=f"{root.split(':/', 1)[1]}/{relative}"
    )
    files = mlflow_artifacts.files_json(
        mlflow_artifacts.artifact_list(place=place), under=place.path and relative
    )
    return {"root_uri": root, "files": files} if files else {"root_uri": root}


# --- paging, ordering, view types ------------------------------------------------------------


def _order_by(data: Data) -> list[str]:
    value = data.get("order_by") or []
    return [value] if isinstance(value, str) else parsing.string_list(data, "order_by")


def _view_type(value: Any, field: str) -> str:
    names = {1: "ACTIVE_ONLY", 2: "DELETED_ONLY", 3: "ALL"}
    if value in (None, ""):
        return "ACTIVE_ONLY"
    if isinstance(value, str) and value in names.values():
        return value
    number = parsing.integer(value, field)
    if number not in names:
        raise parsing.invalid_value(field, value, "must be ACTIVE_ONLY, DELETED_ONLY or ALL")
    return names[number]


def _max_results(data: Data, *, default: int) -> int:
    limit = parsing.integer(data.get("max_results"), "max_results", default=default)
    assert limit is not None
    if not 1 <= limit <= parsing.MAX_RESULTS_SEARCH:
        raise parsing.invalid_value(
            "max_results", limit, f"must be between 1 and {parsing.MAX_RESULTS_SEARCH}"
        )
    return limit


def _paged(name: str, items: list[Any], token: str | None) -> Data:
    body: Data = {name: items}
    if token:
        body["next_page_token"] = token
    return body


def _page(items: list[Any], data: Data, limit: int) -> tuple[list[Any], str | None]:
    token = parsing.string(data, "page_token")
    try:
        offset = query.token_decode(token)
    except query.QueryError as exc:
        raise parsing.invalid_value("page_token", token, str(exc)) from exc
    page = items[offset : offset + limit]
    if offset + limit >= len(items):
        return page, None
    return page, query.token_encode(offset + limit)


# --- dispatch --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    methods: tuple[str, ...]
    handler: Callable[[Call], Data]
    write: bool


def _r(methods: str, handler: Callable[[Call], Data], *, write: bool) -> Route:
    return Route(tuple(methods.split(",")), handler, write)


ROUTES: dict[str, Route] = {
    "experiments/get-by-name": _r("GET", experiment_get_by_name, write=False),
    "experiments/get": _r("GET", experiment_get, write=False),
    "experiments/search": _r("GET,POST", experiment_search, write=False),
    "experiments/list": _r("GET", experiment_search, write=False),
    "experiments/create": _r("POST", experiment_create, write=True),
    "experiments/update": _r("POST", experiment_update, write=True),
    "experiments/delete": _r("POST", _experiment_stage(Experiment.Stage.DELETED), write=True),
    "experiments/restore": _r("POST", _experiment_stage(Experiment.Stage.ACTIVE), write=True),
    "experiments/set-experiment-tag": _r("POST", experiment_set_tag, write=True),
    "experiments/delete-experiment-tag": _r("POST", experiment_delete_tag, write=True),
    "runs/create": _r("POST", run_create, write=True),
    "runs/update": _r("POST", run_update, write=True),
    "runs/delete": _r("POST", _run_stage(RunLink.Stage.DELETED), write=True),
    "runs/restore": _r("POST", _run_stage(RunLink.Stage.ACTIVE), write=True),
    "runs/get": _r("GET", run_get, write=False),
    "runs/search": _r("GET,POST", run_search, write=False),
    "runs/log-batch": _r("POST", log_batch, write=True),
    "runs/log-metric": _r("POST", log_metric, write=True),
    "runs/log-parameter": _r("POST", log_param, write=True),
    "runs/set-tag": _r("POST", set_tag, write=True),
    "runs/delete-tag": _r("POST", delete_tag, write=True),
    "runs/log-inputs": _r("POST", log_inputs, write=True),
    "runs/outputs": _r("POST", log_outputs, write=True),
    "runs/log-model": _r("POST", log_model_accepted, write=True),
    "experiments/search-datasets": _r("POST", search_datasets, write=False),
    "artifacts/list": _r("GET", artifact_list_of_run, write=False),
    "logged-models": _r("POST", logged_model_create, write=True),
    "logged-models/search": _r("POST", logged_model_search, write=False),
    "metrics/get-history": _r("GET", metric_history, write=False),
    "metrics/get-history-bulk": _r("GET", metric_history_bulk, write=False),
    "metrics/get-history-bulk-interval": _r("GET", metric_history_bulk_interval, write=False),
}

# Paths with ids in them: (pattern, {method: (handler, write)}).
_PATTERNS: list[tuple[re.Pattern[str], dict[str, tuple[Callable[..., Data], bool]]]] = [
    (
        re.compile(r"^logged-models/(?P<model_id>[^/]+)$"),
        {
            "GET": (logged_model_get, False),
            "PATCH": (logged_model_finalize, True),
            "DELETE": (logged_model_delete, True),
        },
    ),
    (
        re.compile(r"^logged-models/(?P<model_id>[^/]+)/tags$"),
        {"PATCH": (logged_model_set_tags, True)},
    ),
    (
        re.compile(r"^logged-models/(?P<model_id>[^/]+)/tags/(?P<key>.+)$"),
        {"DELETE": (logged_model_delete_tag, True)},
    ),
    (
        re.compile(r"^logged-models/(?P<model_id>[^/]+)/params$"),
        {"POST": (logged_model_log_params, True)},
    ),
    (
        re.compile(r"^logged-models/(?P<model_id>[^/]+)/artifacts/directories$"),
        {"GET": (logged_model_artifacts, False)},
    ),
]


def _route(path: str, method: str) -> Route | None:
    """The route of a path; for a path with ids, the one of its method (or, for a method it
    does not take, its first, so the answer names the methods it takes)."""
    if (route := ROUTES.get(path)) is not None:
        return route
    for pattern, by_method in _PATTERNS:
        if (match := pattern.match(path)) is None:
            continue
        handler, write = by_method.get(method) or next(iter(by_method.values()))
        return Route(tuple(by_method), functools.partial(handler, **match.groupdict()), write)
    return None


_UNSUPPORTED = (
    (
        ("registered-models", "model-versions", "webhooks"),
        "Runcast has no MLflow model registry: logged models (mlflow.<flavor>.log_model) are "
        "kept with their files, but registering them is not served (see docs/mlflow.md).",
    ),
    (
        ("traces", "unified-traces", "get-online-trace-details", "spans"),
        "Runcast does not store MLflow traces.",
    ),
)


def unsupported(path: str) -> MlflowError:
    head = path.strip("/").split("/", 1)[0]
    for heads, message in _UNSUPPORTED:
        if head in heads:
            return MlflowError(message, "NOT_IMPLEMENTED")
    supported = ", ".join(sorted(ROUTES))
    return MlflowError(
        f"Runcast does not serve the MLflow endpoint '{echo(path)}'. Supported: {supported}.",
        "ENDPOINT_NOT_FOUND",
    )


def authenticate(request: HttpRequest) -> ApiToken:
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    token = None
    if scheme.lower() == "bearer" and raw.strip():
        token = tracker_services.token_authenticate(raw=raw.strip())
    if token is None:
        raise MlflowError(
            "Missing or invalid Runcast API token: set MLFLOW_TRACKING_TOKEN to a token of "
            "your project (rc_…), which the MLflow client sends as Authorization: Bearer.",
            "UNAUTHENTICATED",
        )
    return token


def _request_data(request: HttpRequest) -> tuple[Data, bytes]:
    if request.method == "GET":
        data: Data = {k: (v if k in _REPEATED else v[-1]) for k, v in request.GET.lists()}
        return data, b""
    raw = request.body
    return parsing.body_json(raw), raw


def respond(call: Callable[[], Data | HttpResponseBase]) -> HttpResponseBase:
    try:
        answer = call()
        return answer if isinstance(answer, HttpResponseBase) else JsonResponse(answer)
    except MlflowError as exc:
        return JsonResponse(exc.body(), status=exc.status)
    except tracker_services.ServiceError as exc:
        code = {404: "RESOURCE_DOES_NOT_EXIST", 403: "PERMISSION_DENIED"}.get(
            exc.status, "INVALID_PARAMETER_VALUE"
        )
        field = f" ({exc.field})" if exc.field else ""
        return JsonResponse({"error_code": code, "message": exc.message + field}, status=exc.status)
    except DatabaseDriverError as exc:
        # django.db.Error: a dropped connection raises InterfaceError, which no DatabaseError
        # handler catches (it answered Django's HTML 500 to a client that would have retried).
        if not errors.database_unavailable(exc):
            # An IntegrityError or DataError is a bug or the request's fault, not an outage to
            # wait out; its text can quote the schema or the request, so it stays in the log.
            logger.exception("MLflow API request failed")
            body = {"error_code": "INTERNAL_ERROR", "message": errors.INTERNAL_ERROR}
            return JsonResponse(body, status=500)
        # The client retries 503s with backoff: a database hiccup must not lose its points.
        logger.warning("MLflow API request found the database unavailable: %s", exc)
        return errors.unavailable_response(
            {"error_code": "TEMPORARILY_UNAVAILABLE", "message": errors.DATABASE_UNAVAILABLE}
        )


@csrf_exempt
def endpoint(request: HttpRequest, path: str) -> HttpResponseBase:
    def handle() -> Data:
        token = authenticate(request)
        route = _route(path.strip("/"), request.method or "")
        if route is None:
            raise unsupported(path)
        if request.method not in route.methods:
            raise MlflowError(
                f"{echo(path)} takes {' or '.join(route.methods)}, "
                f"not {echo(request.method or '')}",
                "ENDPOINT_NOT_FOUND",
            )
        if route.write and token.scope != ApiToken.Scope.WRITE:
            raise MlflowError(
                f"this token has the {token.scope!r} scope; logging needs a write token",
                "PERMISSION_DENIED",
            )
        data, raw = _request_data(request)
        lists = dict(request.GET.lists()) if request.method == "GET" else {}
        return route.handler(Call(token=token, data=data, raw=raw, lists=lists))

    return respond(handle)
