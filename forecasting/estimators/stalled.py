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
    usual_interval_s: float | None  # None: too few contacts to know it
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
    opened_at: float | None = None,
    declared_interval_s: float | None = None,
    unknown_cadence_limit_s: float | None = None,
) -> StallResult | None:
    """Stall verdict, or None when nothing can be said.

    `listening_since`: when the server last came back. Silence before it was the server's own
    (a client spools through an outage and replays after), so it does not count against a run.

    A run with too few contacts to have a cadence of its own (fewer than 3, the create or
    resume at `opened_at` among them) is judged by `_young_run`: against the heartbeat
    interval its client declared (`declared_interval_s`), else against the fixed
    `unknown_cadence_limit_s` (None: such a run is not judged).
    """
    floor = -np.inf if listening_since is None else listening_since + th.STALL_RECONNECT_GRACE_S
    beats = np.asarray(heartbeat_times, dtype=float)
    beats = beats[np.isfinite(beats) & (beats <= now)]
    moved = _progress_times(
        np.asarray(progress_times, dtype=float), np.asarray(progress_steps, dtype=float)
    )
    moved = moved[moved <= now]
    # Progress points are heartbeats too: a run that logs steps is alive. A batch with steps is
    # both, at one time: one contact (two batches counted as four had a "cadence").
    alive = np.unique(np.concatenate((beats, moved)))
    usual = _usual_interval(alive) if alive.size >= 3 else None
    if usual is None:
        return _young_run(
            alive,
            opened_at=opened_at,
            now=now,
            floor=floor,
            declared_interval_s=declared_interval_s,
            unknown_cadence_limit_s=unknown_cadence_limit_s,
        )
    silent = now - max(float(alive.max()), floor)
    if silent > _limit(usual):
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
    text = f"heartbeat {span(silent)} ago (usually every {span(usual)})"
    return StallResult(False, float(silent), usual, "no_heartbeat", text)


def _young_run(
    alive: np.ndarray,
    *,
    opened_at: float | None,
    now: float,
    floor: float,
    declared_interval_s: float | None,
    unknown_cadence_limit_s: float | None,
) -> StallResult | None:
    """A run that has no cadence of its own yet (a job killed after its create or first batch,
    or one slow to log its first step): silent for too long, it is taken for dead.

    Its client's declared heartbeat interval is the cadence it promised, on the same rule as a
    cadence seen (STALL_FACTOR of them, at least STALL_MIN_S): a client that beats while the
    process lives beats through a 20-minute compile, so its silence is death. Without one (an
    MLflow client sends nothing until the loop logs) the silence may be a slow first step, and
    only the fixed `unknown_cadence_limit_s` tells the two apart.
    """
    contacts = alive
    if opened_at is not None and np.isfinite(opened_at) and opened_at <= now:
        contacts = np.append(alive, opened_at)
    if contacts.size == 0:
        return None
    n = contacts.size
    said = f"{n} contact{'' if n == 1 else 's'} since it started"
    if declared_interval_s is not None and np.isfinite(declared_interval_s):
        limit = _limit(max(float(declared_interval_s), 0.0))
        why = f"{said}; its client beats every {span(declared_interval_s)} while alive"
    elif unknown_cadence_limit_s is not None:
        limit = float(unknown_cadence_limit_s)
        why = f"{said}, too few for a cadence; {span(limit)} of silence is the limit"
    else:
        return None
    silent = now - max(float(contacts.max()), floor)
    stalled = bool(silent > limit)
    head = f"no heartbeat for {span(silent)}" if stalled else f"heartbeat {span(silent)} ago"
    return StallResult(stalled, float(silent), None, "no_heartbeat", f"{head} ({why})")
