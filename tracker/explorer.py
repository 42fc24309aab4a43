"""The runs explorer's reads: every run of some projects, filtered in the MLflow search-filter
language and sorted on any column (the one query module, tracker.query, compiles both to SQL),
a keyset page at a time, with the metric values and config a page shows.

Quick filters (status, experiment, deadline, start dates, a name search) are comparisons of the
same language, appended to the typed filter: one compiler, one set of semantics.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Avg, Count, F, Max, Min, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from tracker import query
from tracker.mlflow.models import Experiment
from tracker.models import Deadline, LatestMetric, MetricChunk, Project, Run
from tracker.query import QueryError

RUNS = query.Schema(
    noun="Runs",
    attributes={
        "name": query.Attribute("name", nullable=False),
        "run_id": query.Attribute("public_id", nullable=False),
        "status": query.Attribute("status", nullable=False),
        "project": query.Attribute("project__slug"),
        # MLflow runs keep their experiment in tracker.mlflow's RunLink (the reverse `mlflow`).
        "experiment": query.Attribute("mlflow__experiment__name"),
        "deadline": query.Attribute("deadline__slug"),
        "user": query.Attribute("created_by_token__created_by__username"),
        "start_time": query.Attribute("started_at", query.Kind.MILLIS, nullable=False),
        "end_time": query.Attribute("ended_at", query.Kind.MILLIS),
        "last_seen": query.Attribute("last_seen_at", query.Kind.MILLIS),
        "steps": query.Attribute("last_step", query.Kind.NUMBER),
        "total_steps": query.Attribute("total_steps", query.Kind.NUMBER),
        "world_size": query.Attribute("world_size", query.Kind.NUMBER),
    },
    aliases={
        "run_name": "name",
        "created": "start_time",
        "started": "start_time",
        "ended": "end_time",
        "step": "steps",
        "experiment_name": "experiment",
    },
    tags="tags",
    tag_labels=True,
    params="config",
    metrics="pk",
    tie="pk",
)
# What the runs may be grouped by besides a param ("p:<key>"), and the column of each.
GROUP_BY = {
    "status": "status",
    "experiment": "mlflow__experiment__name",
    "deadline": "deadline__slug",
    "user": "created_by_token__created_by__username",
    "project": "project__slug",
}
GROUPS_MAX = 200
# What the table sorts by unless told: the newest start first.
DEFAULT_ORDER = "start_time DESC"
PAGE_SIZE = 50
PAGE_SIZE_MAX = 500
# A page offers the metric and param keys its runs have, at most this many of each.
KEYS_OFFERED = 200
# Metrics where a higher value is the better one; every other metric's best is its minimum
# (losses, perplexities, errors).
_HIGHER_IS_BETTER = re.compile(
    r"(acc|accuracy|f1|bleu|rouge|auc|score|reward|mfu|throughput|precision|recall)", re.I
)


@dataclass(frozen=True)
class RunFilter:
    """What a view of the runs asks for: the typed filter and the quick filters."""

    text: str = ""
    status: str = ""
    experiment: str = ""
    deadline: str = ""
    started_from: date | None = None
    started_to: date | None = None  # inclusive: the whole day
    name: str = ""
    order: list[str] = field(default_factory=list)
    # The deleted runs (still restorable, tracker.bulk) instead of the others.
    deleted: bool = False


@dataclass
class RunSearchPage:
    runs: list[Run]
    next_cursor: str | None


def run_search(
    *, projects: list[Project], where: RunFilter, after: str | None, limit: int = PAGE_SIZE
) -> RunSearchPage:
    """One keyset page of the runs of these projects that match, in the asked order (then the
    newest start, then id); each run with its project and deadline (2 queries: the sort over
    narrow rows, then the page's runs whole; a filtered page may first look among the newest
    rows of its order, one query more). QueryError names
    what in the filter or order is wrong, and where."""
    compiled = run_search_compiled(projects=projects, where=where)
    unfiltered = None
    if where.text.strip() or _quick(where):
        order = query.parse_order_by([*where.order, DEFAULT_ORDER])
        base = _listed(Run.objects.all(), projects=projects, where=where)
        unfiltered = query.compile_search(base, RUNS, [], order)
    runs, cursor = query.keyset_page(
        compiled,
        after=after,
        limit=min(limit, PAGE_SIZE_MAX),
        fetch=lambda pks: _runs_read().in_bulk(pks),
        unfiltered=unfiltered,
    )
    return RunSearchPage(runs=runs, next_cursor=cursor)


def run_search_compiled(*, projects: list[Project], where: RunFilter) -> query.Compiled:
    comparisons = [_normalised(c) for c in query.parse(where.text)] + _quick(where)
    order = query.parse_order_by([*where.order, DEFAULT_ORDER])
    rows = _listed(_runs_read(), projects=projects, where=where)
    return query.compile_search(rows, RUNS, comparisons, order)


def _listed(runs: QuerySet[Run], *, projects: list[Project], where: RunFilter) -> QuerySet[Run]:
    """The runs of these projects a view lists: the deleted ones, or every other one."""
    return runs.filter(project__in=projects, deleted_at__isnull=not where.deleted)


def _runs_read() -> QuerySet[Run]:
    """Runs with what a row shows of other tables (project, deadline, who, experiment)."""
    return Run.objects.select_related(
        "project", "deadline", "created_by_token__created_by", "mlflow__experiment"
    )


def _normalised(c: query.Comparison) -> query.Comparison:
    # Runcast's statuses are lower case; MLflow users type FINISHED.
    if c.entity == "attributes" and c.key == "status" and isinstance(c.value, str):
        return query.Comparison(c.entity, c.key, c.op, c.value.lower(), position=c.position)
    if c.entity == "attributes" and c.key == "status" and isinstance(c.value, tuple):
        lowered = tuple(v.lower() for v in c.value)
        return query.Comparison(c.entity, c.key, c.op, lowered, position=c.position)
    return c


def _quick(where: RunFilter) -> list[query.Comparison]:
    out = []
    if where.status:
        out.append(query.Comparison("attributes", "status", "=", where.status.lower()))
    if where.experiment:
        out.append(query.Comparison("attributes", "experiment", "=", where.experiment))
    if where.deadline:
        out.append(query.Comparison("attributes", "deadline", "=", where.deadline))
    if where.name:
        # A substring, any case; LIKE's own wildcards (% and _) work inside it.
        out.append(query.Comparison("attributes", "name", "ILIKE", f"%{where.name}%"))
    if where.started_from is not None:
        out.append(query.Comparison("attributes", "start_time", ">=", _ms(where.started_from)))
    if where.started_to is not None:
        day_after = where.started_to + timedelta(days=1)
        out.append(query.Comparison("attributes", "start_time", "<", _ms(day_after)))
    return out


def _ms(day: date) -> float:
    return datetime.combine(day, time(0), tzinfo=UTC).timestamp() * 1000


@dataclass(frozen=True)
class RunGroup:
    value: str | None  # None: runs without one (no experiment, no such param)
    count: int
    mean: float | None = None  # of the chosen metric's latest finite values
    best: float | None = None


def run_groups(
    *, projects: list[Project], where: RunFilter, by: str, metric: str | None
) -> list[RunGroup]:
    """The runs that match, counted per value of `by` (a GROUP_BY name or "p:<param>"), with
    the mean and best latest value of `metric` per group, the largest groups first (1 query,
    at most GROUPS_MAX groups). QueryError for what cannot group."""
    matched = run_search_compiled(projects=projects, where=where).rows.order_by().values("pk")
    # Typed loosely: the group and the aggregates are aliases django-stubs cannot follow.
    rows: QuerySet[Any] = Run.objects.filter(pk__in=matched)
    entity, _, key = by.partition(":")
    if entity == "p" and key:
        rows = rows.annotate(_group=Cast(KeyTextTransform(key, "config"), TextField()))
    elif by in GROUP_BY:
        rows = rows.annotate(_group=F(GROUP_BY[by]))
    else:
        said = ", ".join(GROUP_BY)
        raise QueryError(f"group: runs are grouped by {said} or p:<param>, not '{by[:40]}'")
    grouped: QuerySet[Any]
    if metric:
        rows, value = query.metric_value(rows, RUNS, metric)
        pick = Max(value) if higher_is_better(metric) else Min(value)
        grouped = rows.values("_group").annotate(n=Count("pk"), mean=Avg(value), best=pick)
    else:
        grouped = rows.values("_group").annotate(n=Count("pk"))
    # The largest groups first; the name breaks ties, so the order is the same every time.
    found = grouped.order_by("-n", "_group")
    return [RunGroup(g["_group"], g["n"], g.get("mean"), g.get("best")) for g in found[:GROUPS_MAX]]


# --- what a page shows besides the runs ------------------------------------------------------


@dataclass(frozen=True)
class MetricValues:
    latest: float | None
    is_nan: bool
    step: int
    best: float | None = None


def higher_is_better(key: str) -> bool:
    return bool(_HIGHER_IS_BETTER.search(key))


def metric_values(*, runs: list[Run], keys: list[str]) -> dict[tuple[int, str], MetricValues]:
    """(run id, key) -> the latest value (the final one of an ended run) and the best over
    every point logged, for these runs and keys (2 queries: the latest rows, and the chunks'
    kept minima and maxima, so no points are unpacked)."""
    ids = [r.pk for r in runs]
    if not ids or not keys:
        return {}
    best: dict[tuple[int, str], tuple[float | None, float | None]] = {
        (run_id, key): (lo, hi)
        for run_id, key, lo, hi in MetricChunk.objects.filter(run_id__in=ids, key__in=keys)
        .values("run_id", "key")
        .annotate(lo=Min("min_value"), hi=Max("max_value"))
        .values_list("run_id", "key", "lo", "hi")
    }
    out = {}
    for m in LatestMetric.objects.filter(run_id__in=ids, key__in=keys):
        lo, hi = best.get((m.run_id, m.key), (None, None))
        pick = hi if higher_is_better(m.key) else lo
        out[(m.run_id, m.key)] = MetricValues(m.value, m.is_nan, m.step, pick)
    return out


def metric_keys(*, runs: list[Run]) -> list[str]:
    """The metric keys these runs have (1 query): what the column picker offers."""
    rows = LatestMetric.objects.filter(run_id__in=[r.pk for r in runs])
    return list(rows.order_by("key").values_list("key", flat=True).distinct()[:KEYS_OFFERED])


def param_keys(runs: list[Run]) -> list[str]:
    """The top-level config keys of these runs (already read): the params a picker offers."""
    keys = {k for r in runs if isinstance(r.config, dict) for k in r.config}
    return sorted(keys)[:KEYS_OFFERED]


def param_text(run: Run, key: str) -> str:
    """A param as the filter compares it: a string as it is, anything else as JSON."""
    if not isinstance(run.config, dict) or key not in run.config:
        return ""
    value = run.config[key]
    return value if isinstance(value, str) else json.dumps(value)


def run_experiment(run: Run) -> str:
    """The name of the MLflow experiment a run was logged to, or '' (a Runcast client's run)."""
    try:
        link = run.mlflow  # type: ignore[attr-defined]  # tracker.mlflow's reverse one-to-one
    except ObjectDoesNotExist:
        return ""
    return str(link.experiment.name)


def run_user(run: Run) -> str:
    """Who started the run: the owner of the token that created it, or ''."""
    token = run.created_by_token
    person = token.created_by if token is not None else None
    return person.get_username() if person is not None else ""


def experiment_choices(*, projects: list[Project]) -> list[str]:
    """The names of the MLflow experiments of these projects that hold a run (1 query)."""
    rows = Run.objects.filter(project__in=projects, mlflow__isnull=False)
    names = rows.values_list("mlflow__experiment__name", flat=True).distinct()
    return sorted(n for n in names if n)


def experiment_targets(*, project: Project) -> list[Experiment]:
    """The MLflow experiments of a project that runs may be moved to: the active ones, by name."""
    found = Experiment.objects.filter(project=project, lifecycle_stage=Experiment.Stage.ACTIVE)
    return list(found.order_by("name"))


def deadline_list_all(*, projects: list[Project]) -> QuerySet[Deadline]:
    """Every deadline of these projects, past and future, the latest cutoff first."""
    return (
        Deadline.objects.select_related("project")
        .filter(project__in=projects)
        .order_by("-cutoff", "pk")
    )


def deadline_list_past(*, projects: list[Project], before: datetime, limit: int) -> list[Deadline]:
    """The deadlines of these projects whose cutoff passed before `before`, the latest first:
    the board lists them under its lanes, which keep only the recent ones."""
    return list(deadline_list_all(projects=projects).filter(cutoff__lt=before)[:limit])


def runs_for_deadlines(*, deadlines: list[Deadline], limit: int) -> list[Run]:
    """The runs aimed at these deadlines (at most `limit`), with project and deadline (1 query)."""
    return list(
        _runs_read()
        .filter(deadline__in=deadlines, deleted_at__isnull=True)
        .order_by("deadline_id", "-started_at", "pk")[:limit]
    )
