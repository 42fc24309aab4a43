"""Divergence detection: synthetic edge cases and real curves from the shared set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from forecasting.estimators.divergence import _eval_rise_flag, detect_divergence, spike_alarms

CURVES = Path("/work/shared/data/curves")


def _healthy(n: int = 3000, noise: float = 0.02, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    s = np.arange(1, n + 1, dtype=float)
    return s, (2.0 + 3.0 * s**-0.4) * np.exp(rng.normal(0, noise, n))


def _kinds(flags: list) -> set[str]:
    return {f.kind for f in flags}


def test_healthy_curve_has_no_flags() -> None:
    s, v = _healthy()
    assert detect_divergence(s, v) == []


def test_nan_flagged_at_first_bad_step_with_cost() -> None:
    s, v = _healthy()
    v = v.copy()
    v[2500:] = np.nan
    times = s * 2.0  # 2 s per step
    flags = detect_divergence(
        s, v, times=times, checkpoints=[1000, 2000, 2600], gpu_count=8, gpu_hour_price=2.0
    )
    nan = [f for f in flags if f.kind == "nan"]
    assert len(nan) == 1
    f = nan[0]
    assert f.onset_step == 2501 and f.onset_index == 2500 and f.detected_step == 2501
    assert f.rollback_step == 2000
    assert f.wasted_s == pytest.approx(2 * (3000 - 2501))
    assert f.cost == pytest.approx(f.wasted_s / 3600 * 8 * 2.0)
    json.dumps(f.to_dict(), allow_nan=False)


@pytest.mark.parametrize(
    ("currency", "text"),
    [
        ("USD", "about $1.11 in GPU cost"),
        ("EUR", "about €1.11 in GPU cost"),
        ("CHF", "about 1.11 CHF in GPU cost"),
    ],
)
def test_cost_in_the_flag_text_names_the_projects_currency(currency: str, text: str) -> None:
    s, v = _healthy()
    v = v.copy()
    v[2500:] = np.nan
    flags = detect_divergence(
        s, v, times=s * 2.0, gpu_count=8, gpu_hour_price=0.5, currency=currency
    )
    assert text in flags[0].explanation  # 998 s x 8 GPUs x 0.5 an hour


def test_nan_at_step_one_and_inf() -> None:
    flags = detect_divergence(np.array([1.0]), np.array([np.nan]))
    assert _kinds(flags) == {"nan"} and flags[0].onset_step == 1
    flags = detect_divergence(np.array([1.0, 2.0, 3.0]), np.array([2.0, np.inf, 2.0]))
    assert "nan" in _kinds(flags) and flags[0].onset_step == 2


def test_old_resolved_nan_is_not_open() -> None:
    s, v = _healthy()
    v = v.copy()
    v[100] = np.nan
    assert "nan" not in _kinds(detect_divergence(s, v))


def test_single_noisy_batch_does_not_page_but_persistent_spike_does() -> None:
    s, v = _healthy(noise=0.03)  # per-step noise like a small LM's train loss
    one = v.copy()
    one[2990] *= 1.3  # one bad batch, moderate (as large as natural ones in real logs)
    assert "spike" not in _kinds(detect_divergence(s, one))
    lasting = v.copy()
    lasting[2990:2994] *= 1.3
    flags = [f for f in detect_divergence(s, lasting) if f.kind == "spike"]
    assert len(flags) == 1
    assert flags[0].onset_step == 2991 and flags[0].detected_step == 2992
    huge = v.copy()
    huge[2990] *= 4.0  # a lone x4 jump is no noisy batch
    assert "spike" in _kinds(detect_divergence(s, huge))


def test_old_resolved_spike_is_not_open() -> None:
    s, v = _healthy()
    v = v.copy()
    v[1000:1010] *= 3.0
    assert "spike" not in _kinds(detect_divergence(s, v))
    assert spike_alarms(s, v)[1000:1010].any()  # but it was alarmed when it happened


def test_spike_alarms_are_causal() -> None:
    s, v = _healthy()
    v = v.copy()
    v[1500:1520] *= 2.0
    full = spike_alarms(s, v)
    prefix = spike_alarms(s[:1510], v[:1510])
    assert np.array_equal(full[:1510], prefix)


def test_sustained_rise() -> None:
    s, v = _healthy()
    v = v.copy()
    v[2400:] *= np.exp(np.linspace(0, 0.15, 600))  # +16% over the last 600 steps
    flags = [f for f in detect_divergence(s, v) if f.kind == "rise"]
    assert len(flags) == 1
    assert 2200 <= flags[0].onset_step <= 2600


def test_a_climb_that_ended_is_no_longer_a_rise() -> None:
    # A sparse validation curve with an injected divergence (issue 9's flag stream, modded-nanogpt
    # medium LongerCooldown, seed 0): falling, a climb of +45% over ten evaluations, then a slow
    # steady decline. While it climbs it is a rise; once it has fallen for a while the rise has
    # ended (its level above the best is a regression's to report), yet the CUSUM, in units of
    # the decline's tiny spread, read "still climbing" there and re-raised the rise flag.
    v = np.array(
        [
            *(10.826, 4.52, 4.19, 4.04, 3.942, 3.654, 3.584, 3.533, 3.489, 3.425, 3.396, 3.372),
            *(3.35, 3.304, 3.283, 3.267, 3.254, 3.233, 3.221, 3.294, 3.425, 3.549, 3.682, 3.813),
            *(3.943, 4.068, 4.196, 4.329, 4.461, 4.591, 4.704, 4.696, 4.686, 4.676, 4.668, 4.662),
            *(4.654, 4.646, 4.636, 4.628, 4.621, 4.614, 4.606, 4.599, 4.592, 4.587, 4.579, 4.572),
            *(4.567, 4.56, 4.554, 4.548, 4.542, 4.537, 4.532, 4.53, 4.529),
        ]
    )
    s = np.arange(v.size, dtype=float) * 125
    assert "rise" in _kinds(detect_divergence(s[:25], v[:25], evaluation=True))
    assert "rise" not in _kinds(detect_divergence(s, v, evaluation=True))


def test_growing_oscillation() -> None:
    s, v = _healthy(noise=0.005)
    v = v.copy()
    amp = np.linspace(0.0, 0.2, 150)
    v[-150:] *= np.exp(amp * np.sin(np.arange(150) * 2.5))
    assert "oscillation" in _kinds(detect_divergence(s, v))


def test_a_noisy_plateau_is_no_regression_but_a_climb_out_of_it_is() -> None:
    # A long small-model run: the loss plateaus with ~5% noise per point and never regresses
    # (its validation loss falls to the end). Its best smoothed level is the luckiest of a few
    # hundred, so the level now read ~15% above it.
    rng = np.random.default_rng(4)
    s = np.arange(1, 401, dtype=float) * 200
    plateau = (0.95 + 0.8 * np.exp(-s / 6000)) * np.exp(rng.standard_t(3, 400) * 0.04)
    assert "regression" not in _kinds(detect_divergence(s, plateau))
    climbed = plateau.copy()
    climbed[280:] *= np.exp(np.minimum(np.arange(120) / 40, 1.0) * 0.3)  # back to step ~5,000
    assert "regression" in _kinds(detect_divergence(s, climbed))


def test_a_sparse_log_that_gives_back_all_its_progress_is_a_regression() -> None:
    # One point per 1,000 steps: the initial loss, a quick fall to a noisy plateau, then a climb
    # above every later level (only the first point stood higher): all progress given back.
    rng = np.random.default_rng(7)
    s = np.arange(0, 70_000, 1000, dtype=float)
    v = 3.4 * np.exp(rng.normal(0, 0.03, s.size))
    v[0] = 9.0
    v[40:] *= np.exp(np.minimum(np.arange(30) / 10, 1.0) * 0.4)
    reg = [f for f in detect_divergence(s, v) if f.kind == "regression"]
    assert len(reg) == 1 and reg[0].regression_to_step == 0.0
    assert "regression" not in _kinds(detect_divergence(s[:40], v[:40]))


def test_a_climb_above_every_logged_level_is_a_regression_unless_it_is_the_warm_up() -> None:
    # The log starts after the initial loss (its first point is already on the plateau), then
    # the loss climbs above anything it ever logged.
    rng = np.random.default_rng(8)
    s = np.arange(1000, 101_000, 1000, dtype=float)
    v = (3.0 + 0.6 * np.exp(-s / 15_000)) * np.exp(rng.normal(0, 0.03, s.size))
    v[40:] *= np.exp(np.minimum(np.arange(60) / 10, 1.0) * 0.4)
    reg = [f for f in detect_divergence(s, v) if f.kind == "regression"]
    assert len(reg) == 1 and "above every level since step 1,000" in reg[0].explanation
    # A loss that rises in the run's first stretch (its best only 3% in): warm-up, not this.
    warm = 3.4 * np.exp(rng.normal(0, 0.01, s.size))
    warm[3:] *= 1.3
    assert "regression" not in _kinds(detect_divergence(s, warm))


@pytest.mark.skipif(not (CURVES / "runs").is_dir(), reason="curve set not present")
def test_a_real_plateau_that_does_not_regress_is_not_flagged() -> None:
    import pandas as pd

    frame = pd.read_csv(
        CURVES / "runs" / "parameter-golf__track_non_record_16mb-2026-03-29_"
        "HNet_ByteVsSubword_Study-train_byte260_4h.csv"
    )
    train = frame[["step", "train_loss"]].dropna()
    s, v = train.step.to_numpy(float), train.train_loss.to_numpy(float)
    for end in range(len(s) // 2, len(s) + 1, 8):
        assert "regression" not in _kinds(detect_divergence(s[:end], v[:end])), end


def test_regression_reports_time_ago() -> None:
    s, v = _healthy(noise=0.005)
    v = v.copy()
    level_at_500 = 2.0 + 3.0 * 500**-0.4
    v[2500:] = level_at_500  # jumped back to where it was at step 500 and stayed
    times = s * 36.0  # 10 h per 1000 steps
    flags = detect_divergence(s, v, times=times)
    reg = [f for f in flags if f.kind == "regression"]
    assert len(reg) == 1
    f = reg[0]
    assert f.regression_to_step is not None and 350 <= f.regression_to_step <= 650
    assert re.search(r"its level of [\d.]+ (h|days?) ago \(step 5\d\d\)", f.explanation)
    assert 2400 <= f.onset_step <= 2550


def test_grad_norm_layers_that_moved_first() -> None:
    s, v = _healthy()
    v = v.copy()
    v[2900:] *= 3.0
    rng = np.random.default_rng(3)
    norms = {}
    layers = (("grad_norm/attn.3", 2850), ("grad_norm/mlp.7", 2895), ("grad_norm/emb", None))
    for name, jump_at in layers:
        g = np.exp(rng.normal(0, 0.05, len(s)))
        if jump_at is not None:
            g[jump_at - 1 :] *= 10
        norms[name] = (s, g)
    flags = detect_divergence(s, v, grad_norms=norms)
    spike = next(f for f in flags if f.kind == "spike")
    assert spike.layers_first[0] == "grad_norm/attn.3"
    assert "grad_norm/emb" not in spike.layers_first


def _sampled_layer_norms(
    s: np.ndarray, every: int, moves: dict[str, tuple[int, float]], seed: int = 5
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """grad_norm/<layer> series logged every `every` steps; a layer in `moves` jumps by its
    factor from its step on."""
    rng = np.random.default_rng(seed)
    gs = s[::every]
    out = {}
    for name in ("grad_norm/wte", "grad_norm/h.0", "grad_norm/h.1", "grad_norm/ln_f"):
        g = np.exp(rng.normal(0, 0.05, len(gs)))
        if name in moves:
            at, factor = moves[name]
            g[gs >= at] *= factor
        out[name] = (gs, g)
    return out


def test_layers_found_when_the_loss_pages_at_once_and_norms_are_sampled() -> None:
    """A sudden LR jump (what tests/client/integrations drive a real GPT into): the loss pages
    on its first bad point, so onset == detection, while grad norms logged every few steps
    show the move only at the next sample and confirm it one sample later. The layers must
    still be found, biggest movers first, and named in the explanation."""
    s, v = _healthy(1000)
    v = v.copy()
    v[s > 950] *= 6.0  # the update at step 950 used the new LR: losses from step 951 on
    moves = {
        "grad_norm/ln_f": (951, 40.0),
        "grad_norm/wte": (951, 9.0),
        "grad_norm/h.1": (951, 6.0),
    }
    norms = _sampled_layer_norms(s, 4, moves)  # samples at 1, 5, ..., 949, 953, 957
    flags = detect_divergence(s, v, checkpoints=[900.0, 940.0, 960.0], grad_norms=norms)
    spike = next(f for f in flags if f.kind == "spike")
    assert spike.onset_step == spike.detected_step == 951
    assert spike.rollback_step == 940
    assert spike.layers_first == ["grad_norm/ln_f", "grad_norm/wte", "grad_norm/h.1"]
    assert "Gradient norms moved first in ln_f, wte, h.1" in spike.explanation


def test_layers_that_moved_after_the_confirmation_window_are_not_first() -> None:
    s, v = _healthy(1000)
    v = v.copy()
    v[s > 950] *= 6.0
    norms = _sampled_layer_norms(s, 4, {"grad_norm/h.0": (981, 20.0)})
    spike = next(f for f in detect_divergence(s, v, grad_norms=norms) if f.kind == "spike")
    assert spike.layers_first == []
    assert "Gradient norms" not in spike.explanation


def test_backward_steps_use_latest_log() -> None:
    s, v = _healthy(1000)
    v = v.copy()
    bad = v.copy()
    bad[700:800] *= 5  # the abandoned stretch before a restart from step 700
    steps = np.concatenate([s[:800], s[700:]])
    values = np.concatenate([bad[:800], v[700:]])
    assert detect_divergence(steps, values) == []


def test_few_points_and_constant_loss() -> None:
    assert detect_divergence(np.array([]), np.array([])) == []
    assert detect_divergence(np.array([1.0, 2.0]), np.array([3.0, 3.1])) == []
    s = np.arange(1, 2001, dtype=float)
    flat = np.full(2000, 2.0)
    assert detect_divergence(s, flat) == []
    flat[-3:] = 2.02  # +1% on a perfectly flat curve is not a spike
    assert detect_divergence(s, flat) == []


def test_million_points_runs() -> None:
    s, v = _healthy(1_000_000, seed=5)
    v[-5:] *= 3
    flags = detect_divergence(s, v)
    assert "spike" in _kinds(flags)


@pytest.mark.skipif(not CURVES.exists(), reason="shared curve set not available")
def test_real_documented_spikes_detected_and_clean_curve_quiet() -> None:
    from curveset import load_runs

    runs = load_runs(CURVES)
    bloom = next(r for r in runs if "tr1-13B" in r.file)
    s, v = bloom.column("step"), bloom.column("train_loss")
    ok = np.isfinite(v)
    flags = [f for f in detect_divergence(s[ok], v[ok]) if f.kind == "spike"]
    assert flags and 29040 <= flags[0].onset_step <= 29050
    assert "still elevated" in flags[0].explanation
    clean = next(r for r in runs if "megatron-lm__bert_release__dev_dgx_h100" in r.file)
    s, v = clean.column("step"), clean.column("train_loss")
    ok = np.isfinite(v)
    assert not spike_alarms(s[ok], v[ok]).any()


def test_the_estimator_and_the_flag_model_spell_the_same_kinds() -> None:
    from forecasting.estimators.divergence import KINDS
    from forecasting.models import Flag

    assert set(KINDS) == set(Flag.DIVERGENCE_KINDS) <= set(Flag.Kind.values)


# --- validation curves: one point per evaluation ---------------------------------------------


def _eval_curve(n: int = 16, noise: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A val loss logged every 125 steps: a fast fall, then a slow one (as a speedrun's)."""
    rng = np.random.default_rng(seed)
    s = np.arange(n, dtype=float) * 125
    level = (3.2 + 7.6 * np.exp(-s / 150.0)) * (1 - 0.03 * s / s[-1])
    return s, level * np.exp(rng.normal(0, noise, n))


