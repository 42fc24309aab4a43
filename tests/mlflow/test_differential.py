"""The same client calls against a real `mlflow server` and against Runcast, compared field by
field (issue 26 item 6).

Each scenario is a function of a `Side` (tests/mlflow/differential.py): it makes calls with the
stock `MlflowClient` and records what they answered. It runs once against the MLflow server
(conftest.py `mlflow_server`, one for the module) and once against Runcast's live server; both
recordings are flattened to `path -> value` fields, ids mapped to their order of creation, server
times to present or absent (a scenario records the orderings that matter), and compared. A field
that differs fails the test unless the scenario names it in `EXPECTED` with the reason; an entry
there that no longer differs fails too, so the list stays the list of differences that exist.
docs/mlflow.md ("Differences from an MLflow server") names each with its reason.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import pytest

from tests.mlflow.differential import Comparison, Side, normal_value, normalise

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

T0 = 1_760_000_000_000  # metric timestamps are the client's: sent explicitly, compared exactly

Scenario = Callable[[Side], None]
SCENARIOS: dict[str, Scenario] = {}
# scenario -> {field pattern (fnmatch) -> why Runcast answers differently}
EXPECTED: dict[str, dict[str, str]] = {}


def scenario(expected: dict[str, str] | None = None) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[fn.__name__] = fn
        EXPECTED[fn.__name__] = expected or {}
        return fn

    return register


def done(answer: Any) -> None:
    """Record that a call succeeded, not what it echoed back (the 7,000 characters sent)."""


def ids(items: Any) -> list[str]:
    return [item.info.run_id for item in items]


def new_experiment(s: Side, name: str, **kwargs: Any) -> str:
    return s.made(s.client.create_experiment(s.name(name), **kwargs), "exp")


def new_run(s: Side, experiment_id: str, name: str, **kwargs: Any) -> str:
    run = s.client.create_run(experiment_id, run_name=name, **kwargs)
    return s.made(run.info.run_id, "run")


# --- experiments -------------------------------------------------------------------------------


@scenario(
    {
        "rename_onto_taken.error_code": "MLflow's SQL store lets the database refuse the name "
        "(BAD_REQUEST); Runcast answers RESOURCE_ALREADY_EXISTS, MLflow's code for creating an "
        "experiment with a taken name",
    }
)
def experiments_create_get_rename(s: Side) -> None:
    exp = new_experiment(s, "vision", tags={"team": "cv"})
    s.record("get", s.client.get_experiment(exp))
    s.record("get_by_name", s.client.get_experiment_by_name(s.name("vision")))
    s.record("get_by_name_missing", s.client.get_experiment_by_name(s.name("nope")))
    s.attempt("create_again", lambda: s.client.create_experiment(s.name("vision")))
    s.attempt("create_empty_name", lambda: s.client.create_experiment(""))
    s.client.set_experiment_tag(exp, "stage", "pretrain")
    s.client.rename_experiment(exp, s.name("vision-2"))
    renamed = s.client.get_experiment(exp)
    s.record("renamed", renamed)
    s.record("renamed_old_name", s.client.get_experiment_by_name(s.name("vision")))
    other = new_experiment(s, "other")
    s.attempt("rename_onto_taken", lambda: s.client.rename_experiment(other, s.name("vision-2")))
    s.client.delete_experiment_tag(exp, "stage")
    s.record("tag_deleted", s.client.get_experiment(exp).tags)


@scenario()
def experiments_search(s: Side) -> None:
    for name, team in [("b", "nlp"), ("a", "cv"), ("c", "cv"), ("d", "rl")]:
        new_experiment(s, name, tags={"team": team})
    mine = f"name LIKE '{s.prefix}-%'"
    search = s.client.search_experiments

    def names(label: str, **kwargs: Any) -> None:
        page = search(**kwargs)
        s.record(label, {"names": [e.name for e in page], "token": page.token})

    names("by_name_asc", filter_string=mine, order_by=["name ASC"])
    names("by_name_desc", filter_string=mine, order_by=["name DESC"])
    names("default_order", filter_string=mine)
    names("tag_eq", filter_string=f"{mine} AND tags.team = 'cv'", order_by=["name"])
    names("tag_neq", filter_string=f"{mine} AND tags.team != 'cv'", order_by=["name"])
    names("tag_ilike", filter_string=f"{mine} AND tags.team ILIKE 'C%'", order_by=["name"])
    names("name_eq", filter_string=f"name = '{s.name('c')}'")
    first = search(filter_string=mine, order_by=["name ASC"], max_results=3)
    s.record("page_1", {"names": [e.name for e in first], "token": first.token})
    second = search(
        filter_string=mine, order_by=["name ASC"], max_results=3, page_token=first.token
    )
    s.record("page_2", {"names": [e.name for e in second], "token": second.token})
    s.attempt("bad_token", lambda: search(filter_string=mine, page_token="not-a-token"))
    s.attempt("bad_filter", lambda: search(filter_string="name = "))
    s.attempt("bad_order", lambda: search(filter_string=mine, order_by=["name SIDEWAYS"]))
    s.attempt("zero_results", lambda: search(filter_string=mine, max_results=0))


@scenario(
    {
        "rename_deleted.error_code": "MLflow's store raises INVALID_STATE, which its server "
        "answers as a 500 (INTERNAL_ERROR) that the client retries; Runcast refuses with "
        "INVALID_PARAMETER_VALUE (400), as every write to a deleted experiment",
    }
)
def experiments_delete_restore(s: Side) -> None:
    from mlflow.entities import ViewType

    exp = new_experiment(s, "doomed")
    run = new_run(s, exp, "inside")
    s.client.log_metric(run, "loss", 1.0, timestamp=T0, step=0)
    s.client.delete_experiment(exp)
    s.record("deleted", s.client.get_experiment(exp))
    s.record("run_when_deleted", s.client.get_run(run).info.lifecycle_stage)
    mine = f"name LIKE '{s.prefix}-%'"
    for view in ("ACTIVE_ONLY", "DELETED_ONLY", "ALL"):
        page = s.client.search_experiments(view_type=getattr(ViewType, view), filter_string=mine)
        s.record(f"search_{view}", [e.name for e in page])
    s.attempt("runs_in_deleted", lambda: ids(s.client.search_runs([exp])))
    s.attempt(
        "deleted_runs_in_deleted",
        lambda: ids(s.client.search_runs([exp], run_view_type=ViewType.DELETED_ONLY)),
    )
    s.attempt("create_run_in_deleted", lambda: s.client.create_run(exp))
    s.attempt("log_to_run_in_deleted", lambda: s.client.log_metric(run, "loss", 2.0, T0, 1))
    s.attempt("rename_deleted", lambda: s.client.rename_experiment(exp, s.name("x")))
    s.attempt("tag_deleted", lambda: s.client.set_experiment_tag(exp, "k", "v"))
    s.attempt("name_of_deleted_taken", lambda: s.client.create_experiment(s.name("doomed")))
    s.client.restore_experiment(exp)
    s.record("restored", s.client.get_experiment(exp))
    s.record("run_when_restored", s.client.get_run(run).info.lifecycle_stage)
    s.attempt("restore_active", lambda: s.client.restore_experiment(exp))
    s.client.delete_experiment(exp)
    s.attempt("delete_again", lambda: s.client.delete_experiment(exp))


# --- runs --------------------------------------------------------------------------------------


@scenario()
def runs_create_get_update(s: Side) -> None:
    exp = new_experiment(s, "runs")
    created = s.client.create_run(exp, run_name="first", tags={"team": "nlp"}, start_time=T0)
    run = s.made(created.info.run_id, "run")
    s.record("created", created)
    s.record("got", s.client.get_run(run))
    s.client.update_run(run, name="renamed")
    s.record("renamed", s.client.get_run(run).info)
    s.client.update_run(run, status="FINISHED")
    finished = s.client.get_run(run).info
    s.record("finished", finished)
    s.record("end_after_start", (finished.end_time or 0) >= (finished.start_time or 0))
    s.client.update_run(run, status="RUNNING")
    s.record("running_again", s.client.get_run(run).info)
    s.client.set_terminated(run, "KILLED", end_time=T0 + 5000)
    s.record("killed", s.client.get_run(run).info)
    plain = s.client.create_run(exp)
    s.made(plain.info.run_id, "run")
    s.record("unnamed_has_name", bool(plain.info.run_name))
    s.record("unnamed_tags", sorted(plain.data.tags))
    s.attempt("create_in_missing_experiment", lambda: s.client.create_run("987654321"))


def _runs_for_search(s: Side) -> tuple[str, list[str]]:
    exp = new_experiment(s, "search")
    spec: list[tuple[str, float | None, str, str, str]] = [
        ("r0", 0.5, "adam", "nlp", "FINISHED"),
        ("r1", float("nan"), "sgd", "cv", "FAILED"),
        ("r2", 0.5, "adam", "cv", "FINISHED"),
        ("r3", None, "sgd", "nlp", "RUNNING"),
        ("r4", 0.1, "adamw", "rl", "KILLED"),
        ("r5", 2.0, "adam", "nlp", "FINISHED"),
    ]
    runs = []
    for i, (name, loss, opt, team, status) in enumerate(spec):
        run = new_run(s, exp, name, start_time=T0 + i * 1000)
        if loss is not None:
            s.client.log_metric(run, "loss", loss, timestamp=T0, step=0)
        s.client.log_param(run, "opt", opt)
        s.client.log_param(run, "layers", str(12 * (i + 1)))
        s.client.set_tag(run, "team", team)
        if status != "RUNNING":
            s.client.set_terminated(run, status, end_time=T0 + 100_000 + i)
        runs.append(run)
    return exp, runs


SEARCH_LANGUAGE = (
    "Runcast's filter language is the runs explorer's too (tracker/query): it takes IN and "
    "NOT IN on any attribute, param or tag and filters on lifecycle_stage, which MLflow refuses"
)


@scenario(
    {
        "lifecycle*": SEARCH_LANGUAGE,
        "param_in*": SEARCH_LANGUAGE,
        "param_not_in*": SEARCH_LANGUAGE,
        "status_in*": SEARCH_LANGUAGE,
    }
)
def search_runs_filters(s: Side) -> None:
    exp, runs = _runs_for_search(s)
    filters = {
        "run_id_in": f"attributes.run_id IN ('{runs[1]}', '{runs[4]}')",
        "run_id_eq": f"attributes.run_id = '{runs[2]}'",
        "user_id": "attributes.user_id = 'unknown'",
        "quoted_tag": "tags.\"mlflow.runName\" = 'r2'",
        "metric_lt": "metrics.loss < 1",
        "metric_eq": "metrics.loss = 0.5",
        "metric_gt": "metrics.loss > 0.2",
        "metric_neq": "metrics.loss != 0.5",
        "param_eq": "params.opt = 'adam'",
        "param_neq": "params.opt != 'adam'",
        "param_like": "params.opt LIKE 'adam%'",
        "param_ilike": "params.opt ILIKE 'ADAM_'",
        "param_in": "params.opt IN ('sgd', 'adamw')",
        "param_not_in": "params.opt NOT IN ('sgd', 'adamw')",
        "param_numeric_text": "params.layers = '24'",
        "tag_eq": "tags.team = 'nlp'",
        "tag_backquoted": "tags.`team` = 'cv'",
        "tag_is_null": "tags.missing IS NULL",
        "tag_is_not_null": "tags.team IS NOT NULL",
        "status": "attributes.status = 'FINISHED'",
        "status_in": "attributes.status IN ('FAILED', 'KILLED')",
        "run_name": "attributes.run_name = 'r3'",
        "run_name_like": "attributes.run_name LIKE 'r%'",
        "start_time": f"attributes.start_time >= {T0 + 3000}",
        "end_time": f"attributes.end_time > {T0 + 100_003}",
        "combined": "params.opt = 'adam' AND tags.team = 'nlp' AND metrics.loss <= 0.5",
        "lifecycle": "attributes.lifecycle_stage = 'active'",
    }
    for label, text in filters.items():
        s.attempt(label, lambda text=text: ids(s.client.search_runs([exp], text)))
    bad = {
        "bad_syntax": "metrics.loss <",
        "bad_entity": "nope.loss = 1",
        "bad_operator": "params.opt ~ 'adam'",
        "metric_vs_string": "metrics.loss = 'a'",
        "or": "params.opt = 'adam' OR params.opt = 'sgd'",
    }
    for label, text in bad.items():
        s.attempt(label, lambda text=text: ids(s.client.search_runs([exp], text)))


@scenario()
def search_runs_order_and_pages(s: Side) -> None:
    exp, _ = _runs_for_search(s)
    orders = {
        "default": [],
        "metric_asc": ["metrics.loss ASC"],
        "metric_desc": ["metrics.loss DESC"],
        "metric_tie_then_name": ["metrics.loss ASC", "attributes.run_name DESC"],
        "param_asc": ["params.opt ASC"],
        "param_desc_numeric_text": ["params.layers DESC"],
        "tag": ["tags.team ASC", "attributes.start_time ASC"],
        "run_name": ["attributes.run_name DESC"],
        "start_time": ["attributes.start_time ASC"],
        "end_time": ["attributes.end_time DESC"],
        "status": ["attributes.status", "attributes.run_name"],
    }
    for label, order in orders.items():
        s.attempt(label, lambda order=order: ids(s.client.search_runs([exp], order_by=order)))
    seen: list[str] = []
    token = None
    for page_no in range(4):
        page = s.client.search_runs(
            [exp], max_results=2, order_by=["attributes.run_name"], page_token=token
        )
        s.record(f"page_{page_no}", {"runs": ids(page), "token": page.token})
        seen += ids(page)
        token = page.token
        if not token:
            break
    s.record("pages_cover_all_once", len(seen) == len(set(seen)) == 6)
    for label, kwargs in {
        "bad_token": {"page_token": "garbage"},
        "bad_order": {"order_by": ["metrics.loss UP"]},
        "bad_order_key": {"order_by": ["loss"]},
        "too_many": {"max_results": 50_001},
    }.items():
        s.attempt(label, lambda kwargs=kwargs: ids(s.client.search_runs([exp], **kwargs)))
    s.attempt("missing_experiment", lambda: ids(s.client.search_runs(["987654321"])))


# --- metrics -----------------------------------------------------------------------------------


@scenario()
def log_batch_duplicates(s: Side) -> None:
    from mlflow.entities import Metric, Param

    run = new_run(s, new_experiment(s, "dupes"), "dupes")
    a = Metric("loss", 1.0, T0, 0)
    b = Metric("loss", 0.5, T0 + 1, 1)
    s.client.log_batch(run, metrics=[a])
    s.client.log_batch(run, metrics=[a, b])
    s.client.log_metric(run, "loss", 0.5, timestamp=T0 + 1, step=1)  # B again, alone
    s.client.log_metric(run, "loss", 0.7, timestamp=T0 + 1, step=1)  # same step, new value
    s.client.log_batch(run, metrics=[Metric("acc", 0.1, T0, 0), Metric("acc", 0.1, T0, 0)])
    s.record("history_loss", s.client.get_metric_history(run, "loss"))
    s.record("history_acc", s.client.get_metric_history(run, "acc"))
    # Over the server's limits (1,000 metrics, 100 params a request) the client splits the
    # batch itself, so both servers take it whole.
    s.client.log_batch(run, metrics=[Metric("m", 1.0, T0, k) for k in range(1001)])
    s.client.log_batch(run, params=[Param(f"p{k}", "v") for k in range(101)])
    s.record("split_batch_points", len(s.client.get_metric_history(run, "m")))
    s.record("split_batch_params", len(s.client.get_run(run).data.params))
    # The limits themselves, in one request as another client may send it.
    point = {"key": "over", "value": 1.0, "timestamp": T0}
    for label, body in {
        "over_1000_metrics": {"metrics": [{**point, "step": k} for k in range(1001)]},
        "over_100_params": {"params": [{"key": f"q{k}", "value": "v"} for k in range(101)]},
        "over_100_tags": {"tags": [{"key": f"t{k}", "value": "v"} for k in range(101)]},
        "metric_without_timestamp": {"metrics": [{"key": "over", "value": 1.0}]},
    }.items():
        s.record(label, s.rest("/api/2.0/mlflow/runs/log-batch", {"run_id": run, **body}))
    s.record("nothing_of_refused_batches", s.client.get_metric_history(run, "over"))
    s.record("latest", s.client.get_run(run).data.metrics)


@scenario(
    {
        "latest.same_step": "two values at one step: MLflow's latest is the one with the later "
        "timestamp, Runcast's the one logged later (its chunks' order, which the ingest path "
        "keeps LatestMetric by)",
    }
)
def metrics_special_values_and_history(s: Side) -> None:
    run = new_run(s, new_experiment(s, "values"), "values")
    for step, value in enumerate([float("nan"), math.inf, -math.inf, 0.0, -0.0, 1e-300, 3.5]):
        s.client.log_metric(run, "v", value, timestamp=T0 + step, step=step)
    s.client.log_metric(run, "only_nan", float("nan"), timestamp=T0, step=0)
    s.client.log_metric(run, "only_inf", math.inf, timestamp=T0, step=0)
    s.client.log_metric(run, "back", 2.0, timestamp=T0 + 10, step=5)
    s.client.log_metric(run, "back", 3.0, timestamp=T0 + 20, step=2)  # an earlier step, later
    s.client.log_metric(run, "same_step", 1.0, timestamp=T0 + 5, step=3)
    s.client.log_metric(run, "same_step", 2.0, timestamp=T0 + 1, step=3)
    s.client.log_metric(run, "big_step", 1.0, timestamp=T0, step=2**62)
    s.record("latest", s.client.get_run(run).data.metrics)
    for key in ("v", "back", "same_step", "big_step", "absent"):
        s.record(f"history_{key}", s.client.get_metric_history(run, key))
    s.attempt("history_missing_run", lambda: s.client.get_metric_history("f" * 32, "v"))
    s.attempt("negative_timestamp", lambda: s.client.log_metric(run, "v", 1.0, -1, 0))
    s.attempt("bad_key", lambda: s.client.log_metric(run, "a//b", 1.0, T0, 0))
    s.attempt("missing_run", lambda: s.client.log_metric("f" * 32, "v", 1.0, T0, 0))


@scenario()
def history_bulk_interval(s: Side) -> None:
    """MLflow's UI endpoint; the client computes intervals itself from get-history, so it is
    called through the client's HTTP layer."""
    from mlflow.entities import Metric

    exp = new_experiment(s, "bulk")
    runs = [new_run(s, exp, f"r{i}") for i in range(2)]
    for i, run in enumerate(runs):
        points = [Metric("loss", 1.0 / (k + 1), T0 + k, k) for k in range(0, 300, i + 1)]
        s.client.log_batch(run, metrics=points)
    endpoint = "/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval"
    for label, extra in {
        "all": {"max_results": 1000},
        "sampled": {"max_results": 10},
        "window": {"max_results": 5, "start_step": 100, "end_step": 150},
    }.items():
        answer = s.rest(endpoint, run_ids=runs, metric_key="loss", **extra)
        s.record(label, answer)
    s.record("one_bound", s.rest(endpoint, run_ids=runs, metric_key="loss", start_step=1))
    s.record("no_runs", s.rest(endpoint, metric_key="loss"))


