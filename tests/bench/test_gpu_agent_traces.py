"""bench/gpu_agent_traces.py: the fake-NVML agent's hosts judged with process data and on power
alone. With process data a stranger's burst during the run's checkpoint is unexplained and
named; on power alone the checkpoint explains it (issue 28), and the checkpoint's own GPUs stay
explained either way."""

from __future__ import annotations

import numpy as np

from bench import gpu_agent_traces as traces


def test_process_data_finds_and_names_a_burst_the_runs_checkpoint_hides_on_power_alone() -> None:
    rng = np.random.default_rng(3)
    hosts = [traces._scenario(rng) for _ in range(6)]
    during = [h for h in hosts if h.burst is not None and h.burst.during_event]
    assert during, "the seed must give a burst during a checkpoint"
    section = traces.agent_attribution(np.random.default_rng(3), 6)
    assert section["bursts_during_event"] == len(during)
    process, power = section["process_data"], section["power_alone"]
    assert process["foreign_recall_during_event"] == 1.0
    assert process["foreign_named"] == 1.0
    assert power["foreign_recall_during_event"] == 0.0
    assert power["foreign_named"] == 0.0
    assert process["own_checkpoint_explained"] == 1.0
