"""Load a directory of runs in the shared curve format (INDEX.csv, EVENTS.csv, runs/*.csv).

Pure pandas: no Django, so the evaluation runs anywhere the estimators do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

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
        frame = pd.read_csv(root / file)
        for col in COLUMNS:
            if col not in frame.columns:
                frame[col] = np.nan
        frame = frame[list(COLUMNS)].apply(pd.to_numeric, errors="coerce")
        totals = frame["total_steps"].dropna()
        runs.append(
            CurveRun(
                file=file,
                family=family,
                frame=frame,
                events=events_by_file.get(file, []),
                total_steps=float(totals.iloc[-1]) if len(totals) else None,
            )
        )
    return runs
