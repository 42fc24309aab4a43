"""`python -m bench.evaluate.odds_bound DIR [--seed N] [--json]`: how well calibrated any P(on
time) built from Runcast's median can be when it gives every run of a cut-off the same shape.

The odds goal of issue 23 asks for an expected calibration error <= 0.05 from 25% on. This
replays the forecasts of `bench.evaluate` (same cut-offs, timing kinds and cutoffs around the
real finish) and replaces Runcast's P(on time) by the empirical distribution of
log(actual / P50) of that cut-off: with hindsight on every run of the set (the best any
one-shape-per-cut-off calibration could do on it), and cross-fitted (half A's distribution
scores half B and the other way round, the split of bench.evaluate.calibrate), which is what a
calibration table shipped in advance would give.

When even the hindsight figure misses the goal, no recalibration of the spread meets it: the
misses come from which runs fall in the tail (a later batch-size stage, a slowdown), which a
shape shared by all runs cannot say; only a forecast that tells those runs apart in advance can.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from bench.evaluate.eta_eval import CUTOFFS, KINDS, score_kinds
from bench.evaluate.odds import (
    U_SPREAD,
    OddsCase,
    brier,
    ece,
    exceedance,
    family_weights,
    outcomes,
)
from curveset import load_runs


def _ecdf(train: np.ndarray, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Weighted share of `train` at or below each x."""
    order = np.argsort(train)
    values, cum = train[order], np.cumsum(weights[order]) / weights.sum()
    idx = np.searchsorted(values, x, side="right")
    return np.where(idx > 0, cum[np.maximum(idx - 1, 0)], 0.0)


def _quantile(train: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(train)
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(train[order][min(int(np.searchsorted(cum, q)), train.size - 1)])


def bound(cases: list[OddsCase]) -> dict[str, dict[str, float]]:
    """ECE, Brier and P90 exceedance of the empirical-shape P(on time), with hindsight and
    cross-fitted, on one cut-off's cases."""
    fams = [c.family for c in cases]
    w = family_weights(fams)
    half = np.array([c.half for c in cases])
    p50 = np.array([c.p50 for c in cases])
    actual = np.array([c.actual for c in cases])
    errors = np.log(actual / p50)
    x = np.log(np.outer(actual, 1.0 + np.array(U_SPREAD)) / p50[:, None])
    y = np.tile(outcomes(), (len(cases), 1))
    out: dict[str, dict[str, float]] = {}
    for mode in ("hindsight", "cross_fitted"):
        p = np.zeros_like(x)
        p90 = np.zeros(len(cases))
        for h in ("A", "B"):
            target = half == h
            train = np.ones(len(cases), dtype=bool) if mode == "hindsight" else ~target
            if not train.any() or not target.any():
                train = np.ones(len(cases), dtype=bool)  # one half empty: in sample
            wt = family_weights([f for f, keep in zip(fams, train, strict=True) if keep])
            p[target] = _ecdf(errors[train], wt, x[target])
            p90[target] = p50[target] * math.exp(_quantile(errors[train], wt, 0.9))
        out[mode] = {
            "p_on_time_ece": round(ece(p, y, w), 4),
            "p_on_time_brier": round(brier(p, y, w), 4),
            "p90_exceedance": round(exceedance(actual, p90, w), 4),
        }
    out["errors"] = {
        f"q{round(q * 100)}": round(_quantile(errors, w, q), 4) for q in (0.1, 0.5, 0.9)
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.evaluate.odds_bound", description=__doc__
    )
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)
    scored = score_kinds(load_runs(args.directory), args.seed).kinds
    result: dict[str, dict] = {}
    print(
        f"{'kind':<10}{'cut':>5}  {'log(actual/P50) q10/50/90':>27}  hindsight ece/brier/p90x"
        "   A<->B ece/brier/p90x"
    )
    for kind in KINDS:
        cases = [sc.odds for sc in scored[kind] if sc.odds is not None]
        for c in CUTOFFS:
            sel = [x for x in cases if x.cutoff == c and math.isfinite(x.p50) and x.p50 > 0]
            if not sel:
                continue
            b = bound(sel)
            result.setdefault(kind, {})[str(c)] = b
            e, hs, cf = b["errors"], b["hindsight"], b["cross_fitted"]
            print(
                f"{kind:<10}{c:>4}%  {e['q10']:+9.3f}{e['q50']:+9.3f}{e['q90']:+9.3f}  "
                + "".join(
                    f"{hs[k]:>8.3f}" for k in ("p_on_time_ece", "p_on_time_brier", "p90_exceedance")
                )
                + " "
                + "".join(
                    f"{cf[k]:>8.3f}" for k in ("p_on_time_ece", "p_on_time_brier", "p90_exceedance")
                )
            )
    if args.json:
        print(json.dumps({"odds_bound": result, "seed": args.seed}, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
