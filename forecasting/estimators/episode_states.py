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


def state_of(data: object) -> str | None:
    """The episode state a flag's or condition's data carries (`data["episode"]["state"]`)."""
    episode = data.get("episode") if isinstance(data, dict) else None
    state = episode.get("state") if isinstance(episode, dict) else None
    return state if isinstance(state, str) else None