# --- params and tags ---------------------------------------------------------------------------


@scenario()
def params_and_tags_values(s: Side) -> None:
    from mlflow.entities import Param, RunTag

    run = new_run(s, new_experiment(s, "values"), "values")
    s.client.log_param(run, "lr", 3e-4)
    s.client.log_param(run, "layers", 12)
    s.client.log_param(run, "flag", True)
    s.client.log_param(run, "nothing", None)
    s.client.log_param(run, "empty", "")
    s.client.set_tag(run, "int_tag", 3)
    s.client.set_tag(run, "none_tag", None)
    s.attempt("long_param", lambda: done(s.client.log_param(run, "long", "p" * 7000)))
    s.attempt("long_tag", lambda: done(s.client.set_tag(run, "long", "t" * 9000)))
    s.attempt("same_param_again", lambda: s.client.log_param(run, "lr", 3e-4))
    s.attempt("param_changed", lambda: s.client.log_param(run, "lr", 1e-3))
    s.attempt(
        "param_changed_in_batch",
        lambda: s.client.log_batch(run, params=[Param("layers", "24"), Param("new", "x")]),
    )
    s.attempt("batch_tags", lambda: s.client.log_batch(run, tags=[RunTag("t", "1")] * 2))
    s.client.set_tag(run, "overwritten", "a")
    s.client.set_tag(run, "overwritten", "b")
    s.attempt("long_key", lambda: s.client.log_param(run, "k" * 251, "v"))
    s.attempt("bad_key", lambda: s.client.set_tag(run, "../x", "v"))
    data = s.client.get_run(run).data
    s.record("params", {k: v for k, v in data.params.items() if k != "long"})
    s.record("tags", {k: v for k, v in data.tags.items() if k != "long"})
    s.record("long_param_length", len(data.params.get("long", "")))
    s.record("long_tag_length", len(data.tags.get("long", "")))


