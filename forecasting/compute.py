"""One forecast computation of one run: load its data, run the pure estimators, store the
forecasts (`store`), weigh the findings (`hysteresis`) and record the changes (`flags`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
from django.db import transaction
from django.utils import timezone

from forecasting import episodes, hysteresis, inputs, selectors
from forecasting.conditions import Condition, Ending, Reading
from forecasting.estimators import formatting as fmt
from forecasting.estimators import thresholds as th
from forecasting.estimators.deadline import deadline_risk
from forecasting.estimators.divergence import detect_divergence
from forecasting.estimators.eta import EtaForecast, forecast_eta
from forecasting.estimators.loss import forecast_loss
from forecasting.estimators.slip import detect_slip
from forecasting.flags import flags_close, flags_sync, int_or_none
from forecasting.models import ConditionReading, Flag, Forecast
from forecasting.sampling import Sample, progress_input, resolved_input, sample_extend
from forecasting.store import forecast_store
from forecasting.stragglers import straggler_finding
from tracker import selectors as tracker_selectors
from tracker.models import Event, Run
from tracker.series import Series

# Forecast inputs are thinned to at most this many points (forecasting.sampling); the
# estimators bin further themselves. The lr schedule and gradient norms need fewer.
MAX_INPUT_POINTS = 200_000
AUX_INPUT_POINTS = 20_000
# Kinds forecast_compute owns (resolves when absent); "stalled" belongs to the liveness sweep.
FORECAST_FLAG_KINDS = (
    *Flag.DIVERGENCE_KINDS,
    Flag.Kind.SLIP,
    Flag.Kind.DEADLINE,
    Flag.Kind.STRAGGLER,
)


def _input(*, run: Run, key: str, limit: int = MAX_INPUT_POINTS) -> Sample:
    """The forecast's sample of one key, from its stored state (forecasting.inputs). The loss
    and progress sample keeps every NaN/Inf: a NaN is the whole signal of a blow-up."""
    return inputs.series_input(
        run=run, key=key, limit=limit, keep_nonfinite=limit == MAX_INPUT_POINTS
    )


def _sample_all(series: Series) -> Series:
    """The same thinning over a history read whole (a run's end, once): resolved, NaN kept."""
    sample = sample_extend(Sample.empty(), series, limit=MAX_INPUT_POINTS, keep_nonfinite=True)
    return resolved_input(sample)


@transaction.atomic
def forecast_compute(*, run_id: int, now: datetime | None = None) -> list[Flag]:
    """Recompute every forecast of one run and record flag changes. Idempotent.

    An ended run is final: its open flags close with the reason and nothing more is forecast.

    One transaction: a computation's rows (its forecasts, its reading, its flags) are stored
    together or not at all; a worker killed half-way left a computation's ETA row without the
    rest (issue 24), and its redelivered task now computes it whole. The transaction lasts the
    computation (~0.1 s for 100k points, ~1 s for a million): on PostgreSQL it holds only this
    run's new rows until then (flags_sync takes the run's row lock last, as before); on SQLite
    (embedded) it holds the write lock, so ingest may wait that long.
    """
    run = Run.objects.select_related("project", "deadline").filter(pk=run_id).first()
    if run is None:
        return []
    now = now or timezone.now()
    if run.has_ended:
        # Its last data may hold a NaN no forecast saw yet (a job that dies seconds after its
        # loss blew up): that is raised first, so the alert says why, then every flag closes.
        raised = final_events(run=run, now=now)
        last_words = _episode_endings(run=run, ended=str(run.status))
        return raised + flags_close(
            run=run, reason=f"the run {run.status}", now=now, resolutions=last_words
        )
    if not run.is_active:
        return []  # a crash the sweeper inferred: its flags stay until the run speaks or ends
    keys = tracker_selectors.series_keys(run=run)
    loss_key = tracker_selectors.loss_key_for(keys)
    progress_key = loss_key or (keys[0] if keys else None)
    # Read once for the computation's steps that weigh findings against them (the straggler's
    # onset, the open episode, the hysteresis); nothing writes flags before flags_sync, which
    # reads them again under the run's lock.
    open_flags = selectors.flags_open(run=run)
    conditions: list[Condition] = []
    endings: dict[str, Ending] = {}
    kinds: tuple[str, ...] = FORECAST_FLAG_KINDS
    if progress_key is not None:
        sample = _input(run=run, key=progress_key)
        if sample.points:
            eta = _eta_and_deadline(run=run, progress=progress_input(sample), now=now)
            if eta is None:
                # No ETA this time (e.g. too few points right after a resume): that says
                # nothing about the deadline or the slip, so their open flags stay as they are.
                kinds = Flag.DIVERGENCE_KINDS
            eta_conditions, odds = eta if eta is not None else ([], None)
            conditions += eta_conditions
            if eta is not None:
                # After the ETA: the what-if finish scales the forecast just stored.
                conditions += _straggler_condition(run=run, now=now, open_flags=open_flags)
            if loss_key is not None:
                # The progress series is the loss series: the same sample, resolved.
                series = resolved_input(sample)
                found, endings = _loss_and_divergence(
                    run=run, key=loss_key, series=series, keys=keys, now=now, open_flags=open_flags
                )
                conditions += found
            conditions = episodes.one_flag_each(
                _sustained(
                    run=run,
                    found=conditions,
                    odds=odds,
                    input_step=int(sample.last.steps[0]),
                    now=now,
                    open_flags=open_flags,
                )
            )
    return flags_sync(run=run, conditions=conditions, kinds=kinds, now=now, resolutions=endings)


EVENT_KINDS = (Flag.Kind.NAN, Flag.Kind.SPIKE)


def final_events(*, run: Run, now: datetime) -> list[Flag]:
    """Raise what the run's final data shows of NaN and spikes that no forecast saw (at its
    end, or when the sweep finds it dead)."""
    keys = tracker_selectors.series_keys(run=run)
    loss_key = tracker_selectors.loss_key_for(keys)
    if loss_key is None:
        return []
    series = tracker_selectors.series_load(run=run, key=loss_key, resolve=False)
    if len(series) == 0:
        return []
    found, _ = _divergence_conditions(
        run=run, key=loss_key, series=_sample_all(series), keys=keys, now=now
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
        and (c.kind, int_or_none(c.onset_step)) not in said
    ]
    return flags_sync(run=run, conditions=events, kinds=(), now=now) if events else []


def _straggler_condition(
    *, run: Run, now: datetime, open_flags: dict[str, Flag]
) -> list[Condition]:
    found = straggler_finding(run=run, now=now, open_flags=open_flags)
    if found is None:
        return []
    kind = Flag.Kind.STRAGGLER
    return [Condition(kind, found.explanation, found.severity, found.onset_step, found.data)]


def _sustained(
    *,
    run: Run,
    found: list[Condition],
    odds: float | None,
    now: datetime,
    open_flags: dict[str, Flag] | None = None,
    input_step: int | None = None,
) -> list[Condition]:
    """Store this computation's reading, then weigh its findings against the readings before
    it (forecasting.hysteresis): the history lives in the database, so a restarted worker sees
    the same."""
    slip = next((c.data.get("amount_s") for c in found if c.kind == Flag.Kind.SLIP), None)
    slip_s = float(slip) if isinstance(slip, int | float) else None
    reading = Reading(now, frozenset(c.kind for c in found), odds, input_step, slip_s)
    _reading_store(run=run, reading=reading)
    window = hysteresis.sustain_window(ran_s=max(0.0, (now - run.started_at).total_seconds()))
    ctx = hysteresis.Context(
        now=now,
        window=window,
        history=selectors.condition_readings(
            run=run, since=now - window * th.FLAG_REOPEN_WINDOWS, until=now
        ),
        open_flags=selectors.flags_open(run=run) if open_flags is None else open_flags,
        recently_resolved=selectors.kinds_resolved_since(
            run=run, since=now - timedelta(seconds=th.FLAG_REOPEN_GUARD_S)
        ),
    )
    return hysteresis.sustained(found, ctx)


def _reading_store(*, run: Run, reading: Reading) -> None:
    # Keyed by the computation's second, not its input: a stalled run brings no new steps, and
    # its findings must still accumulate (recomputing within the same second is idempotent).
    row = ConditionReading(
        run=run,
        segment=run.current_segment,
        second=int(reading.at.timestamp()),
        computed_at=reading.at,
        found=sorted(reading.found),
        deadline_p=reading.deadline_p,
        input_step=reading.input_step,
        slip_s=reading.slip_s,
    )
    # One upsert statement (update_or_create took five), as forecasting.store does.
    ConditionReading.objects.bulk_create(
        [row],
        update_conflicts=True,
        unique_fields=["run", "segment", "second"],
        update_fields=["computed_at", "found", "deadline_p", "input_step", "slip_s"],
    )


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
    forecast_store(
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
        forecast_store(
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
    history = selectors.slip_history(run=run, now=now)
    if len(history) < 2:
        return []
    times = np.array([h[0].timestamp() for h in history])
    finishes = np.array([h[1] for h in history])
    slip = detect_slip(times, finishes, now=now.timestamp())
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
    forecast_store(run=run, kind=Forecast.Kind.DEADLINE, last_step=last_step, now=now, data=data)
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
    # The odds and the fix in the one wording the card and the message use (formatting.on_time).
    odds_text = fmt.on_time(risk.p_on_time, risk.speedup_for_p90, risk.steps_cut_for_p90)
    text = f"{run} {verdict} {run.deadline.name}: {odds_text}"
    return [Condition(Flag.Kind.DEADLINE, text, 1.0 - risk.p_on_time, None, data)], risk.p_on_time


def _loss_and_divergence(
    *,
    run: Run,
    key: str,
    series: Series,
    keys: list[str],
    now: datetime,
    open_flags: dict[str, Flag],
) -> tuple[list[Condition], dict[str, Ending]]:
    """The loss forecast stored, and the divergence conditions with what open episode flags
    say if they close (forecasting.episodes)."""
    if len(series) == 0:
        return [], {}
    lr = resolved_input(_input(run=run, key="lr", limit=AUX_INPUT_POINTS)) if "lr" in keys else None
    finite = np.isfinite(series.values)
    loss = forecast_loss(
        series.steps[finite].astype(float),
        series.values[finite],
        total_steps=run.total_steps,
        lr_steps=lr.steps.astype(float) if lr is not None and len(lr) else None,
        lr_values=lr.values if lr is not None and len(lr) else None,
        target=run.project.targets.get(key),
    )
    if loss is not None:
        forecast_store(
            run=run,
            kind=Forecast.Kind.LOSS,
            last_step=int(series.steps[-1]),
            now=now,
            data={**loss.to_dict(), "key": key},
        )
    return _divergence_conditions(
        run=run, key=key, series=series, keys=keys, now=now, open_flags=open_flags
    )


# Loss keys that are a held-out evaluation (one smooth point per evaluation), not a train loss.
EVALUATION_LOSS_KEYS = ("val_loss", "eval_loss")


def _divergence_conditions(
    *,
    run: Run,
    key: str,
    series: Series,
    keys: list[str],
    now: datetime,
    open_flags: dict[str, Flag] | None = None,
) -> tuple[list[Condition], dict[str, Ending]]:
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
            g = resolved_input(_input(run=run, key=k, limit=AUX_INPUT_POINTS))
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
    found = [Condition(f.kind, f.explanation, f.severity, f.onset_step, f.to_dict()) for f in flags]
    return episodes.with_episodes(
        run=run, found=found, series=series, checkpoints=checkpoints, open_flags=open_flags
    )


def _episode_endings(*, run: Run, ended: str) -> dict[str, Ending]:
    """What the run's open loss episode says as the run's end closes it."""
    keys = tracker_selectors.series_keys(run=run)
    loss_key = tracker_selectors.loss_key_for(keys)
    if loss_key is None:
        return {}
    series = _sample_all(tracker_selectors.series_load(run=run, key=loss_key, resolve=False))
    return episodes.resolutions(run=run, series=series, ended=ended)
