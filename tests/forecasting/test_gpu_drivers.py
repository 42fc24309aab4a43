"""Which process moved each GPU during an episode, and the verdict per GPU it decides
(forecasting.estimators.gpu_attribution: gpu_drivers, split_by_driver, moved_gpus)."""

from __future__ import annotations

import numpy as np

from forecasting.estimators import gpu_attribution as gattr

seconds = np.arange(0.0, 200.0)
TRAINER, STRANGER, OTHER = 100, 200, 300
OWNERS = {TRAINER: ("run", "r1"), OTHER: ("other_run", "r2")}


def sm(level: float, extra: float = 0.0, lo: float = 120, hi: float = 160) -> np.ndarray:
    return np.where((seconds >= lo) & (seconds < hi), level + extra, level)


def drivers(processes: gattr.ProcessSeries, gpus: list[int]) -> dict[int, gattr.Driver]:
    return gattr.gpu_drivers(
        processes, OWNERS, gpus, 120.0, 160.0, before_s=60.0, foreign_min_sm_s=40.0
    )


def test_a_stranger_drives_its_gpu_while_the_trainer_drives_its_own() -> None:
    on_stranger = (seconds >= 120) & (seconds < 160)
    processes = {
        (0, TRAINER): (seconds, sm(55.0, 35.0)),  # the run's checkpoint lifts GPU 0
        (1, TRAINER): (seconds, sm(55.0)),  # flat: it did not move GPU 1
        (1, STRANGER): (seconds[on_stranger], np.full(on_stranger.sum(), 37.0)),
    }
    found = drivers(processes, [0, 1])
    assert (found[0].pid, found[0].owner, found[0].foreign) == (TRAINER, "run", False)
    assert found[0].sm_seconds == 35.0 * 40
    assert (found[1].pid, found[1].owner, found[1].foreign) == (STRANGER, "unknown", True)
    parts = gattr.split_by_driver([0, 1], True, "checkpoint", found)
    verdicts = [(p.gpus, p.explained, p.reason, p.driver and p.driver.pid) for p in parts]
    assert verdicts == [([0], True, "checkpoint", TRAINER), ([1], False, "", STRANGER)]


def test_a_stranger_wins_over_the_runs_own_rise_on_the_same_gpu() -> None:
    processes = {(0, TRAINER): (seconds, sm(55.0, 30.0)), (0, STRANGER): (seconds, sm(0.0, 10.0))}
    found = drivers(processes, [0])
    assert found[0].pid == STRANGER and found[0].foreign


def test_a_stranger_too_small_to_matter_leaves_the_runs_verdict() -> None:
    # 1% of the SM for 40 s: 40 SM-percent-seconds is the least that counts; this is 40 x 0.5.
    processes = {(0, TRAINER): (seconds, sm(55.0, 30.0)), (0, STRANGER): (seconds, sm(0.0, 0.5))}
    found = drivers(processes, [0])
    assert found[0].pid == TRAINER
    (part,) = gattr.split_by_driver([0], True, "eval", found)
    assert (part.explained, part.reason) == (True, "eval")


def test_another_runs_process_is_that_runs_work() -> None:
    processes = {(0, TRAINER): (seconds, sm(55.0)), (0, OTHER): (seconds, sm(0.0, 30.0))}
    (part,) = gattr.split_by_driver([0], False, "", drivers(processes, [0]))
    assert (part.explained, part.reason, part.driver and part.driver.pid) == (True, "run r2", OTHER)


def test_without_process_data_the_runs_events_decide() -> None:
    found = drivers({(0, TRAINER): (seconds, sm(55.0, 30.0))}, [0, 1])
    assert set(found) == {0}
    parts = gattr.split_by_driver([0, 1], True, "checkpoint", found)
    assert [(p.gpus, p.explained) for p in parts] == [([0], True), ([1], True)]
    assert parts[1].driver is None


def test_moved_gpus_are_those_whose_own_level_moved() -> None:
    matrix = np.vstack([sm(55.0, 35.0), sm(55.0, 2.0), sm(0.0, 8.0)])
    moved = gattr.moved_gpus(
        seconds, matrix, [0, 1, 2], 120.0, 160.0, before_s=60.0, rel=0.1, points=5.0
    )
    assert moved == [0, 2]


def test_a_stranger_that_started_just_before_the_episode_is_held_against_its_absence() -> None:
    # On the GPU from 2 s before the episode was found: its two readings there are not its level.
    present = seconds >= 118
    processes = {
        (0, TRAINER): (seconds, sm(55.0, 30.0)),
        (0, STRANGER): (seconds[present], np.full(present.sum(), 37.0)),
    }
    found = drivers(processes, [0])
    assert found[0].pid == STRANGER and found[0].foreign


def test_a_stranger_inside_the_utilisation_band_is_still_an_unexplained_episode() -> None:
    # +6 points on a GPU at 70% for 90 s: inside the band (10% of the level), so no episode on
    # utilisation; the process data says a process of no run used the GPU all that time.
    from forecasting.estimators import gpu_activity as ga
    from forecasting.estimators.gpu_activity import host

    grid = np.arange(1000.0, 1600.0)
    on = (grid >= 1300) & (grid < 1390)
    trainer = 70.0 + np.sin(grid / 7)
    matrix = np.vstack([trainer, trainer + np.where(on, 6.0, 0.0)])
    processes = {
        (0, TRAINER): (grid, trainer),
        (1, TRAINER): (grid, trainer),
        (1, STRANGER): (grid[on], np.full(on.sum(), 6.0)),
    }
    events = ga.RunEvents(phases=[ga.Phase(900.0, 1700.0, "train")])
    found = host.host_episodes(grid, matrix, [0, 1], events, processes={}, owners=OWNERS)
    assert found == []  # power alone: nothing departs
    found = host.host_episodes(grid, matrix, [0, 1], events, processes=processes, owners=OWNERS)
    assert len(found) == 1
    (part,) = found[0].parts
    assert (part.gpus, part.explained, part.driver and part.driver.pid) == ([1], False, STRANGER)
    assert (found[0].episode.start, found[0].episode.end) == (1300.0, 1390.0)
