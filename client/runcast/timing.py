"""Per-rank step timings: what every rank of a distributed job sends so the server can find the
rank (or host) everyone waits for.

In synchronous data parallelism the collectives equalise the whole step time across ranks, so
the signal is the part before the collective (`compute_s`, the rank's own work) or the wait
inside it (`wait_s`: a straggler waits least, the others wait for it). Give both when you can.

Each process has its own timing channel: its own session, seq, spool folder and background
thread, posting to /api/v1/runs/{id}/timings every `timing_interval` seconds (20 by default).
Recording a timing costs what a log() costs: a tuple appended to a deque.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import time
import uuid
from types import TracebackType
from typing import Any

from runcast.batcher import MAX_ABS_STEP, Sealed, _integer
from runcast.sender import Sender
from runcast.settings import Settings

logger = logging.getLogger("runcast")

PARTS = ("compute_s", "wait_s", "total_s")
# The server's limits (tracker/limits.py): steps per timings request, seconds per step.
MAX_STEPS_PER_BATCH = 10_000
MAX_STEP_SECONDS = 86_400.0


class TimingBatcher:
    """Turns queued (step, compute, wait, total) entries into numbered timings request bodies.

    Runs on the sender thread only; the same interface as batcher.Batcher so Sender can drive it.
    """

    def __init__(
        self, session: str, *, rank: int, local_rank: int | None, host: str, max_steps: int
    ) -> None:
        self.session = session
        self.header = {"rank": rank, "local_rank": local_rank, "host": host}
        self.max_steps = max(1, min(max_steps, MAX_STEPS_PER_BATCH))
        self.seq = 0
        self.skipped = 0
        self.opened_at: float | None = None
        self._columns: dict[str, list[Any]] = {"steps": [], **{p: [] for p in PARTS}}
        self._sealed: list[Sealed] = []
        self._warned: set[str] = set()

    @property
    def points(self) -> int:
        return len(self._columns["steps"])

    def add(self, step: Any, when: float, data: Any) -> None:
        number = step if step.__class__ is int else _integer(step)
        if number is None or not -MAX_ABS_STEP <= number <= MAX_ABS_STEP:
            self._skip("step", f"timing: invalid step {step!r}; expected an int, skipped")
            return
        values = [self._seconds(name, value) for name, value in zip(PARTS, data, strict=True)]
        if all(v is None for v in values):
            self._skip("empty", "timing: no valid compute_s, wait_s or total_s; skipped")
            return
        if self.opened_at is None:
            self.opened_at = when
        self._columns["steps"].append(number)
        for name, value in zip(PARTS, values, strict=True):
            self._columns[name].append(value)
        if self.points >= self.max_steps:
            self.seal()

    def _seconds(self, name: str, value: Any) -> float | None:
        if value is None:
            return None
        try:
            seconds = float(value)
        except Exception:
            self._skip(f"value:{name}", f"timing: {name}={value!r} is not a number; left out")
            return None
        if seconds != seconds:
            return None  # NaN: not measured, as the server reads it
        if not 0.0 <= seconds <= MAX_STEP_SECONDS:
            self._skip(
                f"range:{name}", f"timing: {name}={seconds!r} is not 0..86400 seconds; left out"
            )
            return None
        return round(seconds, 6)

    def _skip(self, key: str, message: str) -> None:
        self.skipped += 1
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("runcast: %s", message)

    def seal(self, heartbeat: float | None = None) -> None:
        if not self.points:
            return  # timings carry no heartbeat: an empty batch says nothing
        columns = self._columns
        self._columns = {"steps": [], **{p: [] for p in PARTS}}
        self.opened_at = None
        self.seq += 1
        body: dict[str, Any] = {"session": self.session, "seq": self.seq, **self.header}
        body["steps"] = columns["steps"]
        for name in PARTS:
            if any(v is not None for v in columns[name]):
                body[name] = columns[name]
        encoded = json.dumps(body, separators=(",", ":")).encode("utf-8")
        self._sealed.append(Sealed(self.seq, encoded, len(columns["steps"])))

    def take_sealed(self) -> list[Sealed]:
        sealed, self._sealed = self._sealed, []
        return sealed


class TimingChannel:
    """One process's timings: a queue, the auto-mode clock and a background sender."""

    def __init__(
        self,
        *,
        run_id: str,
        settings: Settings,
        rank: int,
        local_rank: int | None,
        host: str,
    ) -> None:
        self.session = uuid.uuid4().hex
        self.rank = rank
        self._queue: collections.deque = collections.deque(maxlen=settings.max_queue)
        self._numbers = itertools.count()
        # Auto mode: the interval between log() calls at successive steps.
        self._last_step: int | None = None
        self._last_t = 0.0
        self.explicit = False
        interval = max(0.01, settings.timing_interval)
        self._sender = Sender(
            run_id=run_id,
            session=self.session,
            settings=settings,
            queue=self._queue,
            on_created=lambda payload: None,
            batcher=TimingBatcher(
                self.session,
                rank=rank,
                local_rank=local_rank,
                host=host,
                max_steps=settings.batch_points,
            ),
            kind="timings",
            flush_interval=interval,
        )
        self._sender.open(None)
        self._sender.start()

    def record(
        self, step: Any, compute_s: Any = None, wait_s: Any = None, total_s: Any = None
    ) -> None:
        """Queue one step's timings (validated on the sender thread). Never raises."""
        self.explicit = True
        self._queue.append((next(self._numbers), step, time.time(), (compute_s, wait_s, total_s)))

    def tick(self, step: int) -> None:
        """Auto mode (log() calls this): time from the previous step's log() to this one's."""
        now = time.perf_counter()
        last = self._last_step
        if last is None or step > last:
            if last is not None and not self.explicit:
                per_step = (now - self._last_t) / (step - last)
                self._queue.append((next(self._numbers), step, time.time(), (None, None, per_step)))
            self._last_step, self._last_t = step, now
        elif step < last:
            self._last_step, self._last_t = step, now  # a resume went back: start over

    def request_close(self, timeout: float) -> None:
        self._sender.request_close("finished", timeout)

    def join(self, timeout: float) -> None:
        self._sender.join(timeout)

    def stats(self) -> dict[str, Any]:
        return self._sender.stats()


class StepTimer:
    """`with run.step_timer(step) as t: ...; t.wait(); ...` — compute until wait(), then the
    wait inside the collective until the block ends (without wait(): the whole step).

    On a GPU, kernels run asynchronously: call torch.cuda.synchronize() (or time with CUDA
    events and pass the numbers to run.timing()) before t.wait(), or the compute part only
    measures how long it took to queue the kernels.
    """

    __slots__ = ("_channel", "_start", "_waited", "step")

    def __init__(self, channel: TimingChannel | None, step: int) -> None:
        self._channel = channel
        self.step = step
        self._start = 0.0
        self._waited: float | None = None

    def __enter__(self) -> StepTimer:
        self._start = time.perf_counter()
        return self

    def wait(self) -> None:
        """Mark the end of this rank's own work: what follows is waiting for the others."""
        self._waited = time.perf_counter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._channel is None or exc_type is not None:
            return
        end = time.perf_counter()
        if self._waited is None:
            self._channel.record(self.step, total_s=end - self._start)
        else:
            self._channel.record(
                self.step,
                compute_s=self._waited - self._start,
                wait_s=end - self._waited,
                total_s=end - self._start,
            )
