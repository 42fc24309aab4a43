"""Score divergence detection against injected spikes/NaNs and documented events on real curves.

Protocol (docs/forecasting-loss.md has the reasoning):
- Spikes: on every run with a dense loss series (>= SPIKE_EVAL_MIN_POINTS points), a copy gets
  spikes (x1.2-5, 1-50 steps, injection.py) away from the curve's natural spikes. All detectors
  are causal, so one pass over the whole copy equals a replay with no look-ahead.
- An alarm episode (alarms closer than EPISODE_GAP points) is a true positive when it touches an
  injected spike (up to MATCH_TOLERANCE points after it), ignored when it touches a natural spike
  of the clean curve (natural_mask: independent of every detector), otherwise a false alarm.
  Healthy points = points outside injections and natural spikes. F1 is per event.
- NaN: one copy per run with NaN/Inf from a random point; runcast is replayed by calling
  detect_divergence on the prefix that ends at the first bad value; delay in steps.
- Documented events: EVENTS.csv spike/explosion rows with loss data around them (recall only).
- Open flags on clean prefixes at the 10/25/50/75/90% cut-offs: how often detect_divergence
  reports something on an unmodified curve (natural spikes included), per kind.
Aggregation: counts pooled within a family, the family's rate, then the mean across families.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import pandas as pd

from bench.evaluate.injection import (
    NATURAL_EVENT_TYPES,
    inject_nan,
    inject_spikes,
    natural_mask,
    run_rng,
)
from curveset import CurveRun
from forecasting.estimators.divergence import KINDS, detect_divergence, spike_alarms
from forecasting.estimators.smoothing import clean_series

METHODS = ("runcast", "megatron", "llm_foundry")
CUTOFFS = (0.10, 0.25, 0.50, 0.75, 0.90)
SPIKE_COPIES = 3  # independent injected copies per run: more events, less luck in the score
SPIKE_EVAL_MIN_POINTS = 200  # sparser logs cannot show a 1-50 step spike at all
NAN_EVAL_MIN_POINTS = 5  # a NaN needs a few points before it to be "the first"
EPISODE_GAP = 20  # alarms closer than this (points) are one page, not several
MATCH_TOLERANCE = 3  # an alarm up to 3 points after a spike ends still belongs to it
AFTERMATH_POINTS = 10  # alarms this soon after a spike are its echo, not a separate false alarm
MEGATRON_FACTOR = 10.0  # Megatron-style rule: loss >= 10x max of the first 100 steps
MEGATRON_HISTORY_STEPS = 100
FOUNDRY_FACTOR = 2.0  # LLM Foundry-style rule: loss > 2x mean of the last 100 steps ...
FOUNDRY_WINDOW = 100
FOUNDRY_CONSECUTIVE = 5  # ... for 5 consecutive steps
DOCUMENTED_WINDOW_STEPS = 500  # a documented spike counts as caught within 500 steps of its step


# ----------------------------------------------------------------------------- baselines


def megatron_alarms(steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """loss >= 10x the max of the first 100 steps; non-finite loss is caught too, as Megatron's
    check_for_nan_in_loss_and_grad does by default."""
    first = values[steps < steps[0] + MEGATRON_HISTORY_STEPS]
    first = first[np.isfinite(first)]
    limit = MEGATRON_FACTOR * float(np.max(first)) if len(first) else np.inf
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(values) | (values >= limit)


def foundry_alarms(steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """loss > 2x its trailing 100-step mean for 5 consecutive steps (literal: NaN compares false,
    so a NaN is not caught by this rule)."""
    del steps
    ser = pd.Series(values)
    mean = ser.shift(1).rolling(FOUNDRY_WINDOW, min_periods=1).mean().to_numpy()
    with np.errstate(invalid="ignore"):
        above = (values > FOUNDRY_FACTOR * mean).astype(float)
    run = pd.Series(above).rolling(FOUNDRY_CONSECUTIVE, min_periods=FOUNDRY_CONSECUTIVE).sum()
    return run.to_numpy() >= FOUNDRY_CONSECUTIVE


DETECTORS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "runcast": spike_alarms,
    "megatron": megatron_alarms,
    "llm_foundry": foundry_alarms,
}


# ----------------------------------------------------------------------------- series


def loss_series(run: CurveRun, minimum: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The densest loss series (train first: it is logged every step where it exists)."""
    steps = run.column("step")
    for name in ("train_loss", "val_loss"):
        s, v = clean_series(steps, run.column(name))
        if len(s) >= minimum:
            return s, v
    return None


