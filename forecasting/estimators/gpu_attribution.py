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

import re
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


# -- the agent's series: utilisation per second, SM share per process -----------------------

_UTIL = re.compile(r"^gpu/(\d+)/util$")
_PROC_SM = re.compile(r"^gpu/(\d+)/proc/(\d+)/sm$")


def per_second(
    series: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each GPU's utilisation in 1-s bins (NVML's sub-second samples averaged)."""
    out = {}
    for key, (t, v) in series.items():
        match = _UTIL.match(key)
        if match and t.size:
            seconds = np.floor(t)
            keys, inverse = np.unique(seconds, return_inverse=True)
            sums = np.bincount(inverse, weights=v)
            counts = np.bincount(inverse)
            out[int(match.group(1))] = (keys, sums / counts)
    return out


def process_series(
    series: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """(gpu, pid) -> the process's SM-percent samples on that GPU."""
    out = {}
    for key, (t, v) in series.items():
        match = _PROC_SM.match(key)
        if match and t.size:
            out[(int(match.group(1)), int(match.group(2)))] = (t, v)
    return out


# -- which process moved each GPU during an episode -------------------------------------------

# (gpu, pid) -> (epoch times, SM percent): the agent's gpu/<i>/proc/<pid>/sm samples.
ProcessSeries = Mapping[tuple[int, int], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Driver:
    """What moved one GPU during an episode, from its per-process SM samples."""

    gpu: int
    pid: int | None  # None: no process on it rose over its own level
    owner: str  # "run" | "other_run" | "unknown"; "" when pid is None
    run_id: str | None
    sm_seconds: float  # SM-percent-seconds it added over its own level before the episode

    @property
    def foreign(self) -> bool:
        return self.pid is not None and self.owner == "unknown"


def gpu_drivers(
    processes: ProcessSeries,
    owners: Mapping[int, tuple[str, str | None]],
    gpus: Iterable[int],
    start: float,
    end: float,
    *,
    before_s: float,
    foreign_min_sm_s: float,
) -> dict[int, Driver]:
    """Per GPU with process samples over [start - before_s, end): the process that moved it.

    Each process is held against its own median over `before_s` before the episode (0 when it
    was absent from most of it: a stranger that started two seconds before the episode was
    found did not "hold" its level): a trainer at 55% did not move a GPU unless it rose. A
    process of no run (`owners` has no run for it) that added `foreign_min_sm_s` or more is the
    driver whatever the run's own processes did at the same time; otherwise the process that
    added most. GPUs without process samples (MIG, older drivers, power alone) are left out:
    the run's events are all there is to judge them by.
    """
    wanted = set(gpus)
    readings = _readings_before(processes, wanted, start, before_s)
    added: dict[int, dict[int, float]] = {}
    for (gpu, pid), (t, v) in processes.items():
        if gpu not in wanted:
            continue
        near = (t >= start - before_s) & (t < end)
        if not near.any():
            continue
        inside = near & (t >= start)
        before = near & ~inside
        present = before.sum() >= 0.5 * readings.get(gpu, 0)
        base = float(np.median(v[before])) if before.any() and present else 0.0
        period = float(np.median(np.diff(t[near]))) if near.sum() > 1 else 1.0
        rise = np.clip(v[inside] - base, 0.0, 100.0).sum() * min(max(period, 0.1), 10.0)
        added.setdefault(gpu, {})[pid] = float(rise)
    out = {}
    for gpu, by_pid in added.items():
        whose = {pid: owners.get(pid, ("unknown", None)) for pid in by_pid}
        foreign = [
            (amount, pid)
            for pid, amount in by_pid.items()
            if whose[pid][0] == "unknown" and amount >= foreign_min_sm_s
        ]
        amount, pid = max(foreign) if foreign else max((a, p) for p, a in by_pid.items())
        if amount <= 0:
            out[gpu] = Driver(gpu, None, "", None, 0.0)
        else:
            out[gpu] = Driver(gpu, pid, whose[pid][0], whose[pid][1], amount)
    return out


def _readings_before(
    processes: ProcessSeries, gpus: set[int], start: float, before_s: float
) -> dict[int, int]:
    """Per GPU, the most readings any process on it has over `before_s` before `start`: how
    many a process there all along has (the agent reads every process at each sample)."""
    out: dict[int, int] = {}
    for (gpu, _pid), (t, _v) in processes.items():
        if gpu in gpus:
            n = int(((t >= start - before_s) & (t < start)).sum())
            out[gpu] = max(out.get(gpu, 0), n)
    return out


@dataclass
class EpisodePart:
    """The GPUs of an episode that share one verdict and the process it names."""

    gpus: list[int]
    explained: bool
    reason: str
    driver: Driver | None  # None: no process data on these GPUs (the run's events decide)


def split_by_driver(
    gpus: Sequence[int], explained: bool, reason: str, drivers: Mapping[int, Driver]
) -> list[EpisodePart]:
    """One verdict per GPU, GPUs with the same verdict and process grouped.

    Where process data exists it decides: a process of no run makes its GPUs unexplained
    whatever the run logged then (its checkpoint explains the run's activity, not a
    stranger's); another run's process is that run's work; the run's own process, or none that
    rose, keeps the run's verdict from its events. Without process data the events decide.
    """
    parts: dict[tuple[bool, str, int | None, str], EpisodePart] = {}
    for gpu in gpus:
        driver = drivers.get(gpu)
        verdict = (explained, reason)
        if driver is not None and driver.foreign:
            verdict = (False, "")
        elif driver is not None and driver.owner == "other_run":
            verdict = (True, f"run {driver.run_id}")
        named = driver if driver is not None and driver.pid is not None else None
        key = (*verdict, named.pid if named else None, named.owner if named else "")
        part = parts.get(key)
        if part is None:
            part = parts[key] = EpisodePart([], verdict[0], verdict[1], named)
        part.gpus.append(gpu)
    return list(parts.values())


@dataclass(frozen=True)
class Stretch:
    """A process of no run busy on one GPU: its SM share at or above the floor throughout."""

    gpu: int
    pid: int
    start: float
    end: float
    sm_seconds: float


def foreign_stretches(
    processes: ProcessSeries,
    owners: Mapping[int, tuple[str, str | None]],
    *,
    floor: float,
    min_s: float,
    gap_s: float,
    min_sm_s: float,
) -> list[Stretch]:
    """Where a process of no run held `floor` % of a GPU's SM or more for `min_s` (readings
    `gap_s` apart at most) adding `min_sm_s` or more: unexplained whether or not the GPU's own
    utilisation departed from the run's (a stranger adding 8 points to a GPU at 60 % for five
    minutes stays inside the utilisation band)."""
    out = []
    for (gpu, pid), (t, v) in processes.items():
        if owners.get(pid, ("unknown", None))[0] != "unknown":
            continue
        busy = np.flatnonzero(v >= floor)
        if busy.size == 0:
            continue
        breaks = np.flatnonzero(np.diff(t[busy]) > gap_s)
        for a, b in zip(np.r_[0, breaks + 1], np.r_[breaks, busy.size - 1], strict=True):
            idx = busy[a : b + 1]
            period = float(np.median(np.diff(t[idx]))) if idx.size > 1 else 1.0
            start, end = float(t[idx[0]]), float(t[idx[-1]]) + period
            amount = float(np.clip(v[idx], 0.0, 100.0).sum()) * period
            if idx.size >= 2 and end - start >= min_s and amount >= min_sm_s:
                out.append(Stretch(gpu, pid, start, end, amount))
    return out


def moved_gpus(
    times: np.ndarray,
    matrix: np.ndarray,
    gpus: Sequence[int],
    start: float,
    end: float,
    *,
    before_s: float,
    rel: float,
    points: float,
) -> list[int]:
    """The GPUs (rows of `matrix`, read at `times`) whose median over [start, end) moved from
    their median over `before_s` before it by `rel` of that level or `points`, whichever is
    more: the GPUs an episode found on their mean is about."""
    inside = (times >= start) & (times < end)
    before = (times >= start - before_s) & (times < start)
    out = []
    for row, gpu in enumerate(gpus):
        now_v, then_v = matrix[row, inside], matrix[row, before]
        now_v, then_v = now_v[np.isfinite(now_v)], then_v[np.isfinite(then_v)]
        if not now_v.size:
            continue
        level = float(np.median(then_v)) if then_v.size else 0.0
        if abs(float(np.median(now_v)) - level) >= max(rel * abs(level), points):
            out.append(gpu)
    return out


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
