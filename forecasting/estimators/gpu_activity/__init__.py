"""GPU activity that the run's own events do not explain, and the hard `hang` rule.

Input: one activity series (a GPU's utilisation, or a node's power as a proxy) sampled at ~1 Hz,
and the run's own events on the same clock. The method (docs/gpu.md has the figures), by module:

- model.py: the inputs (phases, point events, step timings), the knobs (`Settings`, whose
  defaults and their reasons are in thresholds.py) and the output (`Episode`);
- levels.py: each sample's phase and regime, and each regime's normal level and noise;
- episodes.py: the expected band, departures from it, and episodes explained or not;
- hang.py: `find_hang`, GPUs busy while the run makes no progress.

The names callers use are re-exported here (forecasting.gpu.check imports this package lazily,
as one module: it pulls in pandas).
"""

from __future__ import annotations

from forecasting.estimators.gpu_activity.clock import peer_offsets
from forecasting.estimators.gpu_activity.episodes import find_episodes, learn_peer_profile
from forecasting.estimators.gpu_activity.hang import find_hang
from forecasting.estimators.gpu_activity.levels import phase_labels, step_change_marks
from forecasting.estimators.gpu_activity.model import Episode, Mark, Phase, RunEvents, Settings
from forecasting.estimators.gpu_activity.profile import PeerProfile

__all__ = [
    "Episode",
    "Mark",
    "PeerProfile",
    "Phase",
    "RunEvents",
    "Settings",
    "find_episodes",
    "find_hang",
    "learn_peer_profile",
    "peer_offsets",
    "phase_labels",
    "step_change_marks",
]
