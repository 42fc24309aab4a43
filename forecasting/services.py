"""Load a run's data, run the pure estimators, store forecasts and flag state changes."""

from __future__ import annotations

import logging
import math
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from forecasting import selectors
from forecasting.estimators import thresholds as th
from forecasting.estimators.deadline import deadline_risk
from forecasting.estimators.divergence import detect_divergence
from forecasting.estimators.eta import EtaForecast, forecast_eta
from forecasting.estimators.loss import forecast_loss
from forecasting.estimators.slip import detect_slip
from forecasting.estimators.stalled import detect_stall
from forecasting.models import Flag, Forecast, ServerClock
from forecasting.stragglers import straggler_finding
from tracker import selectors as tracker_selectors
from tracker.models import Event, IngestBatch, Run
from tracker.series import Series, latest_wins

logger = logging.getLogger(__name__)

# Forecast inputs are thinned to this many points; the estimators bin further themselves.
MAX_INPUT_POINTS = 200_000
# Kinds forecast_compute owns (resolves when absent); "stalled" belongs to the liveness sweep.
FORECAST_FLAG_KINDS = (
    *Flag.DIVERGENCE_KINDS,
    Flag.Kind.SLIP,
    Flag.Kind.DEADLINE,
    Flag.Kind.STRAGGLER,
)


@dataclass
class Condition:
    """A flag-worthy condition found by one computation."""

    kind: str
    explanation: str
    severity: float | None = None
    onset_step: float | None = None
    data: dict[str, Any] = field(default_factory=dict)


def _thin(series: Series, limit: int = MAX_INPUT_POINTS) -> Series:
    if len(series) <= limit:
        return series
    # Evenly spaced and strictly increasing (the stride exceeds 1), so no de-duplication.
    idx = np.linspace(0, len(series) - 1, limit).astype(np.int64)
    return _take(series, idx)


def _thin_keep_nonfinite(series: Series, limit: int = MAX_INPUT_POINTS) -> Series:
    # Thinning must never drop the NaN that is the whole signal.
    if len(series) <= limit:
        return series
    idx = np.linspace(0, len(series) - 1, limit).astype(np.int64)
    bad = np.flatnonzero(~np.isfinite(series.values))
    if bad.size:
        idx = np.union1d(idx, bad)
    return _take(series, idx)


def _take(series: Series, idx: np.ndarray) -> Series:
    return Series(series.steps[idx], series.values[idx], series.times[idx], series.segments[idx])


def forecast_compute(*, run_id: int, now: datetime | None = None) -> list[Flag]:
    """Recompute every forecast of one run and record flag changes. Idempotent.

    An ended run is final: its open flags close with the reason and nothing more is forecast.
    """
    run = Run.objects.select_related("project", "deadline").filter(pk=run_id).first()
    if run is None:
        return []
    now = now or timezone.now()
    if run.has_ended:
        # Its last data may hold a NaN no forecast saw yet (a job that dies seconds after its
        # loss blew up): that is raised first, so the alert says why, then every flag closes.
        raised = _final_events(run=run, now=now)
        return raised + flags_close(run=run, reason=f"the run {run.status}", now=now)
    if not run.is_active:
        return []  # a crash the sweeper inferred: its flags stay until the run speaks or ends
    keys = tracker_selectors.series_keys(run=run)
    loss_key = tracker_selectors.loss_key_for(keys)
    progress_key = loss_key or (keys[0] if keys else None)
    conditions: list[Condition] = []
    kinds: tuple[str, ...] = FORECAST_FLAG_KINDS
    if progress_key is not None:
        raw = tracker_selectors.series_load(run=run, key=progress_key, resolve=False)
        if len(raw):
            eta = _eta_and_deadline(run=run, progress=_thin(raw), now=now)
            if eta is None:
                # No ETA this time (e.g. too few points right after a resume): that says
                # nothing about the deadline or the slip, so their open flags stay as they are.
                kinds = Flag.DIVERGENCE_KINDS
            eta_conditions, odds = eta if eta is not None else ([], None)
            conditions += eta_conditions
            if eta is not None:
                # After the ETA: the what-if finish scales the forecast just stored.
                conditions += _straggler_condition(run=run, now=now)
            if loss_key is not None:
                # The progress series is the loss series: resolve it in memory, not reload it.
                series = latest_wins(raw)
                conditions += _loss_and_divergence(
                    run=run, key=loss_key, series=series, keys=keys, now=now
                )
            conditions = _sustained(
                run=run, found=conditions, odds=odds, input_step=int(raw.steps[-1]), now=now
            )
    return flags_sync(run=run, conditions=conditions, kinds=kinds, now=now)


