"""What computations find, as plain data: the flags' writer and the hysteresis share it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class Condition:
    """A flag-worthy condition found by one computation."""

    kind: str
    explanation: str
    severity: float | None = None
    onset_step: float | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Ending:
    """What an open flag says as it closes (a loss episode: how it ended against the run
    before it) and what its closing row records besides (`data`, merged into the row's)."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reading:
    """What one computation found before hysteresis (a stored ConditionReading)."""

    at: datetime
    found: frozenset[str]
    deadline_p: float | None = None
    # The progress report (last step) it was computed from: readings of one report are one.
    input_step: int | None = None
    # How far the finish had slipped, when it found a slip (flag_bands.slip_band places it).
    slip_s: float | None = None
