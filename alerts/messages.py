"""What a notification says: numbers gathered and formatted here, words in templates/alerts/.

Flag.data holds an estimator's to_dict(); keys differ by kind and may be missing (older rows,
estimators that changed), so every read is defensive and a missing number drops its fact.

The clock rule (docs/alerts.md): every time in a message is in the project's zone with its
offset. Contexts hold times as stamps (formatting.stamp), as flag explanations do, and `render`
writes them all in that one zone; the history page renders the same stamps in its reader's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from django.db.models import Max
from django.template.loader import render_to_string

from alerts.kinds import BY_KEY
from alerts.models import Notification
from forecasting import board
from forecasting.estimators import episode_states
from forecasting.estimators import formatting as fmt
from forecasting.estimators.deadline import on_time_tone
from forecasting.models import Flag, Forecast
from forecasting.selectors import ended_diverged_text, episode_at_end, flags_open
from tracker.links import run_url
from tracker.models import ASSUMED_PROCESSES_NOTE, Event, LatestMetric, Run

# How a run ends, as a notification's kind (its event is "ended").
RUN_ENDINGS = ("finished", "failed", "crashed")
SEVERITY_MARK = {"info": "\u2139\ufe0f", "warning": "\u26a0\ufe0f", "critical": "\U0001f6a8"}


@dataclass
class Message:
    """One rendered alert, shared by every transport."""

    subject: str
    text: str
    html: str
    headline: str
    facts: list[tuple[str, str]]
    url: str
    severity: str
    payload: dict[str, Any] = field(default_factory=dict)
    # What the history page shows of it: the explanation, or else the headline, with its times
    # as stamps, so the page writes them in its reader's zone (empty in messages kept before).
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        """What a Notification keeps (its `rendered`): every try sends this, the history shows
        it."""
        return {**asdict(self), "facts": [list(f) for f in self.facts]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Message:
        return cls(**{**data, "facts": [(str(a), str(b)) for a, b in data.get("facts", [])]})

    def for_notification(self, public_id: object) -> Message:
        """This event's message as one delivery of it: its body carries the delivery's id."""
        return replace(self, payload={"id": str(public_id), **self.payload})


def _num(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _assumed(data: dict[str, Any]) -> str:
    """A cost priced on a run that reports no world size says so (Run.priced_processes)."""
    return f" ({ASSUMED_PROCESSES_NOTE})" if data.get("cost_assumed") else ""


def _divergence_context(run: Run, data: dict[str, Any]) -> dict[str, Any]:
    gpus = run.world_size
    return {
        # Rounded as the flag's onset_step and the chart (formatting.step_at).
        "onset": fmt.steps(fmt.step_at(_num(data, "onset_step")))
        if _num(data, "onset_step") is not None
        else None,
        "detected": fmt.steps(_num(data, "detected_step")) if _num(data, "detected_step") else None,
        "rollback": fmt.steps(_num(data, "rollback_step")) if _num(data, "rollback_step") else None,
        "regression_to": fmt.steps(_num(data, "regression_to_step"))
        if _num(data, "regression_to_step") is not None
        else None,
        "wasted": fmt.span(_num(data, "wasted_s")) if _num(data, "wasted_s") is not None else None,
        "gpus": gpus,
        "cost": fmt.money(cost, run.project.currency) + _assumed(data)
        if (cost := _num(data, "cost")) is not None
        else None,
        "layers_first": ", ".join(str(x) for x in data.get("layers_first") or [])[:200],
        **_episode_context(run, data),
    }


def _episode_context(run: Run, data: dict[str, Any]) -> dict[str, Any]:
    """A loss episode's state against the run before its onset (forecasting.episodes)."""
    episode = data.get("episode")
    if not isinstance(episode, dict):
        return {}
    ratio = _num(episode, "ratio")
    reference = episode.get("reference")
    before = _num(reference, "value") if isinstance(reference, dict) else None
    return {
        "state": episode.get("state"),
        "ratio": f"{ratio:.1f}x" if ratio is not None else None,
        "before": f"{before:.4g}" if before is not None else None,
        **_undone_context(run, episode),
    }


def _undone_context(run: Run, episode: dict[str, Any]) -> dict[str, Any]:
    """Where the loss last stood at the episode's level before its onset and the training
    undone since (forecasting.episodes._undone): the numbers the flag's explanation says."""
    step = _num(episode, "back_at_step")
    if step is None:
        return {}
    at, seconds = _num(episode, "back_at_time"), _num(episode, "undone_s")
    steps, cost = _num(episode, "undone_steps"), _num(episode, "undone_cost")
    undone = fmt.span(seconds) if seconds is not None else None
    if undone is None and steps is not None:
        undone = f"{fmt.steps(steps)} steps"
    return {
        "back_at": fmt.steps(step),
        "back_at_when": fmt.stamp(at) if at is not None else None,
        "back_at_beyond": episode.get("back_at_beyond") is True,
        "undone": undone,
        "undone_cost": fmt.money(cost, run.project.currency) + _assumed(episode)
        if cost is not None
        else None,
    }


