"""Reads of forecasts and flags for pages, the digest and the API.

The read model is `RunOutlook`: what the stored forecasts and open flags say about one run. It is
read in a bounded number of queries whatever the number of runs: the latest forecast of each
kind is picked by correlated subqueries that the (run, kind, computed_at) index serves
(`with_latest_forecasts`), then fetched by id in one query (`outlooks_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import BigIntegerField, Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce

from forecasting.conditions import Reading
from forecasting.estimators import episode_states, slip
from forecasting.estimators import formatting as fmt
from forecasting.estimators import thresholds as th
from forecasting.models import ConditionReading, Flag, Forecast
from tracker.models import Run

# How far back "how the ETA moved" looks: a lead's day.
MOVE_WINDOW = timedelta(hours=24)
# The shortest span a move of the ETA or a change of throughput is shown over.
MOVE_MIN_S = 60.0


def forecast_latest(*, run: Run, kind: str) -> Forecast | None:
    # The (run, kind, computed_at) index answers this without reading the run's history:
    # a run keeps ~40k forecasts of each kind (a week in full, then hourly: retention.py).
    return Forecast.objects.filter(run=run, kind=kind).order_by("-computed_at", "-id").first()


def forecasts_latest(*, run: Run) -> dict[str, Forecast]:
    """The newest forecast of each kind (one indexed query per kind)."""
    found = {kind: forecast_latest(run=run, kind=kind) for kind in Forecast.Kind.values}
    return {kind: f for kind, f in found.items() if f is not None}


def open_flags_by_run(run_ids: list[int]) -> dict[int, list[Flag]]:
    """The open flags of many runs in one query: newest row per (run, kind), not resolved.

    "Newest" is by (created_at, id): one computation writes its rows with one timestamp.
    """
    if not run_ids:
        return {}
    newer = Flag.objects.filter(run=OuterRef("run"), kind=OuterRef("kind")).filter(
        Q(created_at__gt=OuterRef("created_at"))
        | Q(created_at=OuterRef("created_at"), id__gt=OuterRef("id"))
    )
    rows = (
        Flag.objects.filter(run_id__in=run_ids)
        .annotate(superseded=Exists(newer))
        .filter(superseded=False)
        .exclude(state=Flag.State.RESOLVED)
        .order_by("-severity", "kind")
    )
    out: dict[int, list[Flag]] = {}
    for flag in rows:
        out.setdefault(flag.run_id, []).append(flag)
    return out


def flags_open(*, run: Run) -> dict[str, Flag]:
    """The open flags of one run by kind."""
    return {f.kind: f for f in open_flags_by_run([run.pk]).get(run.pk, [])}


def flag_history(*, run: Run, limit: int = 200) -> QuerySet[Flag]:
    return Flag.objects.filter(run=run).order_by("-created_at", "-id")[:limit]


def eta_history(
    *, run: Run, limit: int = 5000
) -> list[tuple[float, float | None, float | None, float | None]]:
    """(computed at, P10, P50, P90 finish) of every ETA forecast, oldest first, epoch seconds."""
    rows = (
        Forecast.objects.filter(run=run, kind=Forecast.Kind.ETA, finish_p50__isnull=False)
        .order_by("-computed_at")
        .values_list("computed_at", "finish_p10", "finish_p50", "finish_p90")[:limit]
    )
    return [(c.timestamp(), p10, p50, p90) for c, p10, p50, p90 in reversed(rows)]


def eta_history_rebuilt(*, run: Run) -> int:
    """How many of the run's ETA forecasts were rebuilt from history it logged before its first
    forecast (forecasting.compute._eta_backfill), not made live."""
    # They all precede the first live one: read that many of the oldest, not every forecast of
    # a week-long run (~40k, polled every 15 s) through an unindexed JSON test.
    oldest = (
        Forecast.objects.filter(run=run, kind=Forecast.Kind.ETA)
        .order_by("computed_at", "id")
        .values_list("data__as_of_history", flat=True)[: th.ETA_BACKFILL_POINTS]
    )
    return sum(1 for marked in oldest if marked)


def active_run_ids() -> list[int]:
    """Runs the sweeper checks and re-forecasts (the (status, last_seen_at) index serves it)."""
    return list(Run.objects.filter(status__in=Run.ACTIVE_STATUSES).values_list("pk", flat=True))


@dataclass
class RunOutlook:
    """What the forecasts and flags say about one run. Times are epoch seconds."""

    run: Run
    eta: dict[str, Any] | None = None
    finish: tuple[float, float, float] | None = None  # P10, P50, P90 finish
    computed_at: datetime | None = None
    deadline_risk: dict[str, Any] | None = None
    p_on_time: float | None = None
    eta_moved_s: float | None = None  # + later (slipped), - earlier, over the window
    eta_moved_over_s: float | None = None  # the span the move was measured over
    rate: float | None = None  # steps per second now
    rate_change: float | None = None  # relative change over the same window (-0.1 = 10% slower)
    loss: dict[str, Any] | None = None
    flags: list[Flag] = field(default_factory=list)
    # The latest straggler forecast while a straggler flag is open: who, what it costs, and the
    # what-if finish (`whatif_finish_p50`, `whatif_p_on_time`) beside the real forecast.
    straggler: dict[str, Any] | None = None
    # An ended run's loss episode that its end closed (`episode_ends_by_run`).
    episode_end: Flag | None = None

    @property
    def half_spread_s(self) -> float | None:
        return None if self.finish is None else (self.finish[2] - self.finish[0]) / 2

    @property
    def eta_early(self) -> bool:
        """An early ETA (few intervals seen): its spread says how little is known, and the
        pages say "early estimate" instead of printing it ("slipped 3 min ±17 min" on a
        20-second-old run)."""
        return bool(self.eta and self.eta.get("early"))

    @property
    def finish_seconds(self) -> bool:
        """Whether the finish times are written to the second (formatting.needs_seconds): a
        3-minute run's P10-P90 read "03:26 UTC - 03:26 UTC"."""
        if self.finish is None:
            return False
        left = None if self.computed_at is None else self.finish[1] - self.computed_at.timestamp()
        return fmt.needs_seconds(self.finish[2] - self.finish[0], left)

    @property
    def loss_view(self) -> tuple[str, str, str] | None:
        """(now, P50, spread) in the one wording of the board and the card."""
        if self.loss is None:
            return None
        d = self.loss
        return fmt.loss_outlook(
            _float(d.get("smoothed_last")),
            _float(d.get("p10")),
            _float(d.get("p50")),
            _float(d.get("p90")),
            early=bool(d.get("early")),
        )

    @property
    def loss_healthy(self) -> bool:
        return not any(f.kind in Flag.DIVERGENCE_KINDS for f in self.flags)

    @property
    def episode_end_text(self) -> str | None:
        """'diverged at step 2,500, not recovered': how a run that ended inside a loss episode
        ended (the end-of-run message says the same)."""
        return ended_diverged_text(self.episode_end)


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def ended_diverged_text(end: Flag | None) -> str | None:
    """'diverged at step 2,500, not recovered' for the row that closed a run's episode at its
    end (the board, the run page and the end-of-run message say it in these words)."""
    if end is None or end.onset_step is None:
        return None
    return f"diverged at step {fmt.steps(end.onset_step)}, not recovered"


