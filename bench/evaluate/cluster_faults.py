"""Interruptions as large training clusters report them: the "realistic" timing kind of
`bench.evaluate`, beside today's stress model (`faults.py`).

The stress model gives every run 0-2 restarts and 0-2 gaps sized as shares of its length, so a
7-minute speedrun gets as many outages as a 26-hour run (1.65 on average). Clusters report a
rate per GPU-hour instead; a job's rate is that times its GPUs:

* Llama 3 405B (Dubey et al. 2024, "The Llama 3 Herd of Models", table 5): 419 unexpected
  interruptions in 54 days on 16,384 H100s: 419 / (54 x 24 x 16,384) = 1.97e-5 per GPU-hour.
* OPT-175B (Zhang et al. 2022, section 2.5, and its logbook): at least 35 manual restarts and
  over 100 hosts cycled in about 2 months on 992 A100s (2.4e-5 to 6.9e-5); in its worst
  stretch "40+ restarts" between the November 17 and December 3, 2021 updates (1.05e-4).
* BLOOM-176B (BigScience 2022, 384 A100s for 3.5 months): GPU failures of the order of one or
  two a week, 1.5e-5 to 3.1e-5.
* GLM-130B (its training diary, in the curve set as glm-130b__main-log-restarts): 12 documented
  node failures in 53.8 days on 96 DGX-A100 nodes (768 GPUs): 1.2e-5.

Each run draws its rate log-uniform over that range (RATE_PER_GPU_HOUR), once. A failure stops
the job for RECOVERY_S (log-uniform, minutes to an hour: detection, rescheduling, reloading)
and it resumes from its last checkpoint, taken every CHECKPOINT_EVERY_S of training; the work
since then is recomputed. Slowdowns are today's (`faults.slowdown`: p = 1/2, 5-30% from a
random step on).

The GPUs of a run: from its file name where it says (`8xH100`, MLPerf's `_n64_` nodes,
`v5p-1024` TensorCores, `Gaudi2-N128` nodes) or from its source's documentation (GLM-130B: 96
nodes; BLOOM-176B: 48 nodes; the NanoGPT speedrun and parameter-golf record tracks: 8 H100s);
DEFAULT_GPUS (one 8-GPU node) otherwise.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

import numpy as np

from bench.evaluate.faults import rollback, slowdown

RATE_PER_GPU_HOUR = (1.2e-5, 1.05e-4)  # GLM-130B's diary to OPT-175B's worst fortnight
RECOVERY_S = (300.0, 3600.0)  # 5 minutes to an hour
CHECKPOINT_EVERY_S = 1800.0  # of training time; a job shorter than this loses all it did
DEFAULT_GPUS = 8  # one node, when neither the run nor its source says
GPUS_PER_NODE = 8

# (pattern on the run's file name, GPUs per matched number or None for a fixed count, count).
_GPU_RULES: tuple[tuple[str, float | None, int], ...] = (
    (r"(\d+)xh100", 1.0, 0),  # parameter-golf's "1xh100", "8xH100"
    (r"_n(\d+)_", GPUS_PER_NODE, 0),  # MLPerf NVIDIA: eos_n64 = 64 nodes
    (r"gaudi2-n(\d+)", GPUS_PER_NODE, 0),  # MLPerf Intel: HLS-Gaudi2-N128 = 128 nodes
    (r"tpu-v5p-(\d+)", 0.5, 0),  # a v5p-N slice counts TensorCores, two per chip
    (r"(\d+)xsmc", GPUS_PER_NODE, 0),  # MLPerf Supermicro: 64xSMC-H100 = 64 nodes
    (r"glm-130b", None, 768),
    (r"tr11-176b", None, 384),
    (r"modded-nanogpt", None, 8),
)


def gpus_for(file: str) -> int:
    """The run's GPUs (accelerators), as its name or its source documents them."""
    name = file.lower()
    for pattern, per, fixed in _GPU_RULES:
        match = re.search(pattern, name)
        if match is None:
            continue
        if per is None:
            return fixed
        return max(1, round(int(match.group(1)) * per))
    return DEFAULT_GPUS


def cluster_rng(seed: int, name: str) -> np.random.Generator:
    """Independent of the stress model's stream, so adding this kind changes no stress figure."""
    return np.random.default_rng([seed, zlib.crc32(name.encode()), 1])


@dataclass(frozen=True)
class ClusterLog:
    slowdown: float  # 1.0 = none
    interruptions: int
    rate_per_hour: float  # the job's interruption rate (per wall-clock hour)


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(math.log(lo), math.log(hi))))


def inject_cluster_faults(
    steps: np.ndarray, times: np.ndarray, gpus: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, ClusterLog]:
    """A faulted copy of a clean (monotone) timeline: today's slowdown, then failures at the
    run's rate per wall-clock hour, each losing the work since its last checkpoint."""
    if gpus < 1:
        raise ValueError(f"gpus: must be at least 1, got {gpus}")
    s = np.asarray(steps, dtype=float).copy()
    t = np.asarray(times, dtype=float).copy()
    t, factor = slowdown(s, t, rng)
    rate_h = _log_uniform(rng, *RATE_PER_GPU_HOUR) * gpus
    start, span = float(t[0]), float(t[-1] - t[0])
    count = int(rng.poisson(rate_h * span / 3600.0))
    # Failure times on the run's own clock (training time since its start), in order.
    when = np.sort(rng.uniform(0.0, span, count))
    shift = 0.0  # how far the faulted clock runs behind the unfaulted one after each failure
    done = 0
    for at in when:
        # Checkpoints every CHECKPOINT_EVERY_S of training; the time since the last is lost.
        lost = at - math.floor(at / CHECKPOINT_EVERY_S) * CHECKPOINT_EVERY_S
        down = _log_uniform(rng, *RECOVERY_S)
        fail_t = start + at + shift
        head = _last_stretch(s)
        i = head + int(np.searchsorted(t[head:], fail_t))
        if i - head < 2 or i >= s.size:
            continue  # before the stretch has two points, or after the run's last one
        ckpt_t = max(float(t[head]), float(t[i - 1]) - lost)
        ckpt = float(np.interp(ckpt_t, t[head:i], s[head:i]))
        tail_s, tail_t = rollback(s[head:], t[head:], i - head, ckpt, down)
        s, t = np.concatenate((s[:head], tail_s)), np.concatenate((t[:head], tail_t))
        shift += down + (float(t[i - 1]) - ckpt_t)
        done += 1
    return s, t, ClusterLog(slowdown=factor, interruptions=done, rate_per_hour=rate_h)


def _last_stretch(s: np.ndarray) -> int:
    """Index where the last monotone stretch starts (after the latest rollback)."""
    drops = np.flatnonzero(np.diff(s) < 0)
    return int(drops[-1] + 1) if drops.size else 0
