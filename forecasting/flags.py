"""The one writer of Flag rows (the alerts' outbox), for every kind.

Loss, ETA, deadline, straggler, liveness and GPU findings all become rows here: `flags_sync`
for conditions that open, change and close, `flags_close` when a run ends, `flag_event` for
findings that are events (a hang, an unexplained GPU burst). Each write holds the run's row
lock, so concurrent computations of one run serialise, and sends `signals.flags_written` after
commit: that is how the alerts layer hears of new rows (tests/test_architecture.py keeps every
`Flag` write in this module).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from forecasting import selectors
from forecasting.conditions import Condition, Ending
from forecasting.estimators import episode_states, flag_bands
from forecasting.estimators import formatting as fmt
from forecasting.models import Flag
from forecasting.signals import flags_written
from tracker.models import Run


@transaction.atomic
def flags_sync(
    *,
    run: Run,
    conditions: list[Condition],
    kinds: tuple[str, ...],
    now: datetime,
    reason: str | None = None,
    ended: bool = False,
    resolutions: dict[str, Ending] | None = None,
) -> list[Flag]:
    """Write a Flag row for each change: raised, updated (onset moved) or resolved.

    Of the kinds in `kinds`, an open flag whose condition is absent resolves; `reason` says why,
    when it is not that the condition cleared, and `resolutions` what a kind's flag says as it
    closes (a loss episode: how it ended against the run before it).
    """
    _lock(run)
    current = {c.kind: c for c in conditions}
    open_flags = selectors.flags_open(run=run)
    written = []
    for kind, cond in current.items():
        prev = open_flags.get(kind)
        if prev is not None and not _is_news(prev, cond):
            continue
        state = Flag.State.RAISED if prev is None else Flag.State.UPDATED
        written.append(_write(run, cond, state, prev.state if prev else "", now))
    for kind, prev in open_flags.items():
        if kind in kinds and kind not in current:
            # What the flag said, marked as past: "nan cleared: Loss ... is still not finite"
            # read as the loss still being NaN in the very line that says it cleared.
            said = f"{kind} cleared (it said: {prev.explanation})"
            text = f"{kind} resolved: {reason}" if reason else said
            data: dict[str, Any] = {"reason": reason, "closed_by_run_end": ended} if reason else {}
            if (was := episode_states.state_of(prev.data)) is not None:
                data["episode_was"] = was  # the alert gate routes the close as it did the flag
            if ended:
                # Which attempt's end closed it: a resumed run's later end is how it ended
                # (selectors.episode_ends_by_run), not this one.
                data["attempt"] = run.current_segment
            if resolutions and kind in resolutions:
                ending = resolutions[kind]
                text = ending.text
                data.update(ending.data, episode_end=text)
            cond = Condition(kind, text, None, prev.onset_step, data)
            written.append(_write(run, cond, Flag.State.RESOLVED, prev.state, now))
    _announce(written)
    return written


def flags_close(
    *, run: Run, reason: str, now: datetime, resolutions: dict[str, Ending] | None = None
) -> list[Flag]:
    """Resolve every open flag of a run with the reason (its end): ended runs are final."""
    kinds = tuple(Flag.Kind.values)
    return flags_sync(
        run=run,
        conditions=[],
        kinds=kinds,
        now=now,
        reason=reason,
        ended=True,
        resolutions=resolutions,
    )


@transaction.atomic
def flag_event(*, run: Run, condition: Condition, now: datetime) -> Flag:
    """Raise a finding that is an event of its own (each hang, each unexplained burst): a new
    RAISED row whatever the kind's last row said; the run's end closes it with the rest."""
    _lock(run)
    last = Flag.objects.filter(run=run, kind=condition.kind).first()
    flag = _write(run, condition, Flag.State.RAISED, last.state if last else "", now)
    _announce([flag])
    return flag


def _lock(run: Run) -> None:
    # Serialise every writer of this run's flags: two computations reading the same open flag
    # would each write its change (a raise twice, an update and a resolve crossing).
    Run.objects.select_for_update().filter(pk=run.pk).first()


def _announce(written: list[Flag]) -> None:
    if written:
        ids = [f.pk for f in written]
        # robust: a broker hiccup in a receiver must not fail the caller's commit callbacks.
        transaction.on_commit(lambda: flags_written.send(sender=Flag, flag_ids=ids), robust=True)


def _is_news(prev: Flag, cond: Condition) -> bool:
    # Same onset and same band: the open flag already says this; a new row would re-alert.
    # A deadline's band moves only as forecasting.hysteresis lets it: worse at once, better once
    # held (a short run's odds wobbling 20-42% wrote ten rows in four minutes).
    if prev.kind == Flag.Kind.STRAGGLER and prev.data.get("ranks") != cond.data.get("ranks"):
        return True  # another rank is now the one everyone waits for
    if flag_bands.band(prev.kind, prev.data) != flag_bands.band(cond.kind, cond.data):
        return True
    if episode_states.escalates(cond.data, prev.data):
        return True  # a loss episode got worse (diverged, blew up again): news whatever its onset
    if prev.onset_step == int_or_none(cond.onset_step):
        return False
    if "rollback_step" in prev.data or "rollback_step" in cond.data:
        # A loss finding's onset is re-estimated as points arrive; what a lead acts on is the
        # checkpoint to roll back to. Each small move was an "updated" alert after every
        # cooldown (21 messages for one regression in a stop-17 experiment).
        return prev.data.get("rollback_step") != cond.data.get("rollback_step")
    return True


def int_or_none(value: float | None) -> int | None:
    # Rounded as every reader rounds a step (formatting.step_at): int() cut an onset of 2497.6
    # to 2,497 on the chart while the email, from the same data, said 2,498.
    return fmt.step_at(value)


def _write(run: Run, cond: Condition, state: str, previous: str, now: datetime) -> Flag:
    return Flag.objects.create(
        run=run,
        kind=cond.kind,
        state=state,
        previous_state=previous,
        severity=cond.severity,
        explanation=cond.explanation,
        onset_step=int_or_none(cond.onset_step),
        data=cond.data,
        created_at=now,
    )
