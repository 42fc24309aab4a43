"""The MLflow tracking REST API (`/api/2.0/mlflow/...`, `/ajax-api/2.0/mlflow/...`).

One view dispatches on the path: authenticate (the Runcast token in `Authorization: Bearer`),
read the request, check it by MLflow's rules, call one service or selector, answer MLflow's
JSON. Every failure, an unknown or unsupported endpoint included, answers MLflow's error JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import Error as DatabaseDriverError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from config import errors
from tracker import query
from tracker import services as tracker_services
from tracker.limits import echo
from tracker.mlflow import parsing, search, selectors, services
from tracker.mlflow.errors import MlflowError, invalid, not_found, run_not_found
from tracker.mlflow.models import DEFAULT_EXPERIMENT_ID, Experiment, RunLink
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

    @property
    def project(self) -> Any:
        return self.token.project


# --- lookups shared by handlers --------------------------------------------------------------


def _experiment(call: Call, experiment_id: str) -> Experiment:
    if experiment_id in ("", DEFAULT_EXPERIMENT_ID):
        return services.experiment_default(project=call.project)
    parsing.id_checked(experiment_id, "experiment_id", parsing.MAX_EXPERIMENT_ID_LENGTH)
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
    body: Data = {"experiments": [selectors.experiment_json(e) for e in page]}
    if token:
        body["next_page_token"] = token
    return body


def experiment_update(call: Call) -> Data:
    experiment = _experiment(call, parsing.string(call.data, "experiment_id", required=True))
    name = parsing.experiment_name(call.data, "new_name")
    services.experiment_rename(experiment=experiment, name=name)
    return {}


def _experiment_stage(stage: str) -> Callable[[Call], Data]:
    def handler(call: Call) -> Data:
        experiment_id = parsing.string(call.data, "experiment_id", required=True)
        services.experiment_set_stage(experiment=_experiment(call, experiment_id), stage=stage)
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
    link = _link(call)
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


def log_param(call: Call) -> Data:
    param = parsing.key_value(call.data, "", value_limit=parsing.MAX_PARAM_VAL_LENGTH)
    services.run_log(link=_link(call, active=True), metrics=[], params=[param], tags=[])
    return {}


def set_tag(call: Call) -> Data:
    tag = parsing.key_value(call.data, "", value_limit=parsing.MAX_TAG_VAL_LENGTH)
    services.run_log(link=_link(call, active=True), metrics=[], params=[], tags=[tag])
    return {}


def delete_tag(call: Call) -> Data:
    key = parsing.string(call.data, "key", required=True)
    services.run_delete_tag(link=_link(call, active=True), key=key)
    return {}


def accepted_not_kept(call: Call) -> Data:
    """log-inputs (datasets), log-outputs and log-model: accepted so that training goes on,
    not kept (Runcast tracks progress and forecasts; see docs/mlflow.md)."""
    _link(call)
    return {}


def metric_history(call: Call) -> Data:
    link = _link(call)
    key = parsing.string(call.data, "metric_key", required=True)
    points = selectors.metric_history(run=link.run, key=key)
    if call.data.get("max_results") in (None, ""):
        return {"metrics": points}
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


def run_search(call: Call) -> Data:
    experiment_ids = parsing.string_list(call.data, "experiment_ids")
    for i, experiment_id in enumerate(experiment_ids):
        parsing.id_checked(experiment_id, f"experiment_ids[{i}]", parsing.MAX_EXPERIMENT_ID_LENGTH)
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
    body: Data = {"runs": [selectors.run_json(lk, latest=latest[lk.run_id]) for lk in page]}
    if token:
        body["next_page_token"] = token
    return body


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
    "runs/log-inputs": _r("POST", accepted_not_kept, write=True),
    "runs/outputs": _r("POST", accepted_not_kept, write=True),
    "runs/log-model": _r("POST", accepted_not_kept, write=True),
    "metrics/get-history": _r("GET", metric_history, write=False),
    "metrics/get-history-bulk-interval": _r("GET", metric_history_bulk_interval, write=False),
}

ARTIFACTS_MESSAGE = (
    "Runcast does not keep artifacts (files, models, checkpoints): it tracks metrics, params "
    "and tags and forecasts runs. Keep artifacts in your own storage and log their path as a "
    "tag or param (see docs/mlflow.md)."
)
_UNSUPPORTED = (
    (("artifacts", "mlflow-artifacts"), ARTIFACTS_MESSAGE),
    (("registered-models", "model-versions", "webhooks"), "Runcast has no MLflow model registry."),
    (
        ("logged-models",),
        "Runcast keeps no logged models (they are artifacts). " + ARTIFACTS_MESSAGE,
    ),
    (
        ("traces", "unified-traces", "get-online-trace-details", "spans"),
        "Runcast does not store MLflow traces.",
    ),
)


def unsupported(path: str, *, artifacts: bool = False) -> MlflowError:
    head = path.strip("/").split("/", 1)[0]
    if artifacts:
        return MlflowError(ARTIFACTS_MESSAGE, "NOT_IMPLEMENTED")
    for heads, message in _UNSUPPORTED:
        if head in heads:
            return MlflowError(message, "NOT_IMPLEMENTED")
    supported = ", ".join(sorted(ROUTES))
    return MlflowError(
        f"Runcast does not serve the MLflow endpoint '{echo(path)}'. Supported: {supported}.",
        "ENDPOINT_NOT_FOUND",
    )


def _authenticate(request: HttpRequest) -> ApiToken:
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


def _respond(call: Callable[[], Data]) -> HttpResponse:
    try:
        return JsonResponse(call())
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
def endpoint(request: HttpRequest, path: str) -> HttpResponse:
    def handle() -> Data:
        token = _authenticate(request)
        route = ROUTES.get(path.strip("/"))
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
        return route.handler(Call(token=token, data=data, raw=raw))

    return _respond(handle)


@csrf_exempt
def artifacts(request: HttpRequest, path: str) -> HttpResponse:
    """The artifact proxy (`/api/2.0/mlflow-artifacts/...`) that `log_artifact` writes to."""

    def refuse() -> Data:
        raise unsupported(path, artifacts=True)

    return _respond(refuse)
