"""The straggler flag on the real database: rank timings in, a flag with the what-if finish out."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from forecasting import selectors
from forecasting.estimators import formatting as fmt
from forecasting.models import Flag, Forecast
from forecasting.stragglers import whatif_eta
from tests.forecasting.test_services import (
    T0,
    at,
    compute_sustained,
    healthy_loss,
    make_run,
    send,
)
from tracker.models import Deadline
from tracker.services import RankTimingsIn, rank_timings_ingest

pytestmark = pytest.mark.django_db

RANKS = 8
HOSTS = [f"node-{r // 4}" for r in range(RANKS)]


def send_timings(run, start, stop, *, slow_rank=None, slow_from=None, factor=1.3, seed=0):
    """Every rank's compute time over [start, stop), 20 steps a batch as the client sends them;
    `slow_rank` takes `factor` times longer from `slow_from` on."""
    rng = np.random.default_rng(seed)
    for rank in range(RANKS):
        for first in range(start, stop, 20):
            steps = np.arange(first, min(first + 20, stop))
            compute = 0.8 * (1 + rng.normal(0, 0.01, steps.size))
            if rank == slow_rank:
                compute = np.where(steps >= slow_from, compute * factor, compute)
            wait = 1.0 - compute
            rank_timings_ingest(
                run=run,
                session=f"rank-{rank}",
                seq=first // 20 + 1,
                timings=RankTimingsIn(
                    rank=rank,
                    local_rank=rank % 4,
                    host=HOSTS[rank],
                    steps=steps,
                    compute=compute,
                    wait=wait,
                    total=np.full(steps.size, np.nan),
                ),
            )


def test_a_slow_rank_raises_a_flag_with_the_whatif_finish_and_resolves_when_it_recovers(project):
    Deadline.objects.create(
        project=project, slug="eval", name="blind eval", cutoff=at(9500), buffer=timedelta(0)
    )
    run = make_run(project, deadline="eval")
    steps = np.arange(4000)
    send(run, steps, healthy_loss(steps), seq=1)
    send_timings(run, 0, 4000, slow_rank=5, slow_from=3000)

    compute_sustained(run, 4000)

    flag = selectors.flags_open(run=run)[Flag.Kind.STRAGGLER]
    assert flag.state == Flag.State.RAISED
    assert flag.data["ranks"] == [5] and flag.data["host"] == "node-1"
    assert 0.2 <= flag.data["slowdown"] <= 0.4
    # The window holds steps 2,000-3,999: the onset is inside it and not after the slowdown.
    assert flag.onset_step is not None and 2000 <= flag.onset_step <= 3100
    assert flag.data["whatif_finish_p50"] < flag.data["finish_p50"]
    assert flag.data["whatif_p_on_time"] >= flag.data["p_on_time"]
    text = fmt.render_stamps(flag.explanation)
    assert "rank 5 on node-1 is" in text and "slower since step" in text
    assert "without it: finish" in text and "UTC" in text and "P on time" in text
    # The stored text holds a stamp, not the project's zone: each reader renders its own.
    assert fmt.stamp_parts(flag.explanation)[1] == (
        flag.data["whatif_finish_p50"] // 60 * 60,
        False,
    )
    whatif = Forecast.objects.filter(run=run, kind=Forecast.Kind.STRAGGLER).latest("computed_at")
    assert whatif.finish_p50 == pytest.approx(whatif.data["whatif_finish_p50"])
    # One raise, however many computations saw it.
    assert Flag.objects.filter(run=run, kind=Flag.Kind.STRAGGLER).count() == 1

    more = np.arange(4000, 7000)
    send(run, more, healthy_loss(more), seq=2)
    send_timings(run, 4000, 7000, seed=1)
    compute_sustained(run, 7000)
    compute_sustained(run, 7100)

    rows = list(Flag.objects.filter(run=run, kind=Flag.Kind.STRAGGLER).order_by("created_at"))
    assert [r.state for r in rows] == [Flag.State.RAISED, Flag.State.RESOLVED]


def test_a_run_without_rank_timings_gets_no_straggler_forecast(project):
    run = make_run(project)
    steps = np.arange(3000)
    send(run, steps, healthy_loss(steps), seq=1)
    compute_sustained(run, 3000)
    assert not Forecast.objects.filter(run=run, kind=Forecast.Kind.STRAGGLER).exists()
    assert Flag.Kind.STRAGGLER not in selectors.flags_open(run=run)


def test_whatif_scales_only_the_compute_part_of_the_remaining_time():
    from forecasting.estimators.eta import EtaForecast

    eta = EtaForecast(
        now=T0,
        current_step=100,
        total_steps=1000,
        rate_steps_per_s=1.0,
        compute_p10=800,
        compute_p50=900,
        compute_p90=1000,
        wall_p10=900,
        wall_p50=1000,
        wall_p90=1200,
        interruptions_seen=0,
        downtime_s=0,
        lost_steps=0,
    )
    better = whatif_eta(eta, 0.8)
    assert better.wall_p50 == pytest.approx(1000 - 900 * 0.2)
    assert better.wall_p90 == pytest.approx(1200 - 1000 * 0.2)
    assert whatif_eta(eta, 1.0).wall_p50 == eta.wall_p50
