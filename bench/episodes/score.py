"""Scoring one replay's flag stream against its episode, and the set's summary. No Django: the
replay hands over its flag rows as FlagRow, so the scoring is tested on hand-made streams."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.episodes.data import Episode
from forecasting.estimators import episodes

# forecasting.models.Flag.DIVERGENCE_KINDS, kept here so the scoring imports no Django.
DIVERGENCE_KINDS = ("nan", "spike", "rise", "oscillation", "regression")
OPEN_STATES = ("raised", "updated")
WEEK_H = 7 * 24.0


@dataclass(frozen=True)
class FlagRow:
    t: float  # run-clock seconds
    kind: str
    state: str
    onset_step: float | None
    rollback_step: float | None
    closed_by_end: bool  # resolved because the run ended: not the state at its last point
    sent: int  # notifications of this row sent
    held: int  # notifications of this row not sent (the cooldown, or "no worse than" the last)
    back_at_end: bool = False  # closed by the run's end saying the loss was back then
    escalation: bool = False  # an update that is worse news than its flag's row before


@dataclass
class Scored:
    run: str
    episode: Episode | None  # None: a healthy replay
    run_hours: float
    detected_after_s: float | None = None
    detected_after_steps: float | None = None
    healthy_while_diverged_s: float = 0.0
    rollbacks: list[float] = field(default_factory=list)
    rollback_ok: bool | None = None
    # Checkpoints between the earliest advised rollback and the onset: a rollback safely before
    # the onset can still throw away more training than it had to.
    rollback_skipped: int | None = None
    # Injected: whether the fault stood outside one point's noise band before the first
    # checkpoint after its onset (the one a rollback must not pass). When it did not, the
    # points cannot tell any method that the onset came before that checkpoint.
    visible_before_checkpoint: bool | None = None
    end_open: bool = False
    messages: int = 0
    held: int = 0
    escalations: int = 0  # updates worse than their flag's row before (diverged, blew up again)
    escalations_held: int = 0  # ... of which not sent
    false_alerts: Counter[str] = field(default_factory=Counter)  # healthy replays only

    @property
    def end_state_correct(self) -> bool:
        recovered = self.episode is None or self.episode.recovered_step is not None
        return self.end_open != recovered


def _divergence(flags: list[FlagRow]) -> list[FlagRow]:
    return sorted((f for f in flags if f.kind in DIVERGENCE_KINDS), key=lambda f: f.t)


def open_after(flags: list[FlagRow], t: float) -> set[str]:
    """Divergence kinds open once every row at or before t is applied (run-end closes aside,
    but for those that say the loss was back: the episode was over when the run ended)."""
    state: dict[str, str] = {}
    for f in _divergence(flags):
        if f.t <= t and (not f.closed_by_end or f.back_at_end):
            state[f.kind] = f.state
    return {k for k, s in state.items() if s in OPEN_STATES}


def healthy_seconds(flags: list[FlagRow], start: float, stop: float) -> float:
    """Seconds of [start, stop] with no divergence-kind flag open."""
    if stop <= start:
        return 0.0
    cuts = sorted({start, stop, *(f.t for f in _divergence(flags) if start < f.t < stop)})
    total = 0.0
    for a, b in itertools.pairwise(cuts):
        if not open_after(flags, a):
            total += b - a
    return total


def score_episode(
    run: str,
    episode: Episode,
    flags: list[FlagRow],
    clock: tuple[np.ndarray, np.ndarray],
    checkpoints: list[float],
) -> Scored:
    """`clock`: the replayed rows' (t, step), in order; its last t is the run's last point."""
    times, steps = clock
    end_t = float(times[-1])
    out = Scored(run, episode, end_t / 3600.0, end_open=bool(open_after(flags, np.inf)))
    stop = episode.recovered_t if episode.recovered_t is not None else end_t
    found = [f for f in _divergence(flags) if f.state in OPEN_STATES and f.t >= episode.onset_t]
    if found:
        t = found[0].t
        out.detected_after_s = t - episode.onset_t
        seen = steps[times <= t]
        out.detected_after_steps = float(seen[-1]) - episode.onset_step if seen.size else None
        out.healthy_while_diverged_s = healthy_seconds(flags, t, stop)
    else:
        out.healthy_while_diverged_s = max(0.0, stop - episode.onset_t)
    # Advice given until the recovery, or the first detection's when it came after it.
    inside = [f for f in found if f.t <= max(stop, found[0].t)] if found else []
    out.rollbacks = [f.rollback_step for f in inside if f.rollback_step is not None]
    if out.rollbacks:
        out.rollback_ok = all(r <= episode.onset_step for r in out.rollbacks)
        first = min(out.rollbacks)
        out.rollback_skipped = sum(first < c <= episode.onset_step for c in checkpoints)
    elif found and any(c <= episode.onset_step for c in checkpoints):
        out.rollback_ok = False  # a checkpoint before the onset existed; none was advised
    after = [f for f in _divergence(flags) if f.t >= episode.onset_t]
    out.messages = sum(f.sent for f in after)
    out.held = sum(f.held for f in after if f.state in OPEN_STATES)
    out.escalations = sum(1 for f in after if f.escalation)
    out.escalations_held = sum(1 for f in after if f.escalation and f.held)
    return out


def score_healthy(run: str, flags: list[FlagRow], run_hours: float, alerts: Counter[str]) -> Scored:
    return Scored(
        run, None, run_hours, end_open=bool(open_after(flags, np.inf)), false_alerts=alerts
    )


# --- the set ---------------------------------------------------------------------------------


def _stats(values: list[float], digits: int = 1) -> dict[str, float | None]:
    if not values:
        return {"median": None, "max": None}
    return {"median": round(float(np.median(values)), digits), "max": round(max(values), digits)}


def _share(flags: list[bool | None]) -> float | None:
    known = [f for f in flags if f is not None]
    return round(sum(known) / len(known), 3) if known else None


def episode_summary(eps: list[Scored]) -> dict[str, Any]:
    hwd = [e.healthy_while_diverged_s for e in eps]
    delays = [e.detected_after_s for e in eps if e.detected_after_s is not None]
    delay_steps = [e.detected_after_steps for e in eps if e.detected_after_steps is not None]
    return {
        "episodes": len(eps),
        "episode_recall": round(len(delays) / len(eps), 3) if eps else None,
        "detection_delay_s": _stats(delays),
        "detection_delay_steps": _stats(delay_steps, 0),
        "healthy_while_diverged_s": {
            "total": round(sum(hwd), 1),
            "max": round(max(hwd), 1) if hwd else None,
        },
        "rollback_before_onset_share": _share([e.rollback_ok for e in eps]),
        "rollback_scored": sum(e.rollback_ok is not None for e in eps),
        "rollback_before_onset_share_where_visible": _share(
            [e.rollback_ok for e in eps if e.visible_before_checkpoint is not False]
        ),
        "not_visible_before_checkpoint": sum(e.visible_before_checkpoint is False for e in eps),
        "rollback_checkpoints_skipped": _stats(
            [float(e.rollback_skipped) for e in eps if e.rollback_skipped is not None]
        ),
        "end_state_correct_share": _share([e.end_state_correct for e in eps]),
        "messages_per_episode": _stats([float(e.messages) for e in eps]),
        "raises_or_updates_not_sent": sum(e.held for e in eps),
        "escalations": sum(e.escalations for e in eps),
        "escalations_not_sent": sum(e.escalations_held for e in eps),
    }


def visible_before_checkpoint(
    clean: tuple[np.ndarray, np.ndarray],
    faulty: np.ndarray,
    onset_step: float,
    checkpoints: list[float],
) -> bool | None:
    """Whether an injected fault's loss (`faulty`, at the clean curve's steps) stood above one
    point's noise band of the run before it (episodes.Reference.point_band) at a point before
    the first checkpoint after its onset. None: no reference, or no checkpoint after it."""
    steps, values = clean
    ref = episodes.reference_before(steps, values, onset_step)
    after = [c for c in checkpoints if c > onset_step]
    if ref is None or not after:
        return None
    window = (steps >= onset_step) & (steps < after[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.log(faulty[window]) - np.log(values[window])
    # A NaN the fault writes is as visible as a point can be.
    return bool(np.any(~np.isfinite(faulty[window]) | (excess > ref.point_band())))


def false_alert_rates(healthy: list[Scored]) -> dict[str, Any]:
    """Pooled over run-hours (as bench/flagstream.py), without runs over a week, and the mean
    of per-run rates (issue 22, item 10: a few months-long runs cannot dilute these two)."""

    def pooled(runs: list[Scored], kinds: tuple[str, ...] | None = None) -> float | None:
        hours = sum(r.run_hours for r in runs)
        n = sum(v for r in runs for k, v in r.false_alerts.items() if kinds is None or k in kinds)
        return round(100 * n / hours, 3) if hours else None

    short = [r for r in healthy if r.run_hours <= WEEK_H]
    per_run = [100 * sum(r.false_alerts.values()) / r.run_hours for r in healthy if r.run_hours]
    kinds: Counter[str] = sum((r.false_alerts for r in healthy), Counter())
    return {
        "false_alerts": sum(kinds.values()),
        "false_alerts_by_kind": dict(sorted(kinds.items())),
        "false_alerts_per_100_run_hours": pooled(healthy),
        "divergence_false_alerts_per_100_run_hours": pooled(healthy, DIVERGENCE_KINDS),
        "false_alerts_per_100_run_hours_under_a_week": pooled(short),
        "runs_over_a_week": len(healthy) - len(short),
        "false_alerts_per_100_run_hours_mean_of_runs": (
            round(float(np.mean(per_run)), 3) if per_run else None
        ),
    }


def summarise(scored: list[Scored], skipped: int) -> dict[str, Any]:
    eps = [s for s in scored if s.episode is not None]
    healthy = [s for s in scored if s.episode is None]
    by: dict[str, list[Scored]] = defaultdict(list)
    origin: dict[str, list[Scored]] = {"documented": [], "injected": []}
    for e in eps:
        assert e.episode is not None
        by[e.episode.scenario].append(e)
        origin.setdefault(e.episode.scenario.split(":")[0], []).append(e)
    return {
        **episode_summary(eps),
        "healthy_runs": len(healthy),
        "healthy_run_hours": round(sum(r.run_hours for r in healthy), 3),
        "healthy_end_state_correct_share": _share([r.end_state_correct for r in healthy]),
        **false_alert_rates(healthy),
        "skipped_runs": skipped,
        "by_origin": {k: episode_summary(v) for k, v in origin.items()},
        "by_scenario": {k: episode_summary(v) for k, v in sorted(by.items())},
    }


def table(scored: list[Scored], summary: dict[str, Any]) -> str:
    lines = [
        "episode                                             delay s  healthy s  rollbacks"
        "            end  msgs held"
    ]
    for s in scored:
        if s.episode is None:
            continue
        e = s.episode
        end = "ok" if s.end_state_correct else ("open" if s.end_open else "CLOSED")
        back = "never" if e.recovered_step is None else f"{e.recovered_step:.0f}"
        rb = ",".join(f"{r:.0f}" for r in sorted(set(s.rollbacks))) or "-"
        delay = "missed" if s.detected_after_s is None else f"{s.detected_after_s:.0f}"
        lines.append(
            f"{s.run[:32]:<32} {e.scenario[:18]:<18} {delay:>7} {s.healthy_while_diverged_s:>10.0f}"
            f"  {rb[:18]:<18} (onset {e.onset_step:.0f}, back {back}) {end} {s.messages:>4}"
            f" {s.held:>4}"
        )
    noisy = [s for s in scored if s.episode is None and s.false_alerts]
    lines += [f"false alerts on {s.run}: {dict(s.false_alerts)}" for s in noisy]
    lines.append(f"{summary['episodes']} episodes, {summary['healthy_runs']} healthy replays")
    return "\n".join(lines)
