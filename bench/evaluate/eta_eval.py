"""Replay runs with no look-ahead and score Runcast's ETA against progress-bar baselines.

What is predicted, and why it is fair:

* Truth is the run's actual end: the clock at its last logged step. Every method is told that
  step as the total. Many runs were stopped early by a wall-clock cap, so scoring against the
  planned total would measure whether a method guesses the cap, not how well it forecasts pace;
  giving all methods the same (true) total isolates the pace and interruption forecasting.
* A forecast at cut-off c% uses only the points logged up to c% of the run's duration, and is
  made at the last of them (so "now" is a real log time for every method alike).
* Error is relative to the time that was still to go: |predicted - actual| / actual remaining.
  This is what a user reading the ETA experiences (a 2-minute error with 4 minutes left is 50%).
* Runs are grouped by `family` (near-identical seeds): the per-run errors are averaged within a
  family first, then the median and P90 are taken across families; coverage is the mean of the
  family means.
* Only (run, cut-off) pairs where every method gives a forecast count, so all methods are scored
  on the same questions.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from bench.evaluate.faults import inject_faults, run_rng
from curveset import CurveRun, run_timeline
from forecasting.estimators.baselines import BASELINES
from forecasting.estimators.eta import forecast_eta

CUTOFFS = (10, 25, 50, 75, 90)
METHODS = ("runcast", *BASELINES)


@dataclass
class Score:
    family: str
    cutoff: int
    ape: dict[str, float] = field(default_factory=dict)
    covered: bool = False


def cutoff_points(steps: np.ndarray, times: np.ndarray) -> Iterator[tuple[int, int, float, float]]:
    """(cut-off %, points seen, time of the last one, time actually left) for each cut-off
    that leaves something to forecast."""
    end_t, total, start = float(times[-1]), float(steps[-1]), float(times[0])
    for cutoff in CUTOFFS:
        k = int(np.searchsorted(times, start + cutoff / 100 * (end_t - start), side="right"))
        if k < 3:
            continue
        now = float(times[k - 1])
        actual = end_t - now
        if actual > 0 and total - float(steps[k - 1]) > 0:
            yield cutoff, k, now, actual


def _score_run(family: str, steps: np.ndarray, times: np.ndarray) -> list[Score]:
    total = float(steps[-1])
    scores: list[Score] = []
    for cutoff, k, now, actual in cutoff_points(steps, times):
        s, t = steps[:k], times[:k]
        eta = forecast_eta(s, t, total, now=now)
        preds = {name: fn(s, t, total) for name, fn in BASELINES.items()}
        if eta is None or any(p is None for p in preds.values()):
            continue
        score = Score(family=family, cutoff=cutoff)
        score.ape["runcast"] = abs(eta.wall_p50 - actual) / actual
        for name, pred in preds.items():
            score.ape[name] = abs(float(pred) - actual) / actual  # type: ignore[arg-type]
        score.covered = eta.wall_p10 <= actual <= eta.wall_p90
        scores.append(score)
    return scores


def _family_means(scores: list[Score], cutoff: int, value: str) -> np.ndarray:
    by_family: dict[str, list[float]] = {}
    for sc in scores:
        if sc.cutoff != cutoff:
            continue
        v = float(sc.covered) if value == "cover" else sc.ape[value]
        by_family.setdefault(sc.family, []).append(v)
    return np.array([float(np.mean(v)) for v in by_family.values()])


def _round(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def summarise(scores: list[Score]) -> dict[str, dict]:
    med: dict[str, dict[str, float | None]] = {m: {} for m in METHODS}
    p90: dict[str, dict[str, float | None]] = {m: {} for m in METHODS}
    cover: dict[str, float | None] = {}
    families: dict[str, int] = {}
    for c in CUTOFFS:
        key = str(c)
        for m in METHODS:
            fam = _family_means(scores, c, m)
            med[m][key] = _round(float(np.median(fam))) if fam.size else None
            p90[m][key] = _round(float(np.quantile(fam, 0.9))) if fam.size else None
        cov = _family_means(scores, c, "cover")
        cover[key] = _round(float(cov.mean())) if cov.size else None
        families[key] = int(cov.size)
    # Coverage of each half of the families (crc32(family) % 2: A even, B odd), the split used
    # to fit and hold out (bench.evaluate.calibrate).
    halves: dict[str, dict[str, float | None]] = {}
    for half in ("A", "B"):
        part = [sc for sc in scores if (zlib.crc32(sc.family.encode()) % 2 == 0) == (half == "A")]
        halves[half] = {}
        for c in CUTOFFS:
            cov = _family_means(part, c, "cover")
            halves[half][str(c)] = _round(float(cov.mean())) if cov.size else None
    return {
        "eta_ape_median": med,
        "eta_ape_p90": p90,
        "eta_cover80": cover,
        "eta_cover80_half": halves,
        "families": families,
    }


def _table(title: str, summary: dict[str, dict]) -> str:
    head = f"{'method':<16}" + "".join(f"{c:>8}%" for c in CUTOFFS)
    lines = [title, head]
    for label, key in (("APE median", "eta_ape_median"), ("APE P90", "eta_ape_p90")):
        lines.append(f"-- {label} (family-grouped, error / time remaining)")
        for m in METHODS:
            row = summary[key][m]
            lines.append(f"{m:<16}" + "".join(_cell(row[str(c)]) for c in CUTOFFS))
    cov = summary["eta_cover80"]
    lines.append(f"{'runcast cover80':<16}" + "".join(_cell(cov[str(c)]) for c in CUTOFFS))
    for half, row in summary["eta_cover80_half"].items():
        lines.append(f"{'  half ' + half:<16}" + "".join(_cell(row[str(c)]) for c in CUTOFFS))
    fams = summary["families"]
    lines.append(f"{'families':<16}" + "".join(f"{fams[str(c)]:>9}" for c in CUTOFFS))
    return "\n".join(lines)


def _cell(v: float | None) -> str:
    return f"{'-':>9}" if v is None else f"{v:>9.3f}"


def evaluate_eta(runs: list[CurveRun], seed: int) -> tuple[dict, str]:
    clean: list[Score] = []
    faulted: list[Score] = []
    timed = 0
    for run in runs:
        tl = run_timeline(run)
        if tl is None:
            continue
        timed += 1
        steps, times = tl
        clean.extend(_score_run(run.family, steps, times))
        fs, ft, _ = inject_faults(steps, times, run_rng(seed, run.file))
        faulted.extend(_score_run(run.family, fs, ft))
    real = summarise(clean)
    fault = summarise(faulted)
    fields = {
        "eta_ape_median": real["eta_ape_median"],
        "eta_ape_p90": real["eta_ape_p90"],
        "eta_cover80": real["eta_cover80"],
        "eta_cover80_half": real["eta_cover80_half"],
        "eta_runs_timed": timed,
        "eta_families": real["families"],
        "faulted": {
            k: fault[k]
            for k in ("eta_ape_median", "eta_ape_p90", "eta_cover80", "eta_cover80_half")
        },
    }
    text = "\n\n".join(
        (
            _table(f"ETA on real timings ({timed} timed runs)", real),
            _table(f"ETA with injected faults (seed {seed})", fault),
        )
    )
    return fields, text
