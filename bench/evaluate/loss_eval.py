"""Replay the loss forecast on real curves with no look-ahead and score the final-loss error.

Protocol (docs/forecasting-loss.md has the reasoning):
- Series: val_loss when a run logs at least LOSS_EVAL_MIN_VAL points of it (it is what a final-loss
  forecast is for, and far less noisy), else train_loss with LOSS_EVAL_MIN_TRAIN points, else the
  val_loss it has.
- Cut-offs at 10/25/50/75/90% of the series' step span; the forecaster sees only points up to the
  cut-off and is asked for the loss at the series' last logged step (its actual end: many runs
  were stopped early by a wall-clock cap, so the planned end cannot be scored).
- Truth: the smoothed loss at the last step of the full series, by the same robust local-line
  smoother every method uses for its own "current level", so batch noise in the last logged
  point is not scored as forecast error.
- Methods: runcast (forecast_loss), last_smoothed (current smoothed level), power_law (plain
  unweighted a + b*s^-c fit, no shrinkage). Scores: mean within family, then across families.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from curveset import CurveRun
from forecasting.estimators.loss import (
    fit_power_law,
    forecast_loss,
    prepare,
    smoothed_level,
)
from forecasting.estimators.smoothing import clean_series

CUTOFFS = (0.10, 0.25, 0.50, 0.75, 0.90)
METHODS = ("runcast", "last_smoothed", "power_law")
LOSS_EVAL_MIN_VAL = 8  # val loss is what a final-loss forecast is for, and it is far less noisy
LOSS_EVAL_MIN_TRAIN = 20  # with too few val points, a train-loss series this long is used instead
LOSS_EVAL_MIN_POINTS = 5  # a series needs a few points to have a beginning and an end


def loss_series(run: CurveRun) -> tuple[str, np.ndarray, np.ndarray] | None:
    steps = run.column("step")
    order = (
        ("val_loss", LOSS_EVAL_MIN_VAL),
        ("train_loss", LOSS_EVAL_MIN_TRAIN),
        ("val_loss", LOSS_EVAL_MIN_POINTS),
    )
    for name, minimum in order:
        s, v = clean_series(steps, run.column(name))
        if len(s) >= minimum:
            return name, s, v
    return None


def _forecasts(s: np.ndarray, v: np.ndarray, end: float) -> dict[str, tuple[float, float, float]]:
    """{method: (p10, p50, p90)} from the prefix (s, v)."""
    out: dict[str, tuple[float, float, float]] = {}
    fc = forecast_loss(s, v, total_steps=end)
    if fc is None:
        return out
    out["runcast"] = (fc.p10, fc.p50, fc.p90)
    level = fc.smoothed_last
    out["last_smoothed"] = (level, level, level)
    ds, dv = prepare(s, v)
    pl = fit_power_law(ds, dv, recency_weighted=False)
    pl_end = float(pl.predict(np.array([end]))[0]) if pl is not None else level
    out["power_law"] = (pl_end, pl_end, pl_end)
    return out


def score_run(run: CurveRun) -> list[dict[str, object]]:
    """One row per cut-off with each method's absolute error and runcast's interval hit."""
    series = loss_series(run)
    if series is None:
        return []
    name, s, v = series
    truth = smoothed_level(s, v)
    end = float(s[-1])
    rows: list[dict[str, object]] = []
    for q in CUTOFFS:
        cut = s[0] + q * (s[-1] - s[0])
        keep = s <= cut
        fcs = _forecasts(s[keep], v[keep], end)
        if not fcs:
            continue
        row: dict[str, object] = {"file": run.file, "family": run.family, "series": name}
        row["cutoff"] = q
        row["truth"] = truth
        for method, (_, p50, _) in fcs.items():
            row[method] = abs(p50 - truth)
            row[f"{method}_p50"] = p50
        lo, _, hi = fcs["runcast"]
        row["cover80"] = float(lo <= truth <= hi)
        rows.append(row)
    return rows


def _family_mean(rows: list[dict[str, object]], key: str, cutoff: float) -> float | None:
    by_family: dict[str, list[float]] = {}
    for r in rows:
        if r["cutoff"] == cutoff and key in r:
            by_family.setdefault(str(r["family"]), []).append(float(r[key]))  # type: ignore[arg-type]
    if not by_family:
        return None
    return float(np.mean([np.mean(x) for x in by_family.values()]))


def _key(q: float) -> str:
    # The JSON names cut-offs as percentages ("10" ... "90"), as the ETA figures do.
    return f"{round(q * 100)}"


def evaluate_loss(runs: list[CurveRun], seed: int) -> tuple[dict, str]:
    """Final-loss forecast errors by cut-off. `seed` is unused: the replay is deterministic."""
    del seed
    rows = [row for run in runs for row in score_run(run)]
    mae = {m: {_key(q): _family_mean(rows, m, q) for q in CUTOFFS} for m in METHODS}
    cover = {_key(q): _family_mean(rows, "cover80", q) for q in CUTOFFS}
    # Half B (crc32(family) odd) is held out of the interval calibration fitted on half A.
    halves = {
        half: {
            _key(q): _family_mean(
                [
                    r
                    for r in rows
                    if (zlib.crc32(str(r["family"]).encode()) % 2 == 0) == (half == "A")
                ],
                "cover80",
                q,
            )
            for q in CUTOFFS
        }
        for half in ("A", "B")
    }
    improvement = {
        _key(q): _improvement(
            mae["runcast"][_key(q)], mae["last_smoothed"][_key(q)], mae["power_law"][_key(q)]
        )
        for q in CUTOFFS
    }
    counts = {_key(q): sum(1 for r in rows if r["cutoff"] == q) for q in CUTOFFS}
    families = {_key(q): len({r["family"] for r in rows if r["cutoff"] == q}) for q in CUTOFFS}
    result = {
        "loss_mae": mae,
        "loss_cover80": cover,
        "loss_cover80_half": halves,
        "loss_improvement_vs_best_baseline": improvement,
        "loss_runs_scored": counts,
        "loss_families_scored": families,
    }
    return result, _table(mae, cover, improvement, counts, families, halves)


def _improvement(ours: float | None, a: float | None, b: float | None) -> float | None:
    """Relative error reduction against the better of the two baselines (0.2 = 20% lower)."""
    if ours is None or a is None or b is None:
        return None
    best = min(a, b)
    return None if best <= 0 or math.isnan(best) else 1.0 - ours / best


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.0f}%" if pct else f"{x:.4f}"


def _table(
    mae: dict[str, dict[str, float | None]],
    cover: dict[str, float | None],
    improvement: dict[str, float | None],
    counts: dict[str, int],
    families: dict[str, int],
    halves: dict[str, dict[str, float | None]],
) -> str:
    qs = [_key(q) for q in CUTOFFS]
    head = "final-loss MAE (family mean) | " + " | ".join(f"cut {q}%" for q in qs)
    lines = [head]
    for m in METHODS:
        lines.append(f"{m:28s} | " + " | ".join(f"{_fmt(mae[m][q]):>7s}" for q in qs))
    lines.append(
        f"{'runcast 80% coverage':28s} | " + " | ".join(f"{_fmt(cover[q], True):>7s}" for q in qs)
    )
    lines.append(
        f"{'  held-out half B':28s} | "
        + " | ".join(f"{_fmt(halves['B'][q], True):>7s}" for q in qs)
    )
    lines.append(
        f"{'gain vs best baseline':28s} | "
        + " | ".join(f"{_fmt(improvement[q], True):>7s}" for q in qs)
    )
    lines.append(
        f"{'runs / families scored':28s} | "
        + " | ".join(f"{counts[q]:>3d}/{families[q]:<3d}" for q in qs)
    )
    return "\n".join(lines)