@scenario()
def delete_tag(s: Side) -> None:
    run = new_run(s, new_experiment(s, "tags"), "tags")
    s.client.set_tag(run, "keep", "1")
    s.client.set_tag(run, "drop", "2")
    s.client.delete_tag(run, "drop")
    s.record("tags", s.client.get_run(run).data.tags)
    s.attempt("delete_missing", lambda: s.client.delete_tag(run, "never"))
    s.attempt("delete_on_missing_run", lambda: s.client.delete_tag("f" * 32, "keep"))
    s.record("found_by_deleted", ids(s.client.search_runs([], "tags.drop = '2'")))


@scenario()
def deleted_runs(s: Side) -> None:
    from mlflow.entities import ViewType

    exp = new_experiment(s, "deleted")
    run = new_run(s, exp, "gone")
    other = new_run(s, exp, "kept")
    s.client.log_param(run, "p", "1")
    s.client.delete_run(run)
    s.record("got", s.client.get_run(run).info)
    for view in ("ACTIVE_ONLY", "DELETED_ONLY", "ALL"):
        found = s.client.search_runs([exp], run_view_type=getattr(ViewType, view))
        s.record(f"search_{view}", sorted(ids(found), key=[run, other].index))
    s.attempt("log_metric", lambda: s.client.log_metric(run, "m", 1.0, T0, 0))
    s.attempt("log_param", lambda: s.client.log_param(run, "q", "2"))
    s.attempt("set_tag", lambda: s.client.set_tag(run, "t", "v"))
    s.attempt("delete_tag", lambda: s.client.delete_tag(run, "mlflow.runName"))
    s.attempt("update", lambda: s.client.set_terminated(run, "FINISHED"))
    s.attempt("history", lambda: s.client.get_metric_history(run, "m"))
    s.attempt("delete_again", lambda: s.client.delete_run(run))
    s.client.restore_run(run)
    s.record("restored", s.client.get_run(run).info)
    s.attempt("restore_active", lambda: s.client.restore_run(run))
    s.attempt("delete_missing", lambda: s.client.delete_run("f" * 32))
    s.attempt("restore_missing", lambda: s.client.restore_run("f" * 32))


