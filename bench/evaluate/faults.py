"""Inject the faults real clusters add to a clean run's timeline, deterministically by seed.

Sizes are relative to the run (its duration D and its steps S), so a 10-minute speedrun and a
26-hour run get comparable trouble:

* slowdown: with probability 1/2, from a step in 10-90% of S on, every step is 5-30% slower
  (a throttled GPU, a slow node, a noisy neighbour);
* restarts: 0-2 (probabilities 0.5/0.35/0.15): the job dies, is down for 1-10% of D, and resumes
  from a checkpoint 1-5% of S back; the lost steps are recomputed at the run's own pace;
* downtime gaps: 0-2 (0.3/0.4/0.3): the job hangs or is preempted for 2-20% of D, no progress.

Event positions are uniform over the run, so a forecast at a cut-off sees some and not others,
as in life. Durations are log-uniform (many short, few long).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FaultLog:
    slowdown: float  # 1.0 = none
    restarts: int
    gaps: int


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def run_rng(seed: int, name: str) -> np.random.Generator:
    """One generator per run, so a run's faults do not depend on which other runs are loaded."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def slowdown(s: np.ndarray, t: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    if rng.random() >= 0.5:
        return t, 1.0
    factor = float(rng.uniform(1.05, 1.30))
    lo, hi = float(s.min()), float(s.max())
    from_step = lo + rng.uniform(0.1, 0.9) * (hi - lo)
    i = int(np.searchsorted(s, from_step))  # steps are monotone in a clean timeline
    if i >= s.size:
        return t, 1.0
    out = t.copy()
    out[i:] = t[i - 1 if i > 0 else 0] + (t[i:] - t[i - 1 if i > 0 else 0]) * factor
    return out, factor


def _restart(
    s: np.ndarray, t: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    span_t = float(t[-1] - t[0])
    span_s = float(s.max() - s.min())
    i = int(np.searchsorted(t, t[0] + rng.uniform(0.05, 0.95) * span_t))
    i = min(max(i, 2), s.size - 1)
    ckpt = max(float(s[0]), float(s[i - 1]) - _log_uniform(rng, 0.01, 0.05) * span_s)
    down = _log_uniform(rng, 0.01, 0.10) * span_t
    return rollback(s, t, i, ckpt, down)


def rollback(
    s: np.ndarray, t: np.ndarray, i: int, ckpt: float, down: float
) -> tuple[np.ndarray, np.ndarray]:
    """The job dies after point i - 1 of a monotone timeline, is down for `down` s, and resumes
    from step `ckpt`: the steps since it are recomputed at the run's own pace, then the rest
    follows, shifted by the downtime and the redone work."""
    # Time at which the clean run passed the checkpoint step (monotone history before i).
    t_ckpt = float(np.interp(ckpt, s[:i], t[:i]))
    redo = np.flatnonzero(s[:i] > ckpt)
    restart_t = float(t[i - 1]) + down
    new_s: list[np.ndarray] = [s[:i], np.array([ckpt]), s[redo]]
    new_t: list[np.ndarray] = [t[:i], np.array([restart_t]), restart_t + (t[redo] - t_ckpt)]
    shift = down + float(t[i - 1]) - t_ckpt
    new_s.append(s[i:])
    new_t.append(t[i:] + shift)
    return np.concatenate(new_s), np.concatenate(new_t)


def _gap(s: np.ndarray, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    span_t = float(t[-1] - t[0])
    i = int(np.searchsorted(t, t[0] + rng.uniform(0.05, 0.95) * span_t))
    i = min(max(i, 1), s.size - 1)
    out = t.copy()
    out[i:] += _log_uniform(rng, 0.02, 0.20) * span_t
    return out


def inject_faults(
    steps: np.ndarray, times: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, FaultLog]:
    """Return a faulted copy of a clean (monotone) timeline and what was injected."""
    s = np.asarray(steps, dtype=float).copy()
    t = np.asarray(times, dtype=float).copy()
    t, factor = slowdown(s, t, rng)
    restarts = int(rng.choice(3, p=[0.5, 0.35, 0.15]))
    gaps = int(rng.choice(3, p=[0.3, 0.4, 0.3]))
    # Restarts first: each needs a monotone stretch before it, which the first one guarantees
    # and later ones find because they land on the already faulted (longer) timeline.
    for _ in range(restarts):
        if s.size < 4:
            break
        s, t = _restart_safe(s, t, rng)
    for _ in range(gaps):
        t = _gap(s, t, rng)
    return s, t, FaultLog(slowdown=factor, restarts=restarts, gaps=gaps)


def _restart_safe(
    s: np.ndarray, t: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A restart on a timeline that may already hold one: interpolate on its last clean run."""
    drops = np.flatnonzero(np.diff(s) < 0)
    if drops.size == 0:
        return _restart(s, t, rng)
    head = drops[-1] + 1  # the last monotone stretch starts after the latest rollback
    tail_s, tail_t = _restart(s[head:], t[head:], rng)
    return np.concatenate((s[:head], tail_s)), np.concatenate((t[:head], tail_t))
