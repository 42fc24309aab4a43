"""The states of a loss episode, in order of how bad they are (numpy-free: the flag writer and
the alert gate, which web workers import, compare them; estimators/episodes.py judges them)."""

from __future__ import annotations

# Worse states rank higher: an episode that moves up this order is news (forecasting.flags).
STATES = ("recovered", "recovering", "spiking", "diverged")


def worse(a: str | None, b: str | None) -> bool:
    """Whether state a is worse than state b (unknown states are neither)."""
    if a not in STATES or b not in STATES:
        return False
    return STATES.index(a) > STATES.index(b)
