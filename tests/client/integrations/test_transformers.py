"""RuncastCallback: the docs' Hugging Face example trains a tiny GPT against a live server."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from forecasting.models import Forecast
from tests.client.integrations.conftest import run_example
from tracker import selectors
from tracker.models import Event, Run

# Forecasts run in-process as the example logs, so the run has one to show.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.eager]

LAYERS = {f"grad_norm/{k}" for k in ("wte", "wpe", "h.0", "h.1", "ln_f")}


def test_the_transformers_example_logs_a_forecast_run(example_env, tmp_path: Path) -> None:
    cwd, temp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    temp.mkdir()
    out = run_example("transformers_example.py", example_env(TMPDIR=str(temp)), cwd)
    assert list(cwd.iterdir()) == []  # the output folder is a temp dir, not the working tree
    assert f"checkpoints in: {temp}{os.sep}runcast-" in out
    run = Run.objects.get(name="tiny-gpt-hf")
    assert f"run: {run.public_id} " in out
    assert run.status == "finished"
    assert run.total_steps == 40  # TrainingArguments.max_steps
    assert run.world_size == 1  # one process, said by the trainer (no launcher set WORLD_SIZE)
    assert run.config["training_args"]["learning_rate"] == 0.003
    assert run.config["model"]["n_layer"] == 2

    loss = selectors.series_load(run=run, key="loss")
    assert list(loss.steps) == list(range(1, 41))
    # The LR schedule arrives as "lr" (the key the loss forecast reads): 5 warm-up steps up,
    # then a cosine down to ~0.
    lr = selectors.series_load(run=run, key="lr")
    assert list(lr.steps) == list(range(1, 41))
    assert np.all(np.diff(lr.values[:6]) > 0) and lr.values.max() == pytest.approx(0.003)
    assert np.all(np.diff(lr.values[6:]) < 0) and lr.values[-1] < 0.1 * lr.values.max()
    assert list(selectors.series_load(run=run, key="eval_loss").steps) == [20, 40]

    evals = Event.objects.filter(run=run, kind=Event.Kind.EVAL).order_by("step")
    assert [e.step for e in evals] == [20, 40]
    assert all(np.isfinite(e.payload["eval_loss"]) for e in evals)
    checkpoints = Event.objects.filter(run=run, kind=Event.Kind.CHECKPOINT).order_by("step")
    assert [c.step for c in checkpoints] == [10, 20, 30, 40]
    for c in checkpoints:
        assert Path(c.payload["path"]).is_dir()  # the folder the Trainer saved
        assert Path(c.payload["path"]).is_relative_to(temp)  # in the folder it printed

    # Per-layer norms are read before the Trainer clips (max_grad_norm=1.0): together they
    # make up exactly the pre-clip total norm the Trainer itself logs as grad_norm.
    keys = set(selectors.series_keys(run=run))
    assert {k for k in keys if k.startswith("grad_norm/")} == LAYERS
    total = selectors.series_load(run=run, key="grad_norm")
    per_layer = [selectors.series_load(run=run, key=k) for k in sorted(LAYERS)]
    assert all(list(s.steps) == list(range(5, 41, 5)) for s in per_layer)
    combined = np.sqrt(sum(s.values**2 for s in per_layer))
    reported = total.values[np.isin(total.steps, per_layer[0].steps)]
    assert np.allclose(combined, reported, rtol=1e-4)
    assert reported.max() > 1.0  # clipping was active on some measured step

    summary = Event.objects.get(run=run, kind=Event.Kind.CUSTOM)
    assert summary.payload["name"] == "train_summary" and summary.payload["train_loss"] > 0
    assert "train_runtime" not in keys  # the summary is an event, not one-point series

    assert Forecast.objects.filter(run=run, kind=Forecast.Kind.ETA).exists()
