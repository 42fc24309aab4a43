"""Loss findings as episodes: one open flag from the onset until the loss is really back.

The detectors report what the end of the curve shows now; this layer keeps what an episode
said from its start (forecasting.estimators.episodes): its onset and the checkpoint before it
stay fixed while it is open (a later blow-up joins it, never moving the rollback into the
diverged stretch), a finding the detectors drop stays open while the loss stands above its
pre-onset level, a spike that does not come back escalates to diverged in the same flag, and
the flag resolves only on a sustained return, saying how long the episode lasted.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from forecasting import selectors
from forecasting.conditions import Condition, Ending
from forecasting.estimators import episode_states
from forecasting.estimators import episodes as ep
from forecasting.estimators import thresholds as th
from forecasting.estimators.divergence import GRAD_NORM_PREFIX
from forecasting.estimators.formatting import money, span
from forecasting.models import Flag
from tracker.models import ASSUMED_PROCESSES_NOTE, Run
from tracker.series import Series

# Loss kinds an episode holds (a NaN is its own event: exact onset, nothing to re-learn).
EPISODE_KINDS = tuple(k for k in Flag.DIVERGENCE_KINDS if k != Flag.Kind.NAN)


def _reference(flag: Flag) -> ep.Reference | None:
    episode = flag.data.get("episode") if isinstance(flag.data, dict) else None
    return (
        ep.Reference.from_dict(episode.get("reference", {})) if isinstance(episode, dict) else None
    )


def _open_episode(
    run: Run, open_flags: dict[str, Flag] | None = None
) -> tuple[dict[str, Flag], ep.Reference | None]:
    if open_flags is None:
        open_flags = selectors.flags_open(run=run)
    flags = {k: f for k, f in open_flags.items() if k in EPISODE_KINDS}
    refs = [r for r in map(_reference, flags.values()) if r is not None]
    return flags, min(refs, key=lambda r: r.onset_step, default=None)


def _rollback(checkpoints: list[float], onset: float) -> float | None:
    # Strictly before, as the detectors say it: a checkpoint saved at the onset step already
    # holds the update that blew up.
    before = [c for c in checkpoints if c < onset]
    return before[-1] if before else None


def _text(
    ref: ep.Reference, j: ep.Judgement, rollback: float | None, data: dict[str, Any], run: Run
) -> str:
    onset, before = f"{ref.onset_step:,.0f}", f"its level before it (~{ref.value:.4g})"
    if j.state == "diverged":
        head = f"Loss diverged at step {onset} and has not come back: {j.ratio:.1f}x {before}."
    elif j.state == "spiking":
        head = f"Loss spiked at step {onset} to {j.ratio:.1f}x {before}; still elevated."
    else:
        since = f"{j.since_step:,.0f}" if j.since_step is not None else onset
        head = f"Loss blew up at step {onset} and is back near {before} since step {since}."
    episode = data.get("episode")
    blowups = episode.get("blowups") if isinstance(episode, dict) else None
    if isinstance(blowups, list) and len(blowups) > 1 and j.state in ("spiking", "diverged"):
        head += f" It blew up again at step {blowups[-1]:,.0f}."
    undone = _undone_text(episode, run.project.currency) if isinstance(episode, dict) else ""
    wasted = data.get("wasted_s")
    cost = data.get("cost")
    spent = ""
    if isinstance(wasted, int | float):
        price = (
            f", about {money(cost, run.project.currency)} in GPU cost{_assumed(data)}"
            if cost
            else ""
        )
        spent = f" {span(wasted)} of training since onset{price}."
    where = (
        f" Last checkpoint before onset: step {rollback:,.0f}."
        if rollback is not None
        else " No checkpoint was logged before the onset."
    )
    layers = data.get("layers_first") or []
    moved = ", ".join(str(x).removeprefix(GRAD_NORM_PREFIX) for x in layers)
    moved_first = f" Gradient norms moved first in {moved}." if moved else ""
    return head + undone + spent + where + moved_first


def _blowups(cond: Condition, said: list[float], ref: ep.Reference, series: Series) -> list[float]:
    """The raw onsets of the blow-ups this episode has seen, this finding's added when it is a
    new one: a spike alarm that began more than an alarm's length (the detectors' gap between
    two episodes) after the last one, from a loss that had settled. A growing oscillation
    raises a spike alarm on each big swing: those are the episode going on, not news (50
    messages for one oscillation when each counted)."""
    if cond.kind != Flag.Kind.SPIKE or cond.onset_step is None or cond.onset_step < ref.onset_step:
        return said
    steps = series.steps.astype(float)
    gap = th.DIV_EPISODE_GAP_POINTS * float(np.median(np.diff(steps))) if steps.size > 1 else 0.0
    if said and cond.onset_step <= said[-1] + gap:
        return said
    if said and not ep.calm_before(steps, series.values, cond.onset_step, ref):
        return said
    return [*said, float(cond.onset_step)]


def _as_episode(
    cond: Condition,
    ref: ep.Reference,
    j: ep.Judgement,
    checkpoints: list[float],
    clock: tuple[Series, Run],
    undone: dict[str, Any],
    blowups: list[float],
) -> Condition:
    series, run = clock
    rollback = _rollback(checkpoints, ref.onset_step)
    data: dict[str, Any] = {
        **cond.data,
        **_spent_since(series, run, ref.onset_step),
        "onset_step": ref.onset_step,
        "rollback_step": rollback,
        "episode": {
            "reference": ref.to_dict(),
            "state": j.state,
            "ratio": j.ratio,
            "level": j.level_value,
            "since_step": j.since_step,
            "blowups": blowups,
            **undone,
        },
    }
    text = _text(ref, j, rollback, data, run)
    return replace(cond, explanation=text, onset_step=ref.onset_step, data=data)


def _spent_since(
    series: Series, run: Run, onset: float, until: float | None = None
) -> dict[str, Any]:
    """The training time and GPU cost since the episode's onset, to `until` (a step; the run's
    last point by default)."""
    ok = np.isfinite(series.times)
    if not ok.any():
        return {}
    steps, times = series.steps[ok].astype(float), series.times[ok]
    end = float(times[-1]) if until is None else float(np.interp(until, steps, times))
    wasted = max(0.0, end - float(np.interp(onset, steps, times)))
    out: dict[str, Any] = {"wasted_s": wasted}
    price = run.project.gpu_hour_price
    if price is not None:
        processes, out["cost_assumed"] = run.priced_processes
        out["cost"] = wasted / 3600.0 * processes * float(price)
    return out


def _undone(series: Series, run: Run, ref: ep.Reference, j: ep.Judgement) -> dict[str, Any]:
    """While the loss stands above its reference: the step before the onset at which it last
    stood this high, and the training (time, GPU cost) from there to the run's last point,
    undone. Stored in flag.data["episode"], so the text and the messages say the same numbers."""
    if j.state not in ("spiking", "diverged") or not j.level_value > 0:
        return {}
    found = ep.back_at(
        series.steps.astype(float),
        series.values,
        series.times,
        level=math.log(j.level_value),
        onset_step=ref.onset_step,
    )
    if found is None:
        return {}
    out: dict[str, Any] = {
        "back_at_step": found.step,
        "back_at_time": found.time,
        "back_at_beyond": found.beyond,
        "undone_steps": found.undone_steps,
    }
    undone = found.undone_s
    price = run.project.gpu_hour_price
    if undone is not None:
        out["undone_s"] = undone
        if price is not None:
            processes, assumed = run.priced_processes
            out["undone_cost"] = undone / 3600.0 * processes * float(price)
            out["cost_assumed"] = assumed
    return out


def _undone_text(episode: dict[str, Any], currency: str) -> str:
    """ "Loss 3.3 is its level at step 410: 5.8 h of training undone (≈ $1,240 at the run's
    rate)." from the fields _undone stored; "" without them. The span is said once: "5.8 h
    ago" beside "5.8 h of training undone" would be the same number twice."""
    step, level = episode.get("back_at_step"), episode.get("level")
    if not isinstance(step, int | float) or not isinstance(level, int | float):
        return ""
    beyond = episode.get("back_at_beyond") is True
    where = (
        f"above its level at the start (step {step:,.0f})"
        if beyond
        else f"its level at step {step:,.0f}"
    )
    seconds, steps = episode.get("undone_s"), episode.get("undone_steps")
    if isinstance(seconds, int | float):
        amount = span(seconds)
    elif isinstance(steps, int | float):
        amount = f"{steps:,.0f} steps"
    else:
        return ""
    cost = episode.get("undone_cost")
    rate = (
        f" (≈ {money(cost, currency)} at the run's rate{_assumed(episode, ',')})"
        if isinstance(cost, int | float)
        else ""
    )
    every = "all " if beyond else ""
    return f" Loss {level:.4g} is {where}: {every}{amount} of training undone{rate}."


