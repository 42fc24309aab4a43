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
    judged = [HostEpisode(e, _parts(e, on, processes, owners)) for e, on in found]
    return judged + _stranger_episodes(grid, matrix, gpus, processes, owners, judged, settings)


def _stranger_episodes(
    grid: np.ndarray,
    matrix: np.ndarray,
    gpus: list[int],
    processes: gattr.ProcessSeries,
    owners: Mapping[int, tuple[str, str | None]],
    judged: list[HostEpisode],
    settings: Settings,
) -> list[HostEpisode]:
    """A process of no run busy on a GPU where no episode already names it there: unexplained,
    whether or not the GPU's utilisation left its band (per-process data decides where it
    exists). One episode per process, over the GPUs where its stretches overlap."""
    stretches = gattr.foreign_stretches(
        processes,
        owners,
        floor=th.GPU_FOREIGN_FLOOR,
        min_s=settings.min_duration_s,
        gap_s=settings.merge_gap_s,
        min_sm_s=th.GPU_FOREIGN_MIN_SM_S,
    )

    def named(s: gattr.Stretch) -> bool:
        return any(
            s.gpu in p.gpus
            and p.driver is not None
            and p.driver.pid == s.pid
            and h.episode.start < s.end
            and s.start < h.episode.end
            for h in judged
            for p in h.parts
        )

    groups: list[list[gattr.Stretch]] = []
    for s in sorted((s for s in stretches if not named(s)), key=lambda s: (s.pid, s.start)):
        last = groups[-1] if groups else None
        if last and last[0].pid == s.pid and s.start < max(x.end for x in last):
            last.append(s)
        else:
            groups.append([s])
    return [_stranger_episode(grid, matrix, gpus, group, settings) for group in groups]


def _stranger_episode(
    grid: np.ndarray,
    matrix: np.ndarray,
    gpus: list[int],
    group: list[gattr.Stretch],
    settings: Settings,
) -> HostEpisode:
    start, end = min(s.start for s in group), max(s.end for s in group)
    on = sorted({s.gpu for s in group if s.gpu in gpus})
    rows = matrix[[gpus.index(g) for g in on]] if on else matrix
    inside = _mean(rows[:, (grid >= start) & (grid < end)])
    before = _mean(rows[:, (grid >= start - th.GPU_ATTRIBUTION_BEFORE_S) & (grid < start)])
    inside, before = inside[np.isfinite(inside)], before[np.isfinite(before)]
    observed = float(np.median(inside)) if inside.size else float("nan")
    expected = float(np.median(before)) if before.size else 0.0
    first = group[0]
    episode = Episode(
        start=start,
        end=end,
        kind="plateau" if end - start > settings.plateau_s else "burst",
        phase="",
        explained=False,
        reason="",
        detected_at=start + settings.min_duration_s,
        expected=expected,
        observed=observed,
        delta_rel=(observed - expected) / expected if expected else 0.0,
        peak=float(inside.max()) if inside.size else float("nan"),
        samples=int(inside.size),
    )
    driver = gattr.Driver(first.gpu, first.pid, "unknown", None, sum(s.sm_seconds for s in group))
    return HostEpisode(episode, [gattr.EpisodePart(on, False, "", driver)])


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