EVENT_KINDS = (Flag.Kind.NAN, Flag.Kind.SPIKE)


def _final_events(*, run: Run, now: datetime) -> list[Flag]:
    """Raise what the run's final data shows of NaN and spikes that no forecast saw (at its
    end, or when the sweep finds it dead)."""
    keys = tracker_selectors.series_keys(run=run)
    loss_key = tracker_selectors.loss_key_for(keys)
    if loss_key is None:
        return []
    series = tracker_selectors.series_load(run=run, key=loss_key)
    if len(series) == 0:
        return []
    found = _divergence_conditions(
        run=run, key=loss_key, series=_thin_keep_nonfinite(series), keys=keys, now=now
    )
    # Judged once per end: every forecast task still queued when the run ended runs this again,
    # and each re-raised the NaN the end had just closed (the demo's drill sent it three times).
    # A crash the sweep infers has no end time yet: it is judged now.
    end = run.ended_at or now
    judged = set(
        Flag.objects.filter(
            run=run, kind__in=EVENT_KINDS, state=Flag.State.RAISED, created_at__gte=end
        ).values_list("kind", flat=True)
    )
    # Nor is one this attempt's forecasts already raised (same kind and onset), which the crash
    # closed before the end's look: raising it again sent the demo drill's NaN twice (4 values,
    # then 41). A resumed attempt that blows up again is news again, even at the same step.
    attempt = (
        run.segments.filter(number=run.current_segment).values_list("started_at", flat=True).first()
    )
    said = set(
        Flag.objects.filter(
            run=run,
            kind__in=EVENT_KINDS,
            state__in=(Flag.State.RAISED, Flag.State.UPDATED),
            created_at__gte=attempt or run.started_at,
        ).values_list("kind", "onset_step")
    )
    events = [
        c
        for c in found
        if c.kind in EVENT_KINDS
        and c.kind not in judged
        and (c.kind, _int_or_none(c.onset_step)) not in said
    ]
    return flags_sync(run=run, conditions=events, kinds=(), now=now) if events else []


SUSTAINED_KINDS = (
    Flag.Kind.RISE,
    Flag.Kind.REGRESSION,
    Flag.Kind.OSCILLATION,
    Flag.Kind.DEADLINE,
    Flag.Kind.SLIP,
    Flag.Kind.STRAGGLER,
)


def _straggler_condition(*, run: Run, now: datetime) -> list[Condition]:
    found = straggler_finding(run=run, now=now)
    if found is None:
        return []
    kind = Flag.Kind.STRAGGLER
    return [Condition(kind, found.explanation, found.severity, found.onset_step, found.data)]


def _sustain_window(run: Run, now: datetime) -> timedelta:
    ran = max(0.0, (now - run.started_at).total_seconds())
    seconds = min(th.FLAG_SUSTAIN_MAX_S, max(th.FLAG_SUSTAIN_MIN_S, th.FLAG_SUSTAIN_FRACTION * ran))
    return timedelta(seconds=seconds)


# Kinds read off the ETA: a forecast between two progress reports recomputes the same data
# with a later clock, so a crossing counts as sustained only once it has held across new data
# (the divergence detectors carry their own sustain, in points).
SUSTAINED_ON_NEW_DATA = (Flag.Kind.DEADLINE, Flag.Kind.SLIP)