# --- datasets and logged models ----------------------------------------------------------------


@scenario()
def dataset_inputs(s: Side) -> None:
    from mlflow.entities import Dataset, DatasetInput, InputTag

    exp = new_experiment(s, "data")
    run = new_run(s, exp, "data")
    train = Dataset("train", "d1", "local", '{"uri": "/data/train"}', '{"cols": 3}', '{"n": 9}')
    evaluation = Dataset("eval", "d2", "local", '{"uri": "/data/eval"}')
    context = [InputTag("mlflow.data.context", "training")]
    s.client.log_inputs(run, datasets=[DatasetInput(train, context)])
    s.client.log_inputs(run, datasets=[DatasetInput(train, context)])  # again: kept once
    s.client.log_inputs(run, datasets=[DatasetInput(evaluation, [])])
    s.record("inputs", s.client.get_run(run).inputs)
    found = s.client.search_runs([exp])
    s.record("search_inputs", [r.inputs for r in found])
    s.attempt("missing_run", lambda: s.client.log_inputs("f" * 32, [DatasetInput(train)]))
    summaries = "/ajax-api/2.0/mlflow/experiments/search-datasets"
    found = s.rest(summaries, {"experiment_ids": [exp]})["dataset_summaries"]
    # MLflow's store lists them in no order (a SELECT DISTINCT without ORDER BY): as a set.
    s.record("search_datasets", sorted(found, key=lambda d: (d["name"], d["digest"])))


