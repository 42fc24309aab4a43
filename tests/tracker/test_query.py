"""The query module (tracker.query): the MLflow filter language parsed with errors that say
where, and compiled to SQL over real rows: MLflow runs searched through the API's schema, and a
Runcast Run queryset through a schema of its own (what the runs explorer will do)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tracker import query
from tracker.mlflow import search, services
from tracker.mlflow.models import RunLink
from tracker.mlflow.parsing import KeyValue, MetricIn
from tracker.models import LatestMetric, Project, Run

START = 1_700_000_000_000


# --- parsing ---------------------------------------------------------------------------------


def test_it_names_the_token_and_position_it_could_not_parse() -> None:
    with pytest.raises(query.QueryError, match=r"could not parse near '~ 3' \(position 10\)") as e:
        query.parse("params.lr ~ 3")
    assert e.value.position == 10


def test_it_names_where_an_and_was_expected() -> None:
    with pytest.raises(query.QueryError, match=r"expected AND near 'OR x = '2'' \(position 16\)"):
        query.parse("params.lr = '1' OR x = '2'")


def test_it_refuses_a_value_that_is_not_a_number_or_string() -> None:
    with pytest.raises(query.QueryError, match=r"expected a quoted string or a number near '1\.2"):
        query.parse("metrics.loss < 1.2.3")


def test_it_reads_is_null_as_an_operator_not_as_part_of_the_key() -> None:
    assert query.parse("tags.team IS NULL AND params.opt = 'Adam' AND tags.x is not null") == [
        query.Comparison("tags", "team", "IS NULL", None),
        query.Comparison("params", "opt", "=", "Adam"),
        query.Comparison("tags", "x", "IS NOT NULL", None),
    ]


def test_it_keeps_keys_with_spaces_and_quotes() -> None:
    assert query.parse("tags.my key = 'v' AND params.`a b` != \"w\"") == [
        query.Comparison("tags", "my key", "=", "v"),
        query.Comparison("params", "a b", "!=", "w"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("metrics.loss IS NULL", "only supported for tags and params"),
        ("attributes.status IS NOT NULL", "only supported for tags and params"),
        ("metrics.loss LIKE 'a%'", "metrics compare with"),
        ("metrics.loss = 'a'", "compares with a number, not a string"),
        ("params.x IN ('a'", "needs a list"),
        ("params.x IN (1, 2)", "Invalid list in filter"),
    ],
)
def test_it_refuses_what_mlflow_refuses(text: str, message: str) -> None:
    with pytest.raises(query.QueryError, match=message):
        query.parse(text)


def test_the_api_answers_a_refusal_as_invalid_parameter_value(api: Any) -> None:
    body = api("runs/search", {"experiment_ids": ["0"], "filter": "tags.team IS NUL"}, status=400)
    assert body["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "could not parse near 'IS NUL' (position 10)" in body["message"]


# --- a project of MLflow runs ----------------------------------------------------------------


@pytest.fixture
def api(client: Any, project: Project) -> Any:
    token = services_token(project)

    def call(path: str, body: dict[str, Any], status: int = 200) -> Any:
        resp = client.post(
            f"/api/2.0/mlflow/{path}",
            body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert resp.status_code == status, resp.content
        return resp.json()

    return call


def services_token(project: Project) -> str:
    from tracker.models import ApiToken
    from tracker.services import token_create

    return token_create(project=project, name="q", scope=ApiToken.Scope.WRITE)


def make_run(
    project: Project,
    name: str,
    *,
    start: int,
    metrics: dict[str, list[float]] | None = None,
    params: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
) -> RunLink:
    link = services.run_create(
        project=project,
        experiment=services.experiment_default(project=project),
        user_id="u",
        start_time_ms=start,
        tags=[],
        run_name=name,
        run_id=name,
    )
    points = [
        MetricIn(key=k, value=v, timestamp_ms=start + i, step=i)
        for k, values in (metrics or {}).items()
        for i, v in enumerate(values)
    ]
    services.run_log(
        link=link,
        metrics=points,
        params=[KeyValue(k, v) for k, v in (params or {}).items()],
        tags=[KeyValue(k, v) for k, v in (tags or {}).items()],
    )
    return link


def names(api: Any, filter_string: str = "", order_by: list[str] | None = None) -> list[str]:
    body = {"experiment_ids": ["0"], "filter": filter_string, "order_by": order_by or []}
    return [r["info"]["run_name"] for r in api("runs/search", body).get("runs", [])]


@pytest.fixture
def runs(project: Project) -> None:
    make_run(project, "a", start=START, metrics={"loss": [3.0, 0.5]}, params={"opt": "Adam"})
    make_run(
        project,
        "b",
        start=START + 1000,
        metrics={"loss": [1.0, math.nan]},
        params={"opt": "SGD", "lr": "0.1"},
        tags={"team": "nlp"},
    )
    make_run(project, "c", start=START + 2000, metrics={"loss": [2.0]}, params={"lr": "1e-3"})
    make_run(project, "d", start=START + 3000, params={"opt": "Adam"}, tags={"team": "cv"})


@pytest.mark.django_db
def test_it_filters_on_is_null_with_and(api: Any, runs: None) -> None:
    assert names(api, "tags.team IS NULL AND params.opt = 'Adam'") == ["a"]
    assert names(api, "tags.team IS NOT NULL") == ["d", "b"]
    assert names(api, "params.opt IS NULL") == ["c"]


@pytest.mark.django_db
def test_it_filters_on_the_latest_metric_nan_matching_only_not_equal(api: Any, runs: None) -> None:
    assert names(api, "metrics.loss < 1") == ["a"]
    assert names(api, "metrics.loss >= 0.5") == ["c", "a"]
    assert names(api, "metrics.loss != 2") == ["b", "a"]
    assert names(api, "metrics.loss = 1") == []  # b's latest loss is its NaN, not 1


@pytest.mark.django_db
def test_it_orders_nan_after_numbers_and_missing_last_both_ways(api: Any, runs: None) -> None:
    assert names(api, order_by=["metrics.loss ASC"]) == ["a", "c", "b", "d"]
    assert names(api, order_by=["metrics.loss DESC"]) == ["c", "a", "b", "d"]


@pytest.mark.django_db
def test_it_compares_params_as_text_or_as_numbers(api: Any, runs: None) -> None:
    assert names(api, "params.lr < 0.05") == ["c"]
    assert names(api, "params.lr = '0.1'") == ["b"]
    assert names(api, "params.opt LIKE 'A%'") == ["d", "a"]
    assert names(api, "params.opt ILIKE 'sg_'") == ["b"]
    assert names(api, "params.opt NOT IN ('Adam')") == ["b"]
    assert names(api, "params.opt != 'Adam'") == ["b"]


@pytest.mark.django_db
def test_it_compares_start_time_as_milliseconds(api: Any, runs: None) -> None:
    assert names(api, f"attributes.start_time = {START + 1000}") == ["b"]
    assert names(api, f"start_time > {START + 1000}") == ["d", "c"]
    assert names(api, f"created <= {START + 1000}") == ["b", "a"]
    assert names(api, f"start_time < {START + 999.5}") == ["a"]
    assert names(api, "run_id IN ('a', 'c') AND status = 'RUNNING'") == ["c", "a"]


@pytest.mark.django_db
def test_it_pages_in_sql_with_the_same_tokens(api: Any, runs: None) -> None:
    seen, token, pages = [], "", 0
    while True:
        body = {"experiment_ids": ["0"], "max_results": 3, "page_token": token}
        out = api("runs/search", body)
        seen += [r["info"]["run_name"] for r in out["runs"]]
        pages += 1
        token = out.get("next_page_token", "")
        if not token:
            break
    assert seen == ["d", "c", "b", "a"] and pages == 2
    assert query.token_decode(query.token_encode(3)) == 3
    bad = api("runs/search", {"experiment_ids": ["0"], "page_token": "nope"}, status=400)
    assert "not a token this server gave" in bad["message"]


@pytest.mark.django_db
def test_the_latest_metric_is_the_highest_step_whatever_the_order_logged(project: Project) -> None:
    link = make_run(project, "r", start=START, metrics={"loss": [5.0, 4.0, 3.0]})
    late = MetricIn(key="loss", value=9.0, timestamp_ms=START + 99, step=1)
    services.run_log(link=link, metrics=[late], params=[], tags=[])
    row = LatestMetric.objects.get(run=link.run, key="loss")
    assert (row.value, row.step, row.is_nan) == (3.0, 2, False)
    again = MetricIn(key="loss", value=7.0, timestamp_ms=START + 100, step=2)
    services.run_log(link=link, metrics=[again], params=[], tags=[])
    assert LatestMetric.objects.get(run=link.run, key="loss").value == 7.0


@pytest.mark.django_db
def test_the_number_of_queries_does_not_grow_with_the_runs(api: Any, project: Project) -> None:
    def count(n: int) -> int:
        for i in range(n):
            make_run(project, f"r{n}-{i}", start=START + i, metrics={"loss": [float(i)]})
        names(api)  # a first request of a token also records its use
        with CaptureQueriesContext(connection) as ctx:
            found = names(api, "metrics.loss >= 0", ["metrics.loss DESC"])
        assert len(found) >= n
        return len(ctx.captured_queries)

    assert count(2) == count(30)


# --- a non-MLflow caller ---------------------------------------------------------------------

RUN_SCHEMA = query.Schema(
    noun="Runs",
    attributes={"name": query.Attribute("name"), "status": query.Attribute("status")},
    params="config",
    metrics="pk",
)


@pytest.mark.django_db
def test_a_runcast_run_queryset_is_searched_without_the_mlflow_views(
    project: Project, runs: None
) -> None:
    rows = query.apply(
        Run.objects.filter(project=project),
        RUN_SCHEMA,
        query.parse("params.opt = 'Adam' AND metrics.loss > 0"),
        query.parse_order_by(["name DESC"]),
    )
    assert [r.name for r in rows] == ["a"]
    with pytest.raises(query.QueryError, match="Runs are searched by attributes, params and"):
        query.apply(Run.objects.all(), RUN_SCHEMA, query.parse("tags.x = 'y'"), [])
    with pytest.raises(query.QueryError, match="Invalid attribute key 'nope'"):
        query.apply(Run.objects.all(), RUN_SCHEMA, query.parse("nope = 'y'"), [])


def test_the_mlflow_search_turns_errors_into_invalid_parameter_value() -> None:
    from tracker.mlflow.errors import MlflowError

    with pytest.raises(MlflowError) as e:
        search.read("tags.x IS NULL AND", [])
    assert e.value.code == "INVALID_PARAMETER_VALUE"


@pytest.mark.django_db
def test_the_backfill_finds_what_the_write_path_keeps(project: Project, runs: None) -> None:
    import importlib

    from django.apps import apps

    backfill = importlib.import_module("tracker.migrations.0007_backfill_latest_metrics")
    fields = ("run_id", "key", "value", "is_nan", "step", "timestamp_ms")
    kept = sorted(LatestMetric.objects.values_list(*fields))
    assert len(kept) == 3
    LatestMetric.objects.all().delete()
    backfill.backfill(apps, None)
    assert sorted(LatestMetric.objects.values_list(*fields)) == kept


@pytest.mark.parametrize(
    "item", ["metrics.loss UP", "metrics.my loss", "params.a b c", "name ASC DESC"]
)
def test_it_refuses_an_order_by_that_mlflow_cannot_read(item: str) -> None:
    with pytest.raises(query.QueryError, match="Invalid order_by clause"):
        query.parse_order_by([item])


def test_it_orders_by_a_quoted_key_with_spaces_in_either_case_of_direction() -> None:
    assert query.parse_order_by(["metrics.`my loss` DESC", "metrics.loss asc"]) == [
        query.OrderKey("metrics", "my loss", False),
        query.OrderKey("metrics", "loss", True),
    ]
