"""POST /api/v1/runs/{id}/timings: every rank's step timings under the run rank 0 created."""

from __future__ import annotations

import numpy as np
import pytest

from tracker import limits, rank_timings
from tracker.models import IngestBatch, RankTimingChunk, Run

pytestmark = pytest.mark.django_db


def create(api, token, run_id="run-1"):
    return api("POST", "/runs", token, {"id": run_id, "session": "s0", "total_steps": 1000})


def timings(api, token, run_id="run-1", *, rank=1, session=None, seq=1, **body):
    payload = {
        "session": session or f"rank{rank}",
        "seq": seq,
        "rank": rank,
        "local_rank": rank % 8,
        "host": f"node-{rank // 8}",
        "steps": [0, 1, 2],
        "compute_s": [0.5, 0.51, 0.49],
        "wait_s": [0.1, 0.09, 0.11],
        **body,
    }
    return api("POST", f"/runs/{run_id}/timings", token, payload)


def test_it_stores_a_ranks_timings_without_touching_the_runs_progress(api, write_token):
    create(api, write_token)
    res = timings(api, write_token, rank=9)
    assert res.status_code == 200, res.content
    assert res.json() == {"accepted": 3, "duplicate": False}
    chunk = RankTimingChunk.objects.get()
    assert (chunk.rank, chunk.local_rank, chunk.host) == (9, 1, "node-1")
    run = Run.objects.get()
    # Not an attempt, not progress, not a heartbeat: those stay rank 0's.
    assert run.current_segment == 1 and run.last_step is None and run.points_count == 0
    assert IngestBatch.objects.count() == 0


def test_it_ignores_a_retried_timings_batch(api, write_token):
    create(api, write_token)
    timings(api, write_token, rank=2)
    again = timings(api, write_token, rank=2)
    assert again.json() == {"accepted": 0, "duplicate": True}
    assert RankTimingChunk.objects.count() == 1


def test_it_reads_all_ranks_as_a_matrix_and_one_rank_over_the_run(api, write_token):
    create(api, write_token)
    for rank in range(4):
        for seq, start in enumerate((0, 3), start=1):
            steps = list(range(start, start + 3))
            compute = [0.5 + rank / 10] * 3
            res = timings(api, write_token, rank=rank, seq=seq, steps=steps, compute_s=compute)
            assert res.status_code == 200, res.content
    run = Run.objects.get()
    window = rank_timings.rank_timings_window(run=run, last_steps=4)
    assert window.steps.tolist() == [2, 3, 4, 5]
    assert window.ranks.tolist() == [0, 1, 2, 3]
    assert window.hosts == ["node-0"] * 4
    assert np.allclose(window.compute[:, 3], 0.8)
    steps, compute, _ = rank_timings.rank_history(run=run, rank=1)
    assert steps.tolist() == list(range(6))
    assert np.allclose(compute, 0.6)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"compute_s": [0.5, -1.0, 0.5]}, "compute_s[1]"),
        ({"wait_s": [0.1, 0.1, float("inf")]}, "wait_s[2]"),
        ({"compute_s": [0.5, 0.5]}, "compute_s"),
        ({"total_s": [1.0, 1e9, 1.0]}, "total_s[1]"),
        ({"compute_s": None, "wait_s": None}, "compute_s"),
        ({"steps": [0, "x", 2]}, "steps[1]"),
        ({"rank": -1}, "rank"),
        ({"host": "a\x00b"}, "host"),
    ],
)
def test_it_refuses_bad_timings_naming_the_field(api, write_token, body, field):
    create(api, write_token)
    res = timings(api, write_token, **body)
    assert res.status_code == 400, res.content
    assert res.json()["field"] == field
    assert RankTimingChunk.objects.count() == 0


def test_it_refuses_too_many_steps_naming_the_limit(api, write_token):
    create(api, write_token)
    n = limits.MAX_TIMING_STEPS_PER_BATCH + 1
    res = timings(api, write_token, steps=list(range(n)), compute_s=[0.5] * n, wait_s=None)
    assert res.status_code == 413
    assert res.json()["field"] == "steps"


def test_it_refuses_metrics_from_a_rank_other_than_0(api, write_token):
    create(api, write_token)
    loss = {"steps": [1], "values": [1.0]}
    body = {"session": "r3", "seq": 1, "rank": 3, "metrics": {"loss": loss}}
    res = api("POST", "/runs/run-1/batches", write_token, body)
    assert res.status_code == 400
    assert res.json()["field"] == "rank"
    assert Run.objects.get().points_count == 0


def test_it_answers_404_before_rank_0_created_the_run_and_hides_other_projects(
    api, write_token, other_write_token, read_token
):
    assert timings(api, write_token).status_code == 404
    create(api, write_token)
    assert timings(api, other_write_token).status_code == 404
    assert timings(api, read_token).status_code == 403
    assert timings(api, None).status_code == 401
    assert RankTimingChunk.objects.count() == 0


def test_the_window_drops_the_newest_steps_too_few_ranks_have_sent(api, write_token):
    """Each rank posts on its own clock: the newest steps are always partly reported."""
    create(api, write_token)
    for rank in range(4):
        n = 6 if rank == 3 else 10
        res = timings(
            api, write_token, rank=rank, steps=list(range(n)), compute_s=[0.5] * n, wait_s=None
        )
        assert res.status_code == 200, res.content
    window = rank_timings.rank_timings_window(run=Run.objects.get(), last_steps=100)
    assert window.steps.tolist() == list(range(10))
    assert window.complete().steps.tolist() == list(range(6))
    assert window.complete().compute.shape == (6, 4)
