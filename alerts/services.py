"""Alert work: default rules, channels, the dispatcher (outbox → notifications), delivery with
retries, and the daily digest. Tasks only call these; views only call these.

Exactly-once per (event, channel) rests on two database facts, not on the queue:
  1. a Flag is claimed by `UPDATE ... SET processed_at WHERE processed_at IS NULL` and its
     notifications are created in the same transaction (two dispatchers: one wins, one no-ops);
  2. a Notification is unique on (event_key, channel) and is sent only by the worker whose
     `UPDATE ... SET status='sending' WHERE status='pending'` changed one row.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from alerts.kinds import BY_KEY, RULE_KINDS, RuleKind, rule_kind_for
from alerts.messages import Message, message_for, message_for_event, message_for_test
from alerts.models import Channel, Digest, Notification, Rule
from alerts.signals import notification_created
from alerts.transports import TransportError, transport_for
from config import sweeps
from forecasting.estimators import episode_states, flag_bands
from forecasting.estimators import formatting as fmt
from forecasting.models import Flag
from tracker.links import project_alerts_url
from tracker.models import Membership, Project, Run

logger = logging.getLogger(__name__)

# Run endings are also picked up by the sweeper for this long after ended_at, in case the
# run_finished task was lost; the (run, status, segment) key keeps that from sending twice.
RUN_END_SWEEP_WINDOW = timedelta(hours=1)
# A notification left in "sending" this long lost its worker mid-send. It may or may not have
# arrived, so it is marked failed rather than retried: nothing is ever sent twice.
STUCK_SENDING_AFTER = timedelta(minutes=10)
MAX_BACKOFF_S = 3600.0
# A resolve whose raise is still being sent (or retried) waits this long before looking again.
RESOLVE_WAIT_S = 5.0
ACTIVE = (Notification.Status.PENDING, Notification.Status.SENDING, Notification.Status.SENT)
RAISES = (Flag.State.RAISED, Flag.State.UPDATED)
S = Notification.Status


# --- rules and channels -----------------------------------------------------------------------


@transaction.atomic
def rules_ensure_defaults(*, project: Project) -> list[Rule]:
    """Create the missing rule of every kind, on, with its default threshold. Idempotent.

    Called lazily (dispatcher, pages) so new projects and new rule kinds need no migration.
    """
    existing = set(Rule.objects.filter(project=project).values_list("kind", flat=True))
    missing = [k for k in RULE_KINDS if k.key not in existing]
    if missing:
        # Serialise concurrent first calls for one project (the default Slack channel below).
        Project.objects.select_for_update().filter(pk=project.pk).first()
        Rule.objects.bulk_create(
            [
                Rule(
                    project=project,
                    kind=k.key,
                    severity=k.default_severity,
                    threshold=k.default_threshold,
                )
                for k in missing
            ],
            ignore_conflicts=True,
        )
        if not existing and not project.alert_channels.exists():
            _default_channels_create(project=project)
    return list(Rule.objects.filter(project=project).prefetch_related("channels"))


def _default_channels_create(*, project: Project) -> list[Channel]:
    """Environment-configured channels, so a fresh install (or the demo) alerts with no clicks.

    Idempotent: a channel with the same kind and target is not created twice.
    """
    wanted = [
        (Channel.Kind.SLACK, "Slack (default)", settings.RUNCAST_SLACK_WEBHOOK_URL),
        (Channel.Kind.EMAIL, "Email (default)", _default_email_targets()),
    ]
    created = []
    for kind, name, target in wanted:
        if target and not project.alert_channels.filter(kind=kind, target=target).exists():
            created.append(
                Channel.objects.create(project=project, kind=kind, name=name, target=target)
            )
    return created


def _default_email_targets() -> str:
    """RUNCAST_ALERT_EMAIL's comma-separated addresses, one a line as email channels keep them."""
    raw = settings.RUNCAST_ALERT_EMAIL
    return "\n".join(a.strip() for a in raw.split(",") if a.strip())


def channels_ensure_from_env(*, project: Project) -> list[Channel]:
    """Add the environment's default channels to an existing project (used by scripts/dev)."""
    rules_ensure_defaults(project=project)
    return _default_channels_create(project=project)


def channel_create(*, project: Project, kind: str, name: str, target: str) -> Channel:
    return Channel.objects.create(project=project, kind=kind, name=name, target=target.strip())


