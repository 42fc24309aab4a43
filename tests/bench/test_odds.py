"""Deadline odds scored as odds (bench/evaluate/odds.py) and interruptions at cluster rates
(bench/evaluate/cluster_faults.py), on tiny inputs with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.evaluate import cluster_faults as cf
from bench.evaluate.odds import (
    U_SPREAD,
    OddsCase,
    brier,
    ece,
    exceedance,
    family_weights,
    lognormal_p,
    summarise_odds,
)


def test_brier_and_family_weights() -> None:
    w = family_weights(["f1", "f1", "f2"])
    assert w.tolist() == [0.5, 0.5, 1.0]
    # ((0.8 - 1)^2 * 0.5 + (0.3 - 0)^2 * 0.5 + (0.5 - 1)^2 * 1) / 2
    assert brier(np.array([0.8, 0.3, 0.5]), np.array([1.0, 0.0, 1.0]), w) == pytest.approx(
        (0.04 * 0.5 + 0.09 * 0.5 + 0.25) / 2
    )


def test_ece_over_ten_bins() -> None:
    p = np.array([0.05, 0.05, 0.95, 0.95])
    y = np.array([0.0, 1.0, 1.0, 1.0])
    # Bin 0: mean p 0.05, half on time (gap 0.45); bin 9: mean p 0.95, all on time (gap 0.05).
    assert ece(p, y, np.ones(4)) == pytest.approx(0.5 * 0.45 + 0.5 * 0.05)
    # A coin on a set that is half on time is calibrated; so is a certain and right forecast.
    assert ece(np.full(4, 0.5), np.array([0.0, 1.0, 0.0, 1.0]), np.ones(4)) == 0.0
    assert ece(np.array([0.0, 1.0]), np.array([0.0, 1.0]), np.ones(2)) == 0.0
    # p = 1.0 falls in the top bin, not an eleventh.
    assert ece(np.array([1.0, 0.95]), np.array([1.0, 0.0]), np.ones(2)) == pytest.approx(0.475)


def test_p90_exceedance_counts_outcomes_strictly_after() -> None:
    actual = np.array([1.0, 2.0, 3.0, 4.0])
    assert exceedance(actual, np.full(4, 2.0), np.ones(4)) == 0.5
    assert exceedance(actual, np.full(4, 2.0), np.array([1.0, 1.0, 2.0, 0.0])) == 0.5


def test_lognormal_baseline() -> None:
    assert lognormal_p(np.array([100.0]), np.array([100.0]), 0.1)[0] == pytest.approx(0.5)
    z90 = 1.2815515655446004
    assert lognormal_p(np.array([100.0]), np.array([100.0 * math.exp(0.1 * z90)]), 0.1)[
        0
    ] == pytest.approx(0.9)


def _case(family: str, p: tuple[float, ...], p90: float, point: float) -> OddsCase:
    return OddsCase(
        family=family,
        half="A" if family.startswith("a") else "B",
        cutoff=50,
        actual=100.0,
        p_on_time=p,
        p90=p90,
        points={"bar": point},
    )


def test_summary_of_a_sharp_forecaster_and_a_baseline_fitted_on_the_other_half() -> None:
    sharp = tuple(1.0 if u > 0 else 0.0 for u in U_SPREAD)
    coin = tuple(0.5 for _ in U_SPREAD)
    cases = [
        _case("a1", sharp, 99.0, 100.0),  # right but P90 below the finish: exceeded
        _case("a2", sharp, 120.0, 100.0),
        _case("b1", coin, 120.0, 100.0),
        _case("b2", coin, 130.0, 100.0),
    ]
    out = summarise_odds(cases, (50,))
    assert out["p_on_time_brier"]["A"]["50"] == 0.0
    assert out["p_on_time_brier"]["B"]["50"] == 0.25
    assert out["p_on_time_ece"]["all"]["50"] == 0.0
    assert out["p90_exceedance"]["all"]["50"] == 0.25
    assert out["p90_exceedance"]["A"]["50"] == 0.5
    # A point baseline that is exactly right is best with the narrowest width on either half.
    assert out["baseline"]["50"] == "bar"
    assert out["baseline_sigma"]["50"]["A"] == out["baseline_sigma"]["50"]["B"] == 0.002
    assert out["p_on_time_brier_baseline"]["all"]["50"] < 1e-3


@pytest.mark.parametrize(
    ("name", "gpus"),
    [
        ("runs/parameter-golf__x-logs_baseline_1xh100_600s__run1.csv", 1),
        ("runs/mlperf-v4.0-gpt3__NVIDIA__eos_n64_ngc24.04_nemo__result_0.csv", 512),
        ("runs/mlperf-v4.0-gpt3__Google__cloud-tpu-v5p-1024-maxtext__result_0.csv", 512),
        ("runs/mlperf-v4.0-gpt3__Intel-HabanaLabs__HLS-Gaudi2-N128-PT__result_0.csv", 1024),
        ("runs/glm-130b__main-log-restarts.csv", 768),
        ("runs/olmo__190M-1xC.csv", cf.DEFAULT_GPUS),
    ],
)
def test_gpus_from_the_name_or_the_documented_default(name: str, gpus: int) -> None:
    assert cf.gpus_for(name) == gpus


def test_the_interruption_rate_scales_with_the_runs_gpus() -> None:
    hours = 10.0
    steps = np.arange(0.0, hours * 3600 + 1, 60.0)  # one step a second, a point a minute
    times = steps.copy()
    counts = {}
    for gpus in (100, 1000):
        logs = [
            cf.inject_cluster_faults(steps, times, gpus, cf.cluster_rng(seed, "x"))[2]
            for seed in range(200)
        ]
        # The same draw per seed: the job's rate is the per-GPU-hour rate times its GPUs.
        for log in logs:
            per_gpu = log.rate_per_hour / gpus
            assert cf.RATE_PER_GPU_HOUR[0] <= per_gpu <= cf.RATE_PER_GPU_HOUR[1]
        counts[gpus] = np.mean([log.interruptions for log in logs])
    lo, hi = cf.RATE_PER_GPU_HOUR
    mean_rate = (hi - lo) / math.log(hi / lo)  # mean of the log-uniform draw
    expected = mean_rate * 1000 * hours  # 0.33 interruptions on 1,000 GPUs in 10 h
    assert counts[1000] == pytest.approx(expected, rel=0.35)
    assert counts[100] < counts[1000] / 4


def test_an_interruption_costs_recovery_and_the_work_since_the_last_checkpoint() -> None:
    steps = np.arange(0.0, 20 * 3600 + 1, 60.0)
    times = steps.copy()  # one step a second
    seen = 0
    for seed in range(40):
        s, t, log = cf.inject_cluster_faults(steps, times, 4000, cf.cluster_rng(seed, "y"))
        assert s[-1] == steps[-1] and (np.diff(t) >= 0).all()
        drops = np.flatnonzero(np.diff(s) < 0)
        assert drops.size == log.interruptions
        for i in drops:
            seen += 1
            lost_steps = s[i] - s[i + 1]
            assert 0 < lost_steps <= cf.CHECKPOINT_EVERY_S + 60  # one log interval of slack
            assert cf.RECOVERY_S[0] <= t[i + 1] - t[i] <= cf.RECOVERY_S[1]
        # A slowdown only adds time, so the run ends at least the recoveries later.
        assert t[-1] - times[-1] >= log.interruptions * cf.RECOVERY_S[0] - 1e-6
    assert seen > 20


def test_a_short_job_on_few_gpus_is_almost_never_interrupted() -> None:
    steps = np.arange(0.0, 421.0, 1.0)  # a 7-minute speedrun on 8 GPUs
    logs = [
        cf.inject_cluster_faults(steps, steps.copy(), 8, cf.cluster_rng(seed, "z"))[2]
        for seed in range(300)
    ]
    assert sum(log.interruptions for log in logs) == 0
    with pytest.raises(ValueError, match="gpus"):
        cf.inject_cluster_faults(steps, steps.copy(), 0, cf.cluster_rng(0, "z"))


def test_the_bound_of_one_shape_per_cut_off() -> None:
    from bench.evaluate.odds_bound import bound

    # Every run ends at its median: the empirical shape is a point there, certain and right.
    exact = [
        OddsCase(family=f, half=h, cutoff=50, actual=100.0, p_on_time=(), p90=0.0, p50=100.0)
        for f, h in (("a", "A"), ("b", "B"), ("c", "A"), ("d", "B"))
    ]
    out = bound(exact)
    assert out["hindsight"]["p_on_time_ece"] == 0.0
    assert out["cross_fitted"]["p_on_time_brier"] == 0.0
    # Half the runs 50% late: one shape for all says 1/2 for the cutoffs between, right on
    # average (calibrated) but a coin for each run (Brier).
    late = [
        OddsCase(family=f, half=h, cutoff=50, actual=a, p_on_time=(), p90=0.0, p50=100.0)
        for f, h, a in (("a", "A", 100.0), ("b", "B", 150.0), ("c", "A", 150.0), ("d", "B", 100.0))
    ]
    hind = bound(late)["hindsight"]
    assert hind["p_on_time_brier"] > 0.1 and hind["p_on_time_ece"] < 0.05
