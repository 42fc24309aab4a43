"""RuncastLogger: the docs' Lightning example trains a tiny GPT against a live server."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")
pytest.importorskip("transformers")  # the tiny GPT of the examples is built from a GPT2Config

from forecasting.models import Forecast
from tests.client.integrations.conftest import run_example
from tracker import selectors
from tracker.models import Event, Run

# Forecasts run in-process as the example logs, so the run has one to show.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.eager]

LAYERS = {f"grad_norm/{k}" for k in ("wte", "wpe", "h.0", "h.1", "ln_f")}


def test_the_lightning_example_logs_a_forecast_run(example_env, tmp_path: Path) -> None:
    cwd, temp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    temp.mkdir()
    out = run_example("lightning_example.py", example_env(TMPDIR=str(temp)), cwd)
    assert list(cwd.iterdir()) == []  # checkpoints go to a temp dir, not the working tree
    assert f"checkpoints in: {temp}{os.sep}runcast-" in out
    run = Run.objects.get(name="tiny-gpt-lightning")
    assert f"run: {run.public_id} " in out
    assert run.status == "finished"
    assert run.total_steps == 40  # 1 epoch x 40 batches, from trainer.estimated_stepping_batches
    assert run.config["lr"] == 0.003 and run.config["n_layer"] == 2
    assert run.config["trainer"]["max_epochs"] == 1
    assert run.world_size == 1  # one process, said by the trainer (no launcher set WORLD_SIZE)

    loss = selectors.series_load(run=run, key="loss")
    assert list(loss.steps) == list(range(1, 41))  # global_step after each update
    run.refresh_from_db()
    assert run.last_step == run.total_steps == 40 and run.progress == 1.0  # not 39 of 40
    assert np.all(np.isfinite(loss.values)) and loss.values[-5:].mean() < loss.values[:5].mean()
    assert len(selectors.series_load(run=run, key="lr")) == 40
    assert list(selectors.series_load(run=run, key="val_loss").steps) == [20, 40]

    keys = set(selectors.series_keys(run=run))
    assert {k for k in keys if k.startswith("grad_norm/")} == LAYERS
    for key in LAYERS:
        norms = selectors.series_load(run=run, key=key)
        assert list(norms.steps) == list(range(5, 41, 5))
        assert np.all(norms.values > 0)

    checkpoints = Event.objects.filter(run=run, kind=Event.Kind.CHECKPOINT).order_by("step")
    assert [c.step for c in checkpoints] == [10, 20, 30, 40]
    for c in checkpoints:
        assert Path(c.payload["path"]).is_file()  # the file ModelCheckpoint wrote
        assert Path(c.payload["path"]).is_relative_to(temp)  # in the folder it printed
        assert run.public_id in c.payload["path"]  # Lightning's folder is named for the run

    assert Forecast.objects.filter(run=run, kind=Forecast.Kind.ETA).exists()
