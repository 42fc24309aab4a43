"""Reads behind the MLflow API, answered in MLflow's JSON shapes (its protobuf's JSON form)."""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db import connection

from tracker import rows
from tracker import selectors as tracker_selectors
from tracker.mlflow import artifacts
from tracker.mlflow.models import Experiment, LoggedModel, Mirror, RunLink
from tracker.models import LatestMetric, Project, Run


def experiment_find(*, project: Project, public_id: str) -> Experiment | None:
    return Experiment.objects.filter(project=project, public_id=public_id).first()


def experiment_by_name(*, project: Project, name: str) -> Experiment | None:
    return Experiment.objects.filter(project=project, name=name).first()


@functools.cache
def _run_link_sql() -> str:
    # RunLink.objects.select_related("run", "run__project", "experiment").filter(
    # run__project=project, run__public_id=run_id).first(), written out once: every logging
    # request looks its run up, and compiling that join cost more than running it (tracker.rows).
    return (
        f"SELECT {rows.columns(RunLink, 'l')}, {rows.columns(Run, 'r')}, "  # noqa: S608
        f"{rows.columns(Project, 'p')}, {rows.columns(Experiment, 'e')} "
        f"FROM {rows.table(RunLink)} l "
        f"JOIN {rows.table(Run)} r ON r.id = l.run_id "
        f"JOIN {rows.table(Project)} p ON p.id = r.project_id "
        f"JOIN {rows.table(Experiment)} e ON e.id = l.experiment_id "
        "WHERE r.project_id = %s AND r.public_id = %s ORDER BY l.id LIMIT 1"
    )


def run_link(*, project: Project, run_id: str) -> RunLink | None:
    if "\x00" in run_id:
        return None
    with connection.cursor() as cursor:
        cursor.execute(_run_link_sql(), [project.pk, run_id])
        row = cursor.fetchone()
    if row is None:
        return None
    link, end = rows.instance(RunLink, row)
    run, end = rows.instance(Run, row, end)
    run.project, end = rows.instance(Project, row, end)
    link.run = run
    link.experiment, _ = rows.instance(Experiment, row, end)
    return link


# --- JSON shapes -----------------------------------------------------------------------------


def _ms(dt: Any) -> int:
    return int(dt.timestamp() * 1000)


def number(value: float) -> float | str:
    """A double as MLflow's server answers it: NaN as protobuf's "NaN", and ±Inf clamped to
    ±1.7976931348623157e308 as its store saves them (Runcast keeps the Inf, which forecasts
    read as a divergence; only the answer is MLflow's)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return sys.float_info.max if value > 0 else -sys.float_info.max
    return value


def experiment_json(experiment: Experiment) -> dict[str, Any]:
    return {
        "experiment_id": experiment.public_id,
        "name": experiment.name,
        # As `mlflow server --serve-artifacts`: the client resolves it against the tracking URI
        # and reaches Runcast's artifact proxy (tracker.mlflow.artifacts).
        "artifact_location": f"mlflow-artifacts:/{experiment.public_id}",
        "lifecycle_stage": experiment.lifecycle_stage,
        "creation_time": _ms(experiment.created_at),
        "last_update_time": _ms(experiment.updated_at),
        "tags": [{"key": k, "value": v} for k, v in sorted(experiment.tags.items())],
    }


def run_info_json(link: RunLink) -> dict[str, Any]:
    run = link.run
    info: dict[str, Any] = {
        "run_id": run.public_id,
        "run_uuid": run.public_id,
        "run_name": run.name,
        "experiment_id": link.experiment.public_id,
        "user_id": link.user_id,
        "status": link.status,
        "start_time": _ms(run.started_at),
        "artifact_uri": artifacts.run_artifact_uri(link),
        "lifecycle_stage": link.lifecycle_stage,
    }
    if link.end_time_ms is not None:
        info["end_time"] = link.end_time_ms
    return info


@dataclass(frozen=True)
class Latest:
    value: float
    timestamp_ms: int
    step: int


def latest_metrics(*, run: Run) -> dict[str, Latest]:
    """Each key's latest point as MLflow defines it: the highest step, then the latest time."""
    return latest_metrics_many(run_ids=[run.pk])[run.pk]