OUTLOOK_IDS = ("eta_id", "eta_start_id", "deadline_fc_id", "loss_id", "straggler_fc_id")


def _latest_id(kind: str) -> Subquery:
    qs = Forecast.objects.filter(run=OuterRef("pk"), kind=kind)
    return Subquery(qs.order_by("-computed_at", "-id").values("id")[:1])


def with_latest_forecasts(runs: QuerySet[Run], *, now: datetime) -> QuerySet[Run]:
    """Annotate runs with the ids `outlooks_for` reads (no extra query per run)."""
    window_start = Forecast.objects.filter(
        run=OuterRef("pk"), kind=Forecast.Kind.ETA, computed_at__gte=now - MOVE_WINDOW
    ).order_by("computed_at", "id")
    return runs.annotate(
        eta_id=_latest_id(Forecast.Kind.ETA),
        eta_start_id=Subquery(window_start.values("id")[:1]),
        deadline_fc_id=_latest_id(Forecast.Kind.DEADLINE),
        loss_id=_latest_id(Forecast.Kind.LOSS),
        straggler_fc_id=_latest_id(Forecast.Kind.STRAGGLER),
    )


def outlooks_for(runs: list[Run]) -> list[RunOutlook]:
    """Outlooks of runs read through `with_latest_forecasts`: 2 queries, whatever their number,
    and a third when some have ended (the loss episodes their ends closed)."""
    ids = {getattr(r, a) for r in runs for a in OUTLOOK_IDS if getattr(r, a, None)}
    forecasts = {f.id: f for f in Forecast.objects.filter(id__in=ids)} if ids else {}
    flags = open_flags_by_run([r.pk for r in runs]) if runs else {}
    ended = episode_ends_by_run([r.pk for r in runs if not r.is_active])
    out = [_outlook(run, forecasts=forecasts, flags=flags.get(run.pk, [])) for run in runs]
    for outlook in out:
        outlook.episode_end = ended.get(outlook.run.pk)
    return out


