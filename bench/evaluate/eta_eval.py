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
* Each run is scored three times (KINDS): as logged, with interruptions at cluster rates
  (cluster_faults.py) and with today's stress faults (faults.py); every forecast is also asked
  the P(on time) of cutoffs around the real finish (odds.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from bench.evaluate.cluster_faults import cluster_rng, gpus_for, inject_cluster_faults
from bench.evaluate.faults import inject_faults, run_rng
from bench.evaluate.odds import U_SPREAD, OddsCase, summarise_odds
from bench.evaluate.split import half_of
from curveset import CurveRun, run_timeline
from forecasting.estimators.baselines import BASELINES
from forecasting.estimators.deadline import deadline_risk
from forecasting.estimators.eta import forecast_eta

CUTOFFS = (10, 25, 50, 75, 90)
METHODS = ("runcast", *BASELINES)
# The timing kinds scored: the runs as logged, with interruptions at the rates clusters report
# (cluster_faults.py), and today's stress model (faults.py; "faulted" in the JSON before).
KINDS = ("real", "realistic", "stress")
ODDS_KEYS = (
    "p_on_time_ece",
    "p_on_time_brier",
    "p_on_time_brier_baseline",
    "p_on_time_ece_baseline",
    "p90_exceedance",
    "p90_exceedance_baseline",
)


@dataclass
class Score:
    family: str
    cutoff: int
    ape: dict[str, float] = field(default_factory=dict)
    covered: bool = False
    odds: OddsCase | None = None


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
        # The P(on time) a lead would have read for cutoffs around the real finish.
        p_on_time = tuple(deadline_risk(eta, now + actual * (1.0 + u)).p_on_time for u in U_SPREAD)
        score.odds = OddsCase(
            family=family,
            half=half_of(family),
            cutoff=cutoff,
            actual=actual,
            p_on_time=p_on_time,
            p90=eta.wall_p90,
            p10=eta.wall_p10,
            p50=eta.wall_p50,
            points={name: float(pred) for name, pred in preds.items()},  # type: ignore[arg-type]
        )
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
        part = [sc for sc in scores if half_of(sc.family) == half]
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


def _odds_table(title: str, odds: dict[str, dict]) -> str:
    head = f"{'':<28}" + "".join(f"{c:>8}%" for c in CUTOFFS)
    lines = [title, head]
    for key in ODDS_KEYS:
        for part in ("all", "A", "B"):
            row = odds.get(key, {}).get(part, {})
            label = key if part == "all" else f"  half {part}"
            lines.append(f"{label:<28}" + "".join(_cell(row.get(str(c))) for c in CUTOFFS))
    names = odds.get("baseline", {})
    # Names cut to 8 characters, so neighbouring columns stay apart.
    lines.append(f"{'baseline':<28}" + "".join(f" {names.get(str(c), '-'):>8.8}" for c in CUTOFFS))
    return "\n".join(lines)


def _by_kind(odds: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """{kind: {figure: {part: {cut-off: v}}}} -> {figure: {kind: {cut-off: v}}} for all families
    and {figure + "_half": {kind: {half: {cut-off: v}}}}."""
    out: dict[str, dict] = {}
    for kind, figures in odds.items():
        for key in ODDS_KEYS:
            parts = figures.get(key, {})
            out.setdefault(key, {})[kind] = parts.get("all", {})
            out.setdefault(f"{key}_half", {})[kind] = {h: parts.get(h, {}) for h in ("A", "B")}
        out.setdefault("p_on_time_baseline", {})[kind] = {
            "method": figures.get("baseline", {}),
            "sigma": figures.get("baseline_sigma", {}),
        }
    return out


@dataclass
class Scored:
    """Every (run, cut-off) score of each timing kind, and what the cluster model injected."""

    kinds: dict[str, list[Score]]
    timed: int = 0
    interruptions: int = 0
    interrupted_runs: int = 0


def score_kinds(runs: list[CurveRun], seed: int) -> Scored:
    out = Scored(kinds={kind: [] for kind in KINDS})
    for run in runs:
        tl = run_timeline(run)
        if tl is None:
            continue
        out.timed += 1
        steps, times = tl
        clean = _score_run(run.family, steps, times)
        out.kinds["real"].extend(clean)
        cs, ct, log = inject_cluster_faults(
            steps, times, gpus_for(run.file), cluster_rng(seed, run.file)
        )
        out.interruptions += log.interruptions
        out.interrupted_runs += log.interruptions > 0
        # The forecast is deterministic: a run the cluster model left alone scores as real.
        untouched = log.interruptions == 0 and log.slowdown == 1.0
        out.kinds["realistic"].extend(clean if untouched else _score_run(run.family, cs, ct))
        fs, ft, _ = inject_faults(steps, times, run_rng(seed, run.file))
        out.kinds["stress"].extend(_score_run(run.family, fs, ft))
    return out


def evaluate_eta(runs: list[CurveRun], seed: int) -> tuple[dict, str]:
    got = score_kinds(runs, seed)
    scored, timed = got.kinds, got.timed
    interruptions, faulted_runs = got.interruptions, got.interrupted_runs
    summary = {kind: summarise(scored[kind]) for kind in KINDS}
    odds = {
        kind: summarise_odds([sc.odds for sc in scored[kind] if sc.odds is not None], CUTOFFS)
        for kind in KINDS
    }
    real = summary["real"]
    keys = ("eta_ape_median", "eta_ape_p90", "eta_cover80", "eta_cover80_half")
    fields = {
        "eta_ape_median": real["eta_ape_median"],
        "eta_ape_p90": real["eta_ape_p90"],
        "eta_cover80": real["eta_cover80"],
        "eta_cover80_half": real["eta_cover80_half"],
        "eta_runs_timed": timed,
        "eta_families": real["families"],
        # Today's fault model, kept under its old key: the stress column.
        "faulted": {k: summary["stress"][k] for k in keys},
        "realistic": {k: summary["realistic"][k] for k in keys},
        "realistic_interruptions": interruptions,
        "realistic_runs_interrupted": faulted_runs,
        "p_on_time_u": list(U_SPREAD),
        **_by_kind(odds),
    }
    text = "\n\n".join(
        (
            _table(f"ETA on real timings ({timed} timed runs)", real),
            _table(
                f"ETA with cluster-rate faults (seed {seed}: {interruptions} interruptions"
                f" in {faulted_runs} runs, slowdowns as in stress)",
                summary["realistic"],
            ),
            _table(f"ETA with stress faults (today's model, seed {seed})", summary["stress"]),
            *(
                _odds_table(
                    f"Deadline odds, {kind} timings (cutoffs at the real finish x (1 + u),"
                    f" u in {list(U_SPREAD)})",
                    odds[kind],
                )
                for kind in KINDS
            ),
        )
    )
    return fields, text