def _sustained(
    *,
    run: Run,
    found: list[Condition],
    odds: float | None,
    now: datetime,
    input_step: int | None = None,
) -> list[Condition]:
    """Hysteresis: of trending conditions, report a new one only when every computation over
    the window found it, and keep an open one until none has (see FLAG_SUSTAIN_*). A deadline or
    slip must also have held over FLAG_SUSTAIN_MIN_INPUTS distinct progress reports (or, with no
    new report, over FLAG_REOPEN_WINDOWS windows): on a run that reports every few minutes, a
    window of recomputations of one report is one reading. Its odds must not be climbing back
    over those reports (unless under 50%), and an open deadline flag closes only on odds held
    at FLAG_DEADLINE_RESOLVE_P over the same span and reports.

    Each computation's raw findings are stored (a CONDITIONS forecast), so this needs no state
    outside the database and a restarted worker sees the same history.
    """
    _store(
        run=run,
        kind=Forecast.Kind.CONDITIONS,
        # Keyed by the computation's time, not its input: a stalled run brings no new steps,
        # and its findings must still accumulate (recomputing at the same instant is idempotent).
        last_step=int(now.timestamp()),
        now=now,
        data={"found": sorted(c.kind for c in found), "deadline_p": odds, "input": input_step},
    )
    window = _sustain_window(run, now)
    longest = window * th.FLAG_REOPEN_WINDOWS
    history = list(
        Forecast.objects.filter(
            run=run,
            kind=Forecast.Kind.CONDITIONS,
            computed_at__gte=now - longest,
            computed_at__lte=now,
        )
        .order_by("computed_at")
        .values_list("computed_at", "data")
    )

    def throughout(test: Callable[[dict[str, Any]], bool], span: timedelta) -> tuple[bool, int]:
        """Whether every computation over the span passed the test, and on how many reports."""
        rows = [(at, d) for at, d in history if at >= now - span]
        passed = (
            len(rows) >= th.FLAG_SUSTAIN_MIN_COMPUTATIONS
            and now - rows[0][0] >= span * th.FLAG_SUSTAIN_COVERAGE
            and all(test(d) for _, d in rows)
        )
        return passed, len({d.get("input") for _, d in rows})

    def across_reports(test: Callable[[dict[str, Any]], bool], span: timedelta) -> timedelta | None:
        """The span over which every computation passed the test on FLAG_SUSTAIN_MIN_INPUTS
        distinct progress reports, or None. With fewer reports in `span` (a run that reports
        rarely, or has stopped: the stall flag speaks for that) the reading must have held over
        the longest span: on a run that reports every few minutes, a window of recomputations
        of one report is one reading."""
        passed, inputs = throughout(test, span)
        if passed and inputs < th.FLAG_SUSTAIN_MIN_INPUTS:
            span = longest
            passed = throughout(test, span)[0]
        return span if passed else None

    def odds_recovering(span: timedelta) -> bool:
        """Whether the chance of making the cutoff rose from the span's first progress report
        to its last, and is still at least even. A crossing that every new report takes back
        towards the line (the band narrowing after an early ETA, one slow interval of a sparse
        log, a downtime already over) is clearing as data arrive, not sustained: raising it
        opened a flag that resolved within minutes and came back as "new" when a real slowdown
        followed (issue 9). A run more likely late than not is news whichever way its odds move
        (a slowed run's odds climb from 15% to 30% as its new pace is measured)."""
        by_report: dict[Any, float] = {}
        for at, d in history:
            p = d.get("deadline_p")
            if at >= now - span and isinstance(p, int | float):
                by_report[d.get("input")] = float(p)  # a report's latest reading
        odds = list(by_report.values())
        return len(odds) >= 2 and odds[-1] > odds[0] and odds[-1] >= th.DEADLINE_LIKELY_LATE_P

    def held(kind: str, span: timedelta) -> bool:
        def has(d: dict[str, Any]) -> bool:
            return kind in (d.get("found") or [])

        if kind not in SUSTAINED_ON_NEW_DATA:
            return throughout(has, span)[0]
        judged = across_reports(has, span)
        return judged is not None and not odds_recovering(judged)

    rows = [(at, d) for at, d in history if at >= now - window]
    covered = (
        len(rows) >= th.FLAG_SUSTAIN_MIN_COMPUTATIONS
        and (now - min(r[0] for r in rows)) >= window * th.FLAG_SUSTAIN_COVERAGE
    )
    seen = [set(d.get("found") or []) for _, d in rows]
    open_flags = selectors.flags_open(run=run)
    recently_resolved = set(
        Flag.objects.filter(
            run=run,
            state=Flag.State.RESOLVED,
            created_at__gte=now - timedelta(seconds=th.FLAG_REOPEN_GUARD_S),
        ).values_list("kind", flat=True)
    )
    out = []
    for cond in found:
        span = longest if cond.kind in recently_resolved else window
        # A finding the detector already required to hold over several evaluations (a sparse
        # validation curve, a point every few minutes) is sustained in points: a time window on
        # top of it would outlast a short run. Kept open and closed like the others.
        in_points = bool(cond.data.get("sustained_points"))
        if (
            cond.kind not in SUSTAINED_KINDS
            or cond.kind in open_flags
            or in_points
            or held(cond.kind, span)
        ):
            out.append(cond)
    reported = {c.kind for c in out}
    for kind, prev in open_flags.items():
        if kind not in SUSTAINED_KINDS or kind in reported:
            continue
        if kind == Flag.Kind.DEADLINE:
            # Open until the odds are clearly back, in every computation of the window and on
            # new reports, as a raise must hold (one report's reading, recomputed, is one).
            back = across_reports(_odds_back, window) is not None
        else:
            back = covered and not any(kind in s for s in seen)
        if not back:  # still open: the same condition, so no new row
            out.append(Condition(kind, prev.explanation, prev.severity, prev.onset_step, prev.data))
    return out


