"""The GPU activity estimator on plain arrays: the run's own phases are explained, foreign work
and throttling are not, peers cancel synchronous swings, and the hang rule."""

from __future__ import annotations

import numpy as np
import pytest

from forecasting.estimators import gpu_activity as ga
from forecasting.estimators import gpu_attribution as gattr


def training(seconds: int = 1800, seed: int = 0) -> tuple[np.ndarray, np.ndarray, ga.RunEvents]:
    """1 Hz utilisation of a run: train at ~70%, an eval dip to ~40% every 300 s for 20 s."""
    rng = np.random.default_rng(seed)
    t = np.arange(seconds, dtype=float)
    v = 70 + rng.normal(0, 1.5, seconds)
    phases = [ga.Phase(0, seconds, "train")]
    for start in range(250, seconds, 300):
        v[start : start + 20] = 40 + rng.normal(0, 1.5, 20)
        phases.append(ga.Phase(start, start + 20, "eval"))
    return t, v, ga.RunEvents(phases=phases)


def unexplained(episodes: list[ga.Episode]) -> list[ga.Episode]:
    return [e for e in episodes if not e.explained]


def test_it_finds_nothing_unexplained_in_the_runs_own_phases() -> None:
    t, v, events = training()
    assert unexplained(ga.find_episodes(t, v, events)) == []


def test_it_calls_an_eval_without_its_phase_unexplained() -> None:
    # The same data without the logged evals: the dips are departures nobody explains.
    t, v, events = training()
    bare = ga.RunEvents(phases=[p for p in events.phases if p.kind != "eval"])
    drops = unexplained(ga.find_episodes(t, v, bare))
    assert drops and all(e.kind == "drop" for e in drops)


@pytest.mark.parametrize(("start", "length"), [(100, 12), (600, 60), (1000, 240)])
def test_it_finds_a_foreign_burst_during_training(start: int, length: int) -> None:
    t, v, events = training()
    v[start : start + length] += 20
    found = unexplained(ga.find_episodes(t, v, events))
    # A burst that spans one of the run's evals may be reported on either side of it.
    assert found and all(start - 2 <= e.start and e.end <= start + length + 2 for e in found)
    burst = found[0]
    assert burst.kind == "burst"
    assert abs(burst.start - start) <= 2
    assert burst.detected_at - start <= 10


def test_it_finds_a_burst_during_an_eval() -> None:
    t, v, events = training()
    v[852:868] += 25  # inside the eval at 850-870, above the eval level
    found = unexplained(ga.find_episodes(t, v, events, settings=ga.Settings(tolerance_s=2)))
    assert [e.phase for e in found] == ["eval"]


def test_it_finds_throttling_as_a_drop() -> None:
    t, v, events = training()
    v[400:520] *= 0.7
    found = unexplained(ga.find_episodes(t, v, events))
    assert [e.kind for e in found] == ["drop"]


def test_a_checkpoint_or_architecture_change_explains_its_departure() -> None:
    t, v, events = training()
    v[400:430] += 20
    events.marks.append(ga.Mark(430.0, "checkpoint", before_s=30.0))
    found = ga.find_episodes(t, v, events)
    assert found and all(e.explained for e in found)
    assert "checkpoint" in found[0].reason


def test_an_architecture_change_starts_a_new_level() -> None:
    # Neurons grown at 900 s: the run's level rises for good. A new regime, not a plateau.
    t, v, events = training()
    v[900:] += 15
    events.marks.append(ga.Mark(900.0, "arch_change"))
    assert unexplained(ga.find_episodes(t, v, events)) == []
    without = ga.RunEvents(phases=events.phases)
    assert unexplained(ga.find_episodes(t, v, without))


