"""The runs explorer's table and the deadline page: the runs tracker.explorer finds, each with
what the forecasts say (finish, P(on time)) or how it ended against its cutoff (the board's rules,
forecasting.board: one wording), its loss episode, cost, and the metric and param values a view
chose. A constant number of queries per page, whatever its length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from forecasting.board import RunView, end_margin_s
from forecasting.selectors import OUTLOOK_IDS, outlooks_for, with_latest_forecasts
from tracker import explorer
from tracker.explorer import MetricValues, RunFilter, RunGroup
from tracker.models import Deadline, Project, Run
from tracker.selectors import LOSS_KEYS

# The deadline page lists at most this many runs (all deadlines together).
DEADLINE_RUNS_MAX = 2_000


@dataclass
class TableRow:
    view: RunView
    metrics: dict[str, MetricValues]
    params: dict[str, str]

    @property
    def run(self) -> Run:
        return self.view.run

    @property
    def duration_s(self) -> float:
        end = self.run.ended_at or self.run.last_seen_at
        return max(0.0, (end - self.run.started_at).total_seconds())

    @property
    def experiment(self) -> str:
        return explorer.run_experiment(self.run)

    @property
    def user(self) -> str:
        return explorer.run_user(self.run)

    @property
    def final_loss(self) -> tuple[str, MetricValues] | None:
        """The first loss key (LOSS_KEYS' order) the run logs, and its values."""
        return next(((k, self.metrics[k]) for k in LOSS_KEYS if k in self.metrics), None)


@dataclass
class RunsTable:
    rows: list[TableRow]
    next_cursor: str | None
    metrics: list[str]  # the metric columns shown
    params: list[str]  # the param columns shown
    metric_keys: list[str] = field(default_factory=list)  # what the picker offers
    param_keys: list[str] = field(default_factory=list)
    # With a group-by: every matching run counted per value (not only this page's).
    groups: list[RunGroup] | None = None


def runs_table(
    *,
    projects: list[Project],
    where: RunFilter,
    after: str | None,
    limit: int,
    metrics: list[str],
    params: list[str],
    now: datetime,
    group_by: str = "",
) -> RunsTable:
    """One page of the explorer (8 queries: the page, the keys it offers, forecast ids, the
    forecasts, open flags, episode ends, latest values and best values; one more with a
    group-by). Without chosen metrics the page shows its runs' loss. Raises QueryError for a
    filter, order or group it refuses."""
    found = explorer.run_search(projects=projects, where=where, after=after, limit=limit)
    keys = explorer.metric_keys(runs=found.runs)
    if not metrics:
        metrics = [k for k in LOSS_KEYS if k in keys][:1]
    groups = None
    if group_by:
        # The groups' aggregate is of the first metric shown.
        metric = metrics[0] if metrics else None
        groups = explorer.run_groups(projects=projects, where=where, by=group_by, metric=metric)
    return RunsTable(
        groups=groups,
        rows=table_rows(runs=found.runs, metrics=metrics, params=params, now=now),
        next_cursor=found.next_cursor,
        metrics=metrics,
        params=params,
        # The chosen keys stay offered (and ticked) on a page whose runs lack them.
        metric_keys=sorted({*keys, *metrics}),
        param_keys=sorted({*explorer.param_keys(found.runs), *params}),
    )


def table_rows(
    *, runs: list[Run], metrics: list[str], params: list[str], now: datetime
) -> list[TableRow]:
    """These runs (read with project and deadline) as table rows, in their order."""
    _with_forecast_ids(runs, now=now)
    values = explorer.metric_values(runs=runs, keys=metrics)
    return [
        TableRow(
            view=RunView.of(outlook, now=now),
            metrics={
                k: values[(outlook.run.pk, k)] for k in metrics if (outlook.run.pk, k) in values
            },
            params={k: explorer.param_text(outlook.run, k) for k in params},
        )
        for outlook in outlooks_for(runs)
    ]


def _with_forecast_ids(runs: list[Run], *, now: datetime) -> None:
    """The ids `outlooks_for` reads, set on runs already read (1 query): the page's query
    stays a plain one that its indexes serve, and the subqueries run for its rows only."""
    if not runs:
        return
    rows = with_latest_forecasts(Run.objects.filter(pk__in=[r.pk for r in runs]), now=now)
    ids = {row["pk"]: row for row in rows.values("pk", *OUTLOOK_IDS)}
    for run in runs:
        for name in OUTLOOK_IDS:
            setattr(run, name, ids[run.pk][name])


@dataclass
class DeadlineRuns:
    deadline: Deadline
    rows: list[TableRow]
    passed: bool

    @property
    def made_it(self) -> int:
        return sum(1 for m in self._margins if m >= 0)

    @property
    def missed(self) -> int:
        return sum(1 for m in self._margins if m < 0)

    @property
    def _margins(self) -> list[float]:
        """Each finished run's margin at its end (forecasting.board.end_margin_s)."""
        margins = (end_margin_s(r.run) for r in self.rows)
        return [m for m in margins if m is not None]


def deadline_page(*, projects: list[Project], now: datetime) -> list[DeadlineRuns]:
    """Every deadline of these projects, past and future (the latest cutoff first), each with
    its runs: the odds of a live one, the outcome of an ended one, and final losses (7 queries)."""
    deadlines = list(explorer.deadline_list_all(projects=projects))
    runs = explorer.runs_for_deadlines(deadlines=deadlines, limit=DEADLINE_RUNS_MAX)
    rows = table_rows(runs=runs, metrics=list(LOSS_KEYS), params=[], now=now)
    by_deadline: dict[int, list[TableRow]] = {}
    for row in rows:
        assert row.run.deadline_id is not None  # runs_for_deadlines reads aimed runs only
        by_deadline.setdefault(row.run.deadline_id, []).append(row)
    return [
        DeadlineRuns(deadline=d, rows=by_deadline.get(d.pk, []), passed=d.cutoff <= now)
        for d in deadlines
    ]
