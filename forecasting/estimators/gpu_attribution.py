"""Whose work is on a GPU: each interval's activity split into the run, other runs and unknown.

Identity of a process across PID namespaces (containers): the kernel's boot id, the pid as the
process sees it (the last NSpid entry the host agent reads from /proc/<pid>/status) and its start
time in clock ticks since boot (/proc/<pid>/stat field 22, the same number in every namespace).
The training client records that triple for itself (and for its launcher parent: torchrun,
deepspeed, mpirun ...); the host agent reports it for every GPU process and its ancestors, plus
RUNCAST_RUN_ID when /proc/<pid>/environ is readable (multi-node ranks that never call init()).
A process belongs to a run when it, or one of its ancestors, matches one of the run's triples, or
its environment names the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ProcessKey = tuple[str, int, int]  # (boot id, namespace pid, start ticks)


@dataclass(frozen=True)
class ProcessSample:
    time: float
    gpu: int
    pid: int  # host pid
    sm: float  # percent of the GPU's SM time over the sample period (NVML smUtil)
    memory_bytes: float = 0.0
    key: ProcessKey | None = None
    ancestors: tuple[ProcessKey, ...] = ()
    env_run: str | None = None  # RUNCAST_RUN_ID from the process environment, when readable


@dataclass
class PidShare:
    pid: int
    owner: str  # "run" | "other_run" | "unknown"
    run_id: str | None
    sm_seconds: float


@dataclass
class Attribution:
    # SM-percent x seconds per owner class: 100 for one second is one fully busy GPU-second.
    totals: dict[str, float] = field(
        default_factory=lambda: {"run": 0.0, "other_runs": 0.0, "unknown": 0.0}
    )
    by_pid: dict[int, PidShare] = field(default_factory=dict)

    def top_unknown(self) -> PidShare | None:
        unknown = [p for p in self.by_pid.values() if p.owner == "unknown"]
        return max(unknown, key=lambda p: p.sm_seconds) if unknown else None

    def fraction(self, owner: str) -> float:
        total = sum(self.totals.values())
        return self.totals[owner] / total if total else 0.0


def owner_of(
    sample: ProcessSample,
    own: Mapping[ProcessKey, str] | Iterable[ProcessKey] | set[int],
    other_runs: Mapping[ProcessKey, str] | Mapping[int, str],
    run_id: str | None = None,
) -> tuple[str, str | None]:
    """("run" | "other_run" | "unknown", run id)."""
    chain: list = [sample.key, *sample.ancestors] if sample.key else []
    own_set = set(own)
    # Without namespace keys (tests, old agents) host pids identify processes.
    if sample.pid in own_set or any(k in own_set for k in chain if k):
        return "run", run_id
    if sample.env_run is not None and sample.env_run == run_id:
        return "run", run_id
    for candidate in [sample.pid, *chain]:
        if candidate in other_runs:
            return "other_run", other_runs[candidate]  # type: ignore[index]
    if sample.env_run is not None:
        return "other_run", sample.env_run
    return "unknown", None


def attribute(
    samples: Sequence[ProcessSample],
    own: Iterable[ProcessKey] | set[int],
    other_runs: Mapping[ProcessKey, str] | Mapping[int, str],
    *,
    run_id: str | None = None,
    period_s: float = 1.0,
) -> Attribution:
    """Sum each process's SM share over the samples, by owner."""
    own_set: set[Any] = set(own)
    result = Attribution()
    for s in samples:
        owner, rid = owner_of(s, own_set, other_runs, run_id)
        amount = max(0.0, s.sm) * period_s
        result.totals[_bucket(owner)] += amount
        share = result.by_pid.get(s.pid)
        if share is None:
            share = result.by_pid[s.pid] = PidShare(s.pid, owner, rid, 0.0)
        share.sm_seconds += amount
    return result


def _bucket(owner: str) -> str:
    return {"run": "run", "other_run": "other_runs"}.get(owner, "unknown")


def split_gpu_activity(
    gpu_util: float, process_sm: Mapping[int, float], process_memory: Mapping[int, float]
) -> dict[int, float]:
    """Split one GPU sample's utilisation among its processes.

    NVML's per-process SM shares are sampled on their own clock and do not always add up to the
    device's utilisation (or are missing: MIG, older drivers). Scale them to the device figure;
    without any, split by memory used (the best proxy for who is resident).
    """
    total = sum(max(0.0, v) for v in process_sm.values())
    if total > 0:
        return {pid: gpu_util * max(0.0, v) / total for pid, v in process_sm.items()}
    memory = sum(max(0.0, v) for v in process_memory.values())
    if memory > 0:
        return {pid: gpu_util * max(0.0, v) / memory for pid, v in process_memory.items()}
    return {}


# -- synthetic traces for the bench and tests ------------------------------------------------


@dataclass
class SyntheticTrace:
    samples: list[ProcessSample]
    own_pids: set[int]
    other_runs: dict[int, str]
    foreign_pid: int
    truth: dict[str, float]


def synthetic_trace(rng: np.random.Generator, gpus: int = 8, seconds: int = 600) -> SyntheticTrace:
    """A host with a run on every GPU (its pid and a data-loader child), sometimes another run
    on some GPUs, and one unknown process bursting on a few GPUs at a random time."""
    boot = "boot-" + str(int(rng.integers(1 << 30)))
    run_pid, child = 4000 + int(rng.integers(1000)), 6000 + int(rng.integers(1000))
    run_key = (boot, 17, 1000)
    other_pid, foreign = 8000 + int(rng.integers(1000)), 41230 + int(rng.integers(1000))
    other_on = set(rng.choice(gpus, size=int(rng.integers(0, 3)), replace=False).tolist())
    burst_gpus = set(rng.choice(gpus, size=int(rng.integers(1, gpus + 1)), replace=False).tolist())
    b0 = int(rng.integers(0, seconds - 120))
    b1 = b0 + int(rng.integers(10, 120))
    samples: list[ProcessSample] = []
    truth = {"run": 0.0, "other_runs": 0.0, "unknown": 0.0}
    for t in range(seconds):
        for g in range(gpus):
            run_sm = float(np.clip(rng.normal(70, 5), 0, 100))
            samples.append(ProcessSample(t, g, run_pid, run_sm, key=run_key))
            # The data-loader child: matched through its ancestor, not its own pid.
            samples.append(
                ProcessSample(t, g, child, 2.0, key=(boot, 30, 2000), ancestors=(run_key,))
            )
            truth["run"] += run_sm + 2.0
            if g in other_on:
                samples.append(ProcessSample(t, g, other_pid, 10.0))
                truth["other_runs"] += 10.0
            if g in burst_gpus and b0 <= t < b1:
                sm = float(rng.uniform(15, 30))
                samples.append(ProcessSample(t, g, foreign, sm))
                truth["unknown"] += sm
    # The run registered its own key from inside its container (namespace pid 17).
    own = {run_key}
    return SyntheticTrace(
        samples=samples,
        own_pids=own,  # type: ignore[arg-type]
        other_runs={other_pid: "other-run"},
        foreign_pid=foreign,
        truth=truth,
    )