# Runs per query of latest_metrics_many: far below every backend's bound on query parameters.
_LATEST_BATCH = 500


def latest_metrics_many(*, run_ids: list[int]) -> dict[int, dict[str, Latest]]:
    """`latest_metrics` of many runs in one query per 500 runs, read from the rows the write
    path keeps (tracker.models.LatestMetric), not from the chunks."""
    out: dict[int, dict[str, Latest]] = {pk: {} for pk in run_ids}
    for i in range(0, len(run_ids), _LATEST_BATCH):
        rows = LatestMetric.objects.filter(run_id__in=run_ids[i : i + _LATEST_BATCH]).values_list(
            "run_id", "key", "value", "is_nan", "timestamp_ms", "step"
        )
        for run_id, key, value, is_nan, timestamp_ms, step in rows:
            out[run_id][key] = Latest(
                value=math.nan if is_nan or value is None else value,
                timestamp_ms=timestamp_ms,
                step=step,
            )
    return out


def run_json(link: RunLink, *, latest: dict[str, Latest] | None = None) -> dict[str, Any]:
    run = link.run
    latest = latest_metrics(run=run) if latest is None else latest
    return {
        "info": run_info_json(link),
        "data": {
            "metrics": [
                {"key": k, "value": number(m.value), "timestamp": m.timestamp_ms, "step": m.step}
                for k, m in sorted(latest.items())
            ],
            "params": [{"key": k, "value": str(v)} for k, v in sorted(run.config.items())],
            "tags": [{"key": k, "value": v} for k, v in sorted(link.tags.items())],
        },
        "inputs": _inputs_json(link),
        "outputs": {"model_outputs": link.model_outputs} if link.model_outputs else {},
    }


def _inputs_json(link: RunLink) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    if link.dataset_inputs:
        inputs["dataset_inputs"] = link.dataset_inputs
    if link.model_inputs:
        inputs["model_inputs"] = link.model_inputs
    return inputs


# --- logged models ---------------------------------------------------------------------------


def logged_model_find(
    *, project: Project, model_id: str, allow_deleted: bool = False
) -> LoggedModel | None:
    found = LoggedModel.objects.select_related("experiment").filter(
        project=project, model_id=model_id
    )
    if not allow_deleted:
        found = found.filter(lifecycle_stage=LoggedModel.Stage.ACTIVE)
    return found.first()


def logged_model_json(model: LoggedModel) -> dict[str, Any]:
    info: dict[str, Any] = {
        "model_id": model.model_id,
        "experiment_id": model.experiment.public_id,
        "name": model.name,
        "creation_timestamp_ms": _ms(model.created_at),
        "last_updated_timestamp_ms": _ms(model.updated_at),
        "artifact_uri": artifacts.model_artifact_uri(model),
        "status": model.status,
        "tags": [{"key": k, "value": v} for k, v in sorted(model.tags.items())],
    }
    if model.model_type:
        info["model_type"] = model.model_type
    if model.source_run_id:
        info["source_run_id"] = model.source_run_id
    if model.status_message:
        info["status_message"] = model.status_message
    metrics = [
        {k: v for k, v in {**m, "model_id": model.model_id}.items() if v not in ("", None)}
        for m in model.metrics
    ]
    return {
        "info": info,
        "data": {
            "params": [{"key": k, "value": v} for k, v in sorted(model.params.items())],
            "metrics": metrics,
        },
    }


# --- metric history --------------------------------------------------------------------------


def metric_history(*, run: Run, key: str) -> list[dict[str, Any]]:
    """Every point of one key as logged, every attempt included (MLflow keeps all history)."""
    series = tracker_selectors.series_load(run=run, key=key, resolve=False)
    if series.steps.size == 0:
        return []
    # Storage order is by attempt and step; MLflow answers in logging (time) order.
    order = np.lexsort((series.steps, series.times))
    stamps = np.rint(series.times[order] * 1000).astype(np.int64)
    return [
        {"key": key, "value": number(v), "timestamp": int(t), "step": int(s)}
        for v, t, s in zip(
            series.values[order].tolist(),
            stamps.tolist(),
            series.steps[order].tolist(),
            strict=True,
        )
    ]


