"""When a diverged loss is back: the `recovered` label the generator writes, read off the loss.

Defined on the logged train loss alone, so any curve set can be labelled the same way:

- the pre-onset band: the last BAND_POINTS finite losses logged before the onset; its top is
  their BAND_QUANTILE quantile;
- it left the band at the first logged step at or after the onset whose loss is not finite or
  above DEPART_FACTOR x the top (a clear excursion, not a noisy point);
- recovered at the first logged step r after it left whose loss is at or under the top and from
  which, over the next SUSTAIN_STEPS steps, every logged loss is finite and at least
  SUSTAIN_SHARE of them lie at or under the top;
- never, when it never left (no recovery to speak of) or no such r leaves SUSTAIN_STEPS of run
  after it.
"""

from __future__ import annotations

import numpy as np

BAND_POINTS = 40
BAND_QUANTILE = 0.9
SUSTAIN_STEPS = 200
SUSTAIN_SHARE = 0.8
DEPART_FACTOR = 1.2


def band_top(steps: np.ndarray, loss: np.ndarray, onset: float) -> float | None:
    before = loss[(steps < onset) & np.isfinite(loss)][-BAND_POINTS:]
    return float(np.quantile(before, BAND_QUANTILE)) if before.size >= BAND_POINTS // 2 else None


def left_step(steps: np.ndarray, loss: np.ndarray, onset: float) -> float | None:
    """The first logged step at or after the onset whose loss left the band; None if none did
    (the fault never moved the loss: there is no episode to score, only a fault)."""
    top = band_top(steps, loss, onset)
    if top is None:
        return None
    out = (steps >= onset) & (~np.isfinite(loss) | (loss > DEPART_FACTOR * top))
    return float(steps[np.argmax(out)]) if out.any() else None


def recovered_step(steps: np.ndarray, loss: np.ndarray, onset: float) -> float | None:
    top = band_top(steps, loss, onset)
    left = left_step(steps, loss, onset)
    if top is None or left is None:
        return None
    last = steps[-1]
    for i in np.flatnonzero((steps > left) & (loss <= top)):
        if steps[i] + SUSTAIN_STEPS > last:
            return None
        window = loss[(steps >= steps[i]) & (steps < steps[i] + SUSTAIN_STEPS)]
        if np.isfinite(window).all() and np.mean(window <= top) >= SUSTAIN_SHARE:
            return float(steps[i])
    return None
