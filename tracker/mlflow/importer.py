"""Copy experiments, runs, params, tags and full metric histories from an MLflow server.

Idempotent and incremental without any bookkeeping of its own: what is already here is the
record of what was copied. An MLflow run keeps its run id as the Runcast run id; each key's
points already stored (as (step, timestamp, value)) are subtracted from the server's history and
only the rest is sent, through the same batch ingestion as live logging, one transaction per
batch. So a second import copies only points logged since, and an import interrupted between
batches resumes where it stopped (a batch is stored whole or not at all).

`client` is an `mlflow.MlflowClient` (or anything with its methods): this module does not import
mlflow, so the server runs without it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tracker import selectors as tracker_selectors
from tracker.mlflow import selectors, services
from tracker.mlflow.errors import MlflowError
from tracker.mlflow.models import DEFAULT_EXPERIMENT_NAME, Experiment, RunLink
from tracker.mlflow.parsing import KeyValue, MetricIn
from tracker.models import Project

# Points per ingested batch: well under MAX_POINTS_PER_BATCH, and a bounded transaction.
BATCH_POINTS = 10_000
PAGE = 1000
ENDED = ("FINISHED", "FAILED", "KILLED")


@dataclass
class ImportSummary:
    experiments: int = 0
    runs_seen: int = 0
    runs_created: int = 0
    points_copied: int = 0
    points_present: int = 0
    params: int = 0
    tags: int = 0
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self, source: str) -> str:
        skipped = f", {len(self.skipped)} skipped" if self.skipped else ""
        return (
            f"Imported from {source}: {self.experiments} experiments, {self.runs_seen} runs "
            f"({self.runs_created} new{skipped}), {self.points_copied:,} points copied "
            f"({self.points_present:,} already here), {self.params} params and {self.tags} tags "
            f"set, in {self.seconds:.1f} s"
        )


# (runs done, runs total, what just happened)
Progress = Callable[[int, int, str], None]


def _pages(fetch: Callable[[str | None], Any]) -> Iterator[Any]:
    token = None
    while True:
        page = fetch(token)
        yield from page
        token = getattr(page, "token", None)
        if not token:
            return


def _experiments(client: Any, names: list[str] | None) -> list[Any]:
    def fetch(token: str | None) -> Any:
        return client.search_experiments(max_results=PAGE, page_token=token)

    found = list(_pages(fetch))
    if not names:
        return found
    by_name = {e.name: e for e in found}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise MlflowError(
            f"no experiment named {missing} on the MLflow server", "RESOURCE_DOES_NOT_EXIST"
        )
    return [by_name[n] for n in names]


def _runs(client: Any, experiment_id: str, query: str) -> Iterator[Any]:
    def fetch(token: str | None) -> Any:
        return client.search_runs(
            [experiment_id], filter_string=query, max_results=PAGE, page_token=token
        )

    return _pages(fetch)


def _target_experiment(project: Project, source: Any) -> tuple[Experiment, bool]:
    if source.name == DEFAULT_EXPERIMENT_NAME:
        return services.experiment_default(project=project), False
    existing = selectors.experiment_by_name(project=project, name=source.name)
    if existing is not None:
        return existing, False
    tags = {k: v for k, v in (source.tags or {}).items() if not k.startswith("mlflow.")}
    return services.experiment_create(project=project, name=source.name, tags=tags), True


def mlflow_import(
    *,
    client: Any,
    project: Project,
    source: str,
    experiment_names: list[str] | None = None,
    since_ms: int | None = None,
    progress: Progress | None = None,
) -> ImportSummary:
    started = time.monotonic()
    summary = ImportSummary()
    report = progress or (lambda done, total, what: None)
    sources = _experiments(client, experiment_names)
    work: list[tuple[Experiment, Any]] = []
    for exp in sources:
        target, _ = _target_experiment(project, exp)
        summary.experiments += 1
        query = f"attributes.start_time >= {since_ms}" if since_ms is not None else ""
        work += [(target, run) for run in _runs(client, exp.experiment_id, query)]
    total = len(work)
    for done, (target, run) in enumerate(work, start=1):

        def within(what: str, done: int = done) -> None:
            report(done - 1, total, what)

        what = _run_import(
            client=client,
            project=project,
            experiment=target,
            run=run,
            source=source,
            summary=summary,
            report=within,
        )
        report(done, total, what)
    summary.runs_seen = total
    summary.seconds = time.monotonic() - started
    return summary


def _run_import(
    *,
    client: Any,
    project: Project,
    experiment: Experiment,
    run: Any,
    source: str,
    summary: ImportSummary,
    report: Callable[[str], None],
) -> str:
    info, data = run.info, run.data
    name = run_name(run)
    link = selectors.run_link(project=project, run_id=info.run_id)
    if link is None:
        link = run_link_create(
            project=project, experiment=experiment, run=run, source=source, summary=summary
        )
    elif not link.imported_from:
        summary.skipped.append(info.run_id)
        return f"{name}: skipped (a run with this id was logged here, not imported)"
    params_tags_copy(link=link, params=data.params, tags=data.tags, summary=summary)
    copied = 0
    for key in sorted(data.metrics):
        copied += _history_copy(client=client, link=link, key=key, summary=summary, report=report)
    if info.status in ENDED and (link.status != info.status or link.end_time_ms != info.end_time):
        services.run_update(link=link, status=info.status, end_time_ms=info.end_time, run_name=None)
    return f"{experiment.name}/{name}: +{copied:,} points"


def run_name(run: Any) -> str:
    """An MLflow run's name as MLflow shows it: its name, its name tag, else its id."""
    info = run.info
    return str(info.run_name or run.data.tags.get(services.RUN_NAME_TAG, "") or info.run_id)