def channel_update(*, channel: Channel, name: str, target: str, enabled: bool) -> Channel:
    channel.name = name
    channel.target = target.strip()
    if enabled and not channel.enabled:
        # Re-enabling is the user saying "fixed": the old reason no longer applies.
        channel.disabled_reason = ""
        channel.disabled_at = None
    channel.enabled = enabled
    channel.save()
    return channel


def channel_delete(*, channel: Channel) -> None:
    channel.delete()


def channel_disable(*, channel_id: int, reason: str, now: datetime | None = None) -> bool:
    """Stop delivering to a channel after a permanent error; keep why for the UI."""
    now = now or timezone.now()
    return bool(
        Channel.objects.filter(pk=channel_id, enabled=True).update(
            enabled=False, disabled_reason=reason[:1000], disabled_at=now
        )
    )


# "Send test message" runs in the web request rather than through the queue: the member is
# waiting on the page to learn whether the channel works, and a queued test would answer after
# they left, or never while the worker is down (testing the worker, not the channel). What keeps
# a slow endpoint from tying up the web server instead: a test must end within
# RUNCAST_ALERTS_TEST_TIMEOUT (a deadline on the whole request, shorter than a delivery's), and
# a web process sends one test at a time, so clicks on a slow channel hold one of its threads
# at most; the others go on serving pages.
_test_in_flight = threading.Lock()


class ChannelTestBusy(Exception):
    """Another test message is being sent from this process; nothing was sent."""


def channel_test(*, channel: Channel) -> str | None:
    """Send a test message now; return the error text, or None when it was accepted.
    ChannelTestBusy while this process is sending another one.

    A failing test does not disable the channel: the user is looking at the answer.
    """
    if not _test_in_flight.acquire(blocking=False):
        raise ChannelTestBusy
    try:
        project = channel.project
        message = message_for_test(
            run_name="test-run", project=project, url=project_alerts_url(project)
        )
        transport = transport_for(channel, timeout=settings.RUNCAST_ALERTS_TEST_TIMEOUT)
        transport.notify(message)
    except TransportError as e:
        return e.message
    finally:
        _test_in_flight.release()
    return None


@transaction.atomic
def rule_update(
    *,
    project: Project,
    kind: str,
    severity: str,
    threshold: float | None,
    channels: list[Channel],
    muted: bool,
    cooldown: timedelta,
) -> Rule:
    """Save one rule kind's settings (the project's rules are created on first save)."""
    if any(c.project_id != project.pk for c in channels):
        raise ValueError("a rule can only send to its own project's channels")
    rules_ensure_defaults(project=project)
    rule = Rule.objects.select_for_update().get(project=project, kind=kind)
    rule.severity = severity
    rule.threshold = threshold
    rule.muted = muted
    rule.cooldown = cooldown
    rule.save()
    rule.channels.set(channels)
    return rule


# --- dispatch: outbox rows → notification rows ------------------------------------------------


@dataclass(frozen=True)
class Event:
    run: Run
    rule_kind: RuleKind
    kind: str
    event: str
    event_key: str
    at: datetime
    flag: Flag | None = None

    @property
    def data(self) -> dict[str, Any]:
        return dict(self.flag.data or {}) if self.flag is not None else {}


def flags_dispatch(*, now: datetime | None = None, limit: int = 500) -> int:
    """Turn unprocessed flags into notifications, oldest first; return notifications created."""
    ids = list(
        Flag.objects.filter(processed_at__isnull=True)
        .order_by("created_at", "id")
        .values_list("pk", flat=True)[:limit]
    )
    created = 0
    for flag_id in ids:
        # Its transaction rolls back, so it stays unclaimed for the next sweep; one bad row
        # (oldest first, so always first) must not stop every other project's alerts.
        with sweeps.unit("dispatch of flag", flag_id):
            created += len(flag_dispatch(flag_id=flag_id, now=now))
    return created


@transaction.atomic
def flag_dispatch(*, flag_id: int, now: datetime | None = None) -> list[Notification]:
    now = now or timezone.now()
    # The claim: of two dispatchers, only the one whose UPDATE changed the row goes on. The
    # notifications are created in the same transaction, so a crash un-claims the flag.
    if not Flag.objects.filter(pk=flag_id, processed_at__isnull=True).update(processed_at=now):
        return []
    flag = Flag.objects.select_related("run__project", "run__deadline").get(pk=flag_id)
    rule_kind = _rule_kind(flag)
    if rule_kind is None:
        return []  # a kind no rule covers yet: processed, nothing to say
    event = Event(
        run=flag.run,
        rule_kind=rule_kind,
        kind=flag.kind,
        event=flag.state,
        event_key=f"flag:{flag.pk}",
        at=flag.created_at,
        flag=flag,
    )
    return _notifications_create(event=event)


