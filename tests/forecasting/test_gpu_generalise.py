"""The GPU activity estimator across systems: whatever the watts, the sampling period and each
node's clock, the run's own activity is explained and foreign work is not (issue 28)."""

from __future__ import annotations

import numpy as np
import pytest

from forecasting.estimators import gpu_activity as ga

EVAL_EVERY, EVAL_S, FIRST_EVAL = 36.0, 10.0, 120.0
# How far behind the job log the eight meters of Dell's 8xXE9680 runs are (bench/data/power-dell).
DELL_CLOCKS = (0.5, 9.0, 11.0, 11.0, 7.0, 16.5, 2.0, 15.0)


def job_level(t: np.ndarray) -> np.ndarray:
    """A multi-node job's draw as a fraction of its training level, on the job's clock:
    init at 0.4 until 0, training at 1, a synchronous stretch at 0.45 inside the first block
    (100-120 s, as Dell's Llama-2 runs), then an eval at 0.7 every 36 s."""
    level = np.where(t < 0, 0.4, 1.0)
    level = np.where((t >= 100) & (t < FIRST_EVAL), 0.45, level)
    for start in np.arange(FIRST_EVAL, 400, EVAL_EVERY):
        level = np.where((t >= start) & (t < start + EVAL_S), 0.7, level)
    return level


def job_events() -> ga.RunEvents:
    phases = [ga.Phase(-60.0, 0.0, "init"), ga.Phase(0.0, 400.0, "train")]
    phases += [
        ga.Phase(float(s), float(s + EVAL_S), "eval")
        for s in np.arange(FIRST_EVAL, 400, EVAL_EVERY)
    ]
    return ga.RunEvents(phases=phases)