def outlook_for_run(*, run: Run, now: datetime) -> RunOutlook:
    """One run's outlook, the run read again with its project and deadline (3 queries)."""
    annotated = with_latest_forecasts(
        Run.objects.select_related("project", "deadline"), now=now
    ).get(pk=run.pk)
    return outlooks_for([annotated])[0]


def _outlook(run: Run, *, forecasts: dict[int, Forecast], flags: list[Flag]) -> RunOutlook:
    out = RunOutlook(run=run, flags=flags)
    eta = forecasts.get(getattr(run, "eta_id", None) or -1)
    start = forecasts.get(getattr(run, "eta_start_id", None) or -1)
    if eta is not None and run.is_active and eta.finish_p50 is not None:
        out.eta, out.computed_at = eta.data, eta.computed_at
        out.finish = (
            eta.finish_p10 or eta.finish_p50,
            eta.finish_p50,
            eta.finish_p90 or eta.finish_p50,
        )
        out.rate = eta.data.get("rate_steps_per_s")
        over = (eta.computed_at - start.computed_at).total_seconds() if start is not None else 0
        # A move measured over a second or two, or between early forecasts, is noise: a
        # 20-second-old run read "slipped 3 min" and "-42% vs 1 s ago".
        if (
            start is not None
            and start.id != eta.id
            and start.finish_p50 is not None
            and over >= MOVE_MIN_S
            and not eta.data.get("early")
        ):
            out.eta_moved_s = eta.finish_p50 - start.finish_p50
            out.eta_moved_over_s = over
            start_rate = start.data.get("rate_steps_per_s")
            if out.rate and start_rate:
                out.rate_change = out.rate / start_rate - 1.0
    dl = forecasts.get(getattr(run, "deadline_fc_id", None) or -1)
    if dl is not None and run.deadline is not None and run.is_active:
        out.deadline_risk = dl.data
        out.p_on_time = dl.data.get("p_on_time")
    loss = forecasts.get(getattr(run, "loss_id", None) or -1)
    if loss is not None and run.is_active:  # an ended run's loss is what it logged, not a forecast
        out.loss = loss.data
    straggler = forecasts.get(getattr(run, "straggler_fc_id", None) or -1)
    flag = next((f for f in flags if f.kind == Flag.Kind.STRAGGLER), None)
    if flag is not None and run.is_active:
        # The newest computation, unless it did not see the straggler (the flag's hysteresis
        # keeps it open a while): then what the flag last said.
        fresh = straggler is not None and straggler.data.get("ranks")
        out.straggler = straggler.data if fresh and straggler is not None else flag.data
    return out


