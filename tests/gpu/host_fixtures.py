"""A host fed through the GPU write path (no agent): the trainer's run on GPUs 0 and 1, two newer
runs registered on the same kernel that never used its GPUs, and a stranger's 40-s burst on
GPU 1 during the trainer's checkpoint on GPU 0; checked once by the real GPU check."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from forecasting.gpu.check import gpu_check_host
from tracker.gpu.services import host_batch_ingest, host_register, run_process_record
from tracker.models import Event, Project
from tracker.services import from_epoch, run_start

BOOT = "boot-node-3"
TRAINER, STRANGER = 4242, 5151
SPAN_S = 600
BUSY = (300, 340)  # the trainer's checkpoint on GPU 0, a stranger's burst on GPU 1


def _run(project: Project, run_id: str, start: float, hosts: list[str], ns_pid: int) -> Any:
    run = run_start(
        project=project,
        public_id=run_id,
        session="s1",
        started_at=from_epoch(start),
        fields={"name": run_id, "total_steps": 1000, "hosts": hosts},
    ).run
    # Every run started on the machine shares its kernel's boot id.
    run_process_record(run=run, session="s1", host=hosts[0], info={"key": [BOOT, ns_pid, 1000]})
    return run


@pytest.fixture
def gpu_host(project: Project) -> dict[str, Any]:
    """node-3: the trainer on GPUs 0 and 1, two more runs registered on its kernel that never
    used its GPUs, and a stranger's 40-s burst on GPU 1 during the trainer's checkpoint."""
    t0 = time.time() - SPAN_S
    host, _ = host_register(
        project=project, name="node-3", boot_id=BOOT, gpus=[{"index": 0}, {"index": 1}]
    )
    trainer = _run(project, "pretrain", t0 - 60, ["node-3"], 17)
    _run(project, "bystander-a", t0 - 30, ["node-3"], 18)
    _run(project, "bystander-b", t0 - 20, ["login-1"], 19)
    busy = lambda t: (t >= t0 + BUSY[0]) & (t < t0 + BUSY[1])  # noqa: E731
    processes = {
        TRAINER: {"key": [BOOT, 17, 1000], "cmdline": "python train.py", "user": "ml"},
        STRANGER: {"key": [BOOT, 99, 5000], "cmdline": "python sweep.py --trial 7", "user": "ge"},
    }
    for seq, b0 in enumerate(range(0, SPAN_S, 10)):
        t = t0 + np.arange(b0, b0 + 10, dtype=float)
        jitter = (t - t0) % 5 * 0.3
        gpu0 = 55.0 + jitter + np.where(busy(t), 37.0, 0.0)
        gpu1 = 55.0 + jitter
        series = {
            "gpu/0/util": (t, gpu0),
            "gpu/1/util": (t, gpu1 + np.where(busy(t), 37.0, 0.0)),
            f"gpu/0/proc/{TRAINER}/sm": (t, gpu0),
            f"gpu/1/proc/{TRAINER}/sm": (t, gpu1),
        }
        seen = [TRAINER]
        if busy(t).any():
            series[f"gpu/1/proc/{STRANGER}/sm"] = (t[busy(t)], np.full(busy(t).sum(), 37.0))
            seen.append(STRANGER)
        infos = [{**processes[p], "pid": p, "time": float(t[0])} for p in seen]
        host_batch_ingest(host=host, session="agent", seq=seq, series=series, processes=infos)
    Event.objects.create(
        run=trainer,
        kind="checkpoint",
        step=BUSY[1],
        time=from_epoch(t0 + BUSY[1]),
        payload={"duration_s": BUSY[1] - BUSY[0]},
    )
    gpu_check_host(host_id=host.pk)
    return {"project": project, "host": host, "t0": t0}