def test_a_step_time_change_starts_a_new_level() -> None:
    t, v, events = training()
    v[900:] -= 15
    steps = np.arange(0, 1800, 2.0)  # one step every 2 s, then every 3 s from 900 s
    times = np.where(steps < 900, steps, 900 + (steps - 900) * 1.5)
    events.step_times, events.steps = times, np.arange(steps.size, dtype=float)
    marks = ga.step_change_marks(events.step_times, events.steps)
    assert len(marks) == 1 and abs(marks[0].time - 900) < 6
    # Its regime split explains the new level; without the step timings one half departs from
    # the other in each phase (training where it settled first, the evals, half and half, at
    # either level: their mode), so each phase's departures are of one kind. The evals are
    # judged on their own level, not on the span to the training's within the phase-edge
    # tolerance, which covered every 20-s eval whole.
    assert unexplained(ga.find_episodes(t, v, events)) == []
    bare = ga.RunEvents(phases=events.phases)
    found = unexplained(ga.find_episodes(t, v, bare))
    assert found and all(e.end <= 910 or e.start >= 890 for e in found)
    for phase in ("train", "eval"):
        assert len({e.kind for e in found if e.phase == phase}) <= 1


def test_peers_cancel_swings_the_whole_run_makes() -> None:
    rng = np.random.default_rng(3)
    t = np.arange(1200, dtype=float)
    swing = 70 + 15 * np.sin(t / 5.0)  # every GPU of the run swings together within a step
    v = swing + rng.normal(0, 1, t.size)
    peers = swing + rng.normal(0, 0.5, t.size)
    events = ga.RunEvents(phases=[ga.Phase(0, 1200, "train")])
    v[500:530] += 12
    found = unexplained(ga.find_episodes(t, v, events, peers=peers))
    assert len(found) == 1 and abs(found[0].start - 500) <= 2


def test_it_tolerates_gaps_and_nan() -> None:
    t, v, events = training()
    v[10:20] = np.nan
    keep = np.ones(t.size, bool)
    keep[300:340] = False
    assert unexplained(ga.find_episodes(t[keep], v[keep], events)) == []


def test_hang_is_busy_gpus_without_progress() -> None:
    t = np.arange(3600, dtype=float)
    v = np.full(t.size, 95.0)
    steps = np.arange(0, 1000, 2.0)  # steps every 2 s until 1000 s, then nothing
    events = ga.RunEvents(
        phases=[ga.Phase(0, 3600, "train")], step_times=steps, steps=np.arange(steps.size)
    )
    hang = ga.find_hang(t, v, events, busy_level=90.0, now=2000.0)
    assert hang is not None and hang.kind == "hang"
    assert hang.start == pytest.approx(998.0)
    # Idle GPUs without progress are a stall (the liveness sweep's business), not a hang.
    assert ga.find_hang(t, np.full(t.size, 3.0), events, busy_level=90.0, now=2000.0) is None
    # Still within many usual step times: no verdict yet.
    assert ga.find_hang(t, v, events, busy_level=90.0, now=1100.0) is None


def test_hang_judges_only_the_progress_known_by_now() -> None:
    # The GPU samples end at 1000 s (the agent stopped); the run started at 1300 s and steps on.
    t = np.arange(1000, dtype=float)
    steps = np.arange(1300, 2000, 2.0)
    events = ga.RunEvents(
        phases=[ga.Phase(1300, 2001, "train")], step_times=steps, steps=np.arange(steps.size)
    )
    assert ga.find_hang(t, np.full(t.size, 95.0), events, busy_level=90.0) is None
    # Progress after `now` does not count as the history before it: steps every 2 s until
    # 1000 s, none until 3000 s, then stepping again. At 2000 s it is a hang.
    steps = np.concatenate((np.arange(0, 1000, 2.0), np.arange(3000, 3100, 2.0)))
    events = ga.RunEvents(
        phases=[ga.Phase(0, 3600, "train")], step_times=steps, steps=np.arange(steps.size)
    )
    t = np.arange(2000, dtype=float)
    hang = ga.find_hang(t, np.full(t.size, 95.0), events, busy_level=90.0, now=2000.0)
    assert hang is not None and hang.start == pytest.approx(998.0)


def test_attribution_follows_identities_across_namespaces() -> None:
    rng = np.random.default_rng(5)
    trace = gattr.synthetic_trace(rng, gpus=4, seconds=200)
    result = gattr.attribute(trace.samples, trace.own_pids, trace.other_runs)
    for owner, truth in trace.truth.items():
        assert result.totals[owner] == pytest.approx(truth)
    top = result.top_unknown()
    assert top is not None and top.pid == trace.foreign_pid