def condition_readings(*, run: Run, since: datetime, until: datetime) -> list[Reading]:
    """The hysteresis' history: what each computation of the run found, oldest first."""
    rows = ConditionReading.objects.filter(
        run=run, computed_at__gte=since, computed_at__lte=until
    ).order_by("computed_at")
    return [
        Reading(r.computed_at, frozenset(r.found or ()), r.deadline_p, r.input_step, r.slip_s)
        for r in rows.only("computed_at", "found", "deadline_p", "input_step", "slip_s")
    ]


def kinds_resolved_since(*, run: Run, since: datetime) -> frozenset[str]:
    return frozenset(
        Flag.objects.filter(run=run, state=Flag.State.RESOLVED, created_at__gte=since).values_list(
            "kind", flat=True
        )
    )


def episode_at_end(*, run: Run) -> Flag | None:
    """The row that closed the loss episode a run ended inside (forecasting.episodes: its
    explanation says how it stood, "... never recovered"), or None: the record of a divergence
    outlives the run."""
    return episode_ends_by_run([run.pk]).get(run.pk)


def episode_ends_by_run(run_ids: list[int]) -> dict[int, Flag]:
    """For each run, the row that closed the loss episode its latest end found open (1 query,
    none without runs): how the run ended, for the board, the run page and the end message.

    Only the latest end counts: an attempt that ended diverged and was resumed from a
    checkpoint is not how the run ended once the resumed attempt finished (flags_close stamps
    the attempt; a row from before it did counts as the current attempt's, as it did then).
    """
    if not run_ids:
        return {}
    attempt = Coalesce(
        Cast(KT("data__attempt"), BigIntegerField()),
        F("run__current_segment"),
        output_field=BigIntegerField(),
    )
    rows = (
        Flag.objects.filter(
            run_id__in=run_ids,
            kind__in=Flag.DIVERGENCE_KINDS,
            state=Flag.State.RESOLVED,
            data__closed_by_run_end=True,
            data__has_key="episode_end",
        )
        # Rows closed before the ending said its state have none: they count (a key that is
        # absent compares as NULL, which a bare exclude() would drop).
        .filter(
            ~Q(data__episode__state__in=("recovered", "recovering"))
            | Q(data__episode__state__isnull=True)
        )
        .annotate(attempt=attempt)
        .filter(attempt=F("run__current_segment"))
        .order_by("-created_at", "-id")
    )
    out: dict[int, Flag] = {}
    for flag in rows:
        out.setdefault(flag.run_id, flag)
    return out


def flag_exists(*, run: Run, kinds: tuple[str, ...], onset_from: int, onset_to: int) -> bool:
    """Whether a flag of these kinds has its onset in [onset_from, onset_to]."""
    # The (run, kind, created_at) index narrows it to the run's few rows of these kinds.
    rows = Flag.objects.filter(run=run, kind__in=kinds)
    return rows.filter(onset_step__gte=onset_from, onset_step__lte=onset_to).exists()


# --- the record: each loss flag from its raise to its close ------------------------------------

# How many of a run's newest rows of the kinds asked for `flag_spans` folds: one loss flag writes
# a row per change of news (a raise, a moved rollback, a worse state, its close), a handful per
# episode, so this holds hundreds of episodes; a span whose raise is older starts at its oldest
# row read.
FLAG_SPANS_ROWS = 2000