def _odds_back(computation: dict[str, Any]) -> bool:
    p = computation.get("deadline_p")
    return isinstance(p, int | float) and p >= th.FLAG_DEADLINE_RESOLVE_P


def _store(
    *,
    run: Run,
    kind: str,
    last_step: int,
    now: datetime,
    data: dict[str, Any],
    finish: tuple[float, float, float] | None = None,
) -> Forecast:
    p10, p50, p90 = finish if finish else (None, None, None)
    forecast, _ = Forecast.objects.update_or_create(
        run=run,
        kind=kind,
        segment=run.current_segment,
        input_last_step=last_step,
        defaults={
            "computed_at": now,
            "data": data,
            "finish_p10": p10,
            "finish_p50": p50,
            "finish_p90": p90,
        },
    )
    return forecast


def _eta_and_deadline(
    *, run: Run, progress: Series, now: datetime
) -> tuple[list[Condition], float | None] | None:
    """Slip and deadline conditions and the chance of making the cutoff (None without one), or
    None when no ETA can be made from the data."""
    now_s = now.timestamp()
    eta = forecast_eta(progress.steps.astype(float), progress.times, run.total_steps, now=now_s)
    if eta is None:
        return None
    _eta_backfill(run=run, progress=progress)
    last_step = int(progress.steps[-1])
    finish = (now_s + eta.wall_p10, now_s + eta.wall_p50, now_s + eta.wall_p90)
    _store(
        run=run,
        kind=Forecast.Kind.ETA,
        last_step=last_step,
        now=now,
        data=eta.to_dict(),
        finish=finish,
    )
    if run.deadline is None:
        return _slip_condition(run=run, now=now), None
    conditions, odds = _deadline_condition(run=run, eta=eta, last_step=last_step, now=now)
    # For a run aimed at a cutoff the lead's question is the cutoff: a slipping ETA is not a
    # flag of its own but the why of the deadline flag, said in it while the cutoff is at risk
    # (a slip that leaves it safe is nothing a lead would act on; the ETA chart shows it). Two
    # flags for one worry sent two messages for a healthy Nemotron run's one slow step, and
    # keeping them apart took three special cases (issue 9).
    if conditions:
        slip = _slip_condition(run=run, now=now)
        if slip:
            deadline = conditions[0]
            why = str(slip[0].data.get("explanation", "")) or slip[0].explanation
            conditions[0] = replace(
                deadline,
                explanation=f"{deadline.explanation}; {why}",
                data={**deadline.data, "slip": slip[0].data},
            )
    return conditions, odds


