"""What a member does to many runs at once from the runs explorer: tag or untag them, delete
them (softly: restorable for RUNCAST_DELETED_RUN_KEEP_DAYS) and restore them, move MLflow runs
to another experiment of their project; and the purge
(`runs_purge`, hourly by beat) that deletes them for good once that keep is over.

A deleted run has `Run.deleted_at` set; an MLflow run's `RunLink.lifecycle_stage` says
"deleted" with it (MLflow's own `delete_run` sets both, tracker.mlflow.services.run_set_stage),
so the board, the explorer and MLflow's `runs/search` hide the same runs.

Each service reads the runs it names in one project under a row lock and refuses the whole
request, changing nothing, when an id is not a run of that project (another project's run is
indistinguishable from a missing one).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from config import sweeps
from tracker import limits
from tracker.mlflow.models import DEFAULT_EXPERIMENT_ID, Experiment, RunLink
from tracker.models import Project, Run
from tracker.services import NotFound, ServiceError

# At most one explorer page of runs per request (tracker.explorer.PAGE_SIZE_MAX).
RUN_IDS_MAX = 500
TAG_MAX = 100  # a label's length, as the run API and MLflow's labels keep it
# Runs per purge transaction: each cascades to the run's points, events and forecasts, so a
# transaction stays short even for long runs. The one cascade Django loads row by row, the
# run's ingest-batch rows, is empty by then: retention deletes them after
# RUNCAST_BATCH_KEEP_DAYS (7), well inside the keep (30).
PURGE_BATCH = 20


def keep_until(deleted_at: datetime) -> datetime:
    """The time until which a run deleted at `deleted_at` is kept restorable."""
    return deleted_at + timedelta(days=settings.RUNCAST_DELETED_RUN_KEEP_DAYS)


def _locked(*, project: Project, run_ids: list[str]) -> list[Run]:
    ids = sorted({i.strip() for i in run_ids if i.strip()})
    if not ids:
        raise ServiceError("select at least one run", field="run_ids")
    if len(ids) > RUN_IDS_MAX:
        raise ServiceError(f"at most {RUN_IDS_MAX} runs at a time", field="run_ids")
    runs = list(
        Run.objects.select_for_update().filter(project=project, public_id__in=ids).order_by("pk")
    )
    missing = sorted(set(ids) - {r.public_id for r in runs})
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise NotFound(f"no such run in this project: {shown}", field="run_ids")
    return runs


def _label(tag: str) -> str:
    label = tag.strip()
    if not label or len(label) > TAG_MAX:
        raise ServiceError(f"a tag is 1 to {TAG_MAX} characters", field="tag")
    if any(ord(ch) < 32 for ch in label):
        raise ServiceError("a tag holds no control characters", field="tag")
    return label


@transaction.atomic
def runs_tag(*, project: Project, run_ids: list[str], tag: str, remove: bool = False) -> int:
    """Add the label `tag` ("team:nlp", or a bare "baseline") to these runs, or remove it.
    Returns how many runs changed. An MLflow run's tag is set on its RunLink too, so the MLflow
    API reports it and a later MLflow set_tag (which rebuilds the labels from the RunLink) keeps
    it, spelt as MLflow's labels are ("team: nlp", a bare tag "baseline: ")."""
    label = _label(tag)
    runs = _locked(project=project, run_ids=run_ids)
    changed = [r for r in runs if (label in r.tags) == remove]
    if not remove:
        full = [r.public_id for r in changed if len(r.tags) >= limits.MAX_TAGS]
        if full:
            raise ServiceError(
                f"runs with {limits.MAX_TAGS} tags already: {', '.join(full[:5])}", field="tag"
            )
    for run in changed:
        run.tags = [t for t in run.tags if t != label] if remove else [*run.tags, label]
    Run.objects.bulk_update(changed, ["tags"])
    key, _, value = label.replace("=", ":", 1).partition(":")
    links = list(RunLink.objects.select_for_update().filter(run__in=changed))
    for link in links:
        if remove:
            link.tags.pop(key.strip(), None)
        else:
            link.tags[key.strip()] = value.strip()
    RunLink.objects.bulk_update(links, ["tags"])
    return len(changed)


@transaction.atomic
def runs_delete(*, project: Project, run_ids: list[str], now: datetime) -> int:
    """Delete these runs softly at `now`; returns how many were not deleted already (a run
    deleted before keeps its first time, so a second delete does not extend its keep)."""
    runs = _locked(project=project, run_ids=run_ids)
    fresh = [r.pk for r in runs if r.deleted_at is None]
    Run.objects.filter(pk__in=fresh).update(deleted_at=now)
    RunLink.objects.filter(run_id__in=fresh).update(lifecycle_stage=RunLink.Stage.DELETED)
    return len(fresh)


@transaction.atomic
def runs_restore(*, project: Project, run_ids: list[str]) -> int:
    """Bring deleted runs back wherever they were listed; returns how many were deleted."""
    runs = _locked(project=project, run_ids=run_ids)
    deleted = [r.pk for r in runs if r.deleted_at is not None]
    Run.objects.filter(pk__in=deleted).update(deleted_at=None)
    RunLink.objects.filter(run_id__in=deleted).update(lifecycle_stage=RunLink.Stage.ACTIVE)
    return len(deleted)


