"""Writes behind the MLflow API and the import. Metrics go through `tracker.services` (the
same batch ingestion as /api/v1/: one transaction per batch, exactly once, forecasts after
commit); these only add what MLflow has on top: experiments, params, tags and statuses.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.db import IntegrityError, transaction
from django.utils import timezone

from tracker import limits
from tracker import selectors as tracker_selectors
from tracker import services as tracker_services
from tracker.limits import echo
from tracker.mlflow.errors import MlflowError, invalid, not_found
from tracker.mlflow.models import (
    DEFAULT_EXPERIMENT_ID,
    DEFAULT_EXPERIMENT_NAME,
    Experiment,
    LoggedModel,
    RunLink,
)
from tracker.mlflow.parsing import KeyValue, MetricIn, series_of
from tracker.models import Deadline, LatestMetric, Project, Run

RUN_NAME_TAG = "mlflow.runName"
# MLflow statuses a client may set, and the Runcast ending each one is.
ENDINGS = {"FINISHED": "finished", "FAILED": "failed", "KILLED": "crashed"}
STATUSES = ("RUNNING", "SCHEDULED", *ENDINGS)

# --- the plan: what Runcast needs for forecasts, read from params and tags -------------------
TOTAL_STEPS_KEYS = ("runcast.total_steps", "total_steps", "max_steps")
EPOCH_KEYS = ("epochs", "num_epochs", "num_train_epochs", "max_epochs", "n_epochs")
STEPS_PER_EPOCH_KEYS = ("steps_per_epoch", "num_update_steps_per_epoch")
DEADLINE_KEYS = ("runcast.deadline",)
PLAN_KEYS = frozenset((*TOTAL_STEPS_KEYS, *EPOCH_KEYS, *STEPS_PER_EPOCH_KEYS, *DEADLINE_KEYS))


def _positive_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    if not math.isfinite(number) or number < 1 or number > 2**62 or not number.is_integer():
        return None  # e.g. Transformers' max_steps=-1, "not set"
    return int(number)


def planned_total_steps(values: dict[str, str]) -> int | None:
    """`runcast.total_steps`, else `total_steps` / `max_steps`, else epochs x steps per epoch."""
    for key in TOTAL_STEPS_KEYS:
        if (total := _positive_int(values.get(key))) is not None:
            return total
    epochs = next((e for k in EPOCH_KEYS if (e := _positive_int(values.get(k)))), None)
    per_epoch = next((s for k in STEPS_PER_EPOCH_KEYS if (s := _positive_int(values.get(k)))), None)
    if epochs and per_epoch:
        return epochs * per_epoch
    return None


def _plan_apply(*, link: RunLink, run: Run, changed: set[str]) -> set[str]:
    """Set total steps and deadline when this request logged one of their keys (an edit made
    in the UI stays until the run logs one of them again). Tags win over params."""
    if not changed & PLAN_KEYS:
        return set()
    values = {**{k: str(v) for k, v in run.config.items()}, **link.tags}
    updated = set()
    total = planned_total_steps(values)
    if total is not None and total != run.total_steps:
        run.total_steps = total
        updated.add("total_steps")
    slug = next((values[k] for k in DEADLINE_KEYS if values.get(k)), None)
    if slug:
        # An unknown deadline is not an error: the run must not fail over a deadline someone
        # has yet to create; it is linked when the tag is logged again.
        deadline = Deadline.objects.filter(project=run.project_id, slug=slug).first()
        if deadline is not None and deadline.pk != run.deadline_id:
            run.deadline = deadline
            updated.add("deadline")
    return updated


# --- experiments -----------------------------------------------------------------------------


def experiment_default(*, project: Project) -> Experiment:
    experiment, _ = Experiment.objects.get_or_create(
        project=project,
        public_id=DEFAULT_EXPERIMENT_ID,
        defaults={"name": DEFAULT_EXPERIMENT_NAME},
    )
    return experiment


def _new_experiment_id() -> str:
    # 18 random digits: MLflow's ids are digit strings; random so ids say nothing of other
    # projects (a counter would).
    return str(10**17 + secrets.randbelow(9 * 10**17))


def experiment_create(*, project: Project, name: str, tags: dict[str, str]) -> Experiment:
    experiment_default(project=project)
    if Experiment.objects.filter(project=project, name=name).exists():
        raise MlflowError(
            f"Experiment(name={echo(name)}) already exists.", "RESOURCE_ALREADY_EXISTS"
        )
    for _ in range(5):
        try:
            with transaction.atomic():
                return Experiment.objects.create(
                    project=project, public_id=_new_experiment_id(), name=name, tags=tags
                )
        except IntegrityError:
            if Experiment.objects.filter(project=project, name=name).exists():
                raise MlflowError(
                    f"Experiment(name={echo(name)}) already exists.", "RESOURCE_ALREADY_EXISTS"
                ) from None
    raise MlflowError("could not allocate an experiment id; retry", "TEMPORARILY_UNAVAILABLE")


def experiment_rename(*, experiment: Experiment, name: str) -> None:
    experiment_check_active(experiment=experiment)
    if experiment.public_id == DEFAULT_EXPERIMENT_ID:
        raise invalid("The default experiment cannot be renamed in Runcast.")
    clash = Experiment.objects.filter(project=experiment.project_id, name=name)
    if clash.exclude(pk=experiment.pk).exists():
        raise MlflowError(
            f"Experiment(name={echo(name)}) already exists.", "RESOURCE_ALREADY_EXISTS"
        )
    Experiment.objects.filter(pk=experiment.pk).update(name=name, updated_at=timezone.now())


def experiment_set_stage(*, experiment: Experiment, stage: str) -> None:
    if experiment.public_id == DEFAULT_EXPERIMENT_ID and stage == Experiment.Stage.DELETED:
        raise invalid(
            "Cannot delete the default experiment '0'. This is an internally reserved ID."
        )
    if experiment.lifecycle_stage == stage:
        return  # restoring an active experiment must not revive the runs deleted one by one
    with transaction.atomic():
        Experiment.objects.filter(pk=experiment.pk).update(
            lifecycle_stage=stage, updated_at=timezone.now()
        )
        # As MLflow's store: deleting an experiment deletes its runs (no longer searchable nor
        # writable), restoring it restores them. The same soft delete as run_set_stage's, so
        # the board, the explorer and the purge see it too (a run deleted before keeps its time).
        RunLink.objects.filter(experiment=experiment).update(lifecycle_stage=stage)
        runs = Run.objects.filter(mlflow__experiment=experiment)
        if stage == Experiment.Stage.DELETED:
            runs.filter(deleted_at__isnull=True).update(deleted_at=timezone.now())
        else:
            runs.update(deleted_at=None)


def experiment_check_active(*, experiment: Experiment) -> None:
    if experiment.lifecycle_stage != Experiment.Stage.ACTIVE:
        raise invalid(
            f"The experiment {experiment.public_id} must be in the 'active' state. "
            f"Current state is {experiment.lifecycle_stage}."
        )


@transaction.atomic
def experiment_set_tag(*, experiment: Experiment, key: str, value: str | None) -> None:
    """Set (or, with value None, delete) one experiment tag."""
    locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
    experiment_check_active(experiment=locked)
    if value is None:
        locked.tags.pop(key, None)
    else:
        locked.tags[key] = value
    locked.updated_at = timezone.now()
    locked.save(update_fields=["tags", "updated_at"])


# --- runs ------------------------------------------------------------------------------------


def _labels(link: RunLink, experiment: Experiment) -> list[str]:
    """The chips the run page shows: the experiment and the user's own (non-mlflow.) tags."""
    labels = []
    if experiment.public_id != DEFAULT_EXPERIMENT_ID:
        labels.append(f"experiment: {experiment.name}"[:100])
    labels += [
        f"{k}: {v}"[:100] for k, v in sorted(link.tags.items()) if not k.startswith("mlflow.")
    ]
    return labels[: limits.MAX_TAGS]


