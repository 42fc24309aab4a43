"""The straggler condition of one forecast: load the recent window of rank timings, run the
pure detector, and price what the straggler costs and when the run would finish without it.

Called by forecasting.compute.forecast_compute (it owns the flag's hysteresis and rows); this
module writes only the STRAGGLER forecast (through forecasting.store), which the run page and
the board read.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime
from typing import Any

import numpy as np

from forecasting import selectors
from forecasting.estimators import formatting as fmt
from forecasting.estimators import thresholds as th
from forecasting.estimators.deadline import deadline_risk
from forecasting.estimators.eta import EtaForecast
from forecasting.estimators.straggler_detect import Straggler, StragglerReport, detect_stragglers
from forecasting.models import Flag, Forecast
from forecasting.store import forecast_store
from tracker import rank_timings
from tracker.models import Run


@dataclasses.dataclass(frozen=True)
class StragglerFinding:
    """What a computation found, before the hysteresis: the condition's text and data."""

    explanation: str
    severity: float
    onset_step: int
    data: dict[str, Any]


def eta_from(forecast: Forecast | None) -> EtaForecast | None:
    """The EtaForecast a stored ETA row was made from (its to_dict() minus derived keys)."""
    if forecast is None or not forecast.data:
        return None
    names = {f.name for f in dataclasses.fields(EtaForecast)}
    try:
        return EtaForecast(**{k: v for k, v in forecast.data.items() if k in names})
    except TypeError:
        return None  # an older row without a field this version needs


def whatif_eta(eta: EtaForecast, factor: float) -> EtaForecast:
    """The ETA if the job ran at `factor` of its step time: only compute scales (downtime
    and interruptions do not get shorter because a rank is faster)."""
    f = min(1.0, max(0.0, factor))

    def scaled(wall: float, compute: float) -> float:
        return max(0.0, wall - compute * (1.0 - f))

    return dataclasses.replace(
        eta,
        compute_p10=eta.compute_p10 * f,
        compute_p50=eta.compute_p50 * f,
        compute_p90=eta.compute_p90 * f,
        wall_p10=scaled(eta.wall_p10, eta.compute_p10),
        wall_p50=scaled(eta.wall_p50, eta.compute_p50),
        wall_p90=scaled(eta.wall_p90, eta.compute_p90),
        rate_steps_per_s=eta.rate_steps_per_s / f if f > 0 else eta.rate_steps_per_s,
    )


def straggler_finding(
    *, run: Run, now: datetime, open_flags: dict[str, Flag] | None = None
) -> StragglerFinding | None:
    """Detect on the recent window, store the STRAGGLER forecast, return the finding (if any).

    Runs whose ranks send no timings cost one indexed query. `open_flags`: the run's open
    flags, when the caller has read them already.
    """
    # From the rollup (folded here first): a few block rows, not every rank's chunks.
    timings = rank_timings.rank_timings_recent(
        run=run, last_steps=th.STRAGGLER_WINDOW_STEPS
    ).complete()
    if timings.empty:
        return None
    report = detect_stragglers(
        timings.steps,
        timings.signal(),
        hosts=timings.hosts if any(timings.hosts) else None,
        wait_s=timings.wait if _any_finite(timings.wait) else None,
        total_s=timings.total if _any_finite(timings.total) else None,
    )
    # The detector names matrix columns; a column is the n-th rank that reported.
    report = dataclasses.replace(
        report,
        stragglers=[
            dataclasses.replace(s, ranks=tuple(int(timings.ranks[i]) for i in s.ranks))
            for s in report.stragglers
        ],
    )
    eta = eta_from(selectors.forecast_latest(run=run, kind=Forecast.Kind.ETA))
    last_step = int(timings.steps[-1])
    top = max(report.stragglers, key=lambda s: s.cost_s, default=None)
    if open_flags is None:
        open_flags = selectors.flags_open(run=run)
    open_flag = open_flags.get(Flag.Kind.STRAGGLER)
    onset = _onset(top, open_flag) if top is not None else None
    data = _data(run=run, report=report, top=top, onset=onset, eta=eta, last_step=last_step)
    data["window"] = [int(timings.steps[0]), last_step]
    data["ranks_seen"] = int(timings.ranks.size)
    _store(run=run, last_step=last_step, now=now, data=data, report=report)
    if top is None or onset is None:
        return None
    text = _explanation(top=top, onset=onset, data=data, now=now)
    return StragglerFinding(text, float(top.slowdown), onset, data)


def _any_finite(matrix: np.ndarray) -> bool:
    return bool(np.isfinite(matrix).any())


