"""Attribution scored on the host agent's own traces: the real runcast agent with its fake NVML
(tests/client/fake_nvml.py, the one seam) samples seeded hosts, and the server's host-level
check (forecasting.estimators.gpu_activity.host.host_episodes) judges them twice: with the
agent's per-process data and on each GPU's power alone (what a node's power log gives).

Each host: 2-8 GPUs, the run's trainer on all of them at 40-70% SM, its checkpoint lifting
GPU 0 (or every GPU) by 20-35 points for 15-60 s, logged when written with its duration; and,
on most hosts, a process of no run adding 15-40 points on some GPUs for 10-120 s, during the
checkpoint (the case of issue 28: the run's event explained the stranger's burst) or apart from
it, or a weak one adding 5.5-9 points apart from it (inside the utilisation band). Scored per
(burst, GPU): found when an unexplained part on that GPU overlaps the burst, named when that
part names the stranger's pid; and the checkpoint's GPUs the stranger left alone must stay
explained.

Used by bench/gpu_activity.py (its `gpu_agent_attribution` section).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from forecasting.estimators import gpu_activity as ga
from forecasting.estimators import gpu_attribution as gattr
from forecasting.estimators.gpu_activity import host as ga_host

ROOT = Path(__file__).resolve().parents[1]
SPAN_S = 480
START = 1_800_000_000.0  # the fake clock's epoch: any fixed time


@dataclass
class Burst:
    gpus: list[int]
    start: float
    end: float
    during_event: bool
    weak: bool = False  # 5.5-9 points: inside the utilisation band (10% of a 40-70% level)


@dataclass
class Host:
    gpus: int
    ckpt_gpus: list[int]
    ckpt: tuple[float, float]
    burst: Burst | None
    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def _scenario(rng: np.random.Generator) -> Host:
    gpus = int(rng.integers(2, 9))
    c0 = START + float(rng.uniform(120, 360))
    ckpt = (c0, c0 + float(rng.uniform(15, 60)))
    ckpt_gpus = [0] if rng.random() < 0.5 else list(range(gpus))
    case = str(rng.choice(["during", "apart", "weak", "none"], p=[0.4, 0.25, 0.2, 0.15]))
    length = float(np.exp(rng.uniform(np.log(10), np.log(120))))
    if case == "during":
        b0: float | None = ckpt[0] + float(rng.uniform(-5, 5))
    else:
        # Apart: 90 s or more from the checkpoint (its event window, 60 s, does not reach it),
        # 20 s or more inside the trace.
        spans = [(START + 20, ckpt[0] - 90 - length), (ckpt[1] + 90, START + SPAN_S - 20 - length)]
        spans = [(a, b) for a, b in spans if b > a]
        b0 = float(rng.uniform(*spans[int(rng.integers(len(spans)))])) if spans else None
    burst = None
    if case != "none" and b0 is not None:
        size = int(rng.integers(1, gpus + 1))
        on = sorted(rng.choice(gpus, size=size, replace=False).tolist())
        burst = Burst(on, b0, b0 + length, case == "during", case == "weak")
    return Host(gpus, ckpt_gpus, ckpt, burst)


def _record(rng: np.random.Generator, host: Host, trainer: int, stranger: int, spool: Path) -> None:
    """Run the real agent over the scenario, one sample a second, and keep what it queued."""
    sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "client")) if p not in sys.path]
    from runcast.agent import Agent
    from runcast.settings import Settings

    from tests.client.fake_nvml import FakeGpu, FakeNvml, FakeProcess

    level = float(rng.uniform(40, 70))
    lift = float(rng.uniform(20, 35))
    extra = float(rng.uniform(5.5, 9) if host.burst and host.burst.weak else rng.uniform(15, 40))
    phase = rng.uniform(0, 2 * np.pi, host.gpus)
    burst = host.burst

    def trainer_sm(gpu: int) -> Any:
        def sm(t: float) -> float:
            lifted = gpu in host.ckpt_gpus and host.ckpt[0] <= t < host.ckpt[1]
            return level + (lift if lifted else 0.0) + 1.5 * float(np.sin(t / 7 + phase[gpu]))

        return sm

    def stranger_sm(gpu: int) -> Any:
        def sm(t: float) -> float:
            busy = burst is not None and gpu in burst.gpus and burst.start <= t < burst.end
            return extra if busy else -1.0  # -1: not on the GPU

        return sm

    def util(gpu: int) -> Any:
        return lambda t: min(100.0, trainer_sm(gpu)(t) + max(0.0, stranger_sm(gpu)(t)))

    clock = [START]
    fakes = [
        FakeGpu(
            util=util(g),
            processes=[FakeProcess(trainer, trainer_sm(g)), FakeProcess(stranger, stranger_sm(g))],
        )
        for g in range(host.gpus)
    ]
    nvml = FakeNvml(fakes, clock=lambda: clock[0])
    agent = Agent(Settings(url=None, token=None, dir=spool), nvml=nvml, host="bench", interval=0)
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for second in range(SPAN_S):
        clock[0] = START + second
        agent.sample(clock[0])
        while agent.queue:
            _, _, when, data = agent.queue.popleft()
            if isinstance(data, dict):
                for key, value in data.items():
                    points[key].append((when, value))
    host.series = {
        k: (np.array([p[0] for p in v]), np.array([p[1] for p in v])) for k, v in points.items()
    }


def _judge(host: Host, trainer: int, with_processes: bool) -> list[ga_host.HostEpisode]:
    if with_processes:
        util = gattr.per_second(host.series)
        processes = gattr.process_series(host.series)
    else:
        power = {k.replace("/power_w", "/util"): v for k, v in host.series.items()}
        util = gattr.per_second({k: v for k, v in power.items() if k.endswith("/util")})
        processes = {}
    gpus = sorted(util)
    grid, matrix = ga_host.grid_of(util, gpus)
    # As the server builds them (forecasting.gpu.check._run_events): the run's span as
    # training, each event a mark, a duration widening its window backwards.
    events = ga.RunEvents(
        phases=[ga.Phase(START - 60, START + SPAN_S + 1, "train")],
        marks=[ga.Mark(host.ckpt[1], "checkpoint", before_s=host.ckpt[1] - host.ckpt[0])],
    )
    owners = {trainer: ("run", "bench-run")}
    return ga_host.host_episodes(grid, matrix, gpus, events, processes=processes, owners=owners)


def _score(hosts: list[Host], found: list[list[ga_host.HostEpisode]], stranger: int) -> dict:
    pairs = named = 0
    hits = {"during": [0, 0], "apart": [0, 0], "weak": [0, 0]}
    own = [0, 0]
    false_parts = 0
    for host, episodes in zip(hosts, found, strict=True):
        unexplained = [(e.episode, p) for e in episodes for p in e.parts if not p.explained]
        burst = host.burst
        if burst is not None:
            key = "during" if burst.during_event else ("weak" if burst.weak else "apart")
            for gpu in burst.gpus:
                over = [
                    p
                    for e, p in unexplained
                    if gpu in p.gpus and e.start < burst.end and e.end > burst.start
                ]
                hits[key][1] += 1
                hits[key][0] += bool(over)
                pairs += bool(over)
                named += any(p.driver is not None and p.driver.pid == stranger for p in over)
        alone = [g for g in host.ckpt_gpus if burst is None or g not in burst.gpus]
        for gpu in alone:
            own[1] += 1
            own[0] += not any(
                gpu in p.gpus and e.start < host.ckpt[1] and e.end > host.ckpt[0]
                for e, p in unexplained
            )
        for e, p in unexplained:
            if burst is None or not (
                set(p.gpus) & set(burst.gpus) and e.start < burst.end and e.end > burst.start
            ):
                false_parts += 1
    total = sum(of for _, of in hits.values())
    return {
        "foreign_recall": round(pairs / total, 3) if total else None,
        "foreign_recall_during_event": _share(*hits["during"]),
        "foreign_recall_apart": _share(*hits["apart"]),
        "foreign_recall_weak": _share(*hits["weak"]),
        "foreign_named": round(named / pairs, 3) if pairs else 0.0,
        "own_checkpoint_explained": _share(*own),
        "false_unexplained_parts": false_parts,
    }


def _share(hit: int, of: int) -> float | None:
    return round(hit / of, 3) if of else None


def agent_attribution(rng: np.random.Generator, hosts: int) -> dict:
    """The `gpu_agent_attribution` section: the same hosts with process data and power alone,
    and the ratio of the first to the second where it has one."""
    # The stranger is a real process (the agent reads its /proc), not this one's child in
    # anything but name: ownership here comes from the owners map, not its ancestry.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    trainer = os.getpid()
    scenarios = [_scenario(rng) for _ in range(hosts)]
    try:
        with tempfile.TemporaryDirectory() as spool:
            for host in scenarios:
                _record(rng, host, trainer, stranger.pid, Path(spool))
    finally:
        stranger.kill()
        stranger.wait()
    process = _score(scenarios, [_judge(h, trainer, True) for h in scenarios], stranger.pid)
    power = _score(scenarios, [_judge(h, trainer, False) for h in scenarios], stranger.pid)
    bursts = [h.burst for h in scenarios if h.burst is not None]
    return {
        "hosts": hosts,
        "host_hours": round(hosts * SPAN_S / 3600, 2),
        "bursts": len(bursts),
        "burst_gpus": sum(len(b.gpus) for b in bursts),
        "bursts_during_event": sum(b.during_event for b in bursts),
        "bursts_weak": sum(b.weak for b in bursts),
        "process_data": process,
        "power_alone": power,
        "recall_ratio_process_to_power": (
            round(process["foreign_recall"] / power["foreign_recall"], 2)
            if process["foreign_recall"] and power["foreign_recall"]
            else None
        ),
    }
