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


def blowups(data: object) -> int:
    """How many distinct blow-ups (spike alarms) a loss episode has seen."""
    episode = data.get("episode") if isinstance(data, dict) else None
    seen = episode.get("blowups") if isinstance(episode, dict) else None
    return len(seen) if isinstance(seen, list) else 0


def escalates(new: object, old: object) -> bool:
    """Whether an episode's data (`new`) is worse news than what was said (`old`): a worse
    state, or another blow-up while the loss has not come back (issue 22: worse always gets
    through; the cooldown holds repeats only)."""
    a, b = state_of(new), state_of(old)
    if worse(a, b):
        return True
    elevated = a in ("spiking", "diverged") and not worse(b, a)
    return elevated and blowups(new) > blowups(old)