def _onset(top: Straggler, open_flag: Flag | None) -> int:
    """The open flag's onset while it is the same straggler: the window slides past the onset
    of a long episode, and a moving onset would re-raise the same flag every computation."""
    if open_flag is not None and open_flag.onset_step is not None:
        same = list(open_flag.data.get("ranks") or []) == list(top.ranks)
        if same and open_flag.onset_step <= top.onset_step:
            return int(open_flag.onset_step)
    return int(top.onset_step)


def _data(
    *,
    run: Run,
    report: StragglerReport,
    top: Straggler | None,
    onset: int | None,
    eta: EtaForecast | None,
    last_step: int,
) -> dict[str, Any]:
    factor = report.whatif_factor()
    data: dict[str, Any] = {
        **report.to_dict(),
        "whatif_factor": factor,
        "last_step": last_step,
    }
    if top is not None and onset is not None:
        gain = _finite(report.job_step_s) - _finite(report.whatif_step_s)
        before_window = max(0, top.onset_step - onset)
        # The detector prices the steps it saw; an episode older than the window adds the
        # same per-step loss for the steps before it.
        cost = float(top.cost_s) + max(0.0, gain) * before_window
        data.update(
            kind=top.kind,
            ranks=list(top.ranks),
            host=top.host,
            slowdown=float(top.slowdown),
            cost_s=cost,
            onset_step=onset,
            since_s=max(0.0, (last_step - onset) * _finite(report.job_step_s)),
        )
    if eta is not None:
        better = whatif_eta(eta, factor)
        data.update(finish_p50=eta.finish_p50(), whatif_finish_p50=better.finish_p50())
        if run.deadline is not None:
            cutoff = run.deadline.train_by.timestamp()
            data.update(
                deadline=run.deadline.name,
                p_on_time=deadline_risk(eta, cutoff).p_on_time,
                whatif_p_on_time=deadline_risk(better, cutoff).p_on_time,
            )
    return data


def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else 0.0


def _store(
    *,
    run: Run,
    last_step: int,
    now: datetime,
    data: dict[str, Any],
    report: StragglerReport,
) -> None:
    # The what-if finish is this forecast's finish: the board draws it beside the ETA.
    p50 = data.get("whatif_finish_p50") if report.stragglers else None
    forecast_store(
        run=run,
        kind=Forecast.Kind.STRAGGLER,
        last_step=last_step,
        now=now,
        data=data,
        finish=(None, p50, None),
    )


def who(top_kind: str, ranks: list[int], host: str | None) -> str:
    """'rank 17 on node-3', 'node-3 (ranks 16-23)', 'ranks 3, 9'."""
    if top_kind == "host" and host:
        span = f"ranks {ranks[0]}-{ranks[-1]}" if len(ranks) > 2 else _ranks(ranks)
        return f"{host} ({span})"
    where = f" on {host}" if host else ""
    return f"{_ranks(ranks)}{where}"


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:8]) + (" ..." if len(ranks) > 8 else "")


def _explanation(*, top: Straggler, onset: int, data: dict[str, Any], now: datetime) -> str:
    subject = who(top.kind, list(top.ranks), top.host)
    verb = "are" if top.kind == "host" or len(top.ranks) > 1 else "is"
    if top.kind == "last_arrival":
        state = f"{subject} {verb} last to the collective in most steps ({top.slowdown:.0%} slower)"
    else:
        state = f"{subject} {verb} {top.slowdown:.0%} slower"
    since = data.get("since_s")
    ago = f" ({fmt.span(since)} ago)" if isinstance(since, float) and since >= 1 else ""
    text = (
        f"{state} since step {fmt.steps(onset)}{ago}; the whole job runs at its pace: "
        f"+{fmt.span(data.get('cost_s'))} to the finish so far"
    )
    whatif = data.get("whatif_finish_p50")
    if isinstance(whatif, float):
        # Stamps: each reader writes them in its zone (the clock rule, docs/alerts.md).
        seconds = fmt.needs_seconds(whatif - now.timestamp())
        text += f"; without it: finish {fmt.stamp(whatif, seconds=seconds)}"
        p, p_whatif = data.get("p_on_time"), data.get("whatif_p_on_time")
        odds = (
            isinstance(p, float) and isinstance(p_whatif, float) and f"{p:.0%}" != f"{p_whatif:.0%}"
        )
        real = data.get("finish_p50")
        if odds:
            # Only when the straggler changes the odds: "100% instead of 100%" says nothing.
            text += f" (P on time {p_whatif:.0%} instead of {p:.0%})"
        elif isinstance(real, float):
            text += f" instead of {fmt.stamp(real, seconds=seconds)}"
    return text
