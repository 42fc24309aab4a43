"""GPU activity, the hard `hang` rule: GPUs busy while neither the step counter nor any event
has moved for many usual step (and eval) durations, the BLOOM-176B eval deadlock."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from forecasting.estimators import thresholds as th
from forecasting.estimators.gpu_activity.model import DEFAULT, Episode, RunEvents, Settings

# -- hang -----------------------------------------------------------------------------------


def find_hang(
    times: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    events: RunEvents,
    *,
    busy_level: float,
    now: float | None = None,
    settings: Settings = DEFAULT,
) -> Episode | None:
    """GPUs busy while the run has made no progress for many usual step (or eval) times.

    Progress is a step that advanced or any logged event (an eval that ends is progress).
    `busy_level` is the run's usual training activity; busy means >= busy_rel of it.
    """
    t = np.asarray(times, float)
    v = np.asarray(values, float)
    if t.size == 0:
        return None
    now = float(t.max()) if now is None else now
    # The run's history as known at `now`: the samples can end before its progress does (an
    # agent stopped while training went on, or a run that started after the last sample), and
    # a step after `now` is neither its usual cadence nor the last progress before it.
    progress = _progress(events)
    progress = progress[progress <= now]
    if progress.size < 3:
        return None
    usual = float(np.median(np.diff(progress)[-50:]))
    evals = [p.end - p.start for p in events.phases if p.kind == "eval"]
    usual = max(usual, float(np.median(evals)) if evals else 0.0)
    limit = max(settings.hang_factor * usual, settings.hang_min_s)
    last = float(progress[-1])
    silent = now - last
    if silent < limit:
        return None
    window = (t > last) & (t <= now)
    if window.sum() < 3:
        return None
    busy = v[window] >= settings.busy_rel * busy_level
    if busy.mean() < th.GPU_HANG_BUSY_SHARE:
        return None
    observed = float(np.median(v[window]))
    return Episode(
        start=last,
        end=now,
        kind="hang",
        phase="hang",
        explained=False,
        reason=f"no step or event for {silent:.0f} s (usual {usual:.1f} s)",
        detected_at=last + limit,
        expected=busy_level,
        observed=observed,
        delta_rel=(observed - busy_level) / busy_level if busy_level else 0.0,
        peak=float(v[window].max()),
        samples=int(window.sum()),
    )


def _progress(events: RunEvents) -> np.ndarray:
    t = np.asarray(events.step_times, float)
    s = np.asarray(events.steps, float)
    ok = np.isfinite(t) & np.isfinite(s)
    t, s = t[ok], s[ok]
    order = np.argsort(t)
    t, s = t[order], s[order]
    if s.size:
        best = np.maximum.accumulate(s)
        t = t[np.concatenate(([True], best[1:] > best[:-1]))]
    edges = [p.start for p in events.phases] + [p.end for p in events.phases]
    edges += [m.time for m in events.marks]
    return np.unique(np.concatenate((t, np.asarray(edges, float))))
