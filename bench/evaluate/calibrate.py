"""`python -m bench.evaluate.calibrate DIR`: fit the interval calibration on half the families.

Split-conformal, by family: families with `zlib.crc32(family) % 2 == 0` (half A) fit the factor,
the others (half B) are held out and only scored. At each cut-off (10/25/50/75/90%) a forecast's
score is how far the truth lies from the median in units of the uncalibrated half-width on its
side (ETA: log remaining compute; loss: final loss), so it is covered when |score| <= factor.
The factor is the smallest one that covers 80% of half A with every family weighted equally,
placed at the median share of the run done at that cut-off; `forecasting/estimators/
calibration.py` interpolates between those knots. The output is the two tables to paste there,
the coverage they give on held-out half B, and the same fit the other way round (on B, scored
on A) as a check of how far a table depends on the families it saw.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from bench.evaluate.eta_eval import CUTOFFS, cutoff_points
from bench.evaluate.loss_eval import CUTOFFS as LOSS_CUTOFFS
from bench.evaluate.loss_eval import loss_series
from bench.evaluate.split import half_of
from curveset import CurveRun, load_runs, run_timeline
from forecasting.estimators.calibration import scale_at
from forecasting.estimators.eta import forecast_eta
from forecasting.estimators.loss import forecast_loss, smoothed_level

TARGET = 0.8
Row = tuple[str, int, float, float]  # family, cut-off %, share of the run done, raw score


def _side(truth: float, lo: float, mid: float, hi: float) -> float:
    width = hi - mid if truth >= mid else mid - lo
    return abs(truth - mid) / width if width > 0 else (0.0 if truth == mid else math.inf)


def eta_rows(run: CurveRun) -> list[Row]:
    tl = run_timeline(run)
    if tl is None:
        return []
    steps, times = tl
    total = float(steps[-1])
    rows: list[Row] = []
    for cutoff, k, now, actual in cutoff_points(steps, times):
        eta = forecast_eta(steps[:k], times[:k], total, now=now)
        if eta is None or eta.compute_p50 <= 0:
            continue
        logs = [math.log(max(x, 1e-12)) for x in (eta.compute_p10, eta.compute_p50)]
        logs.append(math.log(max(eta.compute_p90, 1e-12)))
        score = _side(math.log(actual), *logs) * eta.interval_scale  # undo the current factor
        rows.append((run.family, cutoff, eta.current_step / total, score))
    return rows


def loss_rows(run: CurveRun) -> list[Row]:
    series = loss_series(run)
    if series is None:
        return []
    _, s, v = series
    truth, end = smoothed_level(s, v), float(s[-1])
    rows: list[Row] = []
    for q in LOSS_CUTOFFS:
        keep = s <= s[0] + q * (s[-1] - s[0])
        fc = forecast_loss(s[keep], v[keep], total_steps=end)
        if fc is None:
            continue
        half = (fc.p90 - fc.p50) / fc.interval_scale
        miss = truth - fc.p50
        if miss < 0:  # the lower side also allows the anneal drop, which is not scaled
            miss = math.sqrt(max(0.0, miss * miss - fc.anneal_drop**2))
        score = miss / half if half > 0 else (0.0 if miss == 0 else math.inf)
        rows.append((run.family, round(q * 100), float(s[keep][-1]) / end, score))
    return rows


def _weights(rows: list[Row]) -> np.ndarray:
    counts: dict[str, int] = {}
    for fam, *_ in rows:
        counts[fam] = counts.get(fam, 0) + 1
    return np.array([1.0 / counts[fam] for fam, *_ in rows])


def fit(rows: list[Row], cutoffs: tuple[int, ...]) -> tuple[tuple[float, float], ...]:
    """Knots (median share done, factor covering TARGET of the families) per cut-off."""
    knots: list[tuple[float, float]] = []
    for c in cutoffs:
        sel = [r for r in rows if r[1] == c]
        if not sel:
            continue
        scores = np.array([r[3] for r in sel])
        w = _weights(sel)
        order = np.argsort(scores)
        covered = np.cumsum(w[order]) / w.sum()
        factor = float(scores[order][np.searchsorted(covered, TARGET - 1e-9)])
        share = float(np.median([r[2] for r in sel]))
        if knots and share <= knots[-1][0]:
            share = knots[-1][0] + 1e-6
        knots.append((round(share, 4), round(factor, 3)))
    return tuple(knots)


def coverage(rows: list[Row], table: tuple[tuple[float, float], ...]) -> dict[str, float | None]:
    """Family-mean coverage per cut-off with the factors of `table`."""
    out: dict[str, float | None] = {}
    for c in sorted({r[1] for r in rows}):
        by_fam: dict[str, list[float]] = {}
        for fam, cut, share, score in rows:
            if cut == c:
                by_fam.setdefault(fam, []).append(float(score <= scale_at(share, table)))
        out[str(c)] = round(float(np.mean([np.mean(x) for x in by_fam.values()])), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.evaluate.calibrate", description=__doc__)
    parser.add_argument("directory")
    parser.add_argument("--only", choices=("eta", "loss"), help="fit one table only")
    args = parser.parse_args(argv)
    runs = load_runs(args.directory)
    for name, collect, cutoffs in (
        ("ETA_SCALE", eta_rows, CUTOFFS),
        ("LOSS_SCALE", loss_rows, tuple(round(q * 100) for q in LOSS_CUTOFFS)),
    ):
        if args.only and not name.lower().startswith(args.only):
            continue
        rows = [r for run in runs for r in collect(run)]
        a = [r for r in rows if half_of(r[0]) == "A"]
        b = [r for r in rows if half_of(r[0]) == "B"]
        table = fit(a, cutoffs)
        print(f"{name}: tuple[tuple[float, float], ...] = {table}")
        print(f"  uncalibrated  A {coverage(a, ())}  B {coverage(b, ())}")
        print(f"  fitted on A:  A {coverage(a, table)}  B (held out) {coverage(b, table)}")
        # Cross-fitting the other way shows how much a table depends on which families it saw:
        # factors that differ a lot between the halves are fitting clusters, not the method.
        other = fit(b, cutoffs)
        print(f"  fitted on B:  {other}  A (held out) {coverage(a, other)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