def _rule_kind(flag: Flag) -> RuleKind | None:
    """The rule a flag row answers to. A loss episode keeps the kind of the detector that saw
    it first (one flag per episode); once it has diverged it is a divergence, with that rule's
    severity and channels, and so is its close."""
    rule_kind = rule_kind_for(flag.kind)
    if rule_kind is not None and rule_kind.key == "spike":
        was = (episode_states.state_of(flag.data), (flag.data or {}).get("episode_was"))
        if "diverged" in was:
            return BY_KEY["divergence"]
    return rule_kind


def run_end_dispatch(*, run_id: int) -> list[Notification]:
    """Notify a run's ending (finished / failed / reported crashed). Idempotent per ending."""
    run = Run.objects.select_related("project", "deadline").filter(pk=run_id).first()
    # A crash the sweeper only inferred arrives as a "stalled" flag instead: not announced twice.
    if run is None or not run.has_ended:
        return []
    # The kind says what happened (finished, failed, crashed); a failure and a crash answer to
    # one rule. A crash went out as "failed ended" (webhook event `failed.ended`).
    kind = str(run.status)
    rule_kind = BY_KEY["finished"] if run.status == Run.Status.FINISHED else BY_KEY["failed"]
    # The segment makes a resumed-then-finished-again run a new ending, and a repeated finish
    # call of the same attempt the same one.
    key = f"run:{run.pk}:{run.status}:{run.current_segment}"
    if Notification.objects.filter(event_key=key).exists():
        # Dispatched already (its rows are made in one transaction): the sweep looks again at
        # every ending of the last hour in case its task was lost, and gave the channels added
        # since (a webhook, an email channel made after the run ended) notes of endings that
        # happened before they existed. A channel carries what happens from its creation on.
        return []
    event = Event(
        run=run,
        rule_kind=rule_kind,
        kind=kind,
        event="ended",
        event_key=key,
        at=run.ended_at or run.last_seen_at,
    )
    with transaction.atomic():
        return _notifications_create(event=event)


def runs_ended_dispatch(*, now: datetime | None = None) -> int:
    now = now or timezone.now()
    ids = Run.objects.filter(
        status__in=(Run.Status.FINISHED, Run.Status.FAILED, Run.Status.CRASHED),
        ended_at__gte=now - RUN_END_SWEEP_WINDOW,
    ).values_list("pk", flat=True)
    created = 0
    for run_id in ids:
        with sweeps.unit("dispatch of the ending of run", run_id):
            created += len(run_end_dispatch(run_id=run_id))
    return created


def _rule_for(event: Event) -> Rule | None:
    rules_ensure_defaults(project=event.run.project)
    return (
        Rule.objects.filter(project=event.run.project, kind=event.rule_kind.key)
        .prefetch_related("channels")
        .first()
    )


def _passes_threshold(rule: Rule, event: Event) -> bool:
    if event.event == Flag.State.RESOLVED or event.rule_kind.passes is None:
        return True
    if rule.threshold is None:
        return True
    severity = event.flag.severity if event.flag is not None else None
    return event.rule_kind.passes(severity, event.data, rule.threshold)


def _channels_for(rule: Rule) -> list[Channel]:
    chosen = list(rule.channels.all())
    if chosen:
        return [c for c in chosen if c.enabled]
    return list(Channel.objects.filter(project_id=rule.project_id, enabled=True))


NO_CHANNEL = "not sent: no channel (add one on the project's alert channels page)"