def with_episodes(
    *,
    run: Run,
    found: list[Condition],
    series: Series,
    checkpoints: list[float],
    open_flags: dict[str, Flag] | None = None,
) -> tuple[list[Condition], dict[str, Ending]]:
    """The detectors' loss findings folded into the run's open episode, the episode's open
    flags kept while the loss has not come back (see the module's docstring), and what each
    open episode flag says if it closes now (for flags_sync's resolutions). `open_flags`: the
    run's, when the caller has read them already."""
    open_flags, ref = _open_episode(run, open_flags)
    steps, values = series.steps.astype(float), series.values
    judged: dict[int, ep.Judgement | None] = {}

    def judge(r: ep.Reference) -> ep.Judgement | None:
        # One judgement per reference per computation (a finding and the open flags share it).
        if id(r) not in judged:
            judged[id(r)] = ep.judge(steps, values, r)
        return judged[id(r)]

    # What the episode undid, once per computation as its judgement (it smooths the run
    # before the onset: ~0.1 s on a million points). References and judgements are frozen.
    undone = functools.cache(lambda r, j: _undone(series, run, r, j))

    def episode(
        cond: Condition, r: ep.Reference, j: ep.Judgement, blowups: list[float]
    ) -> Condition:
        return _as_episode(cond, r, j, checkpoints, (series, run), undone(r, j), blowups)

    endings: dict[str, Ending] = {}
    if ref is not None and open_flags:
        j0 = judge(ref)
        text = _ending_text(ref, j0, lasted=_lasted(series, run, ref, j0)) if j0 else None
        endings = dict.fromkeys(open_flags, Ending(text)) if text else {}
    out: list[Condition] = []
    for cond in found:
        if cond.kind not in EPISODE_KINDS or cond.onset_step is None:
            out.append(cond)
            continue
        ref = _reference_for(cond.onset_step, ref, judge, steps, values)
        j = judge(ref) if ref is not None else None
        if ref is None or j is None:
            out.append(cond)  # too little history before the onset to judge against
            continue
        if _no_episode(run, ref, j, bool(open_flags), cond.onset_step):
            continue
        # One flag per episode: the open one, whichever kind the detectors see now.
        kind = next(iter(open_flags), cond.kind) if open_flags else cond.kind
        said = _said_blowups(open_flags) if ref.onset_step == _onset(open_flags) else []
        blowups = _blowups(cond, said, ref, series)
        out.append(episode(replace(cond, kind=kind), ref, j, blowups))
    reported = {c.kind for c in out}
    for kind, prev in open_flags.items():
        if kind in reported or ref is None:
            continue
        j = judge(ref)
        if j is not None and j.state != "recovered":
            cond = Condition(kind, prev.explanation, prev.severity, prev.onset_step, prev.data)
            out.append(episode(cond, ref, j, _said_blowups(open_flags)))
    return _one_per_kind(out), endings