def test_split_gpu_activity_scales_process_shares_or_uses_memory() -> None:
    assert gattr.split_gpu_activity(90.0, {1: 30.0, 2: 15.0}, {}) == {1: 60.0, 2: 30.0}
    assert gattr.split_gpu_activity(50.0, {}, {1: 3.0, 2: 1.0}) == {1: 37.5, 2: 12.5}
    assert gattr.split_gpu_activity(50.0, {}, {}) == {}


def test_a_throttle_over_most_of_a_short_run_is_found_against_the_peers() -> None:
    # 300 s; a throttle from 60 s to the end is the series' mode, but not its peers' level.
    rng = np.random.default_rng(7)
    t = np.arange(0, 300, 2.0)
    swing = 6000 + 300 * np.sin(t / 3.0)
    peers = swing + rng.normal(0, 20, t.size)
    v = swing + rng.normal(0, 40, t.size)
    v[t >= 60] *= 0.75
    events = ga.RunEvents(phases=[ga.Phase(0, 300, "train")])
    found = unexplained(ga.find_episodes(t, v, events, peers=peers))
    assert [e.kind for e in found] == ["drop"]
    assert abs(found[0].start - 60) <= 4


def test_a_gap_in_the_readings_does_not_split_a_burst() -> None:
    t, v, events = training()
    v[600:615] += 20
    keep = np.ones(t.size, bool)
    keep[604:613] = False  # the sensor skipped 9 readings inside the 15-s burst
    found = unexplained(ga.find_episodes(t[keep], v[keep], events))
    assert len(found) == 1 and found[0].start == 600 and found[0].end >= 614


def test_evals_too_short_to_show_do_not_open_an_idle_gap() -> None:
    # 1-s evals every 20 s between blocks, read every 2 s: a throttle across them is found.
    t = np.arange(0, 600, 2.0)
    rng = np.random.default_rng(1)
    v = 7000 + rng.normal(0, 20, t.size)
    phases = [ga.Phase(s + 1.0, s + 20.0, "train") for s in range(0, 600, 20)]
    phases += [ga.Phase(s, s + 1.0, "eval") for s in range(20, 600, 20)]
    v[(t >= 300) & (t < 400)] *= 0.7
    found = unexplained(ga.find_episodes(t, v, ga.RunEvents(phases=phases)))
    assert [e.kind for e in found] == ["drop"] and 295 <= found[0].start <= 305


def test_an_idle_rise_is_setup_only_when_it_lasts_until_idle_ends() -> None:
    t = np.arange(-60, 360, 2.0)
    rng = np.random.default_rng(2)
    v = np.where((t >= -30) & (t < 0), 2600.0, np.where((t >= 0) & (t < 300), 7000.0, 2100.0))
    v = v + rng.normal(0, 10, t.size)
    phases = [ga.Phase(-30, 0, "init"), ga.Phase(0, 300, "train")]
    events = ga.RunEvents(phases=phases)
    # The next job's setup: up to the init level and staying there until the readings end.
    setup = v.copy()
    setup[t >= 330] += 450
    assert unexplained(ga.find_episodes(t, setup, events)) == []
    # Foreign work on the idle node: the same rise, over before idle ends.
    foreign = v.copy()
    foreign[(t >= 316) & (t < 340)] += 450
    found = unexplained(ga.find_episodes(t, foreign, events))
    assert [e.phase for e in found] == ["idle"]
    # Foreign work on top of the next job's setup: above the setup level for 12 of its 28 s.
    on_top = setup.copy()
    on_top[(t >= 340) & (t < 352)] += 500
    found = unexplained(ga.find_episodes(t, on_top, events))
    assert [e.phase for e in found] == ["idle"]
    # A rise that lasts until the readings end but stays well below the init level (+10% of
    # the floor, not the +24% of a job's setup) is not a job starting.
    low = v.copy()
    low[t >= 330] += 210
    found = unexplained(ga.find_episodes(t, low, events))
    assert [e.phase for e in found] == ["idle"]


