"""Done-when (issue 28): per-process data decides. The real agent (NVML faked at its one seam)
and the real training client against the live server, the real sweep: a process of no run
drives GPU 1 to 92% while the trainer's checkpoint lifts GPU 0. The checkpoint explains GPU 0,
naming the trainer's process and the event; GPU 1 is unexplained, naming the stranger."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import runcast
import runcast.run
from runcast.agent import Agent
from runcast.settings import Settings

from forecasting import tasks
from forecasting.models import Flag
from tests.client.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tests.gpu.test_end_to_end import Clock, sweep  # noqa: F401 - the stranger's process
from tracker.models import ApiToken, GpuEpisode, Host, Project
from tracker.services import token_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.eager]

SPAN_S = 300
BUSY = (150, 190)  # seconds into the timeline: the checkpoint on GPU 0, the stranger on GPU 1
TRAIN_SM = 55.0
EXTRA = 37.0  # 55 + 37: GPU 1 at 92%


def test_a_strangers_burst_during_the_runs_checkpoint_is_unexplained_on_its_gpu(
    live_server: Any,
    tmp_path: Path,
    sweep: int,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = Project.objects.create(slug="hpc", name="HPC")
    token = token_create(project=project, name="t", scope=ApiToken.Scope.WRITE)
    settings = Settings(
        url=live_server.url, token=token, dir=tmp_path / "spool", flush_interval=0.05
    )
    start = time.time() - SPAN_S
    clock = Clock(start)

    def busy() -> bool:
        return BUSY[0] <= clock.now - start < BUSY[1]

    def trainer_gpu0(t: float) -> float:
        return TRAIN_SM + (EXTRA if busy() else 0.0) + (clock.now - start) % 5 * 0.3

    def trainer_gpu1(t: float) -> float:
        return TRAIN_SM + (clock.now - start) % 5 * 0.3

    def stranger(t: float) -> float:
        return EXTRA if busy() else -1.0  # -1: not on the GPU

    trainer = os.getpid()
    gpu0 = FakeGpu(util=trainer_gpu0, processes=[FakeProcess(trainer, trainer_gpu0)])
    gpu1 = FakeGpu(
        util=lambda t: trainer_gpu1(t) + max(0.0, stranger(t)),
        processes=[FakeProcess(trainer, trainer_gpu1), FakeProcess(sweep, stranger)],
    )
    nvml = FakeNvml([gpu0, gpu1], clock)
    run = runcast.init(
        project="hpc", id="pretrain", total_steps=1000, settings=settings, started_at=start
    )
    agent = Agent(settings, nvml=nvml, host="node-3", interval=0.0)
    # The trainer's clock is the timeline's (its events take the time they are logged at).
    monkeypatch.setattr(runcast.run, "_time", SimpleNamespace(time=clock))
    for second in range(SPAN_S):
        clock.now = start + second
        agent.sample(clock.now)
        if second % 10 == 0:
            run.log({"loss": 3.0 - second * 1e-3}, step=second)
        if second == BUSY[1]:
            # Logged once written, with how long it took (its window reaches back over it).
            run.event("checkpoint", step=second, duration_s=BUSY[1] - BUSY[0])
    run.finish()
    agent.start()  # after the run's sender: SQLite takes one writer at a time
    agent.close(timeout=90.0)

    host = Host.objects.get(project=project, name="node-3")
    tasks.sweep_gpu_hosts()
    tasks.sweep_gpu_hosts()  # a second sweep changes nothing

    episodes = list(GpuEpisode.objects.filter(host=host))
    described = [(e.gpus, e.explained, e.reason, e.start - start) for e in episodes]
    unexplained = [e for e in episodes if not e.explained]
    assert len(unexplained) == 1, described
    foreign = unexplained[0]
    assert foreign.gpus == [1], described
    assert abs(foreign.start - start - BUSY[0]) <= 5, described
    assert foreign.attribution["driver"]["pid"] == sweep
    assert foreign.attribution["driver"]["owner"] == "unknown"
    assert foreign.text.startswith("GPU 1 on node-3"), foreign.text
    assert f"pid {sweep} `python sweep.py --trial 7`" in foreign.text, foreign.text
    assert "not part of any run" in foreign.text

    ckpt = [e for e in episodes if e.explained and e.start < start + BUSY[1]]
    assert [e.gpus for e in ckpt] == [[0]], described
    assert ckpt[0].attribution["driver"]["pid"] == trainer
    assert ckpt[0].attribution["driver"]["owner"] == "run"
    assert ckpt[0].attribution["event"]["kind"] == "checkpoint"
    assert ckpt[0].reason.startswith("checkpoint at "), ckpt[0].reason
    assert f"pid {trainer}" in ckpt[0].reason

    flags = Flag.objects.filter(run__public_id="pretrain", kind=Flag.Kind.GPU_UNEXPLAINED)
    assert [f.data["gpus"] for f in flags] == [[1]]