def _run_name(requested: str, tags: dict[str, str], run_id: str) -> str:
    # MLflow's server names an unnamed run; Runcast shows the name everywhere.
    return (requested or tags.get(RUN_NAME_TAG) or f"run-{run_id[:8]}")[:200]


@transaction.atomic
def run_create(
    *,
    project: Project,
    experiment: Experiment,
    user_id: str,
    start_time_ms: int | None,
    tags: list[KeyValue],
    run_name: str,
    run_id: str | None = None,
    imported_from: str = "",
) -> RunLink:
    if experiment.lifecycle_stage != Experiment.Stage.ACTIVE:
        raise invalid(
            f"Could not create run under non-active experiment with ID {experiment.public_id}."
        )
    run_id = run_id or uuid.uuid4().hex
    tag_map = {t.key: t.value for t in tags}
    name = _run_name(run_name, tag_map, run_id)
    tag_map[RUN_NAME_TAG] = tag_map.get(RUN_NAME_TAG) or name
    started = tracker_services.from_epoch(
        start_time_ms / 1000 if start_time_ms else timezone.now().timestamp()
    )
    link = RunLink(
        experiment=experiment, tags=tag_map, user_id=user_id[:256], imported_from=imported_from
    )
    start = tracker_services.run_start(
        project=project,
        public_id=run_id,
        session=link.session,
        started_at=started,
        fields={"name": name, "tags": _labels(link, experiment)},
    )
    if not start.created:
        raise MlflowError(f"Run with id={echo(run_id)} already exists.", "RESOURCE_ALREADY_EXISTS")
    link.run = start.run
    link.save()
    run = start.run
    if fields := _plan_apply(link=link, run=run, changed=set(tag_map)):
        run.save(update_fields=list(fields))
    return link


