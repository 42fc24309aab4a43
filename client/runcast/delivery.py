"""Sending requests with retries, and replaying spool folders in order.

Shared by the live background sender and `runcast sync`, so both classify server answers
the same way:

* 2xx: delivered (a spool file may now be deleted, and only now).
* 408 / 429 / 5xx / no response: transient; retry with backoff, then leave it spooled.
* 400 / 413 (and other 4xx) on a batch: that batch is bad; log once and drop it so it
  never blocks the batches behind it.
* 401 / 403 / 404, or any 4xx on the create request: the run cannot be written with this
  token/URL; keep everything spooled and stop talking to the server (don't spin).
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runcast import spool as spool_mod
from runcast import transport
from runcast.batcher import points_in
from runcast.settings import Settings

logger = logging.getLogger("runcast")

BLOCKING_STATUSES = frozenset({401, 403, 404})


class Verdict(enum.Enum):
    OK = "ok"
    TRANSIENT = "transient"
    DROP = "drop"
    BLOCKED = "blocked"


def classify(kind: str, status: int) -> Verdict:
    if transport.is_success(status):
        return Verdict.OK
    if transport.is_transient(status):
        return Verdict.TRANSIENT
    if kind == "timings" and status == 404:
        # Rank 0 creates the run; another rank's first timings may arrive before it has.
        # Kept and retried (with the growing probe interval), never dropped.
        return Verdict.TRANSIENT
    if kind == "create" or status in BLOCKING_STATUSES:
        return Verdict.BLOCKED
    return Verdict.DROP


@dataclass
class Counters:
    """Cumulative numbers a user (or a test) can read through Run.stats()."""

    retries: int = 0
    batches_sent: int = 0
    batches_duplicate: int = 0
    batches_dropped: int = 0
    # Points the server will never get from this process: in batches it refused, that could
    # not be spooled, or that were deleted from a full spool.
    points_dropped: int = 0
    batches_spooled: int = 0
    files_replayed: int = 0


class Client:
    """Talks to one server with one token; knows backoff, Retry-After and deadlines."""

    def __init__(self, settings: Settings, counters: Counters | None = None) -> None:
        self.settings = settings
        self.counters = counters or Counters()
        # Set while closing: an absolute time after which nothing is retried any more.
        self.deadline: float | None = None
        # Wakes a backoff sleep early when the deadline changes (finish, SIGTERM).
        self.interrupt = threading.Event()
        # Earliest time a caller should talk to the server again (Retry-After too long).
        self.not_before = 0.0
        self._warned: set[tuple[str, int, str]] = set()

    def url_for(self, kind: str, run_id: str) -> str:
        base = self.settings.url or ""
        if kind == "create":
            return f"{base}/api/v1/runs"
        quoted = urllib.parse.quote(run_id, safe="")
        suffix = {"batch": "batches", "timings": "timings"}.get(kind, "finish")
        return f"{base}/api/v1/runs/{quoted}/{suffix}"

    def post(self, kind: str, run_id: str, body: bytes, retries: int) -> transport.Response:
        """POST with up to `retries` retries on transient failures."""
        url = self.url_for(kind, run_id)
        attempt = 0
        while True:
            response = transport.post_json(url, body, self.settings.token, self.settings.timeout)
            status, _, headers = response
            if not transport.is_transient(status) or attempt >= retries:
                return response
            delay = self._delay(attempt, headers)
            if delay is None:
                return response
            if not self._sleep(delay):
                return response
            attempt += 1
            self.counters.retries += 1

    def _sleep(self, delay: float) -> bool:
        """Sleep `delay` seconds; False if a deadline set meanwhile says give up now."""
        end = time.time() + delay
        while True:
            remaining = end - time.time()
            if remaining <= 0:
                return True
            if self.deadline is not None and end > self.deadline:
                return False
            # interrupt is set by finish()/SIGTERM so a long backoff re-checks the deadline.
            if self.interrupt.wait(remaining):
                self.interrupt.clear()

    def _delay(self, attempt: int, headers: dict) -> float | None:
        """Seconds to wait before the next try, or None to give up (and spool) now."""
        retry_after = transport.retry_after_seconds(headers)
        if retry_after is not None:
            if retry_after > self.settings.retry_after_max:
                self.not_before = time.time() + retry_after
                return None
            delay = retry_after
        else:
            ceiling = min(self.settings.backoff_max, self.settings.backoff_base * 2**attempt)
            # Jitter so a fleet of trainers does not hammer a recovering server in step.
            delay = ceiling * (0.5 + random.random() / 2)
        if self.deadline is not None and time.time() + delay > self.deadline:
            return None
        return delay

    def warn_once(self, kind: str, response: transport.Response, what: str) -> None:
        status, payload, _ = response
        error = str(payload.get("error", "")) if isinstance(payload, dict) else ""
        key = (kind, status, error)
        if key in self._warned:
            return
        self._warned.add(key)
        field_name = payload.get("field") if isinstance(payload, dict) else None
        detail = f" (field {field_name!r})" if field_name else ""
        logger.warning(
            "runcast: %s request got HTTP %s: %s%s; %s", kind, status, error or "-", detail, what
        )


OnSuccess = Callable[[str, dict], None]


class ReplayResult(enum.Enum):
    DONE = "done"  # nothing left in the folder
    PARTIAL = "partial"  # stopped early (time budget); call again
    TRANSIENT = "transient"  # server unavailable; try again later
    BLOCKED = "blocked"  # auth / unknown run; needs a human


def replay(
    client: Client,
    folder: spool_mod.SessionSpool,
    run_id: str,
    *,
    first_retries: int = 0,
    retries: int | None = None,
    budget_s: float | None = None,
    on_success: OnSuccess | None = None,
) -> ReplayResult:
    """Send a session's spooled files in order, deleting each only after a 2xx."""
    started = time.monotonic()
    more_retries = client.settings.max_retries if retries is None else retries
    for index, path in enumerate(folder.pending()):
        if budget_s is not None and index and time.monotonic() - started > budget_s:
            return ReplayResult.PARTIAL
        tries = first_retries if index == 0 else more_retries
        verdict = _replay_one(client, path, run_id, tries, on_success)
        if verdict is Verdict.TRANSIENT:
            return ReplayResult.TRANSIENT
        if verdict is Verdict.BLOCKED:
            return ReplayResult.BLOCKED
    return ReplayResult.DONE


def _replay_one(
    client: Client, path: Path, run_id: str, retries: int, on_success: OnSuccess | None
) -> Verdict:
    try:
        body = path.read_bytes()
    except FileNotFoundError:
        return Verdict.OK  # delivered meanwhile by a concurrent sync
    kind = spool_mod.kind_of(path)
    response = client.post(kind, run_id, body, retries)
    verdict = classify(kind, response[0])
    if verdict is Verdict.OK:
        spool_mod.remove(path)
        client.counters.files_replayed += 1
        record_success(client.counters, kind, response)
        if on_success is not None:
            on_success(kind, response[1])
    elif verdict is Verdict.DROP:
        client.warn_once(kind, response, f"dropping spooled {path.name}")
        client.counters.batches_dropped += 1
        client.counters.points_dropped += points_in(body)
        spool_mod.remove(path)
    elif verdict is Verdict.BLOCKED:
        client.warn_once(kind, response, f"keeping spool in {path.parent} for `runcast sync`")
    return verdict


def record_success(counters: Counters, kind: str, response: transport.Response) -> None:
    if kind not in ("batch", "timings"):
        return
    counters.batches_sent += 1
    if response[1].get("duplicate"):
        counters.batches_duplicate += 1
