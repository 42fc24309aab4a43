"""Which run a host's GPUs are held against: every run started on a machine shares its kernel's
boot id, so the newest run registered there need not be the one on its GPUs (issue 28: the host
page listed 11 runs, most never on that host)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gpu.host_fixtures import STRANGER, TRAINER, gpu_host  # noqa: F401
from tracker.models import GpuEpisode

pytestmark = pytest.mark.django_db


def test_the_gpus_are_held_against_the_run_on_them_not_the_newest_on_the_kernel(
    gpu_host: dict[str, Any],  # noqa: F811
) -> None:
    episodes = list(GpuEpisode.objects.filter(host=gpu_host["host"]).select_related("run"))
    # Two newer runs are registered on the kernel; the trainer's events explain its checkpoint.
    assert {e.run.public_id if e.run else None for e in episodes} == {"pretrain"}
    verdicts = sorted((e.gpus, e.explained, e.attribution["driver"]["pid"]) for e in episodes)
    assert verdicts == [([0], True, TRAINER), ([1], False, STRANGER)]