def test_eval_curve_rise_above_its_best_is_flagged() -> None:
    s, v = _eval_curve()
    v = v.copy()
    v[-2:] *= [1.15, 1.25]  # the last two evaluations climb back 15-25%
    found = _eval_rise_flag(s, v)
    assert found is not None and found.kind == "rise"
    assert found.onset_step == s[-2] and found.detected_step == s[-1]
    assert found.sustained_points == 2  # the service need not wait a time window on top
    assert "Validation loss" in found.explanation and "above its best" in found.explanation
    assert "rise" in _kinds(detect_divergence(s, v, evaluation=True))


def test_eval_curve_one_odd_evaluation_is_not_a_rise() -> None:
    s, v = _eval_curve()
    v = v.copy()
    v[-1] *= 1.3  # only the latest: it must hold at two evaluations
    assert _eval_rise_flag(s, v) is None
    v[-1] /= 1.3
    v[-3] *= 1.3  # a blip that came back down is not open either
    assert _eval_rise_flag(s, v) is None


def test_eval_curve_rise_must_beat_its_own_wobble() -> None:
    s, v = _eval_curve(n=30)
    v = v.copy()
    v[10::2] *= 1.04  # a small eval set: every other evaluation 4% up
    v[-2:] = v[:-2].min() * 1.07  # 7% above the best: under 3x its 4% wobbles
    assert _eval_rise_flag(s, v) is None
    v[-2:] = v[:-2].min() * 1.3
    assert _eval_rise_flag(s, v) is not None


def test_eval_curve_slow_climb_is_caught_as_it_accumulates() -> None:
    s, v = _eval_curve(n=24)
    v = v.copy()
    v[12:] = v[11] * 1.03 ** np.arange(1, 13)  # +3% per evaluation: each step small
    found = [i for i in range(14, 25) if _eval_rise_flag(s[:i], v[:i]) is not None]
    assert found and found[0] < 24
    assert found == list(range(found[0], 25))  # and it stays open while the loss climbs


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_healthy_eval_curves_never_flag_a_rise(noise: float) -> None:
    for seed in range(20):
        s, v = _eval_curve(n=16, noise=noise, seed=seed)
        for i in range(3, len(s) + 1):
            assert _eval_rise_flag(s[:i], v[:i]) is None
