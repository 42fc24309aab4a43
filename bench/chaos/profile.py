"""What one chaos run does: which scenarios, how long each dependency stays down, how many
trainers log how fast, and the liveness clocks the stack runs with.

Two presets. `full` replays issue 24 as it was tried (web down 10 min, PostgreSQL killed for
2 min, three trainers at 50 points/s) on the production liveness rules. `quick` (CI) keeps the
scenarios that need no long outage and shortens the liveness clocks so that a run killed after
one batch is judged within a minute: the sweep every 5 s instead of 60, a silence of 20 s
instead of 60 at least before a run is crashed, 10 s instead of 60 of grace after an outage, the
client beating every 2 s (15) and probing a down server at most every 5 s (60). The grace must
stay at least the client's longest probe interval, as in production (STALL_RECONNECT_GRACE_S).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The order they run in: the ones that need the whole stack healthy first, the outages after,
# Redis last (issue 24: the worker dies with it, and nothing after it could be forecast).
SCENARIOS = ("run_killed", "worker_killed", "web_down", "postgres_killed", "redis_killed")
# Issue 24's goal: forecasts back within 2 minutes of each dependency's return.
FORECAST_RESUME_GOAL_S = 120.0


@dataclass(frozen=True)
class Liveness:
    """The clocks the liveness rules run on (docs/deployment.md#outages)."""

    sweep_period_s: float  # RUNCAST_SWEEP_PERIOD_S
    stall_min_s: float  # forecasting.estimators.thresholds.STALL_MIN_S
    reconnect_grace_s: float  # ... STALL_RECONNECT_GRACE_S
    heartbeat_s: float  # the client's RUNCAST_HEARTBEAT_INTERVAL
    probe_max_s: float  # the client's longest probe interval while the server is away

    @property
    def production(self) -> bool:
        return self == PRODUCTION_LIVENESS


PRODUCTION_LIVENESS = Liveness(
    sweep_period_s=60.0,
    stall_min_s=60.0,
    reconnect_grace_s=60.0,
    heartbeat_s=15.0,
    probe_max_s=60.0,
)
SHORT_LIVENESS = Liveness(
    sweep_period_s=5.0, stall_min_s=20.0, reconnect_grace_s=10.0, heartbeat_s=2.0, probe_max_s=5.0
)


@dataclass(frozen=True)
class Profile:
    name: str
    scenarios: tuple[str, ...]
    trainers: int  # live trainers, each a run of its own for the whole bench
    points_per_s: float  # per trainer: `keys` points a step
    keys: int
    web_down_s: float
    postgres_down_s: float
    redis_down_s: float
    # Longest wait, after a dependency is back, for every live run's next forecast. Past the
    # goal so that a slow return is measured rather than cut off.
    resume_timeout_s: float
    liveness: Liveness
    # Before any scenario: every live run has its first forecast (the stack works at all).
    warmup_timeout_s: float = 120.0


QUICK = Profile(
    name="quick",
    scenarios=("run_killed", "worker_killed", "redis_killed"),
    trainers=3,
    points_per_s=20.0,
    keys=2,
    web_down_s=20.0,
    postgres_down_s=15.0,
    redis_down_s=5.0,
    # The goal itself: a forecast that has not come back by then has missed it.
    resume_timeout_s=FORECAST_RESUME_GOAL_S,
    liveness=SHORT_LIVENESS,
)
FULL = Profile(
    name="full",
    scenarios=SCENARIOS,
    trainers=3,
    points_per_s=50.0,
    keys=2,
    web_down_s=600.0,
    postgres_down_s=120.0,
    redis_down_s=30.0,
    resume_timeout_s=300.0,
    liveness=PRODUCTION_LIVENESS,
)
PROFILES = {p.name: p for p in (QUICK, FULL)}


def with_overrides(
    profile: Profile, *, fields: Mapping[str, Any], clocks: Mapping[str, float | None]
) -> Profile:
    """`profile` with the given fields and liveness clocks changed (None: unchanged)."""
    fields = {k: v for k, v in fields.items() if v is not None}
    scenarios = fields.get("scenarios")
    if scenarios is not None:
        unknown = set(scenarios) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenario(s): {', '.join(sorted(unknown))}")
        # Always in SCENARIOS' order, whatever order they were named in.
        fields["scenarios"] = tuple(s for s in SCENARIOS if s in scenarios)
    liveness = dataclasses.replace(
        profile.liveness, **{k: v for k, v in clocks.items() if v is not None}
    )
    return dataclasses.replace(profile, liveness=liveness, **fields)
