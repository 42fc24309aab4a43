"""A tiny curve set in the shared format, built in a test's tmp dir: one healthy run and one that
goes NaN at a documented step (with checkpoints every 100 steps)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

NAN_AT = 401  # the documented onset: the loss is NaN from this step on
STEPS = 600
EVERY = 2  # a row per 2 steps, half a second per step: a 5-minute run


def _curve(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.arange(EVERY, STEPS + 1, EVERY)
    loss = (2.0 + 3.0 * np.exp(-steps / 200.0)) * np.exp(rng.normal(0.0, 0.01, steps.size))
    return steps, loss


def _write_run(root: Path, name: str, steps: np.ndarray, loss: np.ndarray) -> str:
    file = f"runs/{name}.csv"
    lines = ["step,total_steps,elapsed_s,train_loss,val_loss,step_ms"]
    for s, v in zip(steps, loss, strict=True):
        cell = "nan" if not math.isfinite(v) else f"{v:.5f}"
        lines.append(f"{s},{STEPS},{0.5 * s:.1f},{cell},,500")
    (root / file).write_text("\n".join(lines) + "\n")
    return file


def build(root: Path) -> Path:
    (root / "runs").mkdir(parents=True)
    healthy = _write_run(root, "toy__healthy", *_curve(1))
    steps, loss = _curve(2)
    loss[steps >= NAN_AT] = math.nan
    broken = _write_run(root, "toy__nan", steps, loss)
    (root / "INDEX.csv").write_text(f"file,family\n{healthy},toy/healthy\n{broken},toy/nan\n")
    events = ["file,step,elapsed_s,event_type,description,origin"]
    events += [
        f"{broken},{s},{0.5 * s},checkpoint,saved,documented" for s in range(100, STEPS, 100)
    ]
    events.append(f"{broken},{NAN_AT},{0.5 * NAN_AT},divergence_onset,nan injected,documented")
    events.append(f"{broken},{NAN_AT + 1},{0.5 * NAN_AT + 0.5},nan,loss not finite,documented")
    (root / "EVENTS.csv").write_text("\n".join(events) + "\n")
    return root