def _notifications_create(*, event: Event) -> list[Notification]:
    """One notification per channel of the matching rule. With no channel, one row anyway
    (channel None, not sent) so the history shows what would have been said."""
    rule = _rule_for(event)
    if rule is None or rule.muted or not _passes_threshold(rule, event):
        return []
    created = []
    channels: list[Channel | None] = [*_channels_for(rule)] or [None]
    message: Message | None = None
    for channel in channels:
        gate = _gate(rule=rule, channel=channel, event=event)
        if gate is None:
            continue
        status, reason = gate
        if channel is None and status == S.PENDING:
            status, reason = S.SUPPRESSED, NO_CHANNEL
        # Rendered once, now, from the run and flag as the event found them: every try sends
        # it and the history shows it, sent or suppressed, whatever the run does next.
        if message is None:
            message = _message_for(event, rule)
        public_id = uuid.uuid4()
        notification, was_created = Notification.objects.get_or_create(
            event_key=event.event_key,
            channel=channel,
            defaults={
                "public_id": public_id,
                "rendered": message.for_notification(public_id).as_json(),
                "run": event.run,
                "flag": event.flag,
                "rule_kind": rule.kind,
                "kind": event.kind,
                "event": event.event,
                "severity": rule.severity,
                "status": status,
                "reason": reason,
                "created_at": event.at,
                # Due now, not at event.at: a run ending's time is the trainer's clock, and one
                # running ahead would hold the message back until that clock's "now".
                "next_attempt_at": min(event.at, timezone.now()),
            },
        )
        if was_created:
            created.append(notification)
            if notification.status == S.PENDING:
                _announce(notification.pk)
    return created


def _message_for(event: Event, rule: Rule) -> Message:
    return message_for_event(
        run=event.run,
        kind=event.kind,
        rule=rule.kind,
        event=event.event,
        severity=rule.severity,
        flag=event.flag,
        at=event.at,
    )


def _announce(notification_id: int) -> None:
    # After commit: delivery starts only once the row exists for the worker (alerts.receivers
    # enqueues it); robust: a broker hiccup must not fail the caller's commit callbacks.
    transaction.on_commit(
        lambda: notification_created.send(sender=Notification, notification_id=notification_id),
        robust=True,
    )


def _gate(*, rule: Rule, channel: Channel | None, event: Event) -> tuple[str, str] | None:
    """(status, reason) for a new notification, or None when there is nothing to record.

    Raises within the cooldown of an earlier raise on the same (run, rule, channel) are recorded
    as suppressed. A resolve is sent only if that channel's last word on the kind was a raise,
    so a flapping flag produces at most one raise and one resolve per cooldown; a raise still
    waiting to go out when its resolve comes is withdrawn, and neither is sent. A flag closed by
    the run's end says nothing more: the run-end message does.
    """
    history = Notification.objects.filter(run=event.run, channel=channel)
    if event.event in RAISES:
        # The latest raise of this rule on this channel, sent or due, within the cooldown.
        recent = (
            history.filter(
                rule_kind=rule.kind,
                event__in=RAISES,
                status__in=ACTIVE,
                created_at__gte=event.at - rule.cooldown,
                created_at__lte=event.at,
            )
            .order_by("-created_at")
            .first()
        )
        if recent is not None and not _escalates(event.flag, recent.flag):
            # A stamp: the history page writes it in its reader's zone, beside its When column.
            sent = fmt.stamp(recent.created_at.timestamp())
            return S.SUPPRESSED, f"cooldown: a {recent.kind} alert went out at {sent}"
        update = event.flag if event.event == Flag.State.UPDATED else None
        said = _said_this_episode(event=event, history=history, rule=rule) if update else None
        if update and said and said.flag and _worse(update, said.flag) is False:
            sent = fmt.stamp(said.created_at.timestamp())
            return S.SUPPRESSED, f"no worse than the alert at {sent}"
        return S.PENDING, ""
    if event.event == Flag.State.RESOLVED:
        same_kind = history.filter(kind=event.kind)
        if not same_kind.exists():
            return None
        if event.data.get("closed_by_run_end"):
            return S.SUPPRESSED, _closed_by_end_note(run=event.run, channel=channel)
        last = same_kind.filter(status__in=ACTIVE).order_by("-created_at", "-id").first()
        if last is None or last.event not in RAISES:
            # With no channel nothing was delivered for the plain reason that there is none;
            # "cooldown or failure" sent a lead looking for a fault.
            if channel is None:
                return S.SUPPRESSED, NO_CHANNEL
            return S.SUPPRESSED, "its raise was not delivered on this channel (cooldown or failure)"
        withdrawn = Notification.objects.filter(pk=last.pk, status=S.PENDING, tries=0).update(
            status=S.SUPPRESSED, reason="resolved before it went out"
        )
        if withdrawn:
            return S.SUPPRESSED, "raised and resolved before either went out: nothing to say"
        return S.PENDING, ""
    return S.PENDING, ""


CLOSED_BY_END = "closed by the run's end: the run-end message says so"