@transaction.atomic
def run_update(
    *, link: RunLink, status: str | None, end_time_ms: int | None, run_name: str | None
) -> RunLink:
    """`end_run` (an ending status) or `start_run(run_id=...)` (RUNNING: a new attempt)."""
    link = RunLink.objects.select_for_update().select_related("run", "experiment").get(pk=link.pk)
    run = link.run
    if run_name:
        link.tags[RUN_NAME_TAG] = run_name
        Run.objects.filter(pk=run.pk).update(name=run_name[:200])
    if status == "RUNNING":
        # A resume: the process restarted (perhaps from an earlier checkpoint), so its points
        # are a new segment, as a runcast client's resume is.
        link.attempt += 1
        tracker_services.run_start(
            project=run.project,
            public_id=run.public_id,
            session=link.session,
            started_at=run.started_at,
            fields={},
        )
        link.end_time_ms = None
    elif status in ENDINGS:
        ended_ms = end_time_ms or int(timezone.now().timestamp() * 1000)
        tracker_services.run_finish(
            run=run,
            status=ENDINGS[status],
            ended_at=tracker_services.from_epoch(ended_ms / 1000),
            session=link.session,
        )
        # Runcast's run needs an end; the MLflow run answers the end the client sent, as
        # MLflow's store keeps none when `update_run` sends a status alone.
        link.end_time_ms = end_time_ms
    if status:
        link.status = status
    link.save()
    return link


@dataclass(frozen=True)
class LogResult:
    points: int
    duplicate: bool


def batch_seq(metrics: list[MetricIn]) -> int:
    """The batch's key within its attempt, from its content: a request the client retries
    (a timeout after the server committed) is the same batch and changes nothing. Two requests
    with the very same points are one, as in MLflow's own store, where (key, timestamp, step,
    value) is the metric's primary key."""
    digest = hashlib.blake2b(digest_size=8)
    for m in metrics:
        digest.update(f"{m.key}\x00{m.value.hex()}\x00{m.timestamp_ms}\x00{m.step}\n".encode())
    return int.from_bytes(digest.digest(), "big") >> 2  # within the API's 0..2**62


