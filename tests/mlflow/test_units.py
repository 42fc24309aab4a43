"""The MLflow API's parsing, search and plan rules, and its error JSON, without the mlflow
package (these run in the default test command)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from tracker import query
from tracker.mlflow import search
from tracker.mlflow.errors import MlflowError
from tracker.mlflow.parsing import metric_of
from tracker.mlflow.services import planned_total_steps
from tracker.models import Run


def test_it_parses_the_filters_clients_send() -> None:
    clauses = query.parse(
        "tags.mlflow.parentRunId = 'abc' and params.`lr` = \"0.1\" AND metrics.loss < 0.5 "
        "AND attributes.status IN ('FINISHED', 'FAILED') AND run_name LIKE 'bert-%'"
    )
    assert [(c.entity, c.key, c.op, c.value) for c in clauses] == [
        ("tags", "mlflow.parentRunId", "=", "abc"),
        ("params", "lr", "=", "0.1"),
        ("metrics", "loss", "<", 0.5),
        ("attributes", "status", "IN", ("FINISHED", "FAILED")),
        ("attributes", "run_name", "LIKE", "bert-%"),
    ]


def test_it_refuses_a_filter_it_does_not_understand() -> None:
    with pytest.raises(MlflowError, match="could not parse") as err:
        search.read("params.lr ~ 3", [])
    assert err.value.code == "INVALID_PARAMETER_VALUE"


@pytest.mark.parametrize(
    ("values", "total"),
    [
        ({"runcast.total_steps": "5000", "max_steps": "10"}, 5000),
        ({"max_steps": "-1", "num_train_epochs": "3", "steps_per_epoch": "100"}, 300),
        ({"max_steps": "1e5"}, 100_000),
        ({"epochs": "3"}, None),
        ({"max_steps": "many"}, None),
    ],
)
def test_it_reads_the_plan_from_params_and_tags(values: dict[str, str], total: int | None) -> None:
    assert planned_total_steps(values) == total


def test_it_names_the_field_of_a_bad_metric() -> None:
    assert math.isnan(metric_of({"key": "l", "value": "NaN", "timestamp": "5"}, "m").value)
    with pytest.raises(MlflowError, match=r"'metrics\[2\]\.step'"):
        metric_of({"key": "l", "value": 1, "timestamp": 5, "step": "x"}, "metrics[2]")
    with pytest.raises(MlflowError, match="'key'"):
        metric_of({"key": "a//b", "value": 1, "timestamp": 5}, "")


@pytest.mark.django_db
def test_every_path_under_the_prefixes_answers_mlflow_json(
    client: Client, write_token: str
) -> None:
    auth = {"HTTP_AUTHORIZATION": f"Bearer {write_token}"}
    for path in (
        "/api/2.0/mlflow/registered-models/create",
        "/ajax-api/2.0/mlflow/nothing-here",
        "/api/2.0/mlflow-artifacts/artifacts/0/abc/artifacts/model.pkl",
    ):
        answer = client.post(path, data="{}", content_type="application/json", **auth)
        body = json.loads(answer.content)
        assert answer["Content-Type"] == "application/json", path
        assert body["error_code"] in ("NOT_IMPLEMENTED", "ENDPOINT_NOT_FOUND") and body["message"]


def _poster(client: Client, token: str) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """POST one MLflow API call with the token; the answer's JSON, asserting a 200."""

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = client.post(
            f"/api/2.0/mlflow/{path}",
            data=json.dumps(body),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert answer.status_code == 200, answer.content
        return json.loads(answer.content)

    return post


@pytest.mark.django_db
def test_params_set_the_plan_and_a_deadline(client: Client, write_token: str, project: Any) -> None:
    from datetime import UTC, datetime

    project.deadlines.create(
        slug="neurips", name="NeurIPS", cutoff=datetime(2027, 5, 1, tzinfo=UTC)
    )
    post = _poster(client, write_token)

    run_id = post("runs/create", {"experiment_id": "0", "run_name": "r"})["run"]["info"]["run_id"]
    post(
        "runs/log-batch",
        {
            "run_id": run_id,
            "params": [{"key": "epochs", "value": "4"}, {"key": "steps_per_epoch", "value": "250"}],
            "tags": [{"key": "runcast.deadline", "value": "neurips"}],
        },
    )
    run = Run.objects.get(public_id=run_id)
    assert (run.total_steps, run.deadline.slug) == (1000, "neurips")
    post("runs/set-tag", {"run_id": run_id, "key": "runcast.total_steps", "value": "1200"})
    assert Run.objects.get(public_id=run_id).total_steps == 1200


@pytest.mark.django_db
def test_members_edit_the_plan_on_the_run_page(
    client: Client, project: Any, member: Any, viewer: Any, outsider: Any
) -> None:
    from datetime import UTC, datetime

    project.deadlines.create(slug="icml", name="ICML", cutoff=datetime(2027, 1, 1, tzinfo=UTC))
    run = Run.objects.create(project=project, public_id="r1", total_steps=10)
    url = f"/runs/{project.slug}/r1/plan/"
    client.force_login(viewer)
    assert client.post(url, {"total_steps": "500"}).status_code == 403
    client.force_login(outsider)
    assert client.post(url, {"total_steps": "500"}).status_code == 404
    client.force_login(member)
    assert client.get(f"/runs/{project.slug}/r1/").status_code == 200
    assert client.post(url, {"total_steps": "0"}).status_code == 400
    assert client.post(url, {"total_steps": "500", "deadline": "icml"}).status_code == 302
    run.refresh_from_db()
    assert (run.total_steps, run.deadline.slug) == (500, "icml")


@pytest.mark.django_db
def test_a_search_reads_latest_metrics_in_a_bounded_number_of_queries(
    client: Client, write_token: str
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    post = _poster(client, write_token)

    def log_runs(count: int) -> None:
        for i in range(count):
            run_id = post("runs/create", {"experiment_id": "0", "run_name": f"r{i}"})["run"][
                "info"
            ]["run_id"]
            # Two batches per key, the second rewriting step 2: the latest point is the highest
            # step's latest write, whichever chunk holds it.
            for value in (float(i), float(i) + 0.5):
                post(
                    "runs/log-batch",
                    {
                        "run_id": run_id,
                        "metrics": [
                            {
                                "key": k,
                                "value": value,
                                "timestamp": 1000 + int(value * 10),
                                "step": s,
                            }
                            for k in ("loss", "acc", "lr")
                            for s in (1, 2)
                        ],
                    },
                )

    def search() -> tuple[int, list[dict[str, Any]]]:
        with CaptureQueriesContext(connection) as queries:
            runs = post(
                "runs/search",
                {
                    "experiment_ids": ["0"],
                    "filter": "metrics.loss >= 1",
                    "order_by": ["metrics.acc"],
                },
            )["runs"]
        return len(queries), runs

    log_runs(3)
    few, runs = search()
    assert [{m["key"]: m["value"] for m in r["data"]["metrics"]}["loss"] for r in runs] == [
        1.5,
        2.5,
    ]
    log_runs(9)
    many, runs = search()
    assert len(runs) == 10
    # One query per run and key before; now the count does not grow with the runs found.
    assert many == few


def test_the_bulk_interval_picks_the_rows_sqls_ntile_starts_buckets_at() -> None:
    """`_ntile_firsts` against SQLite's own NTILE, the window function MLflow's SQL store uses."""
    import sqlite3

    from tracker.mlflow.selectors import _ntile_firsts

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (i INTEGER)")
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(40)])
    for total in range(1, 41):
        for buckets in range(1, 13):
            rows = db.execute(
                "SELECT MIN(i) FROM (SELECT i, NTILE(?) OVER (ORDER BY i) AS b FROM t WHERE i < ?)"
                " GROUP BY b ORDER BY 1",
                (buckets, total),
            ).fetchall()
            firsts = [r[0] for r in rows]
            if total > buckets:
                firsts[-1] = total - 1  # MLflow's store shows the range's end
            assert _ntile_firsts(total, buckets) == firsts, (total, buckets)