def metric_history_sampled(
    *, run: Run, key: str, start: int | None, end: int | None, max_results: int
) -> list[dict[str, Any]]:
    """At most `max_results` points of one key between two steps, chosen as MLflow's SQL store
    chooses them (what its UI asks `get-history-bulk-interval` for): the points in (step,
    timestamp, value) order cut into `max_results` NTILE buckets, the first of each, and the
    last point in place of the last pick."""
    series = tracker_selectors.series_load(run=run, key=key, resolve=True)
    keep = np.ones(series.steps.size, dtype=bool)
    if start is not None:
        keep &= series.steps >= start
    if end is not None:
        keep &= series.steps <= end
    idx = np.flatnonzero(keep)
    idx = idx[np.lexsort((series.values[idx], series.times[idx], series.steps[idx]))]
    idx = idx[_ntile_firsts(idx.size, max_results)]
    return [
        {
            "key": key,
            "value": number(float(series.values[i])),
            "timestamp": round(float(series.times[i]) * 1000),
            "step": int(series.steps[i]),
            "run_id": run.public_id,
        }
        for i in idx.tolist()
    ]


def _ntile_firsts(total: int, buckets: int) -> list[int]:
    """SQL's NTILE(buckets) over `total` rows keeps the first row of each bucket (the first
    `total % buckets` buckets hold one row more); MLflow then puts the last row in the last
    pick's place, so the range's end is always shown."""
    if total <= buckets:
        return list(range(total))
    size, larger = divmod(total, buckets)
    picks = [b * size + min(b, larger) for b in range(buckets)]
    picks[-1] = total - 1
    return picks


# --- datasets --------------------------------------------------------------------------------

DATASET_CONTEXT_TAG = "mlflow.data.context"
MAX_DATASET_SUMMARIES = 1000


def dataset_summaries(*, project: Project, experiment_ids: list[str]) -> list[dict[str, str]]:
    """`experiments/search-datasets`: each (experiment, dataset name, digest, context) the
    experiments' runs logged, once, as MLflow's server lists them (at most 1,000)."""
    links = RunLink.objects.filter(
        run__project=project, experiment__public_id__in=experiment_ids
    ).exclude(dataset_inputs=[])
    seen: dict[tuple[str, str, str, str], None] = {}
    rows = links.values_list("experiment__public_id", "dataset_inputs").order_by("pk")
    for experiment_id, inputs in rows.iterator(chunk_size=500):
        for item in inputs:
            dataset = item["dataset"]
            seen[(experiment_id, dataset["name"], dataset["digest"], _context(item))] = None
        if len(seen) >= MAX_DATASET_SUMMARIES:
            break
    out = []
    for experiment_id, name, digest, context in list(seen)[:MAX_DATASET_SUMMARIES]:
        summary = {"experiment_id": experiment_id, "name": name, "digest": digest}
        if context:
            summary["context"] = context
        out.append(summary)
    return out


def _context(item: dict[str, Any]) -> str:
    """What a dataset was used for (log_input's `context`: "training", "eval"), or ""."""
    return next((t["value"] for t in item["tags"] if t["key"] == DATASET_CONTEXT_TAG), "")


@dataclass(frozen=True)
class DatasetRow:
    name: str
    digest: str
    context: str
    source_type: str


def run_datasets(*, run: Run) -> list[DatasetRow]:
    """The datasets an MLflow run logged (`log_input`), for its page; none for other runs."""
    link = RunLink.objects.filter(run=run).only("dataset_inputs").first()
    if link is None:
        return []
    return [
        DatasetRow(
            name=item["dataset"]["name"],
            digest=item["dataset"]["digest"],
            context=_context(item),
            source_type=item["dataset"].get("source_type", ""),
        )
        for item in link.dataset_inputs
    ]


def mirror_for(*, project: Project) -> Mirror | None:
    return Mirror.objects.filter(project=project).first()