def run_log(
    *,
    link: RunLink,
    metrics: list[MetricIn],
    params: list[KeyValue],
    tags: list[KeyValue],
    heartbeat: datetime | None = None,
) -> LogResult:
    """log-batch, log-metric, log-parameter and set-tag: all or nothing, like MLflow's store."""
    if not params and not tags and not any(m.model_id for m in metrics):
        # Points only: batch_ingest is all or nothing by itself, and an outer transaction
        # would cost a log-metric request two more round trips (BEGIN, COMMIT) for nothing:
        # reading what is stored takes no lock either way.
        return _points_log(link=link, metrics=metrics, heartbeat=heartbeat)
    with transaction.atomic():
        if params or tags:
            _params_tags_store(link=link, params=params, tags=tags)
        if any(m.model_id for m in metrics):
            _model_metrics_record(link=link, metrics=metrics)
        return _points_log(link=link, metrics=metrics, heartbeat=heartbeat)


def _points_log(*, link: RunLink, metrics: list[MetricIn], heartbeat: datetime | None) -> LogResult:
    metrics = _new_points(run=link.run, metrics=metrics)
    if not metrics:
        return LogResult(points=0, duplicate=False)
    result = tracker_services.batch_ingest(
        run=link.run,
        session=link.session,
        seq=batch_seq(metrics),
        series=series_of(metrics),
        events=[],
        heartbeat=heartbeat,
        # batch_seq hashes the content: retention's floor of a session means nothing to it.
        ordered=False,
    )
    return LogResult(points=result.accepted, duplicate=result.duplicate)


def _new_points(*, run: Run, metrics: list[MetricIn]) -> list[MetricIn]:
    """The points not stored yet: MLflow keeps a point, (key, timestamp, step, value), once, so
    `log_batch([A])` then `log_batch([A, B])` stores A once (and log_model's re-logging of the
    run's metrics at its step with the model's id adds nothing to the run). A training that
    logs forward pays a pass over the batch, no query; stored points are read only for the keys
    whose points reach back to a stored step, and the batch is deduplicated only when a
    (key, step) repeats in it."""
    if not metrics:
        return metrics
    lowest: dict[str, int] = {}
    for m in metrics:
        if m.step < lowest.get(m.key, m.step + 1):
            lowest[m.key] = m.step
    repeats = len({(m.key, m.step) for m in metrics}) != len(metrics)
    # In a run's first attempt last_step is the highest step stored for any key (a resume
    # starts it over), so a batch wholly beyond it has nothing stored to repeat.
    run_top = run.last_step if run.current_segment <= 1 else None
    if run_top is not None and min(lowest.values()) > run_top and not repeats:
        return metrics
    latest = dict(
        LatestMetric.objects.filter(run=run, key__in=list(lowest)).values_list("key", "step")
    )
    behind = {k for k, step in lowest.items() if k in latest and step <= latest[k]}
    if not behind and not repeats:
        return metrics
    unique = list({_point(m): m for m in metrics}.values())
    stored: set[tuple[str, int, int, str]] = set()
    for key in behind:
        series = tracker_selectors.series_load(run=run, key=key, resolve=False)
        stamps = np.rint(series.times * 1000).astype(np.int64).tolist()
        for step, stamp, value in zip(
            series.steps.tolist(), stamps, series.values.tolist(), strict=True
        ):
            stored.add((key, stamp, step, float(value).hex()))
    return [m for m in unique if _point(m) not in stored]


def _point(m: MetricIn) -> tuple[str, int, int, str]:
    # hex(): exact, and every NaN is one value (NaN != NaN would keep each).
    return (m.key, m.timestamp_ms, m.step, m.value.hex())


