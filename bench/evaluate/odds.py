"""Deadline odds scored as odds: the P(on time) a lead would have read, against what happened.

For each (run, cut-off) of `bench.evaluate`, cutoffs are placed around the real finish: the time
actually left x (1 + u) for each u in U_SPREAD, as many before the finish as after it, so the
outcome is "on time" exactly when u > 0. Each is scored with the P(on time) Runcast shows
(`deadline.deadline_risk` on the forecast made at the cut-off):

* Brier score: the mean of (p - outcome)^2; lower is better, 0.25 is a coin.
* ECE: expected calibration error over ECE_BINS equal-width bins of p; the weighted mean of
  |mean p - share on time| per bin.
* P90 exceedance: the share of (run, cut-off) outcomes after the forecast's P90 (nominal 10%).

The baseline puts a log-normal of one fixed width around the best point baseline (the
progress-bar ETA with the lowest median error at that cut-off and timing kind, chosen with
hindsight, which favours the baseline). Its width is the one with the lowest Brier score on the
other half of the families (half A's width scores half B and the other way round), so every
baseline figure is out of sample, as Runcast's are.

Every figure weights families equally (each family's (run, cut-off) pairs share one unit of
weight), as the rest of bench.evaluate does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtr

# Cutoffs at 1%, 2%, ... 40% before and after the real finish: the close calls a lead asks
# about and the clear ones. Fixed before any figure was seen; the figures depend on it (a
# spread of only clear calls makes any sharp forecaster look calibrated), so it is printed.
U_SPREAD = (-0.4, -0.2, -0.1, -0.05, -0.02, -0.01, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4)
ECE_BINS = 10
P90_NOMINAL = 0.10
BASELINE_SIGMAS = tuple(float(x) for x in np.geomspace(0.002, 2.0, 61))


@dataclass
class OddsCase:
    """One (run, cut-off): what was left, Runcast's P(on time) per u and P90, the baselines."""

    family: str
    half: str  # "A" or "B" (bench.evaluate.split.half_of)
    cutoff: int
    actual: float  # seconds actually left
    p_on_time: tuple[float, ...]  # Runcast's, one per U_SPREAD
    p90: float  # Runcast's wall P90 of the time left
    p10: float = math.nan  # and its P10 and P50, kept for the bound (bench.evaluate.odds_bound)
    p50: float = math.nan
    points: dict[str, float] = field(default_factory=dict)  # baseline point forecasts


def outcomes() -> np.ndarray:
    return np.array([1.0 if u > 0 else 0.0 for u in U_SPREAD])


def family_weights(families: Sequence[str]) -> np.ndarray:
    counts: dict[str, int] = {}
    for fam in families:
        counts[fam] = counts.get(fam, 0) + 1
    return np.array([1.0 / counts[f] for f in families], dtype=float)


