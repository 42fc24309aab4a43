"""Rule kinds: which flag kinds (or run endings) a rule covers and what its threshold means.

A new condition (stragglers, unexplained GPU activity) plugs in by adding one RuleKind here;
rules_ensure_defaults creates it for every project on next use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from forecasting.models import Flag

K = Flag.Kind


@dataclass(frozen=True)
class RuleKind:
    key: str
    label: str
    # Flag kinds (forecasting.Flag.Kind) or run endings (from Run.status) this rule covers.
    sources: tuple[str, ...]
    default_severity: str = "warning"
    default_threshold: float | None = None
    threshold_help: str = ""
    # (flag severity, flag data, threshold) -> does this raise pass the threshold?
    passes: Callable[[float | None, dict, float], bool] | None = None


def _slip_passes(severity: float | None, data: dict, threshold: float) -> bool:
    amount_s = data.get("amount_s", severity)
    return amount_s is None or float(amount_s) >= threshold * 3600.0


def _deadline_passes(severity: float | None, data: dict, threshold: float) -> bool:
    p = data.get("p_on_time")
    if p is None and severity is not None:
        p = 1.0 - severity
    return p is None or float(p) < threshold


def _stalled_passes(severity: float | None, data: dict, threshold: float) -> bool:
    silent_s = data.get("silent_s", severity)
    return silent_s is None or float(silent_s) >= threshold * 60.0


def _straggler_passes(severity: float | None, data: dict, threshold: float) -> bool:
    # The finish the straggler costs: the real P50 against the what-if P50.
    real, whatif = data.get("finish_p50"), data.get("whatif_finish_p50")
    if not isinstance(real, int | float) or not isinstance(whatif, int | float):
        return True  # no ETA to price it by: the flag itself is the news
    return float(real) - float(whatif) >= threshold * 3600.0


RULE_KINDS: tuple[RuleKind, ...] = (
    RuleKind("nan", "Loss became NaN/Inf", (K.NAN,), "critical"),
    RuleKind("spike", "Loss spike", (K.SPIKE,), "warning"),
    RuleKind(
        "divergence",
        "Divergence (rise, oscillation, regression)",
        tuple(k for k in Flag.DIVERGENCE_KINDS if k not in (K.NAN, K.SPIKE)),
        "critical",
    ),
    RuleKind(
        "stalled",
        "Run stalled or crashed",
        (K.STALLED,),
        "critical",
        0.0,
        "minutes of silence before alerting (0: as soon as the run is flagged)",
        _stalled_passes,
    ),
    RuleKind(
        "slip",
        "ETA slipped",
        (K.SLIP,),
        "warning",
        3.0,
        "hours the P50 finish must have slipped",
        _slip_passes,
    ),
    RuleKind(
        "deadline",
        "Deadline at risk",
        (K.DEADLINE,),
        "critical",
        0.5,
        "alert when the chance of finishing by cutoff minus buffer is below this (0 to 1)",
        _deadline_passes,
    ),
    RuleKind(
        "straggler",
        "Straggler rank or host",
        (K.STRAGGLER,),
        "warning",
        0.0,
        "hours the finish would gain without the straggler (0: as soon as one is flagged)",
        _straggler_passes,
    ),
    RuleKind("gpu_unexplained", "GPU activity no run event explains", (K.GPU_UNEXPLAINED,)),
    RuleKind("hang", "GPUs busy but no progress (hang)", (K.HANG,), "critical"),
    RuleKind("finished", "Run finished", ("finished",), "info"),
    RuleKind("failed", "Run failed or crashed", ("failed", "crashed"), "critical"),
)
BY_KEY = {k.key: k for k in RULE_KINDS}
BY_SOURCE = {source: k for k in RULE_KINDS for source in k.sources}


def rule_kind_for(source: str) -> RuleKind | None:
    return BY_SOURCE.get(source)