def _closed_by_end_note(*, run: Run, channel: Channel | None) -> str:
    """Why a flag the run's end closed says nothing more: the run-end message (which gives the
    outcome against the cutoff, where the run got to and how to resume) says it, on the
    channels the rule for that ending sends to; elsewhere the note must not claim it."""
    if channel is None:
        return NO_CHANNEL
    key = "finished" if run.status == Run.Status.FINISHED else "failed"
    rule = Rule.objects.filter(project_id=run.project_id, kind=key).first()
    if rule is not None and not rule.muted and channel in _channels_for(rule):
        return CLOSED_BY_END
    return "closed by the run's end; the rule for run endings does not send to this channel"


def _said_this_episode(
    *, event: Event, history: QuerySet[Notification], rule: Rule
) -> Notification | None:
    """The latest raise of this rule on this channel (sent or due, with its flag) since the
    flag was raised."""
    if event.flag is None:
        return None
    raised = (
        Flag.objects.filter(
            run=event.run,
            kind=event.kind,
            state=Flag.State.RAISED,
            created_at__lte=event.flag.created_at,
        )
        .order_by("-created_at", "-id")
        .values_list("created_at", flat=True)
        .first()
    )
    if raised is None:
        return None
    return (
        history.filter(
            rule_kind=rule.kind,
            event__in=RAISES,
            status__in=ACTIVE,
            created_at__gte=raised,
            flag__isnull=False,
        )
        .select_related("flag")
        .order_by("-created_at", "-id")
        .first()
    )


def _escalates(flag: Flag | None, said: Flag | None) -> bool:
    """Whether a flag is a worse state than the one its rule last alerted: the cooldown holds
    repeats, never a worsening (a loss spike that diverged, issue 22; deadline odds or a slip
    in a worse band, issue 23: a fall from 44% to 0% two minutes after the 44% alert was held
    for the hour, and the lead's last word was "44% chance" for a run that missed)."""
    if flag is None or said is None:
        return False
    if flag.kind == said.kind and flag_bands.worse(flag.kind, flag.data, said.data):
        return True
    return episode_states.escalates(flag.data, said.data)


# Kinds whose flag severity orders how bad an update is: 1 - P(on time), the slip's seconds.
ORDERED_BY_SEVERITY = (Flag.Kind.DEADLINE, Flag.Kind.SLIP)


def _worse(update: Flag, said: Flag) -> bool | None:
    """Whether an open flag's update is worse than what its last alert said; None for kinds
    with no such order. A deadline whose odds crossed a band upwards (16% -> 25%), or hovered
    about a band's edge, wrote an update the page must show; alerting it again told a lead the
    run was "at 25%" as news (a 9.6-hour slowdown replay sent four deadline messages)."""
    if update.kind not in ORDERED_BY_SEVERITY:
        return None
    if update.severity is None or said.severity is None:
        return None
    return update.severity > said.severity


# --- delivery ---------------------------------------------------------------------------------


def notification_deliver(*, notification_id: int, now: datetime | None = None) -> float | None:
    """Send one notification if it is pending and due; return seconds until a retry, if any."""
    now = now or timezone.now()
    claimed = Notification.objects.filter(
        pk=notification_id, status=S.PENDING, next_attempt_at__lte=now
    ).update(status=S.SENDING, tries=F("tries") + 1, claimed_at=now)
    if not claimed:
        return None
    n = Notification.objects.select_related(
        "channel__project", "run__project", "run__deadline", "flag"
    ).get(pk=notification_id)
    if n.event == Flag.State.RESOLVED and _raise_in_flight(n):
        # Never "resolved" before its "raised": wait for the raise to settle (no try spent).
        Notification.objects.filter(pk=n.pk, status=S.SENDING).update(
            status=S.PENDING,
            tries=F("tries") - 1,
            next_attempt_at=now + timedelta(seconds=RESOLVE_WAIT_S),
        )
        return RESOLVE_WAIT_S
    assert n.channel is not None  # channel-less rows are never pending
    if not n.channel.enabled:
        _settle(n, S.FAILED, f"channel disabled: {n.channel.disabled_reason or 'by a user'}")
        return None
    message = message_for(n)
    if not n.rendered:
        # A row made before messages were kept: what this try sends is what its retries send.
        Notification.objects.filter(pk=n.pk).update(rendered=message.as_json())
    try:
        transport_for(n.channel).notify(message)
    except TransportError as e:
        return _after_error(n, e, now)
    _settle(n, S.SENT, "", sent_at=timezone.now())
    return None