@scenario()
def logged_models(s: Side) -> None:
    exp = new_experiment(s, "models")
    run = new_run(s, exp, "trainer")

    def create(name: str, **kwargs: Any) -> str:
        model = s.client.create_logged_model(exp, name=name, **kwargs)
        return s.made(model.model_id, "model")

    clf = create(
        "clf", source_run_id=run, params={"alpha": "0.1"}, tags={"t": "1"}, model_type="sk"
    )
    reg = create("reg", params={"alpha": "0.5"})
    s.record("created", s.client.get_logged_model(clf))
    s.client.log_model_params(clf, {"l1": "0"})
    s.client.set_logged_model_tags(clf, {"team": "nlp"})
    s.client.delete_logged_model_tag(clf, "t")
    s.attempt("delete_missing_tag", lambda: s.client.delete_logged_model_tag(clf, "never"))
    s.client.log_metric(run, "acc", 0.9, timestamp=T0, step=3, model_id=clf)
    s.record("finalized", s.client.finalize_logged_model(clf, "READY"))
    s.record("run_metrics", s.client.get_run(run).data.metrics)
    s.client.finalize_logged_model(reg, "FAILED")
    search = s.client.search_logged_models

    def model_ids(label: str, **kwargs: Any) -> None:
        s.attempt(label, lambda: [m.model_id for m in search([exp], **kwargs)])

    model_ids("all")
    model_ids("by_name", filter_string="name = 'clf'")
    model_ids("by_param", filter_string="params.alpha = '0.5'")
    model_ids("by_tag", filter_string="tags.team = 'nlp'")
    model_ids("by_status", filter_string="status = 'READY'")
    model_ids("by_run", filter_string=f"source_run_id = '{run}'")
    model_ids("name_asc", order_by=[{"field_name": "name", "ascending": True}])
    model_ids("name_desc", order_by=[{"field_name": "name", "ascending": False}])
    model_ids("bad_filter", filter_string="name = ")
    page = search([exp], max_results=1, order_by=[{"field_name": "name", "ascending": True}])
    s.record("page_1", {"models": [m.model_id for m in page], "token": page.token})
    s.attempt("missing", lambda: s.client.get_logged_model("m-" + "f" * 32))
    s.client.delete_logged_model(reg)
    model_ids("after_delete")


