"""Will the run finish before a deadline, and what would it take to make it likely?"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from forecasting.estimators import formatting
from forecasting.estimators import thresholds as th
from forecasting.estimators.eta import Z90, EtaForecast
from forecasting.estimators.jsonable import as_json

# The standard normal, from the standard library: pages and the digest call on_time_tone from
# this module, and importing scipy.stats for one scalar function costs every web worker ~1 s and
# tens of MB.
_NORMAL = NormalDist()

# How a chance of making the cutoff reads: ok (on track), warn (at risk), bad (likely late).
TONE_WORDS = {"ok": "on track", "warn": "at risk", "bad": "likely late"}


def on_time_tone(p_on_time: float) -> str:
    """The one tone rule: ok at the planning target or above, bad below likely-late."""
    if p_on_time >= th.DEADLINE_TARGET_P:
        return "ok"
    return "warn" if p_on_time >= th.DEADLINE_LIKELY_LATE_P else "bad"


@dataclass
class DeadlineRisk:
    p_on_time: float
    deadline: float
    speedup_for_p90: float | None  # 0.18 = needs +18% speed; 0 if already on target
    steps_cut_for_p90: float | None  # steps to drop from the plan; 0 if already on target
    explanation: str

    def to_dict(self) -> dict[str, float | str | None]:
        return as_json(self)


def _p_before(eta: EtaForecast, budget: float) -> float:
    """P(wall time to finish <= budget), log-normal on each side of the median (split normal)."""
    if budget <= 0:
        return 0.0
    if eta.wall_p50 <= 0:
        return 1.0
    x = math.log(budget / eta.wall_p50)
    edge = eta.wall_p90 if x > 0 else eta.wall_p10
    sigma = abs(math.log(max(edge, 1e-9) / eta.wall_p50)) / Z90
    if sigma < 1e-9:
        return 1.0 if x >= 0 else 0.0
    return _NORMAL.cdf(x / sigma)


def deadline_risk(eta: EtaForecast, deadline: float) -> DeadlineRisk:
    """Chance of finishing by `deadline` (same clock as eta.now) and the fix for P90 on time."""
    budget = deadline - eta.now
    p = _p_before(eta, budget)
    target = th.DEADLINE_TARGET_P
    remaining_steps = max(0.0, eta.total_steps - eta.current_step)
    if p >= target:
        return DeadlineRisk(p, deadline, 0.0, 0.0, formatting.on_time(p, 0.0, 0.0))
    # Downtime does not shrink with faster compute: only the compute part of the P90 scales.
    downtime_p90 = max(0.0, eta.wall_p90 - eta.compute_p90)
    compute_budget = budget - downtime_p90
    if compute_budget <= 0 or eta.compute_p90 <= 0:
        return DeadlineRisk(p, deadline, None, None, formatting.on_time(p, None, None))
    scale = compute_budget / eta.compute_p90  # share of the P90 compute that fits
    speedup = 1.0 / scale - 1.0
    cut = remaining_steps * (1.0 - scale)
    # The words every reader sees for these figures (card, flag, message): one name, one rounding.
    text = formatting.on_time(p, speedup, cut)
    return DeadlineRisk(p, deadline, float(speedup), float(cut), text)