def _end_episode(run: Run) -> dict[str, Any]:
    """What the run's loss episode was when the run ended, if one was still open then, and the
    training it had undone."""
    closed = episode_at_end(run=run) or _still_open_episode(run)
    text = ended_diverged_text(closed)
    if closed is None or text is None:
        return {"episode": None}
    episode = closed.data.get("episode") if isinstance(closed.data, dict) else None
    return {
        "episode": text,
        **(_undone_context(run, episode) if isinstance(episode, dict) else {}),
    }


def _still_open_episode(run: Run) -> Flag | None:
    """An ended run's loss episode flag its last forecast has not closed yet (the message can
    be made first: the run-end dispatch and that forecast are separate tasks): elevated when
    last judged, it is how the run ended."""
    for flag in flags_open(run=run).values():
        if flag.kind in Flag.DIVERGENCE_KINDS and episode_states.state_of(flag.data) in (
            "spiking",
            "diverged",
        ):
            return flag
    return None


def _p50_history(run: Run, at: datetime) -> tuple[float | None, float | None]:
    """P50 finish now and 24 h before `at` (the oldest forecast inside that window)."""
    rows = Forecast.objects.filter(
        run=run, kind=Forecast.Kind.ETA, finish_p50__isnull=False, computed_at__lte=at
    )
    latest = rows.order_by("-computed_at", "-id").values_list("finish_p50", flat=True).first()
    before = (
        rows.filter(computed_at__gte=at - timedelta(hours=24))
        .order_by("computed_at", "id")
        .values_list("finish_p50", flat=True)
        .first()
    )
    return before, latest


def _deadline_context(run: Run, data: dict[str, Any], at: datetime) -> dict[str, Any]:
    deadline = run.deadline
    p = _num(data, "p_on_time")
    speedup = _num(data, "speedup_for_p90")
    cut = _num(data, "steps_cut_for_p90")
    before, latest = _p50_history(run, at)
    ctx: dict[str, Any] = {
        "deadline": data.get("deadline") if isinstance(data.get("deadline"), str) else None,
        "p_pct": None if p is None else f"{100 * p:.0f}%",
        # "at risk" between likely-late and the target, as the pages' tone says (one rule).
        "at_risk": p is not None and on_time_tone(p) == "warn",
        # One name and one rounding with the board, the card and the flag (formatting.speedup).
        "speedup": fmt.speedup(speedup) if speedup else None,
        "steps_cut": fmt.fewer_steps(cut) if cut else None,
        "p50_from": None,
        "p50_to": None,
    }
    cutoff = deadline.cutoff.timestamp() if deadline is not None else None
    train_by = deadline.train_by.timestamp() if deadline is not None else None
    # To the second where the finish, the train-by and the move are that close: "cutoff 12:49
    # JST: P50 finish 12:49 JST; 44% chance" said nothing of the 40 s between them.
    seconds = fmt.needs_seconds(
        None if latest is None or train_by is None else latest - train_by,
        None if latest is None or before is None else latest - before,
        None if latest is None else latest - at.timestamp(),
    )
    if deadline is not None:
        ctx.update(
            deadline=deadline.name,
            cutoff=fmt.stamp(cutoff, seconds=seconds),
            buffer=fmt.span(deadline.buffer.total_seconds()) if deadline.buffer else None,
            train_by=fmt.stamp(train_by, seconds=seconds),
        )
    if latest is not None:
        ctx["p50_to"] = fmt.stamp(latest, seconds=seconds)
        if before is not None and abs(latest - before) >= 60:
            ctx["p50_from"] = fmt.stamp(before, seconds=seconds)
    return ctx


def _slip_context(data: dict[str, Any]) -> dict[str, Any]:
    seconds = fmt.needs_seconds(_num(data, "amount_s"))
    return {
        "from": fmt.stamp(_num(data, "from_finish"), seconds=seconds)
        if _num(data, "from_finish")
        else None,
        "to": fmt.stamp(_num(data, "to_finish"), seconds=seconds)
        if _num(data, "to_finish")
        else None,
        "amount": fmt.span(_num(data, "amount_s")) if _num(data, "amount_s") is not None else None,
        "window": fmt.span(_num(data, "window_s")) if _num(data, "window_s") is not None else None,
    }


