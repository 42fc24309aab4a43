"""Has a run gone quiet (no heartbeat) or stopped making progress while still beating?"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forecasting.estimators import thresholds as th
from forecasting.estimators.formatting import span
from forecasting.estimators.jsonable import as_json


@dataclass
class StallResult:
    stalled: bool
    silent_s: float
    usual_interval_s: float
    kind: str  # "no_heartbeat" | "no_progress"
    explanation: str

    def to_dict(self) -> dict[str, float | bool | str | None]:
        return as_json(self)


def _recent_gaps(times: np.ndarray) -> np.ndarray:
    gaps = np.diff(np.sort(times))[-th.STALL_RECENT_INTERVALS :]
    return gaps[gaps > 0]


def _usual_interval(times: np.ndarray) -> float | None:
    gaps = _recent_gaps(times)
    return float(np.median(gaps)) if gaps.size else None


def _limit(usual: float, longest: float | None = None) -> float:
    """How long a silence may last: STALL_FACTOR usual intervals, or for progress (with the
    longest recent interval) also no more than STALL_LONGEST_FACTOR times the longest one."""
    limit = th.STALL_FACTOR * usual
    if longest is not None:
        limit = min(limit, th.STALL_LONGEST_FACTOR * longest)
    return max(limit, th.STALL_MIN_S)


def _progress_times(times: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Times at which the step actually advanced (repeated or lower steps are not progress)."""
    ok = np.isfinite(times) & np.isfinite(steps)
    t, s = times[ok], steps[ok]
    if t.size == 0:
        return t
    order = np.argsort(t, kind="stable")
    t, s = t[order], s[order]
    best = np.maximum.accumulate(s)
    advanced = np.concatenate(([True], best[1:] > best[:-1]))
    return t[advanced]


def detect_stall(
    heartbeat_times: np.ndarray,
    progress_times: np.ndarray,
    progress_steps: np.ndarray,
    *,
    now: float,
    listening_since: float | None = None,
) -> StallResult | None:
    """Stall verdict, or None when there is too little history to know the usual cadence.

    `listening_since`: when the server last came back. Silence before it was the server's own
    (a client spools through an outage and replays after), so it does not count against a run.
    """
    floor = -np.inf if listening_since is None else listening_since + th.STALL_RECONNECT_GRACE_S
    beats = np.asarray(heartbeat_times, dtype=float)
    beats = beats[np.isfinite(beats) & (beats <= now)]
    moved = _progress_times(
        np.asarray(progress_times, dtype=float), np.asarray(progress_steps, dtype=float)
    )
    moved = moved[moved <= now]
    # Progress points are heartbeats too: a run that logs steps is alive.
    alive = np.concatenate((beats, moved))
    if alive.size >= 3:
        usual = _usual_interval(alive)
        silent = now - max(float(alive.max()), floor)
        if usual is not None and silent > _limit(usual):
            text = f"no heartbeat for {span(silent)} (usually every {span(usual)})"
            return StallResult(True, float(silent), usual, "no_heartbeat", text)
    if moved.size >= 3:
        gaps = _recent_gaps(moved)
        silent = now - max(float(moved.max()), floor)
        if gaps.size:
            usual = float(np.median(gaps))
            stalled = bool(silent > _limit(usual, float(gaps.max())))
            verb = "alive but no progress" if stalled else "progressing"
            text = f"{verb}: last step {span(silent)} ago (usually every {span(usual)})"
            return StallResult(stalled, float(silent), usual, "no_progress", text)
    if alive.size >= 3:
        usual = _usual_interval(alive)
        if usual is not None:
            silent = now - max(float(alive.max()), floor)
            text = f"heartbeat {span(silent)} ago (usually every {span(usual)})"
            return StallResult(False, float(silent), usual, "no_heartbeat", text)
    return None