def test_the_warm_up_lasts_as_long_as_the_runs_own_ramp() -> None:
    rng = np.random.default_rng(4)
    t = np.arange(0, 600, 1.0)
    ramp = np.minimum(1.0, t / 20.0) * 70  # the whole run warms up over 20 s
    peers = ramp + rng.normal(0, 0.5, t.size)
    v = ramp + rng.normal(0, 1.0, t.size)
    events = ga.RunEvents(phases=[ga.Phase(0, 600, "train")])
    # The ramp itself is the run's own, however long it takes to settle.
    assert unexplained(ga.find_episodes(t, v, events)) == []
    # Foreign work once the readings have settled, still within a fixed 30-s window (which
    # explained it): found on a lone series, and against peers.
    v[(t >= 22) & (t < 36)] += 15
    for with_peers in (None, peers):
        found = unexplained(ga.find_episodes(t, v, events, peers=with_peers))
        assert len(found) == 1 and abs(found[0].start - 22) <= 2


def _lone_node_burst(
    *, seed: int, start: float, end: float
) -> tuple[np.ndarray, np.ndarray, ga.RunEvents]:
    """Single-node power read every 2 s: init, training that ramps in one reading, and a +20%
    burst over [start, end) s of training."""
    rng = np.random.default_rng(seed)
    t = np.arange(-40, 400, 2.0)
    v = np.where(t < 0, 2600.0, 7000.0) + rng.normal(0, 20, t.size)
    v[(t >= start) & (t < end)] *= 1.2
    return t, v, ga.RunEvents(phases=[ga.Phase(-40, 0, "init"), ga.Phase(0, 400, "train")])


def test_a_burst_soon_after_a_fast_ramp_is_found_on_a_lone_series() -> None:
    # Single-node power read every 2 s: training ramps in one reading, a +20% burst 10 s in.
    t, v, events = _lone_node_burst(seed=5, start=10, end=24)
    found = unexplained(ga.find_episodes(t, v, events))
    assert [e.kind for e in found] == ["burst"] and abs(found[0].start - 10) <= 2


def skipping_sensor(seed: int) -> tuple[np.ndarray, np.ndarray, ga.RunEvents]:
    """Power read every 2 s, ~6200 W, the sensor skipping 4 readings once a minute."""
    rng = np.random.default_rng(seed)
    t = np.arange(0, 600, 2.0)
    v = 6200 + rng.normal(0, 40, t.size)
    keep = np.ones(t.size, bool)
    for s in range(50, 600, 60):
        keep[(t > s) & (t < s + 10)] = False
    return t[keep], v[keep], ga.RunEvents(phases=[ga.Phase(0, 600, "train")])


def test_a_strong_short_burst_across_skipped_readings_is_found() -> None:
    # A 10-s +20% burst from 46 s: the sensor skips 52-58 s, leaving three readings of it
    # (6 s from the first to one period after the last: under the 8-s minimum).
    t, v, events = skipping_sensor(6)
    burst = (t >= 46) & (t < 56)
    assert burst.sum() == 3
    v[burst] *= 1.2
    found = unexplained(ga.find_episodes(t, v, events))
    assert [e.kind for e in found] == ["burst"] and abs(found[0].start - 46) <= 2


@pytest.mark.parametrize(
    ("times", "factor", "kind"),
    [
        ((104.0, 106.0, 108.0), 1.055, "weak blip"),  # three readings just past the band
        ((200.0,), 1.3, "one reading"),
        ((300.0, 302.0, 304.0), 0.7, "a short strong drop: the run's own stall"),
    ],
)
def test_short_departures_without_enough_evidence_are_not_episodes(
    times: tuple[float, ...], factor: float, kind: str
) -> None:
    t, v, events = skipping_sensor(7)
    v[np.isin(t, times)] *= factor
    assert unexplained(ga.find_episodes(t, v, events)) == [], kind


def test_an_eval_overlapping_the_next_epoch_ends_when_the_epoch_starts() -> None:
    # The last eval is logged until 330 s, but the next epoch starts at 320 s and the power
    # goes back to training: a later phase wins where logged intervals overlap.
    rng = np.random.default_rng(8)
    t = np.arange(0, 340, 2.0)
    v = np.where((t >= 280) & (t < 320), 3600.0, 7000.0) + rng.normal(0, 20, t.size)
    phases = [ga.Phase(0, 280, "train"), ga.Phase(280, 330, "eval"), ga.Phase(320, 340, "train")]
    assert ga.phase_labels(np.array([300.0, 325.0]), phases).tolist() == ["eval", "train"]
    assert unexplained(ga.find_episodes(t, v, ga.RunEvents(phases=phases))) == []