def _eta_backfill(*, run: Run, progress: Series) -> int:
    """Store the as-of ETA forecasts of a run's logged history, once, before its first live one.

    They are marked `data["as_of_history"]`: the chart draws them, but the slip flag reads only
    forecasts made live, so importing a run's past never sends an alert about it."""
    times = progress.times
    finite = times[np.isfinite(times)]
    if finite.size < 2 or float(finite[-1] - finite[0]) < th.ETA_BACKFILL_MIN_SPAN_S:
        return 0
    if Forecast.objects.filter(run=run, kind=Forecast.Kind.ETA).exists():
        return 0
    t0, t1 = float(finite[0]), float(finite[-1])
    stored = 0
    # Evenly spaced in the run's own time, from 5% in (a forecast needs a few points) to just
    # before its last point (the live forecast's own).
    for as_of in np.linspace(t0 + 0.05 * (t1 - t0), t1, th.ETA_BACKFILL_POINTS + 1)[:-1]:
        seen = np.isfinite(times) & (times <= as_of)
        if int(seen.sum()) < th.ETA_MIN_POINTS:
            continue
        steps = progress.steps[seen]
        eta = forecast_eta(steps.astype(float), times[seen], run.total_steps, now=float(as_of))
        if eta is None:
            continue
        at = float(as_of)
        _store(
            run=run,
            kind=Forecast.Kind.ETA,
            last_step=int(steps[-1]),
            now=datetime.fromtimestamp(at, tz=UTC),
            data={**eta.to_dict(), "as_of_history": True},
            finish=(at + eta.wall_p10, at + eta.wall_p50, at + eta.wall_p90),
        )
        stored += 1
    return stored


def _slip_condition(*, run: Run, now: datetime) -> list[Condition]:
    etas = Forecast.objects.filter(
        run=run, kind=Forecast.Kind.ETA, finish_p50__isnull=False
    ).exclude(data__has_key="as_of_history")
    # The slip window never exceeds SLIP_WINDOW_MAX_S and its length needs only the first
    # forecast: a run keeps ~40k ETA forecasts (a week in full), and this runs every 15 s.
    first = etas.order_by("computed_at").values_list("computed_at", "finish_p50").first()
    recent = list(
        etas.filter(computed_at__gte=now - timedelta(seconds=th.SLIP_WINDOW_MAX_S))
        .order_by("computed_at")
        .values_list("computed_at", "finish_p50")
    )
    history = ([first] if first is not None and first not in recent[:1] else []) + recent
    if len(history) < 2:
        return []
    times = np.array([h[0].timestamp() for h in history])
    finishes = np.array([h[1] for h in history])
    slip = detect_slip(times, finishes, now=now.timestamp(), tz=run.project.tzinfo)
    if slip is None or not slip.slipping:
        return []
    return [
        Condition(
            Flag.Kind.SLIP, f"ETA slipping: {slip.explanation}", slip.amount_s, None, slip.to_dict()
        )
    ]


def _deadline_condition(
    *, run: Run, eta: EtaForecast, last_step: int, now: datetime
) -> tuple[list[Condition], float]:
    assert run.deadline is not None
    risk = deadline_risk(eta, run.deadline.train_by.timestamp())
    data = {**risk.to_dict(), "deadline": run.deadline.name, "deadline_slug": run.deadline.slug}
    _store(run=run, kind=Forecast.Kind.DEADLINE, last_step=last_step, now=now, data=data)
    # An early ETA (a handful of intervals, or a sliver of the run) is damped and wide by
    # design: the odds it gives say how little is known, not that the run is slow. It raises
    # only when even so the run is more likely late than not; an open flag is kept or closed by
    # the odds as usual.
    raise_below = th.DEADLINE_LIKELY_LATE_P if eta.early else th.FLAG_DEADLINE_AT_RISK_P
    if risk.p_on_time >= raise_below:
        return [], risk.p_on_time
    # The words follow the one tone rule (deadline.on_time_tone): "will likely miss" beside
    # "76% likely on time" contradicted itself on the demo's run page.
    verdict = (
        "will likely miss"
        if risk.p_on_time < th.DEADLINE_LIKELY_LATE_P
        else "is at risk of missing"
    )
    text = f"{run} {verdict} {run.deadline.name}: {risk.explanation}"
    return [Condition(Flag.Kind.DEADLINE, text, 1.0 - risk.p_on_time, None, data)], risk.p_on_time