# --- errors ------------------------------------------------------------------------------------


@scenario(
    {
        "get_run_too_long.error_code": "a run id over 64 characters cannot exist, so Runcast "
        "refuses it as INVALID_PARAMETER_VALUE naming the field (docs/mlflow.md, Limits)",
    }
)
def error_codes(s: Side) -> None:
    missing_run = "0123456789abcdef0123456789abcdef"
    s.attempt("get_run", lambda: s.client.get_run(missing_run))
    s.attempt("get_run_too_long", lambda: s.client.get_run("a" * 65))
    s.attempt("get_experiment", lambda: s.client.get_experiment("987654321"))
    s.attempt("get_experiment_not_digits", lambda: s.client.get_experiment("abc"))
    s.attempt("create_run_not_digits", lambda: s.client.create_run("abc"))
    s.attempt("search_runs_not_digits", lambda: ids(s.client.search_runs(["abc"])))
    s.attempt("search_runs_missing", lambda: ids(s.client.search_runs(["987654321"])))
    s.attempt("delete_run", lambda: s.client.delete_run(missing_run))
    s.attempt("history", lambda: s.client.get_metric_history(missing_run, "loss"))
    s.attempt("get_logged_model", lambda: s.client.get_logged_model("m-" + "0" * 32))
    s.attempt("update_run", lambda: s.client.update_run(missing_run, status="FINISHED"))
    s.attempt("set_tag", lambda: s.client.set_tag(missing_run, "k", "v"))
    s.attempt("log_param", lambda: s.client.log_param(missing_run, "k", "v"))
    s.attempt("rename_experiment", lambda: s.client.rename_experiment("987654321", "x"))
    s.attempt("delete_experiment", lambda: s.client.delete_experiment("987654321"))
    s.attempt("restore_experiment", lambda: s.client.restore_experiment("987654321"))
    s.attempt("search_runs_bad_token", lambda: s.client.search_runs(["0"], page_token="%%%"))
    s.attempt("search_runs_bad_filter", lambda: s.client.search_runs(["0"], "metrics.x >"))
    s.attempt(
        "search_experiments_bad_filter",
        lambda: s.client.search_experiments(filter_string="name ~ 'x'"),
    )


