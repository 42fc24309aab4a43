"""Episodes of a curve set: documented ones read from EVENTS.csv, injected ones shaped into
copies of its healthy runs, and the checkpoints and gradient norms a replay sends with the loss."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.flagstream import Row, read_loss

SHAPES = ("blowup", "spike", "oscillation", "nan")
CHECKPOINT_SHARE = 0.02
SPIKE_BACK_WITHIN = 0.05  # an injected spike is over when it adds under 5% to the loss


@dataclass(frozen=True)
class Episode:
    scenario: str  # "documented:<what>" or "injected:<shape>"
    onset_step: float
    onset_t: float  # run-clock seconds
    recovered_step: float | None = None
    recovered_t: float | None = None


# --- episodes of a set: documented, and injected ---------------------------------------------


def documented_episodes(events: pd.DataFrame, rows: list[Row]) -> list[Episode]:
    """The run's documented episodes, in order; times from its replayed clock."""
    doc = events[events["origin"] == "documented"]
    marks = sorted(
        (float(s), e) for s, e in zip(doc["step"], doc["event_type"], strict=True) if _finite(s)
    )
    out: list[Episode] = []
    for step, kind in marks:
        open_ = out[-1] if out and out[-1].recovered_step is None else None
        if kind == "divergence_onset" or (kind == "nan" and open_ is None):
            what = _what(doc, step, kind)
            out.append(Episode(f"documented:{what}", step, _t_at(rows, step)))
        elif kind == "recovered" and open_ is not None:
            out[-1] = replace(open_, recovered_step=step, recovered_t=_t_at(rows, step))
    return out


def _what(doc: pd.DataFrame, step: float, kind: str) -> str:
    match = doc[(doc["event_type"] == kind) & (doc["step"].map(_num) == step)]
    words = str(match["description"].iloc[0]).split() if len(match) else []
    return words[0] if words and kind == "divergence_onset" else kind


