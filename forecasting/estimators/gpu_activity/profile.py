"""GPU activity, a series' own profile against its peers, carried from its earlier runs.

A series' usual ratio to its peers is learnt from the run being judged (episodes.py: the level
nearest ratio 1, allowed a steady drift). What one run cannot tell apart from foreign work is a
ratio that depends on how hard the job runs: node 3 of Dell's 8xXE9680 draws +17-21% over its
peers while they sit at 3.5 kW (45% of their training draw, 30 s inside every run's first
block) and +3-9% at their training draw: part of its surplus is watts of its own, not a share
of the work. Fitted within a run, long injections bend such a line (docs/gpu.md: tried and
dropped); learnt from the node's *earlier* runs, nothing in the run being judged moves it.

The profile is the log ratio's residual (against the run's own usual, drifting ratio) as a
step function of the peers' level relative to their training level, in bins of `BIN` in log.
Each earlier run adds, per bin, the median residual of its readings (all of them: what one
run cannot tell from foreign work is what it finds departing). A bin's offset is the median
over the runs that reached it, and only where they agree: at least `MIN_RUNS` runs, and a
median larger than their spread (1.4826 x MAD across runs). So what is learnt as the node's
own is what most recent runs showed at that level. How far that keeps foreign work out
(docs/gpu.md has the figures, `bench.gpu_activity --carry --carry-injected N`):
- foreign work that comes and goes (the issue's case) is rarely at the same relative level in
  most of one node's runs: with one foreign episode per run (on one of eight nodes) learnt,
  Dell's figures are as with a clean history but for one alarm on one seed;
- foreign work on most nodes in most runs *is* learnt where two or three early runs of a node
  share it at one level (too few to outvote it), and the false alarms then rise above those
  with no profile; recall is kept (the failure is loud, not silent). So this is not for a
  production check as it stands: it would need far more runs per node than Dell's ten, or a
  way to tell the node's own level dependence from foreign work inside a run;
- foreign work present throughout every run is the node's usual ratio already, with or
  without a profile (a run's own level absorbs it): power alone cannot see it; per-process
  data can (attribution, step 5 in docs/gpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Bin width in log of the peers' level relative to their training level (~10%: Dell's phases
# sit at 45%, 75% and 100% of the training draw).
BIN = 0.1
# Runs that must have reached a bin before its offset is used, and runs remembered.
MIN_RUNS = 2
HISTORY = 10


@dataclass
class PeerProfile:
    """Per bin of the peers' relative level: the median log-ratio residual of each earlier run
    (oldest first, at most HISTORY)."""

    runs: dict[int, list[float]] = field(default_factory=dict)

    def offset(self, x: np.ndarray) -> np.ndarray:
        """The learnt log-ratio offset at each relative peer level `x` (log); 0 where unknown."""
        out = np.zeros(x.shape, float)
        if not self.runs:
            return out
        bins = _bins(x)
        for key, values in self.runs.items():
            off = _agreed(values)
            if off:
                out[bins == key] = off
        return out

    def learn(self, x: np.ndarray, residual: np.ndarray, min_readings: int) -> None:
        """Add one run: per bin, the median residual of its usable readings (finite; at least
        `min_readings` of them in the bin)."""
        ok = np.isfinite(x) & np.isfinite(residual)
        bins = _bins(x[ok])
        res = residual[ok]
        for key in np.unique(bins):
            inside = res[bins == key]
            if inside.size >= min_readings:
                values = self.runs.setdefault(int(key), [])
                values.append(float(np.median(inside)))
                del values[:-HISTORY]


def _bins(x: np.ndarray) -> np.ndarray:
    return np.floor(np.asarray(x, float) / BIN + 0.5).astype(int)


def _agreed(values: list[float]) -> float:
    """The median of the runs' residuals where at least MIN_RUNS agree on it (the median
    larger than their spread); 0 otherwise."""
    if len(values) < MIN_RUNS:
        return 0.0
    v = np.asarray(values, float)
    median = float(np.median(v))
    spread = 1.4826 * float(np.median(np.abs(v - median)))
    return median if abs(median) > spread else 0.0