def _params_tags_store(*, link: RunLink, params: list[KeyValue], tags: list[KeyValue]) -> None:
    run = Run.objects.select_for_update().select_related("project").get(pk=link.run_id)
    fresh = RunLink.objects.select_related("experiment").get(pk=link.pk)
    config: dict[str, Any] = dict(run.config)
    for p in params:
        old = config.get(p.key)
        if old is not None and str(old) != p.value:
            raise invalid(
                f"Changing param values is not allowed. Param with key='{echo(p.key)}' was "
                f"already logged with value='{echo(str(old))}' for run ID='{run.public_id}'. "
                f"Attempted logging new value '{echo(p.value)}'."
            )
        config[p.key] = p.value
    if len(json.dumps(config, default=str)) > limits.MAX_CONFIG_BYTES:
        raise invalid(
            f"params of this run exceed Runcast's MAX_CONFIG_BYTES ({limits.MAX_CONFIG_BYTES} "
            "bytes in all)"
        )
    for t in tags:
        fresh.tags[t.key] = t.value
    run.config = config
    updated = {"config"}
    if any(t.key == RUN_NAME_TAG for t in tags) and fresh.tags[RUN_NAME_TAG]:
        run.name = fresh.tags[RUN_NAME_TAG][:200]
        updated.add("name")
    run.tags = _labels(fresh, fresh.experiment)
    updated.add("tags")
    updated |= _plan_apply(link=fresh, run=run, changed={kv.key for kv in (*params, *tags)})
    run.save(update_fields=sorted(updated))
    fresh.save(update_fields=["tags"])
    link.tags = fresh.tags


@transaction.atomic
def run_delete_tag(*, link: RunLink, key: str) -> None:
    fresh = RunLink.objects.select_for_update().select_related("experiment", "run").get(pk=link.pk)
    if key not in fresh.tags:
        raise not_found(f"No tag with name: {echo(key)} in run with id {fresh.run.public_id}")
    del fresh.tags[key]
    fresh.save(update_fields=["tags"])
    Run.objects.filter(pk=fresh.run_id).update(tags=_labels(fresh, fresh.experiment))


@transaction.atomic
def run_set_stage(*, link: RunLink, stage: str) -> None:
    """MLflow's delete_run/restore_run: the same soft delete as the runs explorer's
    (tracker.bulk), so Run.deleted_at follows the stage (a run deleted before keeps its time)."""
    RunLink.objects.filter(pk=link.pk).update(lifecycle_stage=stage)
    runs = Run.objects.filter(pk=link.run_id)
    if stage == RunLink.Stage.DELETED:
        runs.filter(deleted_at__isnull=True).update(deleted_at=timezone.now())
    else:
        runs.update(deleted_at=None)


# --- datasets and model links of a run ---------------------------------------------------------


@transaction.atomic
def run_log_inputs(*, link: RunLink, datasets: list[dict[str, Any]], model_ids: list[str]) -> None:
    """`log_input(s)`: keep each dataset (by name and digest) once, its latest tags winning,
    and each logged model read once."""
    fresh = RunLink.objects.select_for_update().get(pk=link.pk)
    kept = {(d["dataset"]["name"], d["dataset"]["digest"]): d for d in fresh.dataset_inputs}
    for item in datasets:
        kept[(item["dataset"]["name"], item["dataset"]["digest"])] = item
    fresh.dataset_inputs = list(kept.values())
    known = {m["model_id"] for m in fresh.model_inputs}
    fresh.model_inputs += [{"model_id": m} for m in dict.fromkeys(model_ids) if m not in known]
    fresh.save(update_fields=["dataset_inputs", "model_inputs"])


@transaction.atomic
def run_log_outputs(*, link: RunLink, outputs: list[tuple[str, int]]) -> None:
    """`log_outputs` (log_model sends it): the logged models the run produced, at which step."""
    fresh = RunLink.objects.select_for_update().get(pk=link.pk)
    known = {(o["model_id"], o["step"]) for o in fresh.model_outputs}
    fresh.model_outputs += [
        {"model_id": m, "step": s} for m, s in dict.fromkeys(outputs) if (m, s) not in known
    ]
    fresh.save(update_fields=["model_outputs"])