def _stalled_context(run: Run, data: dict[str, Any], at: datetime) -> dict[str, Any]:
    silent = _num(data, "silent_s")
    usual = _num(data, "usual_interval_s")
    crashed = data.get("kind") == "no_heartbeat" or run.status == Run.Status.CRASHED
    checkpoint = _last_checkpoint(run)
    return {
        "crashed": crashed,
        "silent": fmt.span(silent) if silent is not None else None,
        "usual": fmt.span(usual) if usual is not None else None,
        **_progress_context(run, checkpoint, at, before="this alert"),
        **_cutoff_context(run, at),
        # Alive but stuck is a hang to look at, not a job to restart.
        "resume": _resume(run, checkpoint) if crashed else None,
    }


# --- where a run got to, against its cutoff, and how to pick it up again ----------------------
# What every end-of-run, crash and stall message says (issue 23): "looks crashed: no heartbeat
# for 1 min" alone left the lead to find the last step, the checkpoint and the way back.

CHECKPOINT_PATH_MAX = 200


def _last_checkpoint(run: Run) -> Event | None:
    """The checkpoint a restart would load: the latest logged at or below the run's last step
    (one an abandoned attempt saved beyond where the run now stands is not its progress)."""
    rows = Event.objects.filter(run=run, kind=Event.Kind.CHECKPOINT, step__isnull=False)
    if run.last_step is not None:
        rows = rows.filter(step__lte=run.last_step)
    return rows.order_by("-time", "-id").first()


def _last_step_time(run: Run) -> float | None:
    """When the run's last step was logged (its point's own time), in epoch seconds."""
    if run.last_step is None:
        return None
    ms = LatestMetric.objects.filter(run=run, step=run.last_step).aggregate(t=Max("timestamp_ms"))
    return ms["t"] / 1000.0 if ms["t"] is not None else None


def _before(at: datetime, epoch_s: float | None) -> str | None:
    # Never negative: a trainer's clock a little ahead of the server's is not "in the future".
    return None if epoch_s is None else fmt.span(max(0.0, at.timestamp() - epoch_s))


def _progress_context(
    run: Run, checkpoint: Event | None, at: datetime, *, before: str
) -> dict[str, Any]:
    """The last step and the last checkpoint, each with how long before `at` (the message's
    time: a frozen message says "before this alert", never "ago", which changes as it is read)."""
    path = checkpoint.payload.get("path") if checkpoint is not None else None
    return {
        "last_step": fmt.steps(run.last_step) if run.last_step is not None else None,
        "total_steps": fmt.steps(run.total_steps) if run.total_steps else None,
        "last_step_before": _before(at, _last_step_time(run)),
        "checkpoint": fmt.steps(checkpoint.step) if checkpoint is not None else None,
        "checkpoint_before": _before(at, checkpoint.time.timestamp()) if checkpoint else None,
        "checkpoint_path": str(path)[:CHECKPOINT_PATH_MAX] if path else None,
        "no_checkpoint": checkpoint is None,
        "before_what": before,
    }


def _cutoff_context(run: Run, at: datetime) -> dict[str, Any]:
    """The run against its cutoff: a finished run's outcome as the board says it (one rule,
    forecasting.board.end_outcome), otherwise how far from its train-by it stopped."""
    deadline = run.deadline
    if deadline is None:
        return {}
    outcome = board.end_outcome(run)
    margin = board.margin_before_train_by(run, at_s=at.timestamp())
    if outcome is None and margin is not None:
        line = "train-by" if deadline.buffer else "cutoff"
        side = "before" if margin >= 0 else "past"
        outcome = f"not finished, {fmt.span(margin)} {side} its {line}"
    # To the second for a short run or a close call ("missed by 19 s" beside a cutoff "12:49").
    seconds = fmt.needs_seconds(at.timestamp() - run.started_at.timestamp(), margin)
    return {
        "cut": {
            "deadline": deadline.name,
            "cutoff": fmt.stamp(deadline.cutoff.timestamp(), seconds=seconds),
            "train_by": fmt.stamp(deadline.train_by.timestamp(), seconds=seconds)
            if deadline.buffer
            else None,
            "outcome": outcome,
        }
    }


