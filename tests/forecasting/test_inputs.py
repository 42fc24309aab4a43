"""A forecast's input from its stored state (forecasting.inputs) is the input a full reload of
every chunk gives: batch by batch, across a resumed segment, a compaction, a batch that lands
before the cursor and a computation rolled back half-way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from django.db import transaction

from forecasting import compute, inputs
from forecasting.models import Forecast, SeriesSample
from forecasting.sampling import Sample, progress_input, resolved_input, sample_extend
from tracker import selectors as tracker_selectors
from tracker.compaction import chunks_compact
from tracker.models import MetricChunk, Run
from tracker.series import Series
from tracker.services import SeriesIn, batch_ingest, from_epoch, run_start

CURVES = Path("/work/shared/data/curves")
T0 = 1.76e9
LIMIT = 400  # small, so the stride doubles several times over a few thousand points

pytestmark = pytest.mark.skipif(not (CURVES / "runs").is_dir(), reason="curve set not present")


def real_losses(count: int) -> list[np.ndarray]:
    from curveset import load_runs

    out = []
    for run in load_runs(CURVES):
        loss = run.column("train_loss")
        loss = loss[np.isfinite(loss)]
        if loss.size >= 500:
            out.append(loss)
    return out[:: max(1, len(out) // count)][:count]


def make_run(project, run_id: str) -> Run:
    return run_start(
        project=project,
        public_id=run_id,
        session="s1",
        started_at=from_epoch(T0),
        fields={"name": run_id, "total_steps": 20_000, "world_size": 8},
    ).run


def send(run: Run, steps: np.ndarray, loss: np.ndarray, *, seq: int, session: str = "s1") -> None:
    times = T0 + steps.astype(float) + (seq * 1e-3)
    series = [
        SeriesIn("loss", steps, loss, times),
        SeriesIn("lr", steps, 3e-4 * np.minimum(1.0, (steps + 1) / 500.0), times),
    ]
    batch_ingest(run=run, session=session, seq=seq, series=series, events=[], heartbeat=None)


def reloaded(run: Run, key: str, limit: int, nonfinite: bool) -> Sample:
    """What a forecast would read with no state: every chunk, sampled at once."""
    raw = tracker_selectors.series_load(run=run, key=key, resolve=False)
    return sample_extend(Sample.empty(), raw, limit=limit, keep_nonfinite=nonfinite)


def same(a: Series, b: Series) -> None:
    np.testing.assert_array_equal(a.steps, b.steps)
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.times, b.times)
    np.testing.assert_array_equal(a.segments, b.segments)


def check(run: Run) -> None:
    for key, limit, nonfinite in (("loss", LIMIT, True), ("lr", LIMIT // 4, False)):
        state = inputs.series_input(run=run, key=key, limit=limit, keep_nonfinite=nonfinite)
        full = reloaded(run, key, limit, nonfinite)
        assert state.points == full.points
        same(progress_input(state), progress_input(full))
        same(resolved_input(state), resolved_input(full))


def test_the_state_gives_the_input_a_full_reload_gives(project, monkeypatch) -> None:
    monkeypatch.setattr(inputs, "FOLD_POINTS", 150)  # rewrite the row every few batches
    for r, curve in enumerate(real_losses(3)):
        run = make_run(project, f"curve-{r}")
        loss = np.interp(np.linspace(0, curve.size - 1, 3_000), np.arange(curve.size), curve)
        loss[1_234] = np.nan
        seq, step = 1, 0
        rng = np.random.default_rng(r)
        while step < 2_000:
            n = int(rng.integers(20, 90))
            send(run, np.arange(step, step + n), loss[step : step + n], seq=seq)
            seq, step = seq + 1, step + n
            check(run)
        # A resumed attempt from an earlier checkpoint: a new segment replaces steps >= 1,700.
        run_start(
            project=project,
            public_id=run.public_id,
            session="s2",
            started_at=from_epoch(T0),
            fields={},
        )
        step = 1_700
        for seq in range(1, 12):
            send(run, np.arange(step, step + 60), loss[step : step + 60], seq=seq, session="s2")
            step += 60
            check(run)
        assert SeriesSample.objects.filter(run=run, key="loss").get().stride > 1


def test_a_batch_landing_before_the_cursor_rebuilds_the_row(project) -> None:
    run = make_run(project, "late")
    steps = np.arange(0, 3_000)
    loss = 3.0 + np.cos(steps / 100.0)
    for seq, lo in enumerate(range(1_000, 3_000, 500), start=2):
        send(run, steps[lo : lo + 500], loss[lo : lo + 500], seq=seq)
    check(run)
    before = SeriesSample.objects.get(run=run, key="loss", limit=LIMIT)
    # Steps 0..999 of the same attempt commit late (their batch took its place earlier): storage
    # order puts them first, ahead of every point the row has sampled.
    send(run, steps[:1_000], loss[:1_000], seq=1)
    check(run)
    after = SeriesSample.objects.get(run=run, key="loss", limit=LIMIT)
    assert after.points == before.points + 1_000


def test_compaction_keeps_the_state_right(project, monkeypatch) -> None:
    monkeypatch.setattr(inputs, "FOLD_POINTS", 100)
    run = make_run(project, "compacted")
    steps = np.arange(0, 2_400)
    loss = 3.0 - steps / 3_000.0
    for seq, lo in enumerate(range(0, 2_400, 40), start=1):
        send(run, steps[lo : lo + 40], loss[lo : lo + 40], seq=seq)
        if seq % 7 == 0:
            check(run)
    # Retention dropped the batch rows: compaction merges the small chunks, across the cursor.
    MetricChunk.objects.filter(run=run).update(batch=None)
    chunks_compact(target=1_000, below=500)
    assert MetricChunk.objects.filter(run=run, key="loss").count() < 60
    check(run)
    send(run, np.arange(2_400, 2_450), np.full(50, 1.0), seq=999)
    check(run)


def test_a_computation_rolled_back_half_way_leaves_a_row_that_is_still_right(project) -> None:
    run = make_run(project, "crash")
    steps = np.arange(0, 12_000)
    loss = 3.0 - steps / 30_000.0
    send(run, steps[:6_000], loss[:6_000], seq=1)
    check(run)
    send(run, steps[6_000:], loss[6_000:], seq=2)

    def killed() -> None:
        with transaction.atomic():
            inputs.series_input(run=run, key="loss", limit=LIMIT, keep_nonfinite=True)
            raise RuntimeError("worker killed")

    with pytest.raises(RuntimeError):
        killed()
    assert SeriesSample.objects.get(run=run, key="loss", limit=LIMIT).points == 6_000
    check(run)


def test_forecasts_from_the_state_equal_those_from_a_full_reload(project) -> None:
    curve = real_losses(1)[0]
    loss = np.interp(np.linspace(0, curve.size - 1, 260_000), np.arange(curve.size), curve)
    steps = np.arange(loss.size)
    grown, once = make_run(project, "grown"), make_run(project, "once")
    for seq, lo in enumerate(range(0, loss.size, 20_000), start=1):
        send(grown, steps[lo : lo + 20_000], loss[lo : lo + 20_000], seq=seq)
        send(once, steps[lo : lo + 20_000], loss[lo : lo + 20_000], seq=seq)
        compute.forecast_compute(run_id=grown.pk, now=from_epoch(T0 + lo + 20_000))
    now = from_epoch(T0 + loss.size + 1)
    compute.forecast_compute(run_id=grown.pk, now=now)
    SeriesSample.objects.filter(run=once).delete()
    compute.forecast_compute(run_id=once.pk, now=now)
    for kind in (Forecast.Kind.LOSS, Forecast.Kind.ETA):
        a = Forecast.objects.filter(run=grown, kind=kind, computed_at=now).get().data
        b = Forecast.objects.filter(run=once, kind=kind, computed_at=now).get().data
        assert a == b


@pytest.mark.parametrize(
    "floats",
    [
        np.array([]),
        np.array([np.nan, -0.0, np.inf, -np.inf, 1e-300, 2.5]),
        np.frombuffer(np.array([0x7FF8000000000123], np.int64).tobytes(), np.float64),  # a payload
        1.76e9 + np.arange(5_000) * 8.0 + np.random.default_rng(0).uniform(0, 0.01, 5_000),
    ],
)
def test_the_row_packing_gives_back_every_bit(floats: np.ndarray) -> None:
    back = inputs._unpack_floats(inputs._pack_floats(floats))
    assert back.tobytes() == floats.tobytes()
    ints = np.array([0, 5, 3, -(2**40), 2**62, 7], np.int64)[: floats.size]
    np.testing.assert_array_equal(inputs._unpack_ints(inputs._pack_ints(ints)), ints)