def _no_episode(
    run: Run, ref: ep.Reference, j: ep.Judgement, flag_open: bool, found_at: float
) -> bool:
    """Whether a finding is no episode to report."""
    if not j.left and not flag_open:
        # The detectors see a change the episode's own measure does not: the loss never left
        # the band of the run before the onset. No episode yet ("blew up at step 10,550 and is
        # back near its level since step 10,550" was raised, then resolved as lasting 0 s); a
        # finding that grows out of the band is raised then.
        return True
    # The episode is over: the detectors keep a spike "back to normal" in view for 200 points,
    # and the flag they raised stayed open with the loss long back (or, once closed, came back
    # as new).
    return j.state == "recovered" and (flag_open or _said(run, ref, found_at))


def _said_blowups(open_flags: dict[str, Flag]) -> list[float]:
    """The blow-ups the open episode flag has told of (the most, if two flags are open)."""
    lists = []
    for flag in open_flags.values():
        episode = flag.data.get("episode") if isinstance(flag.data, dict) else None
        if isinstance(episode, dict) and isinstance(episode.get("blowups"), list):
            lists.append([float(b) for b in episode["blowups"]])
    return max(lists, key=len, default=[])


def _onset(open_flags: dict[str, Flag]) -> float | None:
    refs = [r for r in map(_reference, open_flags.values()) if r is not None]
    return min((r.onset_step for r in refs), default=None)