def _resume(run: Run, checkpoint: Event | None) -> str:
    """How to pick the run up again: the client resumes a run given its id (client/README.md,
    "Resuming a restarted job"), from the checkpoint the job itself loads."""
    how = f'runcast.init(id="{run.public_id}", ...) or RUNCAST_RUN_ID={run.public_id}'
    if checkpoint is None:
        return f"no checkpoint was logged; restarting with {how} continues the same run"
    path = checkpoint.payload.get("path")
    where = f" ({str(path)[:CHECKPOINT_PATH_MAX]})" if path else ""
    return (
        f"load the checkpoint at step {fmt.steps(checkpoint.step)}{where} and restart with "
        f"{how}: the same run continues as a new attempt"
    )


def _straggler_context(data: dict[str, Any]) -> dict[str, Any]:
    ranks = [int(r) for r in data.get("ranks") or [] if isinstance(r, int)]
    host = data.get("host") if isinstance(data.get("host"), str) else None
    slowdown, cost = _num(data, "slowdown"), _num(data, "cost_s")
    real, whatif = _num(data, "finish_p50"), _num(data, "whatif_finish_p50")
    seconds = fmt.needs_seconds(None if real is None or whatif is None else real - whatif)
    p, p_whatif = _num(data, "p_on_time"), _num(data, "whatif_p_on_time")
    return {
        "ranks": ", ".join(str(r) for r in ranks[:16]) + (" ..." if len(ranks) > 16 else ""),
        "rank_word": "rank" if len(ranks) == 1 else "ranks",
        "host": host,
        "whole_host": data.get("kind") == "host",
        "slowdown": f"{100 * slowdown:.0f}%" if slowdown is not None else None,
        "onset": fmt.steps(onset) if (onset := _num(data, "onset_step")) is not None else None,
        "cost": fmt.span(cost) if cost is not None else None,
        "finish": fmt.stamp(real, seconds=seconds) if real is not None else None,
        "whatif_finish": fmt.stamp(whatif, seconds=seconds) if whatif is not None else None,
        "p_pct": f"{100 * p:.0f}%" if p is not None else None,
        "whatif_p_pct": f"{100 * p_whatif:.0f}%" if p_whatif is not None else None,
    }


def _end_context(run: Run, at: datetime) -> dict[str, Any]:
    duration = (run.ended_at - run.started_at).total_seconds() if run.ended_at else None
    checkpoint = _last_checkpoint(run)
    ended_badly = run.status in (Run.Status.FAILED, Run.Status.CRASHED)
    return {
        "status": run.status,
        **_progress_context(run, checkpoint, at, before=f"it {run.status}"),
        "duration": fmt.span(duration) if duration is not None else None,
        **_cutoff_context(run, at),
        "resume": _resume(run, checkpoint) if ended_badly else None,
        **_end_episode(run),
    }


def context_for(
    *, run: Run, kind: str, event: str, severity: str, flag: Flag | None, at: datetime
) -> dict[str, Any]:
    data: dict[str, Any] = dict(flag.data or {}) if flag is not None else {}
    rule = BY_KEY.get(kind) or next((k for k in BY_KEY.values() if kind in k.sources), None)
    ctx: dict[str, Any] = {
        "run": str(run),
        "run_id": run.public_id,
        "project": run.project.name,
        "project_slug": run.project.slug,
        "kind": kind,
        "label": rule.label if rule else kind,
        "event": event,
        "resolved": event == Flag.State.RESOLVED,
        "severity": severity,
        "mark": SEVERITY_MARK.get(severity, ""),
        "explanation": flag.explanation if flag is not None else "",
        "url": run_url(run),
        "when": fmt.stamp(at.timestamp()),
        "tz": run.project.tzinfo,
    }
    if kind in Flag.DIVERGENCE_KINDS:
        ctx["d"] = _divergence_context(run, data)
    elif kind == "deadline":
        ctx["d"] = _deadline_context(run, data, at)
    elif kind == "slip":
        ctx["d"] = _slip_context(data)
    elif kind == "stalled":
        ctx["d"] = _stalled_context(run, data, at)
    elif kind == "straggler":
        ctx["d"] = _straggler_context(data)
    elif kind in RUN_ENDINGS:
        ctx["d"] = _end_context(run, at)
    else:
        ctx["d"] = {}
    return ctx


def _facts(ctx: dict[str, Any]) -> list[tuple[str, str]]:
    text = render_to_string("alerts/facts.txt", ctx)
    facts = []
    for line in text.splitlines():
        label, sep, value = line.partition(":")
        if sep and value.strip():
            facts.append((label.strip(), value.strip()))
    return facts


def _headline(ctx: dict[str, Any]) -> str:
    """The headline with its times as stamps."""
    return " ".join(render_to_string("alerts/headline.txt", ctx).split())