def brier(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    p, y, w = _flat(p, y, w)
    return float(np.sum(w * (p - y) ** 2) / np.sum(w))


def ece(p: np.ndarray, y: np.ndarray, w: np.ndarray, bins: int = ECE_BINS) -> float:
    """Weighted share in each bin times |mean p - mean outcome| there, summed; p = 1.0 falls in
    the top bin."""
    p, y, w = _flat(p, y, w)
    idx = np.minimum((p * bins).astype(int), bins - 1)
    total = float(np.sum(w))
    out = 0.0
    for b in range(bins):
        sel = idx == b
        wb = float(np.sum(w[sel]))
        if wb > 0:
            out += wb / total * abs(float(np.sum(w[sel] * p[sel]) - np.sum(w[sel] * y[sel])) / wb)
    return out


def exceedance(actual: np.ndarray, p90: np.ndarray, w: np.ndarray) -> float:
    """Weighted share of outcomes after the P90."""
    a, q, w = _flat(actual, p90, w)
    return float(np.sum(w * (a > q)) / np.sum(w))


def _flat(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...]:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    w = np.broadcast_to(np.asarray(w, dtype=float).reshape(-1, *([1] * (a.ndim - 1))), a.shape)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("nothing to score")
    return a.ravel(), b.ravel(), w.ravel()


def lognormal_p(point: np.ndarray, budget: np.ndarray, sigma: float) -> np.ndarray:
    """P(time left <= budget) under a log-normal of log-sd `sigma` with median `point`."""
    z = np.log(np.maximum(budget, 1e-12) / np.maximum(point, 1e-12)) / sigma
    return np.asarray(ndtr(z), dtype=float)


def best_baseline(cases: Iterable[OddsCase]) -> str:
    """The point baseline with the lowest family-median relative error over `cases`."""
    by_name: dict[str, dict[str, list[float]]] = {}
    for c in cases:
        for name, pred in c.points.items():
            by_name.setdefault(name, {}).setdefault(c.family, []).append(
                abs(pred - c.actual) / c.actual
            )
    errors = {
        name: float(np.median([np.mean(v) for v in fams.values()]))
        for name, fams in by_name.items()
    }
    return min(sorted(errors), key=lambda n: errors[n])


def _budgets(cases: Sequence[OddsCase]) -> np.ndarray:
    return np.array([[c.actual * (1.0 + u) for u in U_SPREAD] for c in cases])


def fit_sigma(cases: Sequence[OddsCase], name: str) -> float:
    """The fixed log width with the lowest Brier score on `cases` for baseline `name`."""
    point = np.array([[c.points[name]] for c in cases])
    budgets, y = _budgets(cases), np.tile(outcomes(), (len(cases), 1))
    w = family_weights([c.family for c in cases])
    scores = [brier(lognormal_p(point, budgets, s), y, w) for s in BASELINE_SIGMAS]
    return BASELINE_SIGMAS[int(np.argmin(scores))]


def score(cases: Sequence[OddsCase], sigmas: dict[str, float], name: str) -> dict[str, float]:
    """Runcast's ECE, Brier and P90 exceedance on `cases`, and the baseline's, whose width for a
    case of half H is sigmas[H] (fitted on the other half)."""
    w = family_weights([c.family for c in cases])
    y = np.tile(outcomes(), (len(cases), 1))
    p = np.array([c.p_on_time for c in cases])
    budgets = _budgets(cases)
    point = np.array([[c.points[name]] for c in cases])
    sig = np.array([[sigmas[c.half]] for c in cases])
    base = np.array(
        [lognormal_p(point[i], budgets[i], float(sig[i, 0])) for i in range(len(cases))]
    )
    actual = np.array([c.actual for c in cases])
    z90 = 1.2815515655446004
    return {
        "p_on_time_ece": ece(p, y, w),
        "p_on_time_brier": brier(p, y, w),
        "p_on_time_brier_baseline": brier(base, y, w),
        "p_on_time_ece_baseline": ece(base, y, w),
        "p90_exceedance": exceedance(actual, np.array([c.p90 for c in cases]), w),
        "p90_exceedance_baseline": exceedance(actual, point[:, 0] * np.exp(z90 * sig[:, 0]), w),
    }


def summarise_odds(cases: list[OddsCase], cutoffs: Sequence[int]) -> dict[str, dict]:
    """Per cut-off: every figure on all families and on each half, the baseline used and its
    widths. Keys are the figure names, then "all" / "A" / "B", then the cut-off."""
    out: dict[str, dict] = {}
    for c in cutoffs:
        sel = [x for x in cases if x.cutoff == c]
        if not sel:
            continue
        name = best_baseline(sel)
        halves = {h: [x for x in sel if x.half == h] for h in ("A", "B")}
        if not all(halves.values()):
            # One half is empty (a tiny set): the width is fitted in sample, and said so.
            sigma = fit_sigma(sel, name)
            sigmas = {"A": sigma, "B": sigma}
        else:
            sigmas = {"A": fit_sigma(halves["B"], name), "B": fit_sigma(halves["A"], name)}
        parts = {"all": sel, **{h: v for h, v in halves.items() if v}}
        for part, rows in parts.items():
            for key, value in score(rows, sigmas, name).items():
                out.setdefault(key, {}).setdefault(part, {})[str(c)] = _round(value)
        out.setdefault("baseline", {})[str(c)] = name
        out.setdefault("baseline_sigma", {})[str(c)] = {h: _round(s) for h, s in sigmas.items()}
        out.setdefault("cases", {})[str(c)] = len(sel)
    return out


def _round(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None
