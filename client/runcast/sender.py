"""The background thread that drains a run's queue, batches, sends, spools and replays.

State, all owned by this thread:

* online  - batches go straight to the server (with inline retries).
* backlog - something is spooled for this session; new batches are spooled behind it so
            order is kept, and a probe (growing interval) replays the folder oldest first.
* blocked - the server refused the run (401/403/404, or the create was rejected): keep
            spooling, never call the server again from this process.
* offline - RUNCAST_MODE=offline: spool only.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from runcast import spool as spool_mod
from runcast import transport
from runcast.batcher import Batcher, Sealed
from runcast.delivery import Client, ReplayResult, Verdict, classify, record_success, replay
from runcast.settings import Settings

logger = logging.getLogger("runcast")

# Seconds of replay per tick, so new log entries keep being drained during a long replay.
_REPLAY_SLICE_S = 1.0


class Sender(threading.Thread):
    def __init__(
        self,
        *,
        run_id: str,
        session: str,
        settings: Settings,
        queue: collections.deque,
        on_created: Callable[[dict], None],
        batcher: Any = None,
        kind: str = "batch",
        flush_interval: float | None = None,
        client: Client | None = None,
    ) -> None:
        super().__init__(name=f"runcast-sender-{run_id[:12]}", daemon=True)
        self.run_id = run_id
        self.session = session
        self.settings = settings
        self.queue = queue
        self.on_created = on_created
        # The host agent passes a client with its own URLs; batching, spool and replay are shared.
        self.client = client or Client(settings)
        self.spool = spool_mod.SessionSpool.for_session(settings.spool_root(), run_id, session)
        # "batch" (the run's metrics) or "timings" (a rank's step timings: no create, no
        # heartbeat, no finish; its own session, seq and spool folder).
        self.kind = kind
        self.batcher: Any = batcher or Batcher(
            session, settings.batch_points, settings.max_body_bytes
        )
        self.flush_interval = settings.flush_interval if flush_interval is None else flush_interval
        # What this process asked for; the server's pacing hint may only lengthen it.
        self._own_flush_interval = self.flush_interval
        self.offline = settings.mode == "offline"
        self.blocked = False
        self.backlog = False
        self._outbox: collections.deque[Sealed] = collections.deque()
        # The create request when it could be neither sent nor spooled (open()).
        self._unsent_create: bytes | None = None
        self._claimed = False
        self._close_requested = threading.Event()
        self._status = "finished"
        self._finish_time = 0.0
        self._next_probe = 0.0
        self._probe_delay = settings.probe_interval
        self._last_heartbeat = time.time()
        self._outage_logged = False
        # counters.files_replayed when the outage began: what its end may say was replayed.
        self._replayed_before_outage = 0
        # time.monotonic() of the last "cannot write to the spool" warning.
        self._spool_warned_at: float | None = None
        # Points of each batch file this process spooled and has not seen replayed, by name:
        # a file deleted from a full spool is counted in points without reading it back.
        self._spooled_points: dict[str, int] = {}
        self._drop_logged = False
        self._cap_logged = False
        self._spool_dropped = 0
        self._spool_dropped_bytes = 0
        self._received = 0
        self._max_n = -1
        self._points_sent = 0
        self._spooled_batches = 0
        self._poll = min(0.25, max(0.01, self.flush_interval / 4))

    # -- called from the user's thread --------------------------------------------

    def open(self, create_body: bytes | None) -> None:
        """Create the run (one synchronous try) before the thread starts."""
        if create_body is None:
            return  # a rank's timings: rank 0 creates the run
        if self.offline:
            self._spool_write(spool_mod.CREATE, create_body)
            return
        response = self.client.post("create", self.run_id, create_body, retries=0)
        verdict = classify("create", response[0])
        if verdict is Verdict.OK:
            self.on_created(response[1])
            return
        if not self._spool_write(spool_mod.CREATE, create_body):
            # Lost with an unwritable spool, every later batch would meet a run the server
            # never heard of (404: blocked for good). It waits here and goes first.
            self._unsent_create = create_body
        if verdict is Verdict.BLOCKED:
            self._block(response, "create")
        else:
            self._enter_outage(response, time.time())

    def request_close(self, status: str, timeout: float, ended_at: float | None = None) -> None:
        self._status = status
        now = time.time()
        # An importer replaying history ends the run at its recorded end, not now.
        self._finish_time = now if ended_at is None else ended_at
        self.client.deadline = now + timeout
        self.client.interrupt.set()
        self._close_requested.set()

    def stats(self) -> dict[str, Any]:
        counters = self.client.counters
        return {
            "logged": self._received,
            "dropped": max(0, self._max_n + 1 - self._received),
            "skipped": self.batcher.skipped,
            "points_sent": self._points_sent,
            "batches_sent": counters.batches_sent,
            "batches_duplicate": counters.batches_duplicate,
            "batches_dropped": counters.batches_dropped,
            # Points in those batches, in the ones deleted from a full spool, and in spooled
            # ones the server refused on replay: what the server will never get.
            "points_dropped": counters.points_dropped,
            "batches_spooled": self._spooled_batches,
            # Spooled batches deleted, oldest first, to keep the spool under max_spool_bytes.
            "batches_spool_dropped": self._spool_dropped,
            "bytes_spool_dropped": self._spool_dropped_bytes,
            "files_replayed": counters.files_replayed,
            "retries": counters.retries,
            "queued": len(self.queue),
            "blocked": self.blocked,
            "backlog": self.backlog,
        }

    # -- the thread ---------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self._close_requested.wait(self._poll):
                self._tick(time.time())
            self._close()
        except Exception:
            logger.exception("runcast: background sender failed; later metrics are not sent")
        finally:
            self._release()

    def _tick(self, now: float) -> None:
        started = now
        while True:
            drained = self._drain(self.settings.batch_points)
            self._seal_if_due(now)
            self._pump(now, closing=False)
            now = time.time()
            # Keep draining while the trainer outpaces us, but look up for a close request
            # at least every second.
            if drained < self.settings.batch_points or now - started > 1.0:
                return

    def _drain(self, limit: int | None) -> int:
        queue, add = self.queue, self.batcher.add
        count = 0
        while limit is None or count < limit:
            try:
                number, step, when, data = queue.popleft()
            except IndexError:
                break
            count += 1
            if number > self._max_n:
                self._max_n = number
            try:
                add(step, when, data)
            except Exception:
                # One pathological entry must never take the sender thread down.
                logger.debug("runcast: skipping entry that failed to batch", exc_info=True)
                self.batcher.skipped += 1
        self._received += count
        self._warn_if_dropped()
        return count

    def _warn_if_dropped(self) -> None:
        dropped = self._max_n + 1 - self._received
        if dropped > 0 and not self._drop_logged:
            self._drop_logged = True
            logger.warning(
                "runcast: log queue full (max_queue=%d); dropping the oldest entries",
                self.settings.max_queue,
            )

    def _seal_if_due(self, now: float) -> None:
        opened = self.batcher.opened_at
        # With nothing open, an empty batch is still worth sending as a heartbeat.
        due = self._heartbeat_due(now) if opened is None else now - opened >= self.flush_interval
        if due:
            self.batcher.seal(heartbeat=self._heartbeat(now))

    def _heartbeat_due(self, now: float) -> bool:
        # Heartbeats only mean something live: never spool one behind a backlog. A rank's
        # timings carry none: the run's liveness is rank 0's.
        live = not (self.offline or self.blocked or self.backlog or self.kind != "batch")
        return live and now - self._last_heartbeat >= self.settings.heartbeat_interval

    def _heartbeat(self, now: float) -> float | None:
        if not self._heartbeat_due(now):
            return None
        self._last_heartbeat = now
        return now

    # -- delivery -----------------------------------------------------------------

    def _pump(self, now: float, closing: bool) -> None:
        self._outbox.extend(self.batcher.take_sealed())
        if self.offline or self.blocked:
            self._spool_outbox()
            return
        if self._unsent_create is not None and not self._send_unsent_create(now, closing):
            self._spool_outbox()
            return
        if self.backlog and not self._replay_backlog(now, closing):
            self._spool_outbox()
            return
        self._send_outbox(now)

    def _send_unsent_create(self, now: float, closing: bool) -> bool:
        """Send the create that could not be spooled, when a probe is due; True once sent."""
        if not closing and now < self._next_probe:
            return False
        assert self._unsent_create is not None
        # Retried as a live batch is: it stands where the batches' first send would.
        response = self.client.post(
            "create", self.run_id, self._unsent_create, retries=self.settings.max_retries
        )
        verdict = classify("create", response[0])
        if verdict is Verdict.OK:
            self._unsent_create = None
            self.on_created(response[1])
            self._server_answered()
            return True
        if verdict is Verdict.BLOCKED:
            self._block(response, "create")
        else:
            self._schedule_probe(now)
        return False

    def _replay_backlog(self, now: float, closing: bool) -> bool:
        """Replay the spool if it is time to; True once it is empty."""
        if not closing and now < self._next_probe:
            return False
        budget = self._remaining() if closing else _REPLAY_SLICE_S
        result = replay(
            self.client,
            self.spool,
            self.run_id,
            budget_s=budget,
            on_success=self._on_replayed,
        )
        if result is ReplayResult.DONE:
            self._spooled_points.clear()
            self._leave_backlog()
            return True
        if result is ReplayResult.PARTIAL:
            self._next_probe = now  # server is up: continue on the next tick
        elif result is ReplayResult.BLOCKED:
            self.blocked = True
        else:
            self._schedule_probe(now)
        return False

    def _send_outbox(self, now: float) -> None:
        while self._outbox:
            if self._out_of_time():
                # Closing, and a slow (but answering) server used up the finish budget: the
                # rest goes to disk for `runcast sync`, or it would die with the process.
                self._spool_outbox()
                return
            sealed = self._outbox[0]
            response = self.client.post(
                self.kind, self.run_id, sealed.body, retries=self.settings.max_retries
            )
            verdict = classify(self.kind, response[0])
            if verdict is Verdict.OK:
                record_success(self.client.counters, self.kind, response)
                self._points_sent += sealed.points
                self._follow_pacing(response[1])
                self._server_answered()
            elif verdict is Verdict.DROP:
                self.client.warn_once(self.kind, response, f"dropping batch seq {sealed.seq}")
                self._count_dropped(sealed.points)
                self._server_answered()
            elif verdict is Verdict.BLOCKED:
                self._block(response, self.kind)
                self._spool_outbox()
                return
            else:
                self._enter_outage(response, time.time())
                self._spool_outbox()
                return
            self._outbox.popleft()

    def _follow_pacing(self, payload: Any) -> None:
        """Send the next batches no sooner than the server asks (tracker/pacing.py): under load it
        asks for fewer, larger batches. Never sooner than this process's own flush_interval, and
        never later than its heartbeat interval, by which the server judges that it is alive. A
        batch answered without a hint (no load, or an older server) returns to our own."""
        if self.kind != "batch" or not isinstance(payload, dict):
            return
        hint = payload.get("flush_interval")
        if isinstance(hint, bool) or not isinstance(hint, (int, float)) or not hint >= 0:
            self.flush_interval = self._own_flush_interval
            return
        paced = min(float(hint), self.settings.heartbeat_interval)
        self.flush_interval = max(self._own_flush_interval, paced)

    def _on_replayed(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "create":
            self.on_created(payload)
        elif kind in ("batch", "timings"):
            # Replayed batches are counted as the server reports them (0 for a duplicate).
            accepted = payload.get("accepted")
            self._points_sent += accepted if isinstance(accepted, int) else 0
            self._follow_pacing(payload)

    # -- outage / blocked bookkeeping ----------------------------------------------

    def _enter_outage(self, response: transport.Response, now: float) -> None:
        self.backlog = True
        self._schedule_probe(now)
        if self._outage_logged:
            return
        self._outage_logged = True
        self._replayed_before_outage = self.client.counters.files_replayed
        status, payload, _ = response
        logger.warning(
            "runcast: server unavailable (HTTP %s: %s); spooling to %s and retrying in the"
            " background",
            status or "-",
            payload.get("error", "-"),
            self.spool.path,
        )

    def _leave_backlog(self) -> None:
        """The spool folder is empty: new batches go straight to the server again.

        Empty is not the same as replayed: with a spool that cannot be written nothing was
        spooled, and the replay that found nothing asked the server nothing. Only an answer
        ends the outage (_server_answered), here or at the next live send."""
        self.backlog = False
        if self.client.counters.files_replayed > self._replayed_before_outage:
            self._server_answered()

    def _server_answered(self) -> None:
        """The server answered a request: say so once after an outage, with what was replayed."""
        self._probe_delay = self.settings.probe_interval
        if not self._outage_logged:
            return
        self._outage_logged = False
        replayed = self.client.counters.files_replayed - self._replayed_before_outage
        if replayed:
            logger.info("runcast: server reachable again; %d spooled file(s) replayed", replayed)
        else:
            logger.info("runcast: server reachable again")

    def _schedule_probe(self, now: float) -> None:
        delay = self._probe_delay * (0.5 + random.random() / 2)
        self._next_probe = max(now + delay, self.client.not_before)
        self._probe_delay = min(self.settings.probe_interval_max, self._probe_delay * 2)

    def _block(self, response: transport.Response, kind: str) -> None:
        self.blocked = True
        hint = "check RUNCAST_TOKEN" if response[0] == 401 else "check the run's project/deadline"
        self.client.warn_once(
            kind,
            response,
            f"not sending any more; data kept in {self.spool.path} ({hint}, then `runcast sync`)",
        )

    # -- spool --------------------------------------------------------------------

    def _spool_outbox(self) -> None:
        while self._outbox:
            sealed = self._outbox.popleft()
            name = spool_mod.batch_name(sealed.seq, self.kind)
            if not self._spool_write(name, sealed.body, sealed.points):
                continue
            self._spooled_batches += 1
            if not self.offline:
                self.backlog = True

    def _spool_write(self, name: str, body: bytes, points: int | None = None) -> bool:
        """Write one request file; False when it is lost. `points`: it is a batch of that many
        points, counted as dropped when lost (the create and finish requests hold none)."""
        error: OSError | None = None
        try:
            if not self._claimed:
                self.spool.claim(self.run_id, self.session, self.settings.url)
                self._claimed = True
            written = self._make_room(name, len(body))  # False: a batch larger than the cap
            if written:
                self.spool.write(name, body)
        except OSError as exc:
            written, error = False, exc
        if points is not None:
            if written:
                self._spooled_points[name] = points
            else:
                self._count_dropped(points)
        if error is not None:
            self._warn_unwritable(error)  # after counting: it says the count so far
        return written

    def _count_dropped(self, points: int) -> None:
        self.client.counters.batches_dropped += 1
        self.client.counters.points_dropped += points

    def _warn_unwritable(self, exc: OSError) -> None:
        """Say that the spool cannot be written, and how much is lost so far: at once, then at
        most every spool_warning_interval while it lasts (a warning per batch would flood the
        training log; one alone would scroll away while the losses go on)."""
        now = time.monotonic()
        last = self._spool_warned_at
        if last is not None and now - last < self.settings.spool_warning_interval:
            return
        self._spool_warned_at = now
        counters = self.client.counters
        logger.warning(
            "runcast: cannot write to the spool %s (%s): what is not sent to the server now is"
            " lost, %d points in %d batches so far (%s); set RUNCAST_DIR to a writable"
            " directory",
            self.spool.path,
            exc.strerror or exc,
            counters.points_dropped,
            counters.batches_dropped,
            self._stats_key("points_dropped"),
        )

    def _stats_key(self, key: str) -> str:
        """Where a user reads this sender's counter: a rank's timings have their own."""
        if self.kind == "timings":
            return f"run.stats()['timings']['{key}']"
        return f"run.stats()['{key}']"

    def _make_room(self, name: str, size: int) -> bool:
        """Keep the spool under its cap by dropping its oldest batches; False to drop this one
        (a single batch larger than the whole cap)."""
        cap = self.settings.max_spool_bytes
        if not cap or spool_mod.kind_of(self.spool.path / name) != "batch":
            return True
        dropped, freed, fits = self.spool.make_room(size, cap)
        self._spool_dropped += len(dropped)
        self._spool_dropped_bytes += freed
        self.client.counters.points_dropped += sum(
            self._spooled_points.pop(path.name, 0) for path in dropped
        )
        if (dropped or not fits) and not self._cap_logged:
            self._cap_logged = True
            logger.warning(
                "runcast: spool %s reached max_spool_bytes=%d; dropping the oldest spooled"
                " batches (counted in %s and %s)",
                self.spool.path,
                cap,
                self._stats_key("batches_spool_dropped"),
                self._stats_key("points_dropped"),
            )
        return fits  # a batch larger than the cap: the caller counts it in batches_dropped

    def _release(self) -> None:
        if not self._claimed:
            return
        try:
            self.spool.release()
        except OSError:
            logger.debug("runcast: could not release spool folder", exc_info=True)

    # -- closing ------------------------------------------------------------------

    def _close(self) -> None:
        self._drain(None)
        self.batcher.seal()
        self._pump(time.time(), closing=True)
        if self.kind != "batch":
            self._report_leftovers()
            return
        body = transport.encode(
            {"status": self._status, "time": self._finish_time, "session": self.session}
        )
        if not self._send_finish(body):
            self._spool_write(spool_mod.FINISH, body)
        self._report_leftovers()

    def _send_finish(self, body: bytes) -> bool:
        """True when the finish is settled (sent, or rejected as bad) and need not be spooled."""
        if self.offline or self.blocked or self.backlog or self._outbox:
            return False
        response = self.client.post("finish", self.run_id, body, self.settings.max_retries)
        verdict = classify("finish", response[0])
        if verdict in (Verdict.OK, Verdict.DROP):
            self._server_answered()
        if verdict is Verdict.DROP:
            self.client.warn_once("finish", response, "finish not recorded")
        if verdict is Verdict.BLOCKED:
            self._block(response, "finish")
        return verdict in (Verdict.OK, Verdict.DROP)

    def _report_leftovers(self) -> None:
        counters = self.client.counters
        if counters.points_dropped:
            # The one number to read at the end, whatever the warnings before it said.
            logger.warning(
                "runcast: run %s lost %d points in %d batches (refused by the server, not"
                " spoolable, or deleted from a full spool; %s)",
                self.run_id,
                counters.points_dropped,
                counters.batches_dropped + self._spool_dropped,
                self._stats_key("points_dropped"),
            )
        if not self._claimed:
            return
        left = len(self.spool.pending())
        if not left:
            return
        log = logger.info if self.offline else logger.warning
        log(
            "runcast: %d request file(s) for run %s kept in %s; upload with `runcast sync`",
            left,
            self.run_id,
            self.spool.path,
        )

    def _out_of_time(self) -> bool:
        deadline = self.client.deadline
        return deadline is not None and time.time() >= deadline

    def _remaining(self) -> float:
        deadline = self.client.deadline
        return max(0.0, deadline - time.time()) if deadline is not None else 0.0
