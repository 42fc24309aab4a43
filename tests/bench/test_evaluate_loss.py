"""Evaluation harness: JSON shape, no look-ahead, deterministic injection, baseline rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.evaluate import divergence_eval as de
from bench.evaluate import loss_eval as le
from bench.evaluate.injection import inject_nan, inject_spikes, natural_mask, run_rng
from curveset import CurveRun

CURVES = Path("/work/shared/data/curves")


def _run(name: str, n: int = 1500, seed: int = 0, family: str = "fam") -> CurveRun:
    rng = np.random.default_rng(seed)
    s = np.arange(1, n + 1, dtype=float)
    loss = (2 + 3 * s**-0.4) * np.exp(rng.normal(0, 0.02, n))
    frame = pd.DataFrame(
        {
            "step": s,
            "total_steps": float(n),
            "elapsed_s": s,
            "train_loss": loss,
            "val_loss": np.nan,
            "step_ms": 1000.0,
        }
    )
    return CurveRun(file=f"runs/{name}.csv", family=family, frame=frame, total_steps=float(n))


def test_evaluate_loss_json_and_table() -> None:
    runs = [_run("a"), _run("b", seed=1, family="other")]
    result, table = le.evaluate_loss(runs, seed=0)
    json.dumps(result, allow_nan=False)
    for method in ("runcast", "last_smoothed", "power_law"):
        assert set(result["loss_mae"][method]) == {"10", "25", "50", "75", "90"}
    assert "runcast" in table and "cut 50%" in table
    # On a clean power-law curve the forecast must beat "nothing changes" from half-way on.
    assert result["loss_mae"]["runcast"]["50"] < result["loss_mae"]["last_smoothed"]["50"]


def test_loss_replay_has_no_look_ahead() -> None:
    run = _run("a")
    rows = le.score_run(run)
    future = run.frame.copy()
    late = future["step"] > 0.95 * future["step"].max()
    future.loc[late, "train_loss"] *= 1.5  # only the truth may change, not the forecasts
    changed = le.score_run(CurveRun(run.file, run.family, future, total_steps=run.total_steps))
    assert len(rows) == len(changed) == 5
    for a, b in zip(rows, changed, strict=True):
        assert a["truth"] != b["truth"]
        for method in le.METHODS:
            assert a[f"{method}_p50"] == b[f"{method}_p50"]


def test_injection_is_deterministic_and_avoids_natural_spikes() -> None:
    s = np.arange(1, 3001, dtype=float)
    v = 2 + 3 * s**-0.4
    v_nat = v.copy()
    v_nat[1500] *= 1.5
    nat = natural_mask(s, v_nat, [])
    assert nat[1500] and not nat[1000]
    a, inj_a = inject_spikes(s, v_nat, nat, run_rng(7, "x"))
    b, inj_b = inject_spikes(s, v_nat, nat, run_rng(7, "x"))
    assert np.array_equal(a, b) and inj_a == inj_b and len(inj_a) > 0
    for inj in inj_a:
        assert not nat[inj.start : inj.end + 1].any()
        assert 1.2 <= inj.factor <= 5.0 and s[inj.end] - s[inj.start] < 50
    bad, nan_inj = inject_nan(s, v, run_rng(7, "x"))
    assert not np.isfinite(bad[nan_inj.start]) and np.isfinite(bad[: nan_inj.start]).all()


def test_baseline_rules() -> None:
    s = np.arange(1, 401, dtype=float)
    v = np.full(400, 2.0)
    v[200:204] = 5.0  # 2.5x for 4 steps: too short for the 5-step rule
    assert not de.foundry_alarms(s, v).any()
    v[200:206] = 5.0  # 6 steps: fires on the 5th
    alarms = de.foundry_alarms(s, v)
    assert alarms[204] and not alarms[203]
    assert not de.megatron_alarms(s, v).any()  # 2.5x is far below 10x
    v[300] = np.nan
    assert de.megatron_alarms(s, v)[300]


def test_evaluate_divergence_on_synthetic_runs() -> None:
    runs = [_run(f"r{i}", n=2000, seed=i, family=f"f{i % 2}") for i in range(3)]
    result, table = de.evaluate_divergence(runs, seed=0)
    json.dumps(result, allow_nan=False)
    assert result["nan_recall"]["runcast"] == 1.0
    assert result["nan_delay_steps_max"]["runcast"] == 0.0
    assert result["spike_f1"]["runcast"] >= 0.8
    assert result["spike_false_alarms_per_10k"]["runcast"] <= 1.0
    assert "spike_f1" in table


@pytest.mark.skipif(not CURVES.exists(), reason="shared curve set not available")
def test_real_subset_goals() -> None:
    from curveset import load_runs

    runs = [r for r in load_runs(CURVES) if "megatron-lm" in r.file or "2024-11-06" in r.file]
    assert runs
    div, _ = de.evaluate_divergence(runs, seed=0)
    assert div["nan_recall"]["runcast"] == 1.0
    assert div["spike_false_alarms_per_10k"]["runcast"] <= 1.0
    assert div["spike_f1_pooled"]["runcast"] >= 0.9
    loss, _ = le.evaluate_loss(runs, seed=0)
    for q in ("50", "75"):
        best = min(loss["loss_mae"]["last_smoothed"][q], loss["loss_mae"]["power_law"][q])
        assert loss["loss_mae"]["runcast"][q] < best