def test_a_weak_burst_over_a_short_eval_is_found_against_peers() -> None:
    # 2-s readings, a 4-reading eval every 40 s whose first reading is taken mid-transition
    # (the peers, read at other instants, caught it elsewhere on the slope); a +11% burst
    # covering one eval. The edge readings are not the eval's noise.
    rng = np.random.default_rng(9)
    t = np.arange(0, 600, 2.0)
    base = np.full(t.size, 6250.0)
    phases = [ga.Phase(0, 600, "train")]
    for s in range(40, 600, 40):
        base[(t >= s) & (t < s + 8)] = 5300.0
        phases.append(ga.Phase(s - 0.5, s + 7.5, "eval"))
    edge = np.isin(t, np.arange(40, 600, 40))
    peers = base + rng.normal(0, 30, t.size)
    v = base + rng.normal(0, 40, t.size)
    peers[edge] = 5300 + rng.uniform(0, 900, edge.sum())
    v[edge] = 5300 + rng.uniform(0, 900, edge.sum())
    events = ga.RunEvents(phases=phases)
    assert unexplained(ga.find_episodes(t, v, events, peers=peers)) == []
    v[(t >= 320) & (t < 330)] *= 1.11
    found = unexplained(ga.find_episodes(t, v, events, peers=peers))
    assert [e.kind for e in found] == ["burst"] and 318 <= found[0].start <= 324


def test_a_throttle_over_most_of_a_lone_run_is_found_against_where_it_settled() -> None:
    # One node, no peers: a throttle over the last two thirds of training is the regime's
    # mode; the run settled at its usual level first, and the throttle is the departure.
    rng = np.random.default_rng(3)
    t = np.arange(300, dtype=float)
    v = 70 + rng.normal(0, 0.7, t.size)
    v[100:] *= 0.75
    events = ga.RunEvents(phases=[ga.Phase(0, 300, "train")])
    found = unexplained(ga.find_episodes(t, v, events))
    assert [e.kind for e in found] == ["drop"]
    assert abs(found[0].start - 100) <= 2


def test_foreign_work_over_the_start_of_training_is_not_the_warm_up() -> None:
    # A lone node read every 2 s: a +20% burst from the first reading of training for 16 s.
    # The run's ramp rises to its level; readings above it are past the ramp, so the warm-up
    # does not stretch over them.
    t, v, events = _lone_node_burst(seed=6, start=0, end=16)
    found = unexplained(ga.find_episodes(t, v, events))
    assert [e.kind for e in found] == ["burst"] and abs(found[0].start) <= 2


def test_a_lone_runs_level_is_found_behind_a_throttle_and_its_own_dips() -> None:
    # A lone node read every 2 s, a 4-s dip every 18 s (short evals, not logged), throttled
    # from 60 s on: the throttle is the mode and its own dips the mode of what is left, so the
    # untouched training is only the third level the regime holds.
    rng = np.random.default_rng(7)
    t = np.arange(0, 400, 2.0)
    v = np.where(t % 18 < 4, 5000.0, 7000.0) + rng.normal(0, 15, t.size)
    v[t >= 60] *= 0.8
    events = ga.RunEvents(phases=[ga.Phase(0, 400, "train")])
    found = unexplained(ga.find_episodes(t, v, events))
    assert found and all(e.kind == "drop" for e in found)
    # It may take in the run's own dip just before it (54-58 s).
    assert 52 <= found[0].start <= 60 and found[0].end >= 398