def nodes(
    *,
    watts: float,
    period: float,
    noise: float,
    seed: int,
    clocks: tuple[float, ...] = (0.0,) * 8,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per node (its own clock's times, its readings): `noise` relative, plus a 15% dip at one
    reading in twenty (a 1-s meter caught between two steps)."""
    rng = np.random.default_rng(seed)
    out = []
    for clock in clocks:
        true_t = np.arange(-30.0, 400.0, period) + rng.uniform(0, period)
        w = watts * job_level(true_t) * (1 + rng.normal(0, noise, true_t.size))
        dips = rng.random(true_t.size) < 0.05
        w[dips] *= 0.85
        out.append((true_t - clock, w))
    return out


def peers_of(series: list[tuple[np.ndarray, np.ndarray]], i: int) -> np.ndarray:
    t = series[i][0]
    others = [np.interp(t, s, w) for j, (s, w) in enumerate(series) if j != i]
    return np.median(np.vstack(others), axis=0)


def unexplained(
    series: list[tuple[np.ndarray, np.ndarray]], i: int, w: np.ndarray | None = None
) -> list[ga.Episode]:
    t, v = series[i]
    found = ga.find_episodes(t, v if w is None else w, job_events(), peers=peers_of(series, i))
    return [e for e in found if not e.explained]


# A 2-s meter at 6.5 kW per node (the dev set), a 1-s one at 8 kW (Dell's), one GPU at 700 W.
SYSTEMS = [(6500.0, 2.0, 0.012), (8000.0, 1.0, 0.03), (700.0, 1.0, 0.02)]


@pytest.mark.parametrize(("watts", "period", "noise"), SYSTEMS)
def test_it_explains_the_runs_own_phases_on_every_system(
    watts: float, period: float, noise: float
) -> None:
    series = nodes(watts=watts, period=period, noise=noise, seed=1)
    assert [e for i in range(len(series)) for e in unexplained(series, i)] == []


@pytest.mark.parametrize(("watts", "period", "noise"), SYSTEMS)
@pytest.mark.parametrize(("start", "length"), [(40.0, 20.0), (104.0, 14.0), (150.0, 90.0)])
def test_it_finds_a_burst_on_one_node_on_every_system(
    watts: float, period: float, noise: float, start: float, length: float
) -> None:
    # +15% on node 2: in training, over the synchronous low stretch (a band learnt in watts
    # at the training level was 30% wide there), and across two evals.
    series = nodes(watts=watts, period=period, noise=noise, seed=2)
    t, w = series[2]
    burst = w.copy()
    burst[(t >= start) & (t < start + length)] *= 1.15
    found = unexplained(series, 2, burst)
    assert found and all(e.kind == "burst" for e in found)
    assert all(e.start < start + length and e.end > start for e in found)


def test_its_episodes_do_not_depend_on_the_unit_of_the_readings() -> None:
    # The same job in watts and in kilowatts x 0.37: the same episodes at the same times.
    series = nodes(watts=8000.0, period=1.0, noise=0.03, seed=3)
    t, w = series[1]
    w = w.copy()
    w[(t >= 200) & (t < 260)] *= 1.2
    w[(t >= 300) & (t < 340)] *= 0.8
    scaled = [(s, v * 0.37e-3) for s, v in series]
    one = ga.find_episodes(t, w, job_events(), peers=peers_of(series, 1))
    other = ga.find_episodes(t, w * 0.37e-3, job_events(), peers=peers_of(scaled, 1))
    assert [(e.start, e.end, e.kind, e.explained) for e in one] == [
        (e.start, e.end, e.kind, e.explained) for e in other
    ]
    assert {e.kind for e in one if not e.explained} == {"burst", "drop"}


def test_peer_offsets_find_each_nodes_clock() -> None:
    clocks = DELL_CLOCKS
    series = nodes(watts=8000.0, period=1.0, noise=0.03, seed=4, clocks=clocks)
    offsets = ga.peer_offsets(series)
    # What each series' times need to line up: its clock's lag, up to one common shift, to
    # within a reading (1 s, offsets under it are left at 0) and the half-period search step.
    lag = np.array(clocks) - offsets
    assert np.all(np.abs(lag - np.median(lag)) <= 1.5)


def test_peer_offsets_leave_one_clock_alone() -> None:
    series = nodes(watts=6500.0, period=2.0, noise=0.012, seed=5)
    assert np.all(ga.peer_offsets(series) == 0.0)


def test_aligned_clocks_explain_the_evals_that_misaligned_ones_do_not() -> None:
    clocks = DELL_CLOCKS
    series = nodes(watts=8000.0, period=1.0, noise=0.03, seed=6, clocks=clocks)
    raw = sum(len(unexplained(series, i)) for i in range(len(series)))
    offsets = ga.peer_offsets(series)
    aligned = [(t + o, w) for (t, w), o in zip(series, offsets, strict=True)]
    # The common shift left is within the phases' tolerance of the job's clock.
    assert abs(float(np.median(np.array(clocks) - offsets))) <= ga.Settings().tolerance_s
    assert raw > 0
    assert sum(len(unexplained(aligned, i)) for i in range(len(aligned))) == 0


def init_warm_up(rise: float) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Node 0 draws `rise` x its init level from 25 s before run_start; its peers stay."""
    series = nodes(watts=8000.0, period=1.0, noise=0.02, seed=7)
    t, w = series[0]
    w = w.copy()
    early = (t >= -25) & (t < 0)
    w[early] = 8000.0 * 0.4 * rise
    return series, w


def test_an_init_rise_to_the_training_draw_is_the_jobs_warm_up() -> None:
    series, w = init_warm_up(2.5)  # 0.4 x 2.5: the training level
    assert unexplained(series, 0, w) == []


def test_an_init_rise_short_of_the_training_draw_is_not() -> None:
    series, w = init_warm_up(1.3)
    found = unexplained(series, 0, w)
    assert [e.kind for e in found] == ["burst"] and found[0].phase == "init"


def surplus_job(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Dell-like nodes (1-s meters, 8 kW), node 3 drawing a fixed 12% of the training draw in
    watts over its share: +12% at the training level, +27% at its peers' 0.45 stretch."""
    series = nodes(watts=8000.0, period=1.0, noise=0.01, seed=seed)
    t, w = series[3]
    series[3] = (t, w + 0.12 * 8000.0)
    return series


def test_a_nodes_own_surplus_over_its_peers_is_learnt_from_its_earlier_runs() -> None:
    alone = unexplained(surplus_job(10), 3)
    # Within one run the surplus at the low stretch is foreign work as far as it can tell.
    assert any(e.start < 120 and e.end > 100 for e in alone)
    profile = ga.PeerProfile()
    for seed in (11, 12, 13):
        earlier = surplus_job(seed)
        t, w = earlier[3]
        ga.learn_peer_profile(t, w, job_events(), peers=peers_of(earlier, 3), profile=profile)
    series = surplus_job(10)
    t, w = series[3]
    peers = peers_of(series, 3)
    found = ga.find_episodes(t, w, job_events(), peers=peers, profile=profile)
    assert [e for e in found if not e.explained] == []
    # Foreign work on it is still found, at the low stretch and in training.
    for start, length in ((100.0, 18.0), (160.0, 60.0)):
        burst = w.copy()
        burst[(t >= start) & (t < start + length)] *= 1.15
        found = ga.find_episodes(t, burst, job_events(), peers=peers, profile=profile)
        hits = [e for e in found if not e.explained]
        assert hits and all(e.start < start + length and e.end > start for e in hits)


def test_a_profile_learns_only_what_its_earlier_runs_agree_on() -> None:
    profile = ga.PeerProfile()
    at = np.full(20, np.log(0.45))  # the peers at 45% of their training level
    # One run with foreign work there, two without: not learnt.
    for residual in (0.2, 0.0, 0.01):
        profile.learn(at, np.full(20, residual), min_readings=8)
    assert profile.offset(at[:1])[0] == 0.0
    # Every run shows it: learnt, at that level only.
    agreed = ga.PeerProfile()
    for residual in (0.2, 0.18, 0.21):
        agreed.learn(at, np.full(20, residual), min_readings=8)
    assert agreed.offset(at[:1])[0] == pytest.approx(0.2)
    assert agreed.offset(np.zeros(1))[0] == 0.0
    # One run is not enough to learn from, and too few readings in a bin do not count.
    once = ga.PeerProfile()
    once.learn(at, np.full(20, 0.2), min_readings=8)
    assert once.offset(at[:1])[0] == 0.0
    once.learn(at[:5], np.full(5, 0.2), min_readings=8)
    assert once.offset(at[:1])[0] == 0.0
