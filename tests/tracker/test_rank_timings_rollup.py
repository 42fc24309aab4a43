"""The rank-timing rollup: the window cut from its blocks equals the raw read of the chunks."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models.query import QuerySet

from forecasting.estimators import thresholds as th
from tracker import rank_timings
from tracker.models import RankTimingBlock, RankTimingChunk, RankTimingRollup, Run
from tracker.rank_timings import (
    RankTimings,
    rank_rollup_fold,
    rank_timings_recent,
    rank_timings_window,
)
from tracker.services import RankTimingsIn, from_epoch, rank_timings_ingest, run_start

pytestmark = pytest.mark.django_db


def make_run(project, world: int | None = None) -> Run:
    fields = {"total_steps": 100_000} | ({"world_size": world} if world else {})
    return run_start(
        project=project,
        public_id="ranks",
        session="rank0",
        started_at=from_epoch(1.7e9),
        fields=fields,
    ).run


_seq: dict[str, int] = {}


def send(run, rank, steps, *, session=None, host=None, compute=None, wait=None, total=None):
    steps = np.asarray(steps, dtype=np.int64)
    rng = np.random.default_rng(int(steps[0]) * 1_000 + rank)
    session = session or f"rank-{rank}"
    _seq[session] = _seq.get(session, 0) + 1
    nan = np.full(steps.size, np.nan)
    compute = 0.8 + 0.01 * rng.standard_normal(steps.size) if compute is None else compute
    rank_timings_ingest(
        run=run,
        session=session,
        seq=_seq[session],
        timings=RankTimingsIn(
            rank=rank,
            local_rank=rank % 4,
            host=f"node-{rank // 4}" if host is None else host,
            steps=steps,
            compute=np.asarray(compute, dtype=float),
            wait=nan if wait is None else np.asarray(wait, dtype=float),
            total=nan if total is None else np.asarray(total, dtype=float),
        ),
    )


def assert_same(a: RankTimings, b: RankTimings) -> None:
    np.testing.assert_array_equal(a.steps, b.steps)
    np.testing.assert_array_equal(a.ranks, b.ranks)
    assert a.hosts == b.hosts
    for name in ("compute", "wait", "total"):
        # assert_array_equal counts NaN equal to NaN: a missing cell must be missing in both.
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def check(run, last_steps: int = 2_000) -> RankTimings:
    rolled = rank_timings_recent(run=run, last_steps=last_steps)
    raw = rank_timings_window(run=run, last_steps=last_steps)
    assert_same(rolled, raw)
    assert_same(rolled.complete(), raw.complete())
    return rolled


def batches(run, ranks, start, stop, size=20, **kw):
    for first in range(start, stop, size):
        for rank in ranks:
            send(run, rank, range(first, min(first + size, stop)), **kw)


def test_it_equals_the_raw_read_as_chunks_arrive(project):
    run = make_run(project, world=12)
    start = 0
    for stop in (40, 130, 200, 330):
        batches(run, range(12), start, stop)
        start = stop
        got = check(run)
        assert got.compute.shape == (stop, 12)
        check(run, last_steps=100)  # a window starting inside a block
    # Parts no rank gave so far in a block (wait, total) arrive from one rank.
    send(run, 4, range(320, 340), wait=np.full(20, 0.1), total=np.full(20, 1.0))
    got = check(run)
    assert np.isfinite(got.wait).sum() == np.isfinite(got.total).sum() == 20
    # Folded incrementally: each fold read only the chunks after the last one.
    state = RankTimingRollup.objects.get(run=run)
    assert state.through_id == RankTimingChunk.objects.filter(run=run).order_by("-id")[0].id
    assert RankTimingBlock.objects.filter(run=run).count() == -(-340 // rank_timings.BLOCK_STEPS)


def test_a_resent_step_keeps_the_value_the_raw_read_keeps(project):
    run = make_run(project, world=6)
    batches(run, range(6), 0, 300)
    check(run)
    # A resume re-sends steps: a later chunk with the same max_step wins ...
    send(run, 3, range(260, 280), session="resume-1", compute=np.full(20, 2.0))
    # ... one with a lower max_step than the chunk that sent the step first loses (the raw read
    # orders by max_step) ...
    send(run, 2, range(285, 295), session="resume-1", compute=np.full(10, 3.0))
    # ... one with a higher one wins, NaN included (a cell sent as NaN is no longer a value).
    send(run, 1, range(290, 310), session="resume-1", compute=np.full(20, np.nan))
    got = check(run)
    at = {int(s): i for i, s in enumerate(got.steps)}
    assert (got.compute[at[265] : at[279] + 1, 3] == np.float32(2.0)).all()
    assert not (got.compute[:, 2] == np.float32(3.0)).any()
    assert np.isnan(got.compute[at[295], 1])
    # And folded in separate folds, one chunk at a time.
    send(run, 0, range(250, 270), session="resume-2", compute=np.full(20, 4.0))
    check(run)
    send(run, 0, range(255, 260), session="resume-3", compute=np.full(5, 5.0))
    check(run)


def test_a_run_without_rank_timings_costs_one_query_and_no_rollup(
    project, django_assert_num_queries
):
    run = make_run(project)
    with django_assert_num_queries(1):
        assert rank_timings_recent(run=run, last_steps=2_000).empty
    assert not RankTimingRollup.objects.filter(run=run).exists()
    send(run, 0, range(0, 20))
    assert not check(run).empty  # from its first chunk on, the rollup serves it


def test_a_late_rank_and_a_new_rank_land_in_folded_blocks(project):
    run = make_run(project)
    batches(run, range(5), 0, 200)
    check(run)
    batches(run, [5], 0, 200)  # a rank whose batches arrive after the others were folded
    batches(run, [9], 150, 200)  # one that joins late (no steps before 150)
    got = check(run, last_steps=120)
    assert list(got.ranks) == [0, 1, 2, 3, 4, 5, 9]
    assert np.isnan(got.compute[: int(np.searchsorted(got.steps, 150)), -1]).all()


def test_hosts_are_the_last_named_in_the_window(project):
    run = make_run(project, world=4)
    batches(run, range(4), 0, 100)
    batches(run, [1], 100, 140, host="node-9")  # moved host
    batches(run, [2], 100, 140, host="")  # named none: keeps its last named host
    batches(run, [0, 3], 100, 140)
    check(run)
    batches(run, [2], 140, 160, host="node-7")
    batches(run, [1], 140, 160, host="node-9")
    batches(run, [0, 3], 140, 160)
    got = check(run, last_steps=30)
    assert got.hosts == ["node-0", "node-9", "node-7", "node-0"]
    # A window that starts after a rank's last named chunk: that rank has no host in it.
    batches(run, [2], 160, 260, host="")
    batches(run, [0, 1, 3], 160, 260)
    got = check(run, last_steps=50)
    assert got.hosts[2] == ""


def test_old_blocks_go_and_a_longer_window_is_read_raw(project):
    run = make_run(project, world=3)
    batches(run, range(3), 0, 2_600, size=100)
    check(run)
    state = RankTimingRollup.objects.get(run=run)
    assert state.floor_step == 2_600 - rank_timings.ROLLUP_STEPS
    lows = RankTimingBlock.objects.filter(run=run).values_list("lo", flat=True)
    assert min(lows) > state.floor_step - rank_timings.BLOCK_STEPS
    check(run, last_steps=2_500)  # beyond the rollup: the raw read, the same answer
    # A late chunk wholly below the floor changes no window the rollup serves.
    send(run, 1, range(0, 100), session="late", compute=np.full(100, 9.0))
    check(run)


def test_a_runs_rollup_goes_with_the_run(project):
    run = make_run(project, world=3)
    batches(run, range(3), 0, 100)
    check(run)
    assert RankTimingBlock.objects.filter(run=run).exists()
    run.delete()
    assert not RankTimingBlock.objects.exists() and not RankTimingRollup.objects.exists()


def test_a_reset_rollup_is_rebuilt_from_the_chunks(project):
    run = make_run(project, world=3)
    batches(run, range(3), 0, 150)
    check(run)
    rank_timings.rank_rollup_reset(run=run)
    assert not RankTimingBlock.objects.filter(run=run).exists()
    check(run)


def test_the_rollup_serves_the_detectors_window():
    assert th.STRAGGLER_WINDOW_STEPS <= rank_timings.ROLLUP_STEPS


@pytest.mark.django_db(transaction=True)
def test_a_fold_waits_for_an_insert_in_flight_with_a_smaller_id(project):
    """Chunk A draws its id, chunk B (a larger id) commits, a fold starts, then A commits:
    without the chunk table's lock (its trigger) the fold would pass A's id for good."""
    if connection.vendor != "postgresql":
        pytest.skip("the lock is PostgreSQL's (SQLite runs one writer at a time)")
    run = make_run(project, world=3)
    batches(run, range(3), 0, 40)
    rank_rollup_fold(run=run)
    inserted, commit = threading.Event(), threading.Event()

    def slow_insert() -> None:
        try:
            with transaction.atomic():
                RankTimingChunk.objects.create(
                    run=run,
                    session="slow",
                    seq=1,
                    rank=0,
                    n=1,
                    min_step=40,
                    max_step=40,
                    steps=np.array([40], "<i8").tobytes(),
                    compute=np.float32([7.0]).tobytes(),
                    wait=np.float32([np.nan]).tobytes(),
                    total=np.float32([np.nan]).tobytes(),
                )
                inserted.set()
                commit.wait(10)
        finally:
            connection.close()

    def fold() -> None:
        try:
            rank_rollup_fold(run=run)
        finally:
            connection.close()

    a = threading.Thread(target=slow_insert)
    a.start()
    assert inserted.wait(10)
    send(run, 1, [40])  # B: a larger id, committed
    b = threading.Thread(target=fold)
    b.start()
    time.sleep(0.5)  # the fold reaches the lock while A is in flight
    commit.set()
    a.join(10)
    b.join(10)
    got = rank_timings_recent(run=run, last_steps=100)
    assert got.steps[-1] == 40
    assert got.compute[-1, 0] == np.float32(7.0)
    assert_same(got, rank_timings_window(run=run, last_steps=100))


def test_a_failed_fold_leaves_no_lock_behind(project, monkeypatch):
    """The fold's lock is a session's: held past a failed query, every insert of the run
    (whose ids are drawn under it) would wait until the worker's connection closed."""
    if connection.vendor != "postgresql":
        pytest.skip("the lock is PostgreSQL's")
    run = make_run(project, world=3)
    batches(run, range(3), 0, 20)

    def failing(*args, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")

    monkeypatch.setattr(QuerySet, "aggregate", failing)
    with pytest.raises(DatabaseError):
        rank_rollup_fold(run=run)
    monkeypatch.undo()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND pid = pg_backend_pid() AND mode = 'ExclusiveLock'"
        )
        assert cursor.fetchone()[0] == 0
    check(run)