# --- the fluent API ----------------------------------------------------------------------------


@scenario()
def fluent_script(s: Side) -> None:
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(s.uri)
    try:
        exp = mlflow.set_experiment(s.name("fluent"))
        s.made(exp.experiment_id, "exp")
        with mlflow.start_run(run_name="script") as run:
            s.made(run.info.run_id, "run")
            mlflow.log_params({"lr": 3e-4, "max_steps": 100})
            mlflow.set_tags({"team": "nlp"})
            for step in range(3):
                mlflow.log_metrics({"loss": 1.0 / (step + 1)}, step=step, timestamp=T0 + step)
            with mlflow.start_run(run_name="child", nested=True) as child:
                s.made(child.info.run_id, "run")
        got = mlflow.get_run(run.info.run_id)
        s.record("run", got)
        s.record("child_tags", mlflow.get_run(child.info.run_id).data.tags)
        frame = mlflow.search_runs(filter_string="metrics.loss < 0.5", order_by=["metrics.loss"])
        s.record("search_frame_columns", sorted(frame.columns))
        s.record("search_frame_run_ids", list(frame["run_id"]))
    finally:
        mlflow.set_tracking_uri(before)


# --- the test ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_runcast_answers_as_an_mlflow_server(
    name: str,
    mlflow_server: str,
    mlflow_env: Any,
    live_server: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # MLflow's server answers a rename of a deleted experiment with a 500, which the client
    # retries: at once here.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    sides = []
    for uri in (mlflow_server, live_server.url):
        side = Side(uri, prefix=name)
        SCENARIOS[name](side)
        sides.append(normalise(side))
    comparison = Comparison(theirs=sides[0], ours=sides[1], expected=EXPECTED[name])
    print(json.dumps({"scenario": name, **comparison.figures()}))
    if os.environ.get("RC_DIFF_SHOW"):  # every field compared, to read what a scenario checks
        print(comparison.describe(comparison.every(), limit=10**6))
    new = comparison.new()
    assert not new, "Runcast answers differently from MLflow:\n" + comparison.describe(new)
    assert not comparison.stale(), (
        f"expected differences that no longer occur: {comparison.stale()}"
    )