def _raise_in_flight(n: Notification) -> bool:
    return Notification.objects.filter(
        run_id=n.run_id,
        channel=n.channel,
        kind=n.kind,
        event__in=RAISES,
        status__in=(S.PENDING, S.SENDING),
        created_at__lte=n.created_at,
    ).exists()


def _settle(n: Notification, status: str, reason: str, **extra: Any) -> None:
    Notification.objects.filter(pk=n.pk, status=S.SENDING).update(
        status=status, reason=reason[:2000], **extra
    )


def _after_error(n: Notification, e: TransportError, now: datetime) -> float | None:
    if e.permanent:
        _settle(n, S.FAILED, f"permanent error: {e.message}")
        if n.channel_id is not None:
            channel_disable(channel_id=n.channel_id, reason=e.message, now=now)
        logger.warning("channel %s disabled: %s", n.channel_id, e.message)
        return None
    if n.tries >= settings.RUNCAST_ALERTS_MAX_TRIES:
        _settle(n, S.FAILED, f"gave up after {n.tries} tries: {e.message}")
        return None
    delay = min(settings.RUNCAST_ALERTS_BACKOFF_BASE * 4 ** (n.tries - 1), MAX_BACKOFF_S)
    _settle(
        n,
        S.PENDING,
        f"try {n.tries} failed: {e.message}",
        next_attempt_at=now + timedelta(seconds=delay),
    )
    return delay


def notifications_due(*, now: datetime | None = None, limit: int = 500) -> list[int]:
    """Due pending notifications (their task may be lost); fail those a worker abandoned.

    Returns ids for the caller (the sweep task) to enqueue: services know no Celery.
    """
    now = now or timezone.now()
    Notification.objects.filter(status=S.SENDING, claimed_at__lt=now - STUCK_SENDING_AFTER).update(
        status=S.FAILED,
        reason="the worker stopped while sending; not retried so it cannot arrive twice",
    )
    return list(
        Notification.objects.filter(status=S.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )


def alerts_sweep(*, now: datetime | None = None) -> list[int]:
    """Beat: the queue is a hint, the database the truth. Returns notifications to enqueue."""
    now = now or timezone.now()
    flags_dispatch(now=now)
    runs_ended_dispatch(now=now)
    return notifications_due(now=now)


# --- daily digest -----------------------------------------------------------------------------


def digests_send_due(*, now: datetime | None = None) -> int:
    """Send today's digest of every project whose local time is past the digest hour."""
    now = now or timezone.now()
    sent = 0
    for project in Project.objects.order_by("pk"):
        with sweeps.unit("digest of project", project.slug):
            local = now.astimezone(project.tzinfo)
            if local.hour >= settings.RUNCAST_ALERTS_DIGEST_HOUR and digest_send(
                project=project, day=local.date(), now=now
            ):
                sent += 1
    return sent


def digest_send(*, project: Project, day: date, now: datetime) -> bool:
    """Email the project's owners a summary of its runs against their deadlines, once a day."""
    from alerts.digest import digest_message
    from alerts.transports.email import send_email

    recipients = sorted(
        {
            email
            for email in Membership.objects.filter(
                project=project, role=Membership.Role.OWNER
            ).values_list("user__email", flat=True)
            if email
        }
    )
    # Most hourly ticks find today's digest already sent: check that before building it.
    if (
        Digest.objects.filter(project=project, day=day)
        .exclude(status=Digest.Status.FAILED, tries__lt=3)
        .exists()
    ):
        return False
    message = digest_message(project=project, now=now)
    if not recipients or message is None:
        return False
    digest, created = Digest.objects.get_or_create(
        project=project, day=day, defaults={"tries": 1, "recipients": recipients}
    )
    if not created and not Digest.objects.filter(
        Q(status=Digest.Status.FAILED), pk=digest.pk, tries__lt=3
    ).update(status=Digest.Status.SENDING, tries=F("tries") + 1):
        return False
    try:
        send_email(to=recipients, subject=message.subject, text=message.text, html=message.html)
    except TransportError as e:
        Digest.objects.filter(pk=digest.pk).update(status=Digest.Status.FAILED, error=e.message)
        return False
    Digest.objects.filter(pk=digest.pk).update(status=Digest.Status.SENT, error="")
    return True