def _event_steps(run: CurveRun) -> list[float]:
    return [
        e.step
        for e in run.events
        if e.step is not None and any(k in e.event_type for k in NATURAL_EVENT_TYPES)
    ]


# ----------------------------------------------------------------------------- spikes


def _episodes(alarms: np.ndarray) -> list[tuple[int, int]]:
    idx = np.flatnonzero(alarms)
    if len(idx) == 0:
        return []
    cuts = np.flatnonzero(np.diff(idx) > EPISODE_GAP)
    starts = np.append(idx[0], idx[cuts + 1])
    ends = np.append(idx[cuts], idx[-1])
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _score_spikes(
    s: np.ndarray, alarms: np.ndarray, injections: list, natural: np.ndarray
) -> dict[str, object]:
    n = len(s)
    injected = np.zeros(n, dtype=bool)
    echo = np.zeros(n, dtype=bool)
    tp, delays = 0, []
    for inj in injections:
        hi = min(n, inj.end + MATCH_TOLERANCE + 1)
        injected[inj.start : inj.end + 1] = True
        echo[inj.start : min(n, inj.end + AFTERMATH_POINTS + 1)] = True
        hit = np.flatnonzero(alarms[inj.start : hi])
        if len(hit):
            tp += 1
            delays.append(float(s[inj.start + hit[0]] - inj.start_step))
    fp = 0
    for a, b in _episodes(alarms):
        if echo[a : b + 1].any() or natural[a : b + 1].any():
            continue
        fp += 1
    healthy = int(np.sum(~echo & ~natural))
    return {
        "tp": tp,
        "fn": len(injections) - tp,
        "fp": fp,
        "healthy": healthy,
        "delay_sum": float(np.sum(delays)),
        "delay_max": float(np.max(delays)) if delays else 0.0,
        "detected": len(delays),
    }


def _clean_episodes(s: np.ndarray, v: np.ndarray, method: str) -> int:
    return len(_episodes(DETECTORS[method](s, v)))