def run_link_create(
    *, project: Project, experiment: Experiment, run: Any, source: str, summary: Any
) -> RunLink:
    """The Runcast run of an MLflow run copied from `source` (the import's and the mirror's),
    keeping its id, name, user and start; counted in `summary.runs_created`."""
    info = run.info
    link = services.run_create(
        project=project,
        experiment=experiment,
        user_id=info.user_id or "",
        start_time_ms=info.start_time,
        tags=[],
        run_name=run_name(run),
        run_id=info.run_id,
        imported_from=source,
    )
    summary.runs_created += 1
    return link


def params_tags_copy(
    *, link: RunLink, params: dict[str, str], tags: dict[str, str], summary: ImportSummary
) -> None:
    config = link.run.config
    new_params = [KeyValue(k, v) for k, v in sorted(params.items()) if k not in config]
    changed_tags = [KeyValue(k, v) for k, v in sorted(tags.items()) if link.tags.get(k) != v]
    if new_params or changed_tags:
        services.run_log(link=link, metrics=[], params=new_params, tags=changed_tags)
    summary.params += len(new_params)
    summary.tags += len(changed_tags)


def _history_copy(
    *, client: Any, link: RunLink, key: str, summary: ImportSummary, report: Callable[[str], None]
) -> int:
    history = client.get_metric_history(link.run.public_id, key)
    stored = tracker_selectors.series_load(run=link.run, key=key, resolve=False)
    # What is already here, as a multiset: MLflow keeps every (step, timestamp, value) once,
    # and a point copied before is subtracted once.
    here = Counter(
        zip(
            stored.steps.tolist(),
            [round(t * 1000) for t in stored.times.tolist()],
            [v.hex() for v in stored.values.tolist()],
            strict=True,
        )
    )
    new = []
    for m in history:
        mark = (int(m.step), int(m.timestamp), float(m.value).hex())
        if here[mark] > 0:
            here[mark] -= 1
            continue
        new.append(
            MetricIn(key=key, value=float(m.value), timestamp_ms=int(m.timestamp), step=int(m.step))
        )
    summary.points_present += len(history) - len(new)
    new.sort(key=lambda m: (m.timestamp_ms, m.step))
    for start in range(0, len(new), BATCH_POINTS):
        batch = new[start : start + BATCH_POINTS]
        services.run_log(link=link, metrics=batch, params=[], tags=[])
        summary.points_copied += len(batch)
        report(f"{link.run.name} {key}: {start + len(batch):,}/{len(new):,} new points")
    return len(new)
