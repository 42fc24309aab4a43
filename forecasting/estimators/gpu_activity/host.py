"""A host's GPUs against one run's events: episodes on their mean and on each GPU (its other
GPUs as peers), each split by the process that moved its GPUs (gpu_attribution).

The server's check (forecasting.gpu.check) and the bench (bench/gpu_activity.py) run this same
function: the check on the agent's stored series, the bench on the fake-NVML agent's traces,
with process data and without it (power alone).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from forecasting.estimators import gpu_attribution as gattr
from forecasting.estimators import thresholds as th
from forecasting.estimators.gpu_activity.episodes import find_episodes
from forecasting.estimators.gpu_activity.model import Episode, RunEvents, Settings

# The estimator's settings on the server's 1-s bins (thresholds.py says why).
SERVER = Settings(
    tolerance_s=th.GPU_CHECK_TOLERANCE_S,
    event_window_s=th.GPU_EVENT_WINDOW_S,
    rel=th.GPU_CHECK_REL,
)


@dataclass
class HostEpisode:
    episode: Episode  # as found on the series it was found on (the GPUs' mean, or one GPU)
    parts: list[gattr.EpisodePart]  # its GPUs by verdict and the process named


def grid_of(
    util: Mapping[int, tuple[np.ndarray, np.ndarray]], gpus: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Per-second readings (gattr.per_second) on one 1-s grid: (times, GPUs x times)."""
    t0 = min(t[0] for t, _ in util.values())
    t1 = max(t[-1] for t, _ in util.values())
    grid = np.arange(t0, t1 + 1.0)
    matrix = np.full((len(gpus), grid.size), np.nan)
    for row, gpu in enumerate(gpus):
        t, v = util[gpu]
        matrix[row, (t - t0).astype(int)] = v
    return grid, matrix


def host_episodes(
    grid: np.ndarray,
    matrix: np.ndarray,
    gpus: list[int],
    events: RunEvents,
    *,
    processes: gattr.ProcessSeries,
    owners: Mapping[int, tuple[str, str | None]],
    settings: Settings = SERVER,
) -> list[HostEpisode]:
    """Every episode on the host's GPUs with its verdict per GPU.

    On the mean first (foreign work on every GPU at once has no peer to stand out against),
    then per GPU against its peers where no mean episode already covers that GPU then.
    `processes` empty: power alone, the run's events decide every GPU.
    """
    found: list[tuple[Episode, list[int]]] = []
    mean = _mean(matrix)
    for e in find_episodes(grid, mean, events, settings=settings):
        found.append((e, _gpus_in(grid, matrix, gpus, e, processes, owners)))
    for row, gpu in enumerate(gpus):
        others = np.delete(matrix, row, axis=0)
        peers = _median(others) if others.shape[0] >= 2 else None
        for e in find_episodes(grid, matrix[row], events, peers=peers, settings=settings):
            if any(_overlap(e, f) and gpu in on for f, on in found):
                continue
            # Against peers, a GPU left at its own level while most of the others rose (foreign
            # work on five of eight) departs from their median: the episode is theirs.
            if peers is not None and not _moved(grid, matrix[row : row + 1], [gpu], e):
                continue
            found.append((e, [gpu]))
    return [HostEpisode(e, _parts(e, on, processes, owners)) for e, on in found]


def _drivers(
    processes: gattr.ProcessSeries,
    owners: Mapping[int, tuple[str, str | None]],
    gpus: list[int],
    e: Episode,
) -> dict[int, gattr.Driver]:
    return gattr.gpu_drivers(
        processes,
        owners,
        gpus,
        e.start,
        e.end,
        before_s=th.GPU_ATTRIBUTION_BEFORE_S,
        foreign_min_sm_s=th.GPU_FOREIGN_MIN_SM_S,
    )


def _gpus_in(
    grid: np.ndarray,
    matrix: np.ndarray,
    gpus: list[int],
    e: Episode,
    processes: gattr.ProcessSeries,
    owners: Mapping[int, tuple[str, str | None]],
) -> list[int]:
    """The GPUs an episode found on their mean is about: those whose own level moved, and
    those a process of no run was busy on (foreign work is never folded into the run's)."""
    moved = _moved(grid, matrix, gpus, e)
    foreign = {g for g, d in _drivers(processes, owners, gpus, e).items() if d.foreign}
    return sorted(set(moved) | foreign) or list(gpus)


def _moved(grid: np.ndarray, matrix: np.ndarray, gpus: list[int], e: Episode) -> list[int]:
    return gattr.moved_gpus(
        grid,
        matrix,
        gpus,
        e.start,
        e.end,
        before_s=th.GPU_ATTRIBUTION_BEFORE_S,
        rel=th.GPU_MOVED_REL,
        points=th.GPU_MOVED_POINTS,
    )


def _parts(
    e: Episode,
    on: list[int],
    processes: gattr.ProcessSeries,
    owners: Mapping[int, tuple[str, str | None]],
) -> list[gattr.EpisodePart]:
    """The episode's GPUs, grouped by verdict and the process that moved them."""
    return gattr.split_by_driver(on, e.explained, e.reason, _drivers(processes, owners, on, e))


def _overlap(a: Episode, b: Episode) -> bool:
    return a.start < b.end and b.start < a.end


def _mean(matrix: np.ndarray) -> np.ndarray:
    """Per column, the mean of the finite readings (NaN where none: no warning for a second
    no GPU reported)."""
    finite = np.isfinite(matrix)
    counts = finite.sum(axis=0)
    sums = np.where(finite, matrix, 0.0).sum(axis=0)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _median(matrix: np.ndarray) -> np.ndarray:
    out = np.full(matrix.shape[1], np.nan)
    some = np.isfinite(matrix).any(axis=0)
    out[some] = np.nanmedian(matrix[:, some], axis=0)
    return out