def _said(run: Run, ref: ep.Reference, found_at: float) -> bool:
    """Whether a flag already told of this episode: one whose onset lies between where this
    finding's episode was searched back to and where the detectors put it (the search moves
    a little as points arrive; an exact match re-raised a spike told and resolved)."""
    onset_from, onset_to = sorted((int(ref.onset_step), int(found_at)))
    return selectors.flag_exists(
        run=run, kinds=EPISODE_KINDS, onset_from=onset_from, onset_to=onset_to
    )


def _reference_for(
    onset: float,
    ref: ep.Reference | None,
    judge: Callable[[ep.Reference], ep.Judgement | None],
    steps: np.ndarray,
    values: np.ndarray,
) -> ep.Reference | None:
    """The open episode's reference for a finding that joins it; a fresh one for a finding
    from before its onset (the estimate moved earlier) or after it had recovered (a new
    episode)."""
    back = None
    if ref is not None and onset < ref.onset_step:
        # A detector that puts the onset earlier is not by itself an earlier start: the
        # regression's block medians and the rise's CUSUM are coarse (an LR x100 jump at step
        # 801 read as "diverged at step 800", and the rollback moved from checkpoint 800 to
        # 700). The start moves earlier where the change-point search, run again up to the
        # episode's onset with the points since, finds it earlier.
        earlier = ep.onset_search(steps, values, ref.onset_step)
        if earlier >= ref.onset_step:
            return ref
        return ep.reference_before(steps, values, earlier) or ref
    if ref is not None:
        j = judge(ref)
        back = j.since_step if j is not None else None
        over = j is not None and j.state == "recovered" and onset >= (back or onset)
        if not over:
            return ref
    # A new episode: from where the loss began to change, not where a detector's test fired.
    onset = ep.onset_search(steps, values, onset, not_before=back)
    return ep.reference_before(steps, values, onset) or ref


def one_flag_each(conditions: list[Condition]) -> list[Condition]:
    """After the hysteresis: findings of two kinds with one episode (the same reference onset)
    raise one flag, the first's (the detectors list the most severe kinds first), carrying the
    worse news. Before it, each kind keeps its own readings (renaming one to the other's kind
    there broke both kinds' hysteresis: two tinygpt oscillations were never raised); with a
    flag open, with_episodes has already folded every finding into its kind."""
    out: list[Condition] = []
    first: dict[float, int] = {}  # an episode's onset -> its condition's index in out
    for cond in conditions:
        onset = _episode_onset(cond)
        if onset is None or onset not in first:
            if onset is not None:
                first[onset] = len(out)
            out.append(cond)
            continue
        have = out[first[onset]]
        if episode_states.escalates(cond.data, have.data):
            out[first[onset]] = replace(cond, kind=have.kind)
    return out


