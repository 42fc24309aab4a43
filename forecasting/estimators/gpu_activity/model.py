"""The GPU activity estimator's inputs (the run's phases and point events), its knobs and its
output (an episode)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from forecasting.estimators import thresholds as th
from forecasting.estimators.jsonable import as_json

IDLE_PHASES = frozenset({"idle", "pre_init", "post_run"})
# Point events whose effect on activity has no learnable shape: departures near them are the run's.
POINT_EVENT_KINDS = frozenset(
    {"checkpoint", "resume", "restart", "arch_change", "lr_change", "custom", "step_change"}
)


@dataclass(frozen=True)
class Phase:
    start: float
    end: float
    kind: str  # "init", "train", "eval", "checkpoint", ...; gaps between phases are "idle"


@dataclass(frozen=True)
class Mark:
    time: float
    kind: str  # one of POINT_EVENT_KINDS (others are accepted and treated alike)
    # A checkpoint logged when it finished covers its writing time before `time`.
    before_s: float = 0.0
    # Its own margin either side, where its time is known to the sample (a warm-up measured on
    # the readings); None: the event window of point events.
    margin_s: float | None = None
    # Where its window ends otherwise: before `time + after_s` (exclusive; None: margin_s past
    # `time`, inclusive). A warm-up ends at a reading of its own, the first at the level.
    after_s: float | None = None


@dataclass
class RunEvents:
    phases: list[Phase] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    # Step timings: when each step completed and its number (or step durations' end times).
    step_times: np.ndarray = field(default_factory=lambda: np.empty(0))
    steps: np.ndarray = field(default_factory=lambda: np.empty(0))


@dataclass(frozen=True)
class Settings:
    """The estimator's knobs; thresholds.py's GPU section says why each default is what it is."""

    tolerance_s: float = th.GPU_TOLERANCE_S
    # Window around point events (checkpoint, eval logged as an instant ...); None: tolerance_s.
    event_window_s: float | None = None
    min_duration_s: float = th.GPU_MIN_DURATION_S
    merge_gap_s: float = th.GPU_MERGE_GAP_S
    z: float = th.GPU_Z
    rel: float = th.GPU_REL
    min_rel_spread: float = th.GPU_MIN_REL_SPREAD
    window_s: float = th.GPU_WINDOW_S
    smooth_s: float = th.GPU_SMOOTH_S
    idle_quantile: float = th.GPU_IDLE_QUANTILE
    warmup_s: float = th.GPU_WARMUP_S
    passes: int = th.GPU_PASSES
    level_share: float = th.GPU_LEVEL_SHARE
    plateau_s: float = th.GPU_PLATEAU_S
    step_change_rel: float = th.GPU_STEP_CHANGE_REL
    step_change_window: int = th.GPU_STEP_CHANGE_WINDOW
    hang_factor: float = th.GPU_HANG_FACTOR
    hang_min_s: float = th.GPU_HANG_MIN_S
    busy_rel: float = th.GPU_HANG_BUSY_REL


DEFAULT = Settings()


@dataclass
class Episode:
    start: float
    end: float
    kind: str  # "burst" | "plateau" | "drop" | "hang"
    phase: str
    explained: bool
    reason: str
    detected_at: float
    expected: float
    observed: float  # median over the episode
    delta_rel: float  # (observed - expected) / expected
    peak: float
    samples: int

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return as_json(self)
