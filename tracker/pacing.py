"""How often each live run should send its points: the server's flush hint.

The client batches a run's points and sends a batch every `flush_interval` seconds (1 s by
default). At a few hundred live runs those requests are most of the web tier's work, while a
batch every few seconds changes nothing a reader sees (forecasts are debounced to 15 s, the
liveness sweep runs every minute) and nothing the trainer sees (`log()` only appends to a queue).
So each batch's answer carries `flush_interval`: the seconds the server asks between this run's
batches once there are so many live runs that a batch a second from each would exceed
RUNCAST_INGEST_BATCHES_PER_S: then live runs / that budget, so that together they stay within
it. The client waits at least that long (never less than its own setting, never longer than its
heartbeat interval, so liveness is judged as before); while the hint is absent (below budget)
every client keeps its own flush_interval.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from tracker.models import Run

# The client's default flush interval: up to this, the live runs together stay within budget
# without being asked anything.
UNPACED_S = 1.0
# The count is refreshed at most this often, per process: a count query (or a cache round trip)
# per batch would cost more than the batches the hint saves, and a hint up to 30 s stale is
# as good as a fresh one.
COUNT_TTL_S = 30

_lock = threading.Lock()
_count: tuple[float, int] | None = None  # (time.monotonic() it was counted, live runs)


def live_runs() -> int:
    """Runs that sent a batch recently, counted at most once per COUNT_TTL_S in this process."""
    global _count
    with _lock:
        if _count is not None and time.monotonic() - _count[0] < COUNT_TTL_S:
            return _count[1]
    # Live: sent anything within two of the longest hints (a run slowed to the hint counts).
    window = timedelta(seconds=2 * settings.RUNCAST_FLUSH_INTERVAL_MAX_S + COUNT_TTL_S)
    count = Run.objects.filter(
        status=Run.Status.RUNNING, last_seen_at__gte=timezone.now() - window
    ).count()
    with _lock:
        _count = (time.monotonic(), count)
    return count


def forget() -> None:
    """Count afresh on the next batch (tests)."""
    global _count
    with _lock:
        _count = None


def flush_interval_hint(live: int | None = None) -> float | None:
    """Seconds between batches asked of each live run, `live / budget` up to the configured
    maximum, in whole tenths so that it does not jitter with every count; None (ask nothing,
    each client keeps its own flush_interval) while that is a second or less."""
    budget = settings.RUNCAST_INGEST_BATCHES_PER_S
    if budget <= 0:
        return None
    count = live_runs() if live is None else live
    asked = count / budget
    if asked <= UNPACED_S:
        return None
    return round(min(settings.RUNCAST_FLUSH_INTERVAL_MAX_S, asked), 1)