# --- logged models (MLflow 3) ------------------------------------------------------------------


def logged_model_create(
    *,
    project: Project,
    experiment: Experiment,
    name: str,
    model_type: str,
    source_run_id: str,
    params: list[KeyValue],
    tags: list[KeyValue],
) -> LoggedModel:
    if experiment.lifecycle_stage != Experiment.Stage.ACTIVE:
        raise invalid(
            f"Could not create a logged model under non-active experiment with ID "
            f"{experiment.public_id}."
        )
    model_id = f"m-{uuid.uuid4().hex}"
    return LoggedModel.objects.create(
        project=project,
        experiment=experiment,
        model_id=model_id,
        # MLflow names an unnamed model at random; its id's head is as unique and says more.
        name=name or f"model-{model_id[2:10]}",
        model_type=model_type,
        source_run_id=source_run_id,
        params={p.key: p.value for p in params},
        tags={t.key: t.value for t in tags},
    )


def logged_model_finalize(*, model: LoggedModel, status: str) -> LoggedModel:
    model.status = status
    model.updated_at = timezone.now()
    model.save(update_fields=["status", "updated_at"])
    return model


@transaction.atomic
def logged_model_update(
    *,
    model: LoggedModel,
    params: list[KeyValue] | None = None,
    tags: list[KeyValue] | None = None,
    delete_tag: str | None = None,
) -> None:
    """Set params and tags of a logged model, or delete one tag (RESOURCE_DOES_NOT_EXIST if
    the model has no such tag, as MLflow answers)."""
    locked = LoggedModel.objects.select_for_update().get(pk=model.pk)
    locked.params.update({p.key: p.value for p in params or []})
    locked.tags.update({t.key: t.value for t in tags or []})
    if delete_tag is not None:
        if delete_tag not in locked.tags:
            raise not_found(
                f"No tag with key {echo(delete_tag)!r} found for model with ID {locked.model_id!r}."
            )
        del locked.tags[delete_tag]
    locked.updated_at = timezone.now()
    locked.save(update_fields=["params", "tags", "updated_at"])


def logged_model_delete(*, model: LoggedModel) -> None:
    """MLflow's delete: the model is marked deleted (get answers it only with allow_deleted);
    its files stay until the model row goes (with its experiment or project)."""
    LoggedModel.objects.filter(pk=model.pk).update(
        lifecycle_stage=LoggedModel.Stage.DELETED, updated_at=timezone.now()
    )


def _model_metrics_record(*, link: RunLink, metrics: list[MetricIn]) -> None:
    """Metrics logged with a model id also become that model's metrics (each point once).
    An id of no model of this project is refused, as MLflow refuses an unknown model."""
    by_model: dict[str, list[MetricIn]] = {}
    for m in metrics:
        if m.model_id:
            by_model.setdefault(m.model_id, []).append(m)
    for model_id, points in by_model.items():
        model = (
            LoggedModel.objects.select_for_update()
            .filter(project=link.run.project_id, model_id=model_id)
            .first()
        )
        if model is None:
            raise not_found(f"Logged model with ID '{echo(model_id)}' not found.")
        seen = {(p["key"], p["timestamp"], p["step"], p["value"]) for p in model.metrics}
        for m in points:
            value: float | str = m.value if math.isfinite(m.value) else str(m.value)
            point = (m.key, m.timestamp_ms, m.step, value)
            if point in seen:
                continue
            seen.add(point)
            model.metrics.append(
                {
                    "key": m.key,
                    "value": value,
                    "timestamp": m.timestamp_ms,
                    "step": m.step,
                    "run_id": link.run.public_id,
                    "dataset_name": m.dataset_name,
                    "dataset_digest": m.dataset_digest,
                }
            )
        model.updated_at = timezone.now()
        model.save(update_fields=["metrics", "updated_at"])
