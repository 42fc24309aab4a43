"""bench/data/tinygpt: the committed set loads through curveset, its labels are what
bench/tinygpt/labels.py reads off its files, and the generator's faults do what they say."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bench.tinygpt.labels import left_step, recovered_step
from curveset import load_runs, run_timeline

SET = Path(__file__).resolve().parents[2] / "bench" / "data" / "tinygpt"


def test_the_set_loads_with_its_documented_episodes() -> None:
    runs = load_runs(SET)
    assert len(runs) >= 12
    for run in runs:
        assert run_timeline(run) is not None  # every run has a clock
        kinds = {e.event_type for e in run.events}
        assert all(e.origin == "documented" for e in run.events)
        assert "checkpoint" in kinds
        healthy = "healthy" in run.file
        assert ("divergence_onset" in kinds or "fault" in kinds) != healthy
        # An episode is labelled only where the loss left its band; a fault that never moved
        # it is a `fault` row, with no episode to score.
        steps, loss = run.column("step"), run.column("train_loss")
        for e in run.events:
            if e.event_type in ("divergence_onset", "fault"):
                left = left_step(steps, loss, e.step)  # type: ignore[arg-type]
                assert (left is not None) == (e.event_type == "divergence_onset"), run.file
    assert sum("healthy" in r.file for r in runs) >= 3


def test_recovered_labels_are_read_off_the_loss() -> None:
    for run in load_runs(SET):
        onsets = [e.step for e in run.events if e.event_type == "divergence_onset"]
        if not onsets:
            continue
        labelled = [e.step for e in run.events if e.event_type == "recovered"]
        steps, loss = run.column("step"), run.column("train_loss")
        back = recovered_step(steps, loss, onsets[0])  # type: ignore[arg-type]
        assert labelled == ([] if back is None else [back])
        nans = [e.step for e in run.events if e.event_type == "nan"]
        if nans:
            assert not math.isfinite(loss[steps == nans[0]][0])


def test_recovered_needs_the_loss_to_have_left_its_band() -> None:
    steps = np.arange(0.0, 2000.0, 5.0)
    flat = np.full(steps.size, 1.0) + 0.01 * np.sin(steps)
    assert recovered_step(steps, flat, 1000.0) is None  # never left: nothing to recover from
    spiked = flat.copy()
    spiked[(steps >= 1000) & (steps < 1050)] = 3.0
    assert recovered_step(steps, spiked, 1000.0) == 1050.0
    stays = flat.copy()
    stays[steps >= 1000] = 3.0
    assert recovered_step(steps, stays, 1000.0) is None


def test_the_generator_nan_fault_makes_every_later_loss_nan() -> None:
    torch = pytest.importorskip("torch")
    from bench.tinygpt import generate as g
    from bench.tinygpt.model import corpus, encode

    torch.set_num_threads(1)
    sc = g.Scenario("t", 1, 3e-3, "nan", at=11)
    res = g.train(sc, 30, encode(corpus()[:20_000]))
    losses = [(r["step"], r["train_loss"]) for r in res.rows]
    assert all(math.isfinite(v) for s, v in losses if s <= 10)
    assert all(math.isnan(v) for s, v in losses if s > 10)
    assert "grad_norm/block0" in res.rows[1]
    jump = g.Scenario("j", 1, 1e-3, "lr_reverted", at=200, factor=50.0, length=10)
    plain = g.Scenario("h", 1, 1e-3)
    assert g.learning_rate(jump, 205, 3000) == pytest.approx(50 * g.learning_rate(plain, 205, 3000))
    assert g.learning_rate(jump, 210, 3000) == g.learning_rate(plain, 210, 3000)  # reverted
