"""Liveness: the server's own clock (was it listening?) and each silent run's verdict.

A run's silence counts only while the server was listening: the sweep ticks a clock
(ServerClock) every RUNCAST_SWEEP_PERIOD_S (its beat entry in config/celery.py), and only while
the web tier that clients reach answers its probe; a gap between ticks is the server's outage,
not the runs'.
"""

from __future__ import annotations

import logging
import urllib.parse
from datetime import datetime

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from config import outbound
from forecasting.compute import final_events
from forecasting.conditions import Condition
from forecasting.estimators.stalled import detect_stall
from forecasting.flags import flags_sync
from forecasting.models import Flag, ServerClock
from tracker.models import IngestBatch, Run

logger = logging.getLogger(__name__)

# A gap of more than this many sweep periods between two of its ticks is the server (or its
# worker) having been down.
SERVER_GAP_PERIODS = 1.5  # one missed tick is a gap: a late tick is not


def server_tick(*, now: datetime | None = None, period_s: float | None = None) -> datetime:
    """Record that the server is listening; return since when it has been without a gap."""
    now = now or timezone.now()
    period_s = settings.RUNCAST_SWEEP_PERIOD_S if period_s is None else period_s
    with transaction.atomic():
        clock, _ = ServerClock.objects.select_for_update().get_or_create(pk=1)
        gap = None if clock.last_tick_at is None else (now - clock.last_tick_at).total_seconds()
        if clock.listening_since is None or gap is None or gap > SERVER_GAP_PERIODS * period_s:
            clock.listening_since = now
        clock.last_tick_at = max(now, clock.last_tick_at or now)
        clock.save()
    return clock.listening_since


def _listening_since() -> datetime | None:
    return ServerClock.objects.filter(pk=1).values_list("listening_since", flat=True).first()


# How long a web tier that stopped answering the probe holds the liveness checks back. A probe
# silent for longer is more likely broken (a stale RUNCAST_WEB_PROBE_URL after a move) than an
# outage, and a real crash must not stay hidden behind it for good.
WEB_OUTAGE_MAX_S = 3600.0
WEB_PROBE_TIMEOUT_S = 5.0


def web_answers(*, url: str, timeout_s: float = WEB_PROBE_TIMEOUT_S) -> bool:
    """Whether the web tier at `url` (its /healthz, from settings, not user input) answers 200.

    The request names the public site's host: the worker reaches the web by an internal name
    (`web:8000`) that ALLOWED_HOSTS need not list, and SITE_URL's host it must.
    """
    host = urllib.parse.urlsplit(settings.SITE_URL).netloc
    return outbound.get_status(url, host_header=host, timeout=timeout_s) == 200


def server_listening(
    *, probe_url: str, now: datetime | None = None, period_s: float | None = None
) -> bool:
    """The liveness sweep's first step: may the runs' silence be judged now?

    The worker and its beat can run on while the web tier that clients reach is down (a
    redeploy, a crash, its proxy): the clients spool, and their silence is the server's. With a
    probe URL, a tick is taken only when the web answers, so the first tick after it is back
    finds the gap and starts a new listening period with its grace (server_tick). A probe that
    has never answered is read as a misconfiguration and ignored, as is one silent for more than
    WEB_OUTAGE_MAX_S; both are logged.
    """
    now = now or timezone.now()
    if probe_url:
        if web_answers(url=probe_url):
            ServerClock.objects.update_or_create(pk=1, defaults={"web_answered_at": now})
        else:
            last = ServerClock.objects.filter(pk=1).values_list("web_answered_at", flat=True)
            answered = last.first()
            if answered is not None and (now - answered).total_seconds() <= WEB_OUTAGE_MAX_S:
                logger.warning(
                    "web tier %s does not answer: runs' silence is not judged", probe_url
                )
                return False
            logger.warning(
                "web tier %s does not answer (last answer: %s): runs' silence is judged anyway; "
                "check RUNCAST_WEB_PROBE_URL",
                probe_url,
                "never" if answered is None else answered.isoformat(),
            )
    server_tick(now=now, period_s=period_s)
    return True


@transaction.atomic
def run_check_liveness(*, run_id: int, now: datetime | None = None) -> list[Flag]:
    """Mark a silent run crashed (heartbeat lost) or stalled (alive, no progress).

    Silence while the server itself was not listening does not count: a client spools through
    an outage and replays when it is back (outage-aware, see server_tick).

    All or nothing: a check that fails half-way must not leave the run "crashed" without its
    flag, since the sweep, which checks active runs only, would never look at it again.
    """
    now = now or timezone.now()
    run = Run.objects.select_related("project").filter(pk=run_id).first()
    if run is None:
        return []
    if not run.is_active:
        # Ended: forecast_compute closed its flags. Inferred crash: its stalled flag stays open.
        return []
    beats = np.array(
        [
            t.timestamp()
            for t in IngestBatch.objects.filter(run=run)
            .order_by("-received_at")
            .values_list("received_at", flat=True)[:500]
        ][::-1]
    )
    attempt = (
        run.segments.filter(number=run.current_segment)
        .values_list("started_at", "heartbeat_interval_s")
        .first()
    )
    opened_at, declared_s = (attempt[0].timestamp(), attempt[1]) if attempt else (None, None)
    if run.current_segment > 1 and opened_at is not None:
        # A resume is contact: the job calls init before its first batch, and a sweep between
        # the two read the crash's silence as the new attempt's (the demo drill's resume got
        # "no heartbeat for 2 min", was marked crashed and its old NaN alert sent again).
        beats = np.sort(np.append(beats, opened_at))
    # Progress of the current attempt only: a resume goes back to a checkpoint, and its first
    # steps lie below the old attempt's furthest one without being a stall.
    # Chunks whose batch row retention deleted have no received time; they are days old.
    current = run.chunks.filter(segment=run.current_segment, batch__isnull=False).order_by("-id")
    chunks = list(current.values_list("batch__received_at", "max_step")[:500])[::-1]
    progress_t = np.array([c[0].timestamp() for c in chunks])
    progress_s = np.array([float(c[1]) for c in chunks])
    since = _listening_since()
    stall = detect_stall(
        beats,
        progress_t,
        progress_s,
        now=now.timestamp(),
        listening_since=since.timestamp() if since is not None else None,
        # A first attempt's create is contact too, so a job killed after it (or after one
        # batch) is judged from then, by its client's declared heartbeat or the fixed limit.
        opened_at=opened_at,
        declared_interval_s=declared_s,
        unknown_cadence_limit_s=settings.RUNCAST_STALL_UNKNOWN_CADENCE_S,
    )
    conditions = []
    raised: list[Flag] = []
    if stall is not None and stall.stalled:
        status = Run.silent_status(heartbeat_lost=stall.kind == "no_heartbeat")
        Run.objects.filter(pk=run.pk, status__in=Run.ACTIVE_STATUSES).update(status=status)
        if status == Run.Status.CRASHED:
            # A job killed seconds after its loss blew up: the NaN in its last data is the why
            # of the crash, raised first (no forecast runs on an inferred crash), so its alert
            # comes before "looks crashed" (the demo drill's came after it).
            raised = final_events(run=run, now=now)
        conditions.append(
            Condition(Flag.Kind.STALLED, stall.explanation, stall.silent_s, None, stall.to_dict())
        )
    return raised + flags_sync(run=run, conditions=conditions, kinds=(Flag.Kind.STALLED,), now=now)