@dataclass
class FlagSpan:
    """One flag from its raise to its close, or to now while open: a loss episode, a NaN, a
    straggler. `said` is its newest row while open (what it last said: onset, rollback, the
    episode's state), `closed` the row that closed it (None while open)."""

    opened: Flag
    said: Flag
    closed: Flag | None = None

    @property
    def kind(self) -> str:
        return self.said.kind

    @property
    def is_open(self) -> bool:
        return self.closed is None

    @property
    def onset_step(self) -> int | None:
        return self.said.onset_step

    @property
    def rollback_step(self) -> float | None:
        value = self.said.data.get("rollback_step")
        return float(value) if isinstance(value, int | float) else None

    @property
    def state(self) -> str | None:
        """The episode's state as the flag last said it while open ("spiking", "diverged",
        "recovering"); None for a NaN and for flags from before episodes."""
        return episode_states.state_of(self.said.data)

    @property
    def ratio(self) -> float | None:
        return _number(_episode(self.said.data).get("ratio"))

    @property
    def reference_level(self) -> float | None:
        """The loss level before the onset that the episode is judged against."""
        reference = _episode(self.said.data).get("reference")
        return _number(reference.get("value")) if isinstance(reference, dict) else None

    @property
    def outcome(self) -> str | None:
        """How it closed: "recovered" (the loss came back, forecasting.episodes), "not
        recovered" (open when the run ended), "cleared" (the detectors stopped finding it);
        None while open."""
        if self.closed is None:
            return None
        data = self.closed.data if isinstance(self.closed.data, dict) else {}
        if data.get("closed_by_run_end"):
            return "not recovered"
        return "recovered" if "episode_end" in data else "cleared"


def _episode(data: object) -> dict[str, Any]:
    episode = data.get("episode") if isinstance(data, dict) else None
    return episode if isinstance(episode, dict) else {}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def flag_spans(*, run: Run, kinds: tuple[str, ...]) -> list[FlagSpan]:
    """The run's flags of these kinds, open or closed, oldest raise first (1 query): what the
    run page's markers and the API's episodes draw from, so they outlive the run's end and its
    resumes. One flag's rows are one span, however many times it was updated."""
    rows = list(
        Flag.objects.filter(run=run, kind__in=kinds).order_by("-created_at", "-id")[
            :FLAG_SPANS_ROWS
        ]
    )
    spans: list[FlagSpan] = []
    current: dict[str, FlagSpan] = {}
    for row in reversed(rows):  # oldest first, as they were written
        span = current.get(row.kind)
        if row.state == Flag.State.RESOLVED:
            if span is not None:  # else: its raise is older than the rows read
                span.closed = row
                del current[row.kind]
        elif span is None:
            current[row.kind] = FlagSpan(opened=row, said=row)
            spans.append(current[row.kind])
        else:
            span.said = row
    return spans


def slip_history(*, run: Run, now: datetime) -> list[tuple[datetime, float]]:
    """The live ETA forecasts the slip detector needs, oldest first (computed at, P50 finish).

    Not the whole window: a run keeps its forecasts in full for a week (~40k ETA rows) and the
    slip window reaches back 3 days, so reading it cost a forecast more the longer the run was
    watched (17,280 rows every 15 s on day three). `estimators.slip.detect_slip` reads only the
    first forecast, the latest, and inside the window the lowest finish (the earliest such) and
    whether SLIP_MIN_FORECASTS are there: at most six rows, the same answer.
    """
    etas = (
        Forecast.objects.filter(
            run=run,
            kind=Forecast.Kind.ETA,
            computed_at__lte=now,
            # The detector drops NaN and infinite finishes (NaN sorts above Infinity in
            # PostgreSQL; SQLite stores it as NULL).
            finish_p50__gt=-math.inf,
            finish_p50__lt=math.inf,
        )
        .exclude(data__has_key="as_of_history")
        .values_list("id", "computed_at", "finish_p50")
    )
    first = etas.order_by("computed_at", "id").first()
    last = etas.order_by("-computed_at", "-id").first()
    if first is None or last is None or last[2] is None:
        return []
    length = slip.window_length(first[1].timestamp(), last[2])
    inside = etas.filter(computed_at__gte=now - timedelta(seconds=length))
    lowest = inside.order_by("finish_p50", "computed_at", "id").first()
    latest = list(inside.order_by("-computed_at", "-id")[: th.SLIP_MIN_FORECASTS])
    # By id: two forecasts may share a second and a finish, and each counts.
    picked = {row[0]: row for row in (first, last, *latest, lowest) if row is not None}
    return [
        (at, float(p50))
        for _, at, p50 in sorted(picked.values(), key=lambda r: (r[1], r[0]))
        if p50 is not None
    ]