def spike_rows(runs: list[CurveRun], seed: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for run in runs:
        series = loss_series(run, SPIKE_EVAL_MIN_POINTS)
        if series is None:
            continue
        s, v = series
        natural = natural_mask(s, v, _event_steps(run))
        rng = run_rng(seed, run.file)
        clean = {method: _clean_episodes(s, v, method) for method in DETECTORS}
        for copy in range(SPIKE_COPIES):
            injected, injections = inject_spikes(s, v, natural, rng)
            if not injections:
                continue
            for method, detector in DETECTORS.items():
                row = _score_spikes(s, detector(s, injected), injections, natural)
                row.update(
                    family=run.family,
                    file=run.file,
                    method=method,
                    # the clean curve is counted once per run, not once per copy
                    points=len(s) if copy == 0 else 0,
                    clean_episodes=clean[method] if copy == 0 else 0,
                )
                rows.append(row)
    return rows


# ----------------------------------------------------------------------------- NaN


def _first_alarm_from(alarms: np.ndarray, start: int) -> int | None:
    hit = np.flatnonzero(alarms[start:])
    return start + int(hit[0]) if len(hit) else None


def _runcast_nan_delay(s: np.ndarray, v: np.ndarray, start: int) -> float | None:
    """Replay: call detect_divergence on growing prefixes from the first bad value on."""
    for i in range(start, min(len(s), start + 3)):
        flags = detect_divergence(s[: i + 1], v[: i + 1])
        if any(f.kind == "nan" for f in flags):
            return float(s[i] - s[start])
    return None


def nan_rows(runs: list[CurveRun], seed: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for run in runs:
        steps = run.column("step")
        series = loss_series(run, NAN_EVAL_MIN_POINTS)
        if series is None:
            continue
        s, v = series
        rng = run_rng(seed + 1, run.file)
        bad, inj = inject_nan(s, v, rng)
        false_before = any(
            f.kind == "nan" for f in detect_divergence(s[: inj.start], v[: inj.start])
        )
        delays: dict[str, float | None] = {"runcast": _runcast_nan_delay(s, bad, inj.start)}
        for method in ("megatron", "llm_foundry"):
            first = _first_alarm_from(DETECTORS[method](s, bad), inj.start)
            delays[method] = float(s[first] - s[inj.start]) if first is not None else None
        for method, delay in delays.items():
            rows.append(
                {
                    "family": run.family,
                    "method": method,
                    "caught": delay is not None,
                    "delay": delay,
                    "false_before": false_before if method == "runcast" else False,
                }
            )
        del steps
    return rows


# ----------------------------------------------------------------------------- documented


def documented_rows(runs: list[CurveRun]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for run in runs:
        events = [
            e
            for e in run.events
            if e.origin == "documented"
            and e.step is not None
            and ("spike" in e.event_type or "explosion" in e.event_type)
        ]
        series = loss_series(run, NAN_EVAL_MIN_POINTS)
        if not events or series is None:
            continue
        s, v = series
        for e in events:
            near = (s >= float(e.step or 0)) & (s <= float(e.step or 0) + DOCUMENTED_WINDOW_STEPS)
            if not near.any():
                continue
            for method, detector in DETECTORS.items():
                hits = np.flatnonzero(detector(s, v) & near)
                rows.append(
                    {
                        "family": run.family,
                        "method": method,
                        "caught": len(hits) > 0,
                        "delay": float(s[hits[0]] - float(e.step or 0)) if len(hits) else None,
                    }
                )
    return rows


# ----------------------------------------------------------------------------- clean prefixes


def open_flag_rows(runs: list[CurveRun]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for run in runs:
        series = loss_series(run, NAN_EVAL_MIN_POINTS)
        if series is None:
            continue
        s, v = series
        for q in CUTOFFS:
            keep = s <= s[0] + q * (s[-1] - s[0])
            kinds = {f.kind for f in detect_divergence(s[keep], v[keep])}
            row: dict[str, object] = {"family": run.family, "cutoff": q}
            for kind in KINDS:
                row[kind] = float(kind in kinds)
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- summary


def _family_mean(values_by_family: dict[str, float]) -> float | None:
    vals = [v for v in values_by_family.values() if v is not None and np.isfinite(v)]
    return float(np.mean(vals)) if vals else None


def _spike_summary(rows: list[dict[str, object]]) -> dict[str, dict[str, float | None]]:
    df = pd.DataFrame(rows)
    out: dict[str, dict[str, float | None]] = {
        k: {}
        for k in (
            "spike_f1",
            "spike_f1_pooled",
            "spike_recall",
            "spike_precision",
            "spike_false_alarms_per_10k",
            "spike_delay_steps_mean",
            "spike_delay_steps_max",
            "clean_alarm_episodes_per_10k",
        )
    }
    if df.empty:
        return out
    for method, part in df.groupby("method"):
        fam = part.groupby("family")[
            ["tp", "fn", "fp", "healthy", "delay_sum", "detected", "points", "clean_episodes"]
        ].sum()
        fam_max = part.groupby("family")["delay_max"].max()
        f1 = 2 * fam.tp / (2 * fam.tp + fam.fp + fam.fn).replace(0, np.nan)
        recall = fam.tp / (fam.tp + fam.fn).replace(0, np.nan)
        precision = fam.tp / (fam.tp + fam.fp).replace(0, np.nan)
        fa = 1e4 * fam.fp / fam.healthy.replace(0, np.nan)
        delay = fam.delay_sum / fam.detected.replace(0, np.nan)
        clean = 1e4 * fam.clean_episodes / fam.points.replace(0, np.nan)
        m = str(method)
        out["spike_f1"][m] = _family_mean(f1.to_dict())
        tot = fam.sum()
        pooled = 2 * tot.tp / max(1.0, float(2 * tot.tp + tot.fp + tot.fn))
        out["spike_f1_pooled"][m] = float(pooled)
        out["spike_recall"][m] = _family_mean(recall.to_dict())
        out["spike_precision"][m] = _family_mean(precision.to_dict())
        out["spike_false_alarms_per_10k"][m] = _family_mean(fa.to_dict())
        out["spike_delay_steps_mean"][m] = _family_mean(delay.to_dict())
        detected = int(fam.detected.sum())
        out["spike_delay_steps_max"][m] = float(fam_max.max()) if detected else None
        out["clean_alarm_episodes_per_10k"][m] = _family_mean(clean.to_dict())
    return out


def _caught_summary(rows: list[dict[str, object]], prefix: str) -> dict[str, dict]:
    df = pd.DataFrame(rows)
    recall: dict[str, float | None] = {}
    delay_max: dict[str, float | None] = {}
    if not df.empty:
        for method, part in df.groupby("method"):
            fam = part.groupby("family")["caught"].mean()
            recall[str(method)] = _family_mean(fam.to_dict())
            caught = part[part.caught]
            # Max delay only means something when every event was caught.
            all_caught = bool(part.caught.all())
            delay_max[str(method)] = (
                float(caught.delay.max()) if all_caught and len(caught) else None
            )
    return {f"{prefix}_recall": recall, f"{prefix}_delay_steps_max": delay_max}


def evaluate_divergence(runs: list[CurveRun], seed: int) -> tuple[dict, str]:
    spikes = spike_rows(runs, seed)
    nans = nan_rows(runs, seed)
    documented = documented_rows(runs)
    opens = open_flag_rows(runs)
    result: dict[str, object] = dict(_spike_summary(spikes))
    result.update(_caught_summary(nans, "nan"))
    result["nan_false_flag_before"] = (
        float(np.mean([r["false_before"] for r in nans])) if nans else None
    )
    result.update(_caught_summary(documented, "documented_spike"))
    result["spike_events_injected"] = int(
        sum(r["tp"] + r["fn"] for r in spikes if r["method"] == "runcast")  # type: ignore[operator]
    )
    result["spike_runs"] = len({r["file"] for r in spikes})
    result["spike_families"] = len({r["family"] for r in spikes})
    result["nan_runs"] = len(nans) // len(METHODS)
    result["documented_events"] = len(documented) // len(METHODS)
    result["clean_open_flag_rate"] = _open_summary(opens)
    return result, _table(result)


def _open_summary(rows: list[dict[str, object]]) -> dict[str, dict[str, float | None]]:
    df = pd.DataFrame(rows)
    out: dict[str, dict[str, float | None]] = {}
    if df.empty:
        return out
    for kind in KINDS:
        by_cut = {}
        for q, part in df.groupby("cutoff"):
            by_cut[str(q)] = _family_mean(part.groupby("family")[kind].mean().to_dict())
        out[kind] = by_cut
    return out


def _fmt(x: object, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _table(r: dict[str, object]) -> str:
    keys = (
        "spike_f1",
        "spike_f1_pooled",
        "spike_recall",
        "spike_precision",
        "spike_false_alarms_per_10k",
        "spike_delay_steps_mean",
        "spike_delay_steps_max",
        "clean_alarm_episodes_per_10k",
        "nan_recall",
        "nan_delay_steps_max",
        "documented_spike_recall",
    )
    lines = [f"{'divergence (family mean)':30s} | " + " | ".join(f"{m:>11s}" for m in METHODS)]
    for key in keys:
        vals = cast(dict[str, object], r.get(key) or {})
        cells = " | ".join(f"{_fmt(vals.get(m)):>11s}" for m in METHODS)
        lines.append(f"{key:30s} | {cells}")
    lines.append(
        f"events: {r['spike_events_injected']} spikes in {r['spike_runs']} runs "
        f"({r['spike_families']} families), {r['nan_runs']} NaN runs, "
        f"{r['documented_events']} documented spike events"
    )
    opens = cast(dict[str, dict[str, object]], r.get("clean_open_flag_rate") or {})
    lines.append("open flags on clean prefixes (share of runs) by cut-off 10/25/50/75/90%:")
    for kind, by_cut in opens.items():
        lines.append(f"  {kind:12s} " + " ".join(f"{_fmt(x, 2):>5s}" for x in by_cut.values()))
    return "\n".join(lines)