def _loss_and_divergence(
    *, run: Run, key: str, series: Series, keys: list[str], now: datetime
) -> list[Condition]:
    if len(series) == 0:
        return []
    lr = _thin(tracker_selectors.series_load(run=run, key="lr"), 20_000) if "lr" in keys else None
    thin = _thin(series)
    finite = np.isfinite(thin.values)
    loss = forecast_loss(
        thin.steps[finite].astype(float),
        thin.values[finite],
        total_steps=run.total_steps,
        lr_steps=lr.steps.astype(float) if lr is not None and len(lr) else None,
        lr_values=lr.values if lr is not None and len(lr) else None,
        target=run.project.targets.get(key),
    )
    if loss is not None:
        _store(
            run=run,
            kind=Forecast.Kind.LOSS,
            last_step=int(series.steps[-1]),
            now=now,
            data={**loss.to_dict(), "key": key},
        )
    return _divergence_conditions(
        run=run, key=key, series=_thin_keep_nonfinite(series), keys=keys, now=now
    )


# Loss keys that are a held-out evaluation (one smooth point per evaluation), not a train loss.
EVALUATION_LOSS_KEYS = ("val_loss", "eval_loss")


def _divergence_conditions(
    *, run: Run, key: str, series: Series, keys: list[str], now: datetime
) -> list[Condition]:
    checkpoints = [
        float(s)
        for s in Event.objects.filter(run=run, kind=Event.Kind.CHECKPOINT, step__isnull=False)
        .order_by("step")
        .values_list("step", flat=True)
        if s is not None
    ]
    grad_norms = {}
    for k in keys:
        if k.startswith("grad_norm/"):
            g = _thin(tracker_selectors.series_load(run=run, key=k), 20_000)
            grad_norms[k] = (g.steps.astype(float), g.values)
    price = float(run.project.gpu_hour_price) if run.project.gpu_hour_price is not None else None
    flags = detect_divergence(
        series.steps.astype(float),
        series.values,
        times=series.times,
        checkpoints=checkpoints,
        grad_norms=grad_norms or None,
        gpu_count=run.world_size,
        gpu_hour_price=price,
        currency=run.project.currency,
        now=now.timestamp(),
        evaluation=key in EVALUATION_LOSS_KEYS,
    )
    return [Condition(f.kind, f.explanation, f.severity, f.onset_step, f.to_dict()) for f in flags]


@transaction.atomic
def flags_sync(
    *,
    run: Run,
    conditions: list[Condition],
    kinds: tuple[str, ...],
    now: datetime,
    reason: str | None = None,
    ended: bool = False,
) -> list[Flag]:
    """Write a Flag row for each change: raised, updated (onset moved) or resolved.

    `reason` says why absent conditions resolve, when it is not that they cleared.
    """
    Run.objects.select_for_update().filter(pk=run.pk).first()  # serialise concurrent syncs
    current = {c.kind: c for c in conditions}
    open_flags = selectors.flags_open(run=run)
    written = []
    for kind, cond in current.items():
        prev = open_flags.get(kind)
        if prev is not None and not _is_news(prev, cond):
            continue
        state = Flag.State.RAISED if prev is None else Flag.State.UPDATED
        written.append(_flag_write(run, cond, state, prev.state if prev else "", now))
    for kind, prev in open_flags.items():
        if kind in kinds and kind not in current:
            # What the flag said, marked as past: "nan cleared: Loss ... is still not finite"
            # read as the loss still being NaN in the very line that says it cleared.
            said = f"{kind} cleared (it said: {prev.explanation})"
            text = f"{kind} resolved: {reason}" if reason else said
            data = {"reason": reason, "closed_by_run_end": ended} if reason else {}
            cond = Condition(kind, text, None, prev.onset_step, data)
            written.append(_flag_write(run, cond, Flag.State.RESOLVED, prev.state, now))
    return written


def flags_close(*, run: Run, reason: str, now: datetime) -> list[Flag]:
    """Resolve every open flag of a run with the reason (its end): ended runs are final."""
    kinds = tuple(Flag.Kind.values)
    return flags_sync(run=run, conditions=[], kinds=kinds, now=now, reason=reason, ended=True)


