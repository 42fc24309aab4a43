"""The host-batch store's read: every key's points, whatever layouts the batches had."""

from __future__ import annotations

import numpy as np
import pytest

from tracker.gpu import selectors, services
from tracker.gpu.models import Host
from tracker.models import Project

pytestmark = pytest.mark.django_db


def _batch(t0: float, keys: dict[str, int]) -> selectors.Series:
    return {
        key: (t0 + np.arange(n, dtype=float), np.full(n, float(len(key) + n)))
        for key, n in keys.items()
    }


def test_it_reads_every_key_across_batches_of_different_layouts() -> None:
    host = Host.objects.create(project=Project.objects.create(slug="p", name="P"), name="n1")
    # A process appears in the second batch and is gone in the third; the third batch is short.
    layouts = [
        {"gpu/0/util": 10, "gpu/0/power_w": 10},
        {"gpu/0/util": 10, "gpu/0/power_w": 10, "gpu/0/proc/41/sm": 10},
        {"gpu/0/util": 4, "gpu/0/power_w": 4, "agent/cpu": 1},
    ]
    batches = [_batch(1000.0 + 10 * i, keys) for i, keys in enumerate(layouts)]
    # Stored out of time order, as a spool replay after an outage would.
    for seq in (2, 0, 1):
        services.host_batch_ingest(
            host=host, session="s", seq=seq, series=batches[seq], processes=[]
        )

    every = selectors.host_series(host=host, t0=0, t1=2e9)
    assert sorted(every) == ["agent/cpu", "gpu/0/power_w", "gpu/0/proc/41/sm", "gpu/0/util"]
    util_t, util_v = every["gpu/0/util"]
    assert np.array_equal(
        util_t, np.r_[1000 + np.arange(10), 1010 + np.arange(10), 1020 + np.arange(4)]
    )
    assert np.array_equal(util_v, np.r_[np.full(20, 20.0), np.full(4, 14.0)])
    assert np.array_equal(every["gpu/0/proc/41/sm"][0], 1010 + np.arange(10.0))

    gpu_only = selectors.host_series(host=host, t0=1005, t1=1012, prefix="gpu/0/p")
    assert sorted(gpu_only) == ["gpu/0/power_w", "gpu/0/proc/41/sm"]
    assert np.array_equal(gpu_only["gpu/0/power_w"][0], np.arange(1005.0, 1013.0))
    assert np.array_equal(gpu_only["gpu/0/proc/41/sm"][0], np.arange(1010.0, 1013.0))
    assert selectors.host_series(host=host, t0=0, t1=2e9, prefix="nothing/") == {}