def _num(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _finite(value: object) -> bool:
    return math.isfinite(_num(value))


def _t_at(rows: list[Row], step: float) -> float:
    steps = np.array([r.step for r in rows], dtype=float)
    times = np.array([r.t for r in rows], dtype=float)
    return float(np.interp(step, steps, times))


def inject_episode(rows: list[Row], shape: str, rng: random.Random) -> tuple[list[Row], Episode]:
    """A copy of a healthy run with one episode of `shape` from a point of its middle, into
    every loss it logs (a diverged model's validation loss moves too)."""
    cut = rng.uniform(0.3, 0.7) * rows[-1].t
    # At a logged loss (the one the server reads: the train loss when there is one): a row
    # with only a timing would put the onset before any point could show it.
    main = read_loss(rows)
    logged = [i for i, r in enumerate(rows) if getattr(r, main) is not None]
    i0 = next((i for i in logged if rows[i].t >= cut), logged[-1])
    at = rows[i0]
    out = [Row(r.step, r.t, r.loss, r.val) for r in rows]
    span = max(1.0, float(rows[-1].step - at.step))
    settle = math.exp(rng.uniform(math.log(2.0), math.log(20.0)))
    peak = rng.uniform(3.0, 10.0)
    recovered: float | None = None
    for attr in ("loss", "val"):
        idx = [i for i, r in enumerate(out) if getattr(r, attr) is not None]
        if not idx:
            continue
        values = np.array([getattr(out[i], attr) for i in idx], dtype=float)
        steps = np.array([out[i].step for i in idx], dtype=float)
        new = _shaped(shape, steps, values, at.step, span, settle, peak)
        for i, v in zip(idx, new, strict=True):
            setattr(out[i], attr, float(v))
    if shape == "spike":
        tau = 0.01 * span  # the excess (peak - 1) decays by e every 1% of what is left
        recovered = at.step + tau * math.log((peak - 1.0) / SPIKE_BACK_WITHIN)
    episode = Episode(f"injected:{shape}", float(at.step), at.t)
    if recovered is not None and recovered <= rows[-1].step:
        episode = replace(episode, recovered_step=recovered, recovered_t=_t_at(rows, recovered))
    return out, episode


def _shaped(
    shape: str,
    steps: np.ndarray,
    values: np.ndarray,
    onset: float,
    span: float,
    settle: float,
    peak: float,
) -> np.ndarray:
    after = steps >= onset
    d = np.where(after, steps - onset, 0.0)
    out = values.copy()
    if shape == "nan":
        out[after] = math.nan
    elif shape == "spike":
        out[after] = values[after] * (1.0 + (peak - 1.0) * np.exp(-d[after] / (0.01 * span)))
    elif shape == "blowup":
        # Flat at settle x the level before, as a run whose weights were wrecked; the curve's own
        # point-to-point noise (relative to its running median) kept.
        level = float(np.nanmedian(values[~after][-20:])) if (~after).any() else values[0]
        trend = pd.Series(values).rolling(9, center=True, min_periods=1).median().to_numpy()
        excess = (peak * settle - settle) * np.exp(-d / (0.03 * span))
        out[after] = level * (settle + excess[after]) * (values[after] / trend[after])
    elif shape == "oscillation":
        # Swings that grow with the level: at the end x3 up and down around a level x3.
        a = math.log(3.0) * d / span
        period = max(0.02 * span, 1.0)
        out[after] = values[after] * np.exp(
            a[after] * (1.0 + np.sin(2 * math.pi * d[after] / period))
        )
    return out


def restore_non_finite(path: Path, rows: list[Row]) -> None:
    """Put back the NaN/Inf a file logs: the shared loader reads them as 'not logged' (an empty
    cell), and a NaN the replay never sends cannot be detected."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    bad: dict[tuple[str, int], float] = {}
    for col, attr in (("train_loss", "loss"), ("val_loss", "val")):
        if col not in frame.columns:
            continue
        for step, cell in zip(frame["step"], frame[col], strict=True):
            value = _num(cell)
            if cell.strip() and not math.isfinite(value) and _finite(step):
                bad[(attr, int(float(step)))] = value
    for r in rows:
        for attr in ("loss", "val"):
            if (attr, r.step) in bad:
                setattr(r, attr, bad[(attr, r.step)])


# --- extras a training logs besides its loss: checkpoints, per-layer gradient norms ---------


@dataclass(frozen=True)
class Extras:
    checkpoints: list[float]
    grad_norms: dict[str, tuple[np.ndarray, np.ndarray]]


def load_extras(path: Path, events: pd.DataFrame, rows: list[Row]) -> Extras:
    cps = events[(events["event_type"] == "checkpoint")]["step"].map(_num).dropna()
    checkpoints = sorted(float(s) for s in cps)
    if not checkpoints:
        last = float(rows[-1].step)
        every = max(1.0, float(round(CHECKPOINT_SHARE * last)))
        checkpoints = [float(s) for s in np.arange(every, last + 1, every)]
    frame = pd.read_csv(path)
    grads = {}
    for col in frame.columns:
        if str(col).startswith("grad_norm/"):
            ok = frame[col].notna() & frame["step"].notna()
            grads[str(col)] = (frame["step"][ok].to_numpy(float), frame[col][ok].to_numpy(float))
    return Extras(checkpoints, grads)


@contextmanager
def sending_extras(extras: Extras) -> Iterator[None]:
    """Every batch the replay sends carries the checkpoints and gradient norms logged up to
    its last step, as the client's callbacks would send them with the loss."""
    from tracker import services as tr

    original = tr.batch_ingest
    sent_to = -math.inf

    def batch_ingest(**kw: Any) -> Any:
        nonlocal sent_to
        series = list(kw["series"])
        if series:
            last = max(float(s.steps.max()) for s in series)
            ref = series[0]
            ck = [c for c in extras.checkpoints if sent_to < c <= last]
            kw["events"] = [
                *kw["events"],
                *(tr.EventIn("checkpoint", int(c), kw["heartbeat"], {}) for c in ck),
            ]
            for key, (steps, values) in extras.grad_norms.items():
                pick = (steps > sent_to) & (steps <= last)
                if pick.any():
                    times = np.interp(steps[pick], ref.steps.astype(float), ref.times)
                    series.append(
                        tr.SeriesIn(key, steps[pick].astype(np.int64), values[pick], times)
                    )
            sent_to = last
        return original(**{**kw, "series": series})

    tr.batch_ingest = batch_ingest
    try:
        yield
    finally:
        tr.batch_ingest = original