def _band(kind: str, data: dict[str, Any]) -> int | None:
    """Which severity band a condition is in, for kinds whose worsening is news by itself."""
    if kind == Flag.Kind.DEADLINE and isinstance(data.get("p_on_time"), int | float):
        return sum(data["p_on_time"] < b for b in th.FLAG_DEADLINE_BANDS)
    if kind == Flag.Kind.SLIP and isinstance(data.get("amount_s"), int | float):
        return int(math.log2(max(1.0, data["amount_s"] / th.FLAG_SLIP_BAND_BASE_S)))
    return None


def _is_news(prev: Flag, cond: Condition) -> bool:
    # Same onset and same band: the open flag already says this; a new row would re-alert.
    if prev.kind == Flag.Kind.STRAGGLER and prev.data.get("ranks") != cond.data.get("ranks"):
        return True  # another rank is now the one everyone waits for
    if _band(prev.kind, prev.data) != _band(cond.kind, cond.data):
        return True
    if prev.onset_step == _int_or_none(cond.onset_step):
        return False
    if "rollback_step" in prev.data or "rollback_step" in cond.data:
        # A loss finding's onset is re-estimated as points arrive; what a lead acts on is the
        # checkpoint to roll back to. Each small move was an "updated" alert after every
        # cooldown (21 messages for one regression in a stop-17 experiment).
        return prev.data.get("rollback_step") != cond.data.get("rollback_step")
    return True


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _flag_write(run: Run, cond: Condition, state: str, previous: str, now: datetime) -> Flag:
    return Flag.objects.create(
        run=run,
        kind=cond.kind,
        state=state,
        previous_state=previous,
        severity=cond.severity,
        explanation=cond.explanation,
        onset_step=_int_or_none(cond.onset_step),
        data=cond.data,
        created_at=now,
    )


# The liveness sweep runs every minute (config/celery.py); a gap of more than a few periods
# between two of its ticks is the server (or its worker) having been down.
SWEEP_PERIOD_S = 60.0
SERVER_GAP_PERIODS = 1.5  # one missed tick is a gap: a late tick is not


def server_tick(*, now: datetime | None = None, period_s: float = SWEEP_PERIOD_S) -> datetime:
    """Record that the server is listening; return since when it has been without a gap."""
    now = now or timezone.now()
    with transaction.atomic():
        clock, _ = ServerClock.objects.select_for_update().get_or_create(pk=1)
        gap = None if clock.last_tick_at is None else (now - clock.last_tick_at).total_seconds()
        if clock.listening_since is None or gap is None or gap > SERVER_GAP_PERIODS * period_s:
            clock.listening_since = now
        clock.last_tick_at = max(now, clock.last_tick_at or now)
        clock.save()
    return clock.listening_since


def _listening_since() -> datetime | None:
    return ServerClock.objects.filter(pk=1).values_list("listening_since", flat=True).first()


# How long a web tier that stopped answering the probe holds the liveness checks back. A probe
# silent for longer is more likely broken (a stale RUNCAST_WEB_PROBE_URL after a move) than an
# outage, and a real crash must not stay hidden behind it for good.
WEB_OUTAGE_MAX_S = 3600.0
WEB_PROBE_TIMEOUT_S = 5.0


def web_answers(*, url: str, timeout_s: float = WEB_PROBE_TIMEOUT_S) -> bool:
    """Whether the web tier at `url` (its /healthz, from settings, not user input) answers 200.

    The request names the public site's host: the worker reaches the web by an internal name
    (`web:8000`) that ALLOWED_HOSTS need not list, and SITE_URL's host it must.
    """
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return False  # a file: or other scheme is no web tier
    host = urllib.parse.urlsplit(settings.SITE_URL).netloc
    request = urllib.request.Request(url, headers={"Host": host} if host else {})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310
            return bool(answer.status == 200)
    except (OSError, ValueError):  # refused, timed out, HTTP error, a malformed URL
        return False