@pytest.mark.django_db(transaction=False)  # no server, no rows: only the module mark wants a db
def test_the_comparison_fails_on_a_new_difference_and_on_a_stale_expected_one() -> None:
    ids = {"a" * 32: "run#1", "3": "exp#1"}
    theirs = {"x.status": "FINISHED", "x.tags.n": "3", "x.experiment_id": "3", "y": 1}
    ours = {"x.status": "KILLED", "x.tags.n": "3", "x.experiment_id": "3", "y": 1}
    normal = {p: normal_value(p, v, ids) for p, v in theirs.items()}
    # A tag "3" stays "3"; only an experiment_id field is read as experiment 3.
    assert (normal["x.tags.n"], normal["x.experiment_id"]) == ("3", "exp#1")
    assert (
        normal_value("u", f"mlflow-artifacts:/3/{'a' * 32}/x", ids) == "mlflow-artifacts:/3/run#1/x"
    )
    new = Comparison(theirs=theirs, ours=ours, expected={})
    assert new.new() == {"x.status": ("FINISHED", "KILLED")}
    named = Comparison(theirs=theirs, ours=ours, expected={"x.stat*": "why", "y": "fixed since"})
    assert (named.new(), named.stale()) == ({}, ["y"])
    assert named.figures() == {"fields": 4, "identical": 3, "expected_differences": 1}