def _episode_onset(cond: Condition) -> float | None:
    episode = cond.data.get("episode") if cond.kind in EPISODE_KINDS else None
    reference = episode.get("reference") if isinstance(episode, dict) else None
    onset = reference.get("onset_step") if isinstance(reference, dict) else None
    return float(onset) if isinstance(onset, int | float) else None


def _one_per_kind(conditions: list[Condition]) -> list[Condition]:
    # Two findings folded into one episode flag: keep the first (the detectors list the most
    # severe kinds first) unless the other is worse news (a worse state, another blow-up).
    out: dict[str, Condition] = {}
    for cond in conditions:
        have = out.get(cond.kind)
        if have is None or episode_states.escalates(cond.data, have.data):
            out[cond.kind] = cond
    return list(out.values())


def resolutions(*, run: Run, series: Series, ended: str) -> dict[str, Ending]:
    """What each open episode flag says as the run's end closes it (a loss still above its
    reference: what the episode undid, also in the row's data["episode"])."""
    open_flags, ref = _open_episode(run)
    if ref is None or not open_flags:
        return {}
    j = ep.judge(series.steps.astype(float), series.values, ref)
    text = _ending_text(ref, j, ended, _lasted(series, run, ref, j)) if j is not None else None
    if j is None or text is None:
        return {}
    undone = _undone(series, run, ref, j)
    # The state it ended in: a run that ends with its loss back closes its flag saying so
    # ("recovered", "recovering"), and is not a run that ended diverged
    # (selectors.episode_ends_by_run).
    episode = {"state": j.state, "level": j.level_value, **undone}
    if undone:
        text += _undone_text(episode, run.project.currency)
    return dict.fromkeys(open_flags, Ending(text, {"episode": episode}))


def _lasted(series: Series, run: Run, ref: ep.Reference, j: ep.Judgement) -> str:
    """How long a recovered episode lasted and what it cost, from its onset to the step the
    loss was back: " It lasted 12 min (≈ $1,240 at the run's rate)." ("" without times)."""
    if j.state != "recovered" or j.since_step is None:
        return ""
    spent = _spent_since(series, run, ref.onset_step, j.since_step)
    if "wasted_s" not in spent:
        return ""
    cost = spent.get("cost")
    price = (
        f" (≈ {money(cost, run.project.currency)} at the run's rate{_assumed(spent, ',')})"
        if cost
        else ""
    )
    return f" It lasted {span(spent['wasted_s'])}{price}."


def _assumed(data: dict[str, Any], sep: str = "") -> str:
    """ " (1 process assumed)" after a cost priced on a run that reports no world size."""
    if not data.get("cost_assumed"):
        return ""
    return f"{sep} {ASSUMED_PROCESSES_NOTE}" if sep else f" ({ASSUMED_PROCESSES_NOTE})"


def _ending_text(
    ref: ep.Reference, j: ep.Judgement, ended: str | None = None, lasted: str = ""
) -> str | None:
    """How an episode ended against its reference: recovered, or at the run's end back but
    not for long, or never recovered."""
    onset, before = f"{ref.onset_step:,.0f}", f"its level before it (~{ref.value:.4g})"
    if j.state == "recovered":
        since = f"{j.since_step:,.0f}" if j.since_step is not None else onset
        steps = (j.since_step or ref.onset_step) - ref.onset_step
        return (
            f"Loss recovered from the blow-up at step {onset}: back at {before} since step"
            f" {since}, {steps:,.0f} steps after the onset.{lasted}"
        )
    if ended is not None and j.state == "recovering":
        # Back inside, but for fewer points than a recovery asks (a sparse validation loss
        # may have only a few left): the loss was back; "never recovered" was not true.
        since = f"{j.since_step:,.0f}" if j.since_step is not None else onset
        return (
            f"The run {ended} with its loss back near {before} since step {since}: the blow-up"
            f" at step {onset} had passed, for fewer points than a recovery asks"
            f" ({th.EPISODE_RECOVER_POINTS})."
        )
    if ended is not None:
        return (
            f"The run {ended} with its loss {j.ratio:.1f}x {before}: diverged at step {onset}"
            " and never recovered."
        )
    return None