def test_a_throttle_over_most_evals_is_held_against_the_peers_in_them_too() -> None:
    # Power read every 2 s; 8-s evals, which the peers enter a reading earlier or later (their
    # clocks and ramps differ), so the ratio to the peers swings at every eval's edges. A
    # throttle over four of the five evals: the evals' usual ratio is the untouched one, and
    # the throttle is one drop, not five split at the evals.
    rng = np.random.default_rng(8)
    t = np.arange(0, 320, 2.0)
    starts = [60, 120, 180, 240, 300]

    def node(shifts: list[int]) -> np.ndarray:
        v = np.full(t.size, 6300.0)
        for s, shift in zip(starts, shifts, strict=True):
            v[(t >= s + shift) & (t < s + 8 + shift)] = 5300.0
            v[(t >= s + shift) & (t < s + 2 + shift)] = 5800.0  # falling into it
        return v

    v = node([0] * 5) + rng.normal(0, 20, t.size)
    peers = node([-2, 2, -2, 2, -2]) + rng.normal(0, 10, t.size)
    v[(t >= 24) & (t < 296)] *= 0.82
    phases = [ga.Phase(0, 320, "train")] + [ga.Phase(s, s + 8, "eval") for s in starts]
    found = unexplained(ga.find_episodes(t, v, ga.RunEvents(phases=phases), peers=peers))
    assert [(e.kind, e.start, e.end) for e in found] == [("drop", 24.0, 296.0)]


def test_a_burst_settled_between_two_levels_at_a_phase_edge_is_found() -> None:
    # A lone node read every 2 s: a 40-s eval at about half the training power. A +15% burst
    # over the eval's last 10 s holds the readings between the eval's level and the training's,
    # within the phase-edge tolerance of training: not a ramp (they do not move), so it is held
    # against either side, not the whole span between them.
    rng = np.random.default_rng(10)
    t = np.arange(0, 400, 2.0)
    v = np.where((t >= 280) & (t < 320), 3600.0, 7000.0) + rng.normal(0, 20, t.size)
    v[t == 280] = 4400.0  # the ramp into the eval: one reading mid-way
    v[t == 320] = 5900.0  # and back out of it
    phases = [ga.Phase(0, 400, "train"), ga.Phase(279.5, 319.5, "eval")]
    events = ga.RunEvents(phases=phases)
    assert unexplained(ga.find_episodes(t, v, events)) == []
    v[(t >= 310) & (t < 320)] *= 1.15
    found = unexplained(ga.find_episodes(t, v, events))
    assert [e.kind for e in found] == ["burst"] and 310 <= found[0].start <= 314


def _run_end(seed: int) -> tuple[np.ndarray, np.ndarray, ga.RunEvents]:
    """A lone node read every 2 s: its floor (2.2 kW), init at 2.6 kW, training at 7 kW until
    300 s, then the job's teardown at its init level for 8 s, the floor for 12 s and a next
    job's setup (init level) to the end of the readings."""
    rng = np.random.default_rng(seed)
    t = np.arange(-80, 380, 2.0)
    v = np.select(
        [t < -40, t < 0, t < 300, t < 310, t < 322],
        [2200.0, 2600.0, 7000.0, 2600.0, 2200.0],
        2600.0,
    ) + rng.normal(0, 15, t.size)
    v[t == 300] = 5200.0  # the ramp down: one reading mid-way
    phases = [ga.Phase(-40, 0, "init"), ga.Phase(0, 299.5, "train")]
    return t, v, ga.RunEvents(phases=phases)


def test_a_burst_over_the_ramp_down_after_a_run_is_found_but_its_teardown_is_not() -> None:
    # The teardown at the setup level within the phase-edge tolerance is the job's own (a side
    # of the boundary, like the init level); a +16% burst over the ramp down and the teardown,
    # all within the tolerance, lifts the teardown's settled readings above every side.
    t, v, events = _run_end(11)
    assert unexplained(ga.find_episodes(t, v, events)) == []
    v[(t >= 300) & (t < 310)] *= 1.16
    found = unexplained(ga.find_episodes(t, v, events))
    assert [e.phase for e in found] == ["idle"] and 300 <= found[0].start <= 304


def test_the_warm_up_does_not_cover_the_first_readings_at_the_level() -> None:
    # A lone node read every 2 s whose training ramps in one reading (at 0 s): the warm-up
    # ends at the first reading at (or past) the level, 2 s. A +20% burst over that reading
    # and the next two (three strong readings, evidence enough anywhere in training) is foreign
    # work; a period past the warm-up's end covered two of them, and one reading left is no
    # episode.
    t, v, events = _lone_node_burst(seed=12, start=2, end=8)
    v[t == 0] = 4800.0  # the ramp: one reading mid-way
    found = unexplained(ga.find_episodes(t, v, events))
    assert [e.kind for e in found] == ["burst"] and found[0].start == 2