def render(ctx: dict[str, Any], payload: dict[str, Any]) -> Message:
    """The message, every time in it written in the project's zone (`ctx["tz"]`): the one place
    a message's clock is chosen."""
    tz: tzinfo | None = ctx.get("tz")

    def clock(text: str) -> str:
        return fmt.render_stamps(text, tz)

    stamped = _headline(ctx)
    headline = clock(stamped)
    facts = [(label, clock(value)) for label, value in _facts(ctx)]
    ctx = {**ctx, "headline": headline, "facts": facts}
    subject = " ".join(render_to_string("alerts/email/subject.txt", ctx).split())
    explanation = str(payload.get("explanation") or "")
    return Message(
        subject=clock(subject),
        text=clock(render_to_string("alerts/email/body.txt", ctx)),
        html=clock(render_to_string("alerts/email/body.html", ctx)),
        headline=headline,
        facts=facts,
        url=ctx["url"],
        severity=ctx["severity"],
        payload={
            **payload,
            **({"explanation": clock(explanation)} if "explanation" in payload else {}),
            "headline": headline,
            "facts": dict(facts),
        },
        note=explanation or stamped,
    )


def history_text(notification: Notification) -> str:
    """What the history shows of a notification: the message as it was sent (or would have
    been), its explanation or else its headline, with its times as stamps where it kept them
    (the page writes them in its reader's zone, as every time on a page)."""
    n = notification
    if n.rendered:
        if n.rendered.get("note"):
            return str(n.rendered["note"])
        payload = n.rendered.get("payload") or {}
        return str(payload.get("explanation") or n.rendered.get("headline") or "")
    # A row made before messages were kept: rendered now, as best it can be.
    return n.flag.explanation if n.flag is not None else headline_for(n)


def headline_for(notification: Notification) -> str:
    """The one-line headline a channel gets for this notification, without rendering the
    bodies, for a row made before messages were kept (`Notification.rendered`).

    A run-end row records one ending ("run:<pk>:<status>:<segment>"); the run may have resumed
    or ended again since, and then its current step and status describe another attempt: the
    row says only how that attempt ended."""
    n = notification
    parts = n.event_key.split(":")
    if n.flag is None and n.event == "ended" and len(parts) == 4:
        status, segment = parts[2], parts[3]
        run = n.run
        if not (run.has_ended and run.status == status and str(run.current_segment) == segment):
            return f"{run} {status}"
    at = n.flag.created_at if n.flag is not None else (n.run.ended_at or n.created_at)
    ctx = context_for(
        run=n.run, kind=n.kind, event=n.event, severity=n.severity, flag=n.flag, at=at
    )
    return _headline(ctx)


def message_for_event(
    *,
    run: Run,
    kind: str,
    rule: str,
    event: str,
    severity: str,
    flag: Flag | None,
    at: datetime,
) -> Message:
    """One event's message, as every channel gets it (less the delivery id): rendered once,
    when the event is dispatched, and kept on each of its notifications."""
    ctx = context_for(run=run, kind=kind, event=event, severity=severity, flag=flag, at=at)
    payload = {
        "type": "flag" if flag is not None else "run",
        "project": run.project.slug,
        "run": {"id": run.public_id, "name": str(run), "status": run.status, "url": ctx["url"]},
        "kind": kind,
        "rule": rule,
        "event": event,
        "severity": severity,
        "at": at.astimezone(UTC).isoformat(),
        "explanation": ctx["explanation"],
        "onset_step": flag.onset_step if flag is not None else None,
        "data": dict(flag.data or {}) if flag is not None else {},
    }
    return render(ctx, payload)


def message_for(notification: Notification) -> Message:
    """The message a notification sends: the one kept when it was made; rendered now only for
    a row made before messages were kept."""
    n = notification
    if n.rendered:
        return Message.from_json(n.rendered)
    at = n.flag.created_at if n.flag is not None else (n.run.ended_at or n.created_at)
    message = message_for_event(
        run=n.run,
        kind=n.kind,
        rule=n.rule_kind,
        event=n.event,
        severity=n.severity,
        flag=n.flag,
        at=at,
    )
    return message.for_notification(n.public_id)


def message_for_test(*, run_name: str, project: Any, url: str) -> Message:
    ctx = {
        "run": run_name,
        "project": project.name,
        "project_slug": project.slug,
        "kind": "test",
        "label": "Test message",
        "event": "test",
        "resolved": False,
        "severity": "info",
        "mark": SEVERITY_MARK["info"],
        "explanation": "This is a test message from Runcast: this channel works.",
        "url": url,
        "when": "",
        "d": {},
    }
    payload = {"type": "test", "project": project.slug, "kind": "test", "event": "test"}
    return render(ctx, payload)
