"""Load a directory of runs in the shared curve format (INDEX.csv, EVENTS.csv, runs/*.csv).

Pure pandas: no Django, so the evaluation, the demo and test fixtures run anywhere the
estimators do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from forecasting.estimators.eta import stitch_resets

COLUMNS = ("step", "total_steps", "elapsed_s", "train_loss", "val_loss", "step_ms")


@dataclass(frozen=True)
class Event:
    step: float | None
    elapsed_s: float | None
    event_type: str
    description: str
    origin: str  # "documented" or "auto-detected"


@dataclass
class CurveRun:
    """One run: its columns as float arrays (NaN where the source logged nothing)."""

    file: str
    family: str
    frame: pd.DataFrame
    events: list[Event] = field(default_factory=list)
    total_steps: float | None = None

    def column(self, name: str) -> np.ndarray:
        return self.frame[name].to_numpy(dtype=float)

    @property
    def has_time(self) -> bool:
        return bool(np.isfinite(self.column("elapsed_s")).sum() >= 3)


def _num(value: object) -> float | None:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _read_frame(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path)
    for col in COLUMNS:
        if col not in frame.columns:
            frame[col] = np.nan
    return frame[list(COLUMNS)].apply(pd.to_numeric, errors="coerce")


def _total(frame: pd.DataFrame) -> float | None:
    totals = frame["total_steps"].dropna()
    return float(totals.iloc[-1]) if len(totals) else None


def load_run_file(path: str | Path) -> CurveRun:
    """One run file on its own (the demo replay and test fixtures read single files)."""
    path = Path(path)
    frame = _read_frame(path)
    return CurveRun(file=path.name, family=path.name, frame=frame, total_steps=_total(frame))


def run_timeline(run: CurveRun) -> tuple[np.ndarray, np.ndarray] | None:
    """Progress points of a run with a usable clock: elapsed_s, else cumulated step_ms."""
    steps = run.column("step")
    elapsed = run.column("elapsed_s")
    ok = np.isfinite(steps) & np.isfinite(elapsed)
    if ok.sum() >= 3:
        # Source timers restart (NanoGPT after compile warm-up): stitch, as a wall clock would be.
        return steps[ok], stitch_resets(elapsed[ok])
    step_ms = run.column("step_ms")
    timed = np.isfinite(steps) & np.isfinite(step_ms)
    if timed.sum() < 3:
        return None
    first = int(np.flatnonzero(np.isfinite(steps))[0])
    s = np.concatenate(([steps[first]], steps[timed]))
    # step_ms is the mean over the steps since the previous timed row (interval logging).
    ds = np.clip(np.diff(s), 0.0, None)
    t = np.concatenate(([0.0], np.cumsum(step_ms[timed] / 1000.0 * ds)))
    if timed[first]:
        s, t = s[1:], t[1:] - t[1]
    return s, t


def row_clock(run: CurveRun) -> np.ndarray:
    """Seconds since the start for every row, so untimed rows (losses logged between timing
    lines) get a time too: the run's clock interpolated over steps. A run that logged no time
    at all is paced at one step per second."""
    steps = run.column("step")
    timeline = run_timeline(run)
    if timeline is None:
        return steps - np.nanmin(steps)
    return np.interp(steps, timeline[0], timeline[1])


def load_runs(directory: str | Path) -> list[CurveRun]:
    """Read every run listed in INDEX.csv (or every runs/*.csv when there is no index)."""
    root = Path(directory)
    index_path = root / "INDEX.csv"
    if index_path.exists():
        index = pd.read_csv(index_path, dtype=str).fillna("")
        rows = [(r["file"], r.get("family", "") or r["file"]) for _, r in index.iterrows()]
    else:
        rows = [(f"runs/{p.name}", f"runs/{p.name}") for p in sorted((root / "runs").glob("*.csv"))]
    events_by_file: dict[str, list[Event]] = {}
    events_path = root / "EVENTS.csv"
    if events_path.exists():
        events = pd.read_csv(events_path, dtype=str).fillna("")
        for _, e in events.iterrows():
            events_by_file.setdefault(e["file"], []).append(
                Event(
                    step=_num(e["step"]),
                    elapsed_s=_num(e["elapsed_s"]),
                    event_type=e["event_type"],
                    description=e["description"],
                    origin=e["origin"],
                )
            )
    runs: list[CurveRun] = []
    for file, family in rows:
        frame = _read_frame(root / file)
        runs.append(
            CurveRun(
                file=file,
                family=family,
                frame=frame,
                events=events_by_file.get(file, []),
                total_steps=_total(frame),
            )
        )
    return runs


@dataclass(frozen=True)
class CurveRow:
    """One logged row with its clock: what a replay (the demo, test fixtures) sends."""

    step: int
    t: float  # seconds since the start (row_clock)
    train_loss: float | None
    val_loss: float | None


def curve_rows(path: str | Path) -> tuple[list[CurveRow], int | None]:
    """A run file as rows in order, with its planned total steps (None when not stated)."""
    run = load_run_file(path)
    clock = row_clock(run)
    steps = run.column("step")
    train, val = run.column("train_loss"), run.column("val_loss")
    rows = [
        CurveRow(
            step=int(steps[i]),
            t=float(clock[i]),
            train_loss=float(train[i]) if math.isfinite(train[i]) else None,
            val_loss=float(val[i]) if math.isfinite(val[i]) else None,
        )
        for i in range(len(steps))
        if math.isfinite(steps[i])
    ]
    return rows, None if run.total_steps is None else int(run.total_steps)