def server_listening(
    *, probe_url: str, now: datetime | None = None, period_s: float = SWEEP_PERIOD_S
) -> bool:
    """The liveness sweep's first step: may the runs' silence be judged now?

    The worker and its beat can run on while the web tier that clients reach is down (a
    redeploy, a crash, its proxy): the clients spool, and their silence is the server's. With a
    probe URL, a tick is taken only when the web answers, so the first tick after it is back
    finds the gap and starts a new listening period with its grace (server_tick). A probe that
    has never answered is read as a misconfiguration and ignored, as is one silent for more than
    WEB_OUTAGE_MAX_S; both are logged.
    """
    now = now or timezone.now()
    if probe_url:
        if web_answers(url=probe_url):
            ServerClock.objects.update_or_create(pk=1, defaults={"web_answered_at": now})
        else:
            last = ServerClock.objects.filter(pk=1).values_list("web_answered_at", flat=True)
            answered = last.first()
            if answered is not None and (now - answered).total_seconds() <= WEB_OUTAGE_MAX_S:
                logger.warning(
                    "web tier %s does not answer: runs' silence is not judged", probe_url
                )
                return False
            logger.warning(
                "web tier %s does not answer (last answer: %s): runs' silence is judged anyway; "
                "check RUNCAST_WEB_PROBE_URL",
                probe_url,
                "never" if answered is None else answered.isoformat(),
            )
    server_tick(now=now, period_s=period_s)
    return True


def run_check_liveness(*, run_id: int, now: datetime | None = None) -> list[Flag]:
    """Mark a silent run crashed (heartbeat lost) or stalled (alive, no progress).

    Silence while the server itself was not listening does not count: a client spools through
    an outage and replays when it is back (outage-aware, see server_tick).
    """
    now = now or timezone.now()
    run = Run.objects.select_related("project").filter(pk=run_id).first()
    if run is None:
        return []
    if not run.is_active:
        # Ended: forecast_compute closed its flags. Inferred crash: its stalled flag stays open.
        return []
    beats = np.array(
        [
            t.timestamp()
            for t in IngestBatch.objects.filter(run=run)
            .order_by("-received_at")
            .values_list("received_at", flat=True)[:500]
        ][::-1]
    )
    if run.current_segment > 1:
        # A resume is contact: the job calls init before its first batch, and a sweep between
        # the two read the crash's silence as the new attempt's (the demo drill's resume got
        # "no heartbeat for 2 min", was marked crashed and its old NaN alert sent again).
        resumed = (
            run.segments.filter(number=run.current_segment)
            .values_list("started_at", flat=True)
            .first()
        )
        if resumed is not None:
            beats = np.sort(np.append(beats, resumed.timestamp()))
    # Progress of the current attempt only: a resume goes back to a checkpoint, and its first
    # steps lie below the old attempt's furthest one without being a stall.
    # Chunks whose batch row retention deleted have no received time; they are days old.
    current = run.chunks.filter(segment=run.current_segment, batch__isnull=False).order_by("-id")
    chunks = list(current.values_list("batch__received_at", "max_step")[:500])[::-1]
    progress_t = np.array([c[0].timestamp() for c in chunks])
    progress_s = np.array([float(c[1]) for c in chunks])
    since = _listening_since()
    stall = detect_stall(
        beats,
        progress_t,
        progress_s,
        now=now.timestamp(),
        listening_since=since.timestamp() if since is not None else None,
    )
    conditions = []
    raised: list[Flag] = []
    if stall is not None and stall.stalled:
        status = Run.silent_status(heartbeat_lost=stall.kind == "no_heartbeat")
        Run.objects.filter(pk=run.pk, status__in=Run.ACTIVE_STATUSES).update(status=status)
        if status == Run.Status.CRASHED:
            # A job killed seconds after its loss blew up: the NaN in its last data is the why
            # of the crash, raised first (no forecast runs on an inferred crash), so its alert
            # comes before "looks crashed" (the demo drill's came after it).
            raised = _final_events(run=run, now=now)
        conditions.append(
            Condition(Flag.Kind.STALLED, stall.explanation, stall.silent_s, None, stall.to_dict())
        )
    return raised + flags_sync(run=run, conditions=conditions, kinds=(Flag.Kind.STALLED,), now=now)
