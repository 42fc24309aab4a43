"""A process of no run busy on a run's GPU is an unexplained episode even where the GPU's
utilisation stays in its band, stored once however long it runs (the check reads a sliding
half hour: a stranger busy for hours starts at every window's start)."""

from __future__ import annotations

import numpy as np
import pytest

from forecasting.estimators import thresholds as th
from forecasting.gpu.check import gpu_check_host
from tests.gpu.host_fixtures import BOOT, STRANGER, TRAINER, _run
from tracker.gpu.services import host_batch_ingest, host_register
from tracker.models import GpuEpisode, Project

pytestmark = pytest.mark.django_db

T0 = 1_800_000_000.0
SPAN_S = 3000  # longer than the check's window


def _host(project: Project, stranger_from: float) -> tuple[int, float]:
    """GPU 0 at 70% under the trainer; from `stranger_from` s on, a stranger adds 6 points."""
    host, _ = host_register(project=project, name="node-7", boot_id=BOOT, gpus=[{"index": 0}])
    _run(project, "pretrain", T0 - 60, ["node-7"], 17)
    infos = {
        TRAINER: {"key": [BOOT, 17, 1000], "cmdline": "python train.py"},
        STRANGER: {"key": [BOOT, 99, 5000], "cmdline": "python notebook.py"},
    }
    for seq, b0 in enumerate(range(0, SPAN_S, 30)):
        t = T0 + np.arange(b0, b0 + 30, dtype=float)
        trainer = 70.0 + np.sin(t / 7)
        there = t >= T0 + stranger_from
        series = {
            f"gpu/0/proc/{TRAINER}/sm": (t, trainer),
            "gpu/0/util": (t, trainer + np.where(there, 6.0, 0.0)),
        }
        pids = [TRAINER]
        if there.any():
            series[f"gpu/0/proc/{STRANGER}/sm"] = (t[there], np.full(there.sum(), 6.0))
            pids.append(STRANGER)
        processes = [{**infos[p], "pid": p, "time": float(t[0])} for p in pids]
        host_batch_ingest(host=host, session="a", seq=seq, series=series, processes=processes)
    return host.pk, T0 + SPAN_S


def test_a_stranger_inside_the_band_is_stored_once_across_sweeps(project: Project) -> None:
    host_id, end = _host(project, stranger_from=SPAN_S - 600)
    for now in (end, end + 300, end + 900):  # the window slides; the start stays inside it
        gpu_check_host(host_id=host_id, now=now)
    (row,) = GpuEpisode.objects.filter(host_id=host_id)
    assert (row.gpus, row.explained, row.attribution["driver"]["pid"]) == ([0], False, STRANGER)
    assert row.start == T0 + SPAN_S - 600
    assert "pid 5151 `python notebook.py`" in row.text, row.text


def test_a_stranger_that_began_before_the_window_is_not_stored_again(project: Project) -> None:
    host_id, end = _host(project, stranger_from=0)
    assert end - T0 > th.GPU_CHECK_LOOKBACK_S
    for now in (end, end - 300):
        gpu_check_host(host_id=host_id, now=now)
    assert not GpuEpisode.objects.filter(host_id=host_id).exists()