def _experiment_label(experiment: Experiment) -> str | None:
    # As tracker.mlflow.services labels an MLflow run: its experiment's name, unless Default.
    if experiment.public_id == DEFAULT_EXPERIMENT_ID:
        return None
    return f"experiment: {experiment.name}"[:TAG_MAX]


@transaction.atomic
def runs_move(*, project: Project, run_ids: list[str], experiment_id: str) -> int:
    """Move these MLflow runs to the MLflow experiment `experiment_id` (its public id) of the
    same project; returns how many were in another experiment. The run page's experiment chip
    follows; MLflow's get_run and runs/search then report the run in its new experiment (its
    artifact URI names it too; the files stay under the run's own prefix, and the URI taken
    before the move still reaches them).

    Refused, changing nothing: an experiment not of this project (404, as a missing one), a
    deleted experiment (MLflow creates no run in one either), and a run the Runcast client
    logged (it has no RunLink). Such a run is not given one: MLflow would then report the
    status the link was made with while the client and the liveness sweep move the run's own,
    and its MLflow writes would be ingested as a new segment beside the client's points."""
    experiment = (
        Experiment.objects.filter(project=project, public_id=experiment_id.strip()).first()
        if experiment_id.strip()
        else None
    )
    if experiment is None:
        raise NotFound(
            f"no such experiment in this project: {experiment_id.strip()[:40]!r}",
            field="experiment_id",
        )
    if experiment.lifecycle_stage != Experiment.Stage.ACTIVE:
        raise ServiceError(
            f"the experiment {experiment.name!r} is deleted: restore it first",
            field="experiment_id",
        )
    runs = _locked(project=project, run_ids=run_ids)
    links = {
        link.run_id: link
        for link in RunLink.objects.select_for_update()
        .select_related("experiment")
        .filter(run__in=runs)
    }
    unlinked = [r.public_id for r in runs if r.pk not in links]
    if unlinked:
        raise ServiceError(
            "only MLflow runs belong to an experiment; runs logged by the Runcast client: "
            + ", ".join(unlinked[:5])
            + (" ..." if len(unlinked) > 5 else ""),
            field="run_ids",
        )
    moved = [r for r in runs if links[r.pk].experiment_id != experiment.pk]
    new_label = _experiment_label(experiment)
    for run in moved:
        old_label = _experiment_label(links[run.pk].experiment)
        kept = [t for t in run.tags if t not in (old_label, new_label)]
        # At most MAX_TAGS labels, as every MLflow write rebuilds them.
        run.tags = [*([new_label] if new_label else []), *kept][: limits.MAX_TAGS]
    Run.objects.bulk_update(moved, ["tags"])
    RunLink.objects.filter(run__in=moved).update(experiment=experiment)
    return len(moved)


def runs_purge(*, now: datetime, budget_s: float = 90.0) -> int:
    """Delete for good the runs of every project deleted longer ago than the keep
    (RUNCAST_DELETED_RUN_KEEP_DAYS before `now`); returns how many. Their rows cascade (points,
    events, forecasts, flags, the MLflow RunLink); their artifact files go with the next hourly
    `tracker.mlflow.tasks.artifacts_sweep`, which deletes the files of runs that no longer exist.

    PURGE_BATCH runs per transaction, oldest deletion first, until none is left or `budget_s`
    seconds have passed (the next tick continues). With nothing to purge it is one query on the
    small partial index of deleted runs. A batch that raises is retried run by run, each a
    `config.sweeps.unit`, so one run that cannot be deleted holds back no other."""
    cutoff = now - timedelta(days=settings.RUNCAST_DELETED_RUN_KEEP_DAYS)
    began = time.monotonic()
    purged = 0
    failed: set[int] = set()  # left for the next tick, which retries them
    while time.monotonic() - began < budget_s:
        ids = list(
            Run.objects.filter(deleted_at__lt=cutoff)
            .exclude(pk__in=failed)
            .order_by("deleted_at", "pk")
            .values_list("pk", flat=True)[:PURGE_BATCH]
        )
        if not ids:
            break
        n = _purge_unit(ids=ids, cutoff=cutoff)
        if n is None:  # one of them raises: find which, run by run
            n = 0
            for pk in ids:
                one = _purge_unit(ids=[pk], cutoff=cutoff)
                if one is None:
                    failed.add(pk)
                n += one or 0
        purged += n
    return purged


def _purge_unit(*, ids: list[int], cutoff: datetime) -> int | None:
    """How many of these runs were purged, or None when that raised (logged, rolled back)."""
    with sweeps.unit("purge of deleted runs", ids):
        return _purge(ids=ids, cutoff=cutoff)
    return None


@transaction.atomic
def _purge(*, ids: list[int], cutoff: datetime) -> int:
    # Locked and checked again: a run restored since it was listed stays.
    runs = Run.objects.select_for_update().filter(pk__in=ids, deleted_at__lt=cutoff)
    locked = list(runs.order_by("pk").values_list("pk", flat=True))
    _, per_model = Run.objects.filter(pk__in=locked).delete()
    return per_model.get(Run._meta.label, 0)
