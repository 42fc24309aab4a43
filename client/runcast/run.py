"""The public run objects and `init()`."""

from __future__ import annotations

import collections
import itertools
import logging
import os
import re
import socket
import sys
import threading
import time as _time
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Union

from runcast import create, lifecycle, procinfo, transport
from runcast.batcher import Event
from runcast.sender import Sender
from runcast.settings import Settings, resolve
from runcast.timing import StepTimer, TimingChannel

logger = logging.getLogger("runcast")

UNITS = ("steps", "tokens", "samples")
# The server's rule for run ids (tracker/api/schemas.py RUN_ID_PATTERN).
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
STATUSES = ("finished", "failed", "crashed")

# Extra seconds finish() waits beyond its deadline: one in-flight request may still be
# running into its own timeout before the sender can spool the rest.
_JOIN_SLACK_S = 2.0
_OFF = ("0", "false", "no", "off")


class _Timings:
    """A process's rank identity and, once something is recorded, its timing channel."""

    def __init__(
        self,
        run_id: str,
        settings: Settings,
        *,
        rank: int,
        local_rank: int | None,
        host: str,
        auto: bool,
    ) -> None:
        self.run_id, self.settings = run_id, settings
        self.rank, self.local_rank, self.host = rank, local_rank, host
        self.auto = auto
        self.channel: TimingChannel | None = None
        self._lock = threading.Lock()

    def get(self) -> TimingChannel:
        channel = self.channel
        if channel is None:
            with self._lock:  # two threads' first timing must not start two senders
                if self.channel is None:
                    self.channel = TimingChannel(
                        run_id=self.run_id,
                        settings=self.settings,
                        rank=self.rank,
                        local_rank=self.local_rank,
                        host=self.host,
                    )
                channel = self.channel
        return channel

    def tick(self, step: Any) -> None:
        """Auto mode: called by log(); off once the trainer records timings itself."""
        channel = self.channel or self.get()
        if not channel.explicit:
            channel.tick(step if step.__class__ is int else int(step))

    def request_close(self, budget: float) -> None:
        if self.channel is not None:
            self.channel.request_close(budget)

    def join(self, budget: float) -> None:
        if self.channel is not None:
            self.channel.join(budget + self.settings.timeout + _JOIN_SLACK_S)

    def close(self, budget: float) -> None:
        self.request_close(budget)
        self.join(budget)

    def stats(self) -> dict[str, Any]:
        return self.channel.stats() if self.channel is not None else {}


class Run:
    """A live run. log()/event() only enqueue; a background thread does the rest."""

    def __init__(
        self,
        run_id: str,
        settings: Settings,
        create_body: dict[str, Any],
        timings: _Timings | None = None,
    ) -> None:
        self.id = run_id
        self.session: str = create_body["session"]
        self.url: str | None = None
        self.attempt: int | None = None
        self.segment: int | None = None
        self.settings = settings
        # A deque with maxlen is the bounded queue: append is atomic under the GIL, so
        # log() needs no lock, and when full the oldest entry is dropped (counted by
        # the sender from gaps in the entry numbers).
        self._queue: collections.deque = collections.deque(maxlen=settings.max_queue)
        self._numbers = itertools.count()
        self._auto_step = itertools.count()
        self._closed = False
        self._finish_lock = threading.RLock()
        self._warned: set[str] = set()
        self._timings = timings or _Timings(
            run_id, settings, rank=0, local_rank=None, host=socket.gethostname(), auto=False
        )
        self._sender = Sender(
            run_id=run_id,
            session=self.session,
            settings=settings,
            queue=self._queue,
            on_created=self._on_created,
        )
        self._sender.open(transport.encode(create_body))
        self._sender.start()
        lifecycle.register(self)

    # -- hot path -----------------------------------------------------------------

    def log(
        self, data: Mapping[str, Any], step: int | None = None, time: float | None = None
    ) -> None:
        """Queue metric values for `step` (default: previous step + 1). Never raises.

        `time` (epoch seconds) defaults to now; importers of old logs pass the original time.
        """
        if self._closed:
            self._warn_once("closed", "log() after finish() is ignored")
            return
        try:
            if step is None:
                step = next(self._auto_step)
            elif step.__class__ is int:
                self._auto_step = itertools.count(step + 1)
            else:
                self._auto_step = itertools.count(int(step) + 1)
            if self._timings.auto:
                self._timings.tick(step)
            # Copy: trainers often reuse one dict and mutate it between calls.
            data = dict(data)
            for key, value in data.items():
                if value.__class__ is not float and hasattr(value, "detach"):
                    # A torch tensor may pin its whole autograd graph (activations) until
                    # the sender converts it; detach() is cheap and needs no GPU sync.
                    data[key] = value.detach()
            when = _time.time() if time is None else float(time)
            self._queue.append((next(self._numbers), step, when, data))
        except Exception as exc:
            self._warn_once(f"log:{type(exc).__name__}", f"log() ignored a bad call: {exc!r}")

    def event(self, kind: str, step: int | None = None, **payload: Any) -> None:
        """Queue an event (checkpoint, eval, resume, restart, lr_change, arch_change, custom)."""
        if self._closed:
            self._warn_once("closed", "event() after finish() is ignored")
            return
        try:
            entry = Event(str(kind), dict(payload))
            self._queue.append((next(self._numbers), step, _time.time(), entry))
        except Exception as exc:
            self._warn_once(f"event:{type(exc).__name__}", f"event() ignored: {exc!r}")

    def timing(
        self,
        step: int,
        compute_s: float | None = None,
        wait_s: float | None = None,
        total_s: float | None = None,
    ) -> None:
        """This rank's time for `step`: its own work (`compute_s`) and its wait inside the
        collective (`wait_s`), seconds; `total_s` the whole step. Never raises. Turns off the
        automatic mode (log() intervals) for this process."""
        if self._closed:
            return
        try:
            self._timings.get().record(step, compute_s, wait_s, total_s)
        except Exception as exc:
            self._warn_once(f"timing:{type(exc).__name__}", f"timing() ignored: {exc!r}")

    def step_timer(self, step: int) -> StepTimer:
        """`with run.step_timer(step) as t: forward/backward; t.wait(); all_reduce/step`."""
        try:
            channel = None if self._closed else self._timings.get()
        except Exception as exc:
            self._warn_once(f"timing:{type(exc).__name__}", f"step_timer() ignored: {exc!r}")
            channel = None
        return StepTimer(channel, step)

    # -- lifecycle ----------------------------------------------------------------

    def finish(
        self, status: str = "finished", timeout: float | None = None, ended_at: float | None = None
    ) -> None:
        """Flush everything, then mark the run finished/failed/crashed. Idempotent.

        `ended_at` (epoch seconds) is for replays and importers, like `init(started_at=)`:
        the run ends at that time instead of now."""
        if status not in STATUSES:
            logger.warning("runcast: unknown finish status %r, using 'finished'", status)
            status = "finished"
        budget = self.settings.finish_timeout if timeout is None else timeout
        with self._finish_lock:
            first = not self._closed
            self._closed = True
        if first:
            # Both senders flush at once, inside the one budget.
            self._timings.request_close(budget)
            self._sender.request_close(status, budget, ended_at)
        # Later callers (atexit after finish(), SIGTERM during finish()) also just wait.
        self._sender.join(budget + self.settings.timeout + _JOIN_SLACK_S)
        self._timings.join(budget)
        if self._sender.is_alive():
            logger.warning("runcast: run %s did not flush within %.0fs", self.id, budget)
        lifecycle.unregister(self)

    def stats(self) -> dict[str, Any]:
        """Counters: logged, dropped (queue full), skipped (bad values), sent, retries...
        and under "timings" the same counters of this process's timing channel."""
        return {**self._sender.stats(), "timings": self._timings.stats()}

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.finish("failed" if exc_type is not None else "finished")

    def __repr__(self) -> str:
        return f"<runcast.Run id={self.id!r} url={self.url!r}>"

    # -- internals ----------------------------------------------------------------

    def _on_created(self, payload: dict[str, Any]) -> None:
        url = payload.get("url")
        if isinstance(url, str) and url:
            # The server may answer with a path; users want something they can click.
            self.url = urllib.parse.urljoin((self.settings.url or "") + "/", url)
        self.attempt = payload.get("attempt", self.attempt)
        self.segment = payload.get("segment", self.segment)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("runcast: %s", message)


class NoOpRun:
    """What non-zero ranks (and RUNCAST_MODE=disabled) get: same methods, does nothing."""

    def __init__(self, run_id: str | None = None) -> None:
        self.id = run_id
        self.url: str | None = None
        self.session: str | None = None
        self.attempt: int | None = None
        self.segment: int | None = None

    def log(
        self, data: Mapping[str, Any], step: int | None = None, time: float | None = None
    ) -> None:
        return None

    def event(self, kind: str, step: int | None = None, **payload: Any) -> None:
        return None

    def timing(
        self,
        step: int,
        compute_s: float | None = None,
        wait_s: float | None = None,
        total_s: float | None = None,
    ) -> None:
        return None

    def step_timer(self, step: int) -> StepTimer:
        return StepTimer(None, step)

    def finish(
        self, status: str = "finished", timeout: float | None = None, ended_at: float | None = None
    ) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {}

    def __enter__(self) -> NoOpRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def __repr__(self) -> str:
        return f"<runcast.NoOpRun id={self.id!r}>"


class RankRun(NoOpRun):
    """What ranks other than 0 get in a distributed job: they send only their step timings,
    under the run rank 0 logs to (same id; each rank its own session and spool folder).

    log() sends nothing but, until the trainer calls timing() or step_timer() itself, times the
    interval between log() calls at successive steps (the automatic mode).
    """

    def __init__(self, run_id: str, timings: _Timings) -> None:
        super().__init__(run_id)
        self.rank = timings.rank
        self._timings = timings
        self._closed = False
        self._auto_step = itertools.count()
        lifecycle.register(self)

    def log(
        self, data: Mapping[str, Any], step: int | None = None, time: float | None = None
    ) -> None:
        if self._closed or not self._timings.auto:
            return None
        try:
            if step is None:
                step = next(self._auto_step)
            else:
                self._auto_step = itertools.count(int(step) + 1)
            self._timings.tick(step)
        except Exception:
            logger.debug("runcast: rank timing tick ignored", exc_info=True)
        return None

    def timing(
        self,
        step: int,
        compute_s: float | None = None,
        wait_s: float | None = None,
        total_s: float | None = None,
    ) -> None:
        if self._closed:
            return
        try:
            self._timings.get().record(step, compute_s, wait_s, total_s)
        except Exception:
            logger.debug("runcast: timing() ignored", exc_info=True)

    def step_timer(self, step: int) -> StepTimer:
        try:
            channel = None if self._closed else self._timings.get()
        except Exception:
            channel = None
        return StepTimer(channel, step)

    def finish(
        self, status: str = "finished", timeout: float | None = None, ended_at: float | None = None
    ) -> None:
        # A rank's channel has no end of its own to record: rank 0's finish ends the run.
        if self._closed:
            return
        self._closed = True
        self._timings.close(self._timings.settings.finish_timeout if timeout is None else timeout)
        lifecycle.unregister(self)

    def stats(self) -> dict[str, Any]:
        return {"timings": self._timings.stats()}

    def __exit__(self, *exc_info: object) -> None:
        self.finish()

    def __repr__(self) -> str:
        return f"<runcast.RankRun id={self.id!r} rank={self.rank}>"


AnyRun = Union[Run, RankRun, NoOpRun]


def init(
    project: str | None = None,
    name: str | None = None,
    total_steps: int | None = None,
    config: Mapping[str, Any] | Any | None = None,
    deadline: str | None = None,
    tags: Iterable[str] | None = None,
    id: str | None = None,
    unit: str = "steps",
    *,
    world_size: int | None = None,
    url: str | None = None,
    token: str | None = None,
    mode: str | None = None,
    dir: str | Path | None = None,
    all_ranks: bool = False,
    settings: Settings | None = None,
    started_at: float | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    host: str | None = None,
    timings: bool | None = None,
) -> AnyRun:
    """Start (or resume, with the same `id` / RUNCAST_RUN_ID) a run.

    Arguments override RUNCAST_URL / RUNCAST_TOKEN / RUNCAST_MODE / RUNCAST_DIR. In a
    distributed job only rank 0 logs unless `all_ranks=True`; other ranks get a NoOpRun.
    `started_at` (epoch seconds) defaults to now; importers of old logs pass the original start.

    `rank` and `world_size` default to torch.distributed's group when the script has
    initialised one, else to RANK / WORLD_SIZE; with none of them the run sends no world size
    (the server then prices it as one process, and says so).

    Step timings (straggler detection): `local_rank` defaults to LOCAL_RANK, `host` to the
    host name. With `timings` unset they are on when the world size is over 1:
    ranks other than 0 then get a RankRun that sends only their timings to the same run, which
    needs an id every rank knows (`id`, RUNCAST_RUN_ID, or torchrun's TORCHELASTIC_RUN_ID).
    """
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    overrides = {"url": url, "token": token, "mode": mode, "dir": Path(dir) if dir else None}
    resolved = resolve(settings, overrides)
    shared_id = _shared_run_id(id)
    run_id = shared_id or uuid.uuid4().hex
    if not RUN_ID_PATTERN.fullmatch(run_id):
        # Caught here, before training starts: the server would refuse the create and every
        # point of the run would wait in the spool for a create that can never succeed.
        raise ValueError(
            f"run id {run_id[:80]!r} must be 1-64 characters of letters, digits, '_', '.' or '-'"
            " and start with a letter or digit"
        )
    # The GPU count prices wasted compute; the world size is right for one process per GPU.
    group = _process_group()
    if rank is None:
        rank = group[0] if group else _rank()
    if world_size is None:
        world_size = group[1] if group else _env_int("WORLD_SIZE")
    if timings is None:
        wanted = os.environ.get("RUNCAST_TIMINGS", "").lower() not in _OFF
        timings = _many(world_size) and wanted
    spec = _Timings(
        run_id,
        resolved,
        rank=max(0, int(rank or 0)),
        local_rank=_env_int("LOCAL_RANK") if local_rank is None else local_rank,
        host=create.text(host or socket.gethostname())[: create.MAX_HOST_LENGTH],
        auto=bool(timings),
    )
    if resolved.mode == "disabled":
        return NoOpRun(shared_id)
    if rank not in (None, 0) and not all_ranks:
        if timings and shared_id:
            if resolved.mode == "online" and not resolved.url:
                resolved.mode = "offline"
            return RankRun(shared_id, spec)
        if timings:
            logger.warning(
                "runcast: rank %s sends no step timings: every rank needs the same run id"
                " (init(id=...), RUNCAST_RUN_ID or torchrun's TORCHELASTIC_RUN_ID)",
                rank,
            )
        return NoOpRun(shared_id)
    if resolved.mode == "online" and not resolved.url:
        logger.warning("runcast: RUNCAST_URL is not set; running offline (`runcast sync` later)")
        resolved.mode = "offline"
    if resolved.mode == "online" and not resolved.token:
        logger.warning("runcast: RUNCAST_TOKEN is not set; the server will likely refuse")
    project = str(project or os.environ.get("RUNCAST_PROJECT") or "") or None
    if project is not None and not create.SLUG_PATTERN.fullmatch(project):
        # Like a bad run id: the server would refuse every create of this run (no project has
        # that slug), and sending it elsewhere would misfile it.
        raise ValueError(
            f"project {project[:80]!r} must be a project slug: 1-64 of letters, digits, '-', '_'"
        )
    # Optional fields the server would refuse are dropped or trimmed, with a warning each.
    body = {
        "id": run_id,
        "project": project,
        "name": create.name(name),
        "total_steps": create.total_steps(total_steps),
        "progress_unit": unit,
        "config": create.config(config),
        "tags": create.labels("tags", tags, create.MAX_TAGS, create.MAX_TAG_LENGTH),
        "world_size": create.world_size(world_size),
        "hosts": create.labels(
            "hosts", [socket.gethostname()], create.MAX_HOSTS, create.MAX_HOST_LENGTH
        ),
        "deadline": create.deadline(deadline),
        "session": uuid.uuid4().hex,
        # So the server can tell this run's GPU processes from everyone else's (docs/gpu.md).
        "process": _process_registration(),
        "started_at": create.started_at(started_at, now=_time.time()),
        "heartbeat_interval": create.heartbeat_interval(
            resolved.heartbeat_interval, online=resolved.mode == "online"
        ),
    }
    return Run(run_id, resolved, body, spec)


def _process_registration() -> dict[str, Any] | None:
    try:
        return procinfo.self_registration()
    except Exception:
        logger.debug("runcast: could not read this process's identity", exc_info=True)
        return None


def _rank() -> int | None:
    return _env_int("RANK")


def _process_group() -> tuple[int, int] | None:
    """(rank, world size) of torch.distributed's default group when this process has set one
    up, else None. Launchers other than torchrun (mp.spawn, a hand-rolled init_process_group)
    put no RANK / WORLD_SIZE in the environment; the group knows both. torch is only looked
    at if the training script imported it: the client never imports it itself."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a torch build or backend that cannot answer: fall back to the env
        logger.debug("runcast: could not read torch.distributed's group", exc_info=True)
    return None


def _many(world_size: Any) -> bool:
    """More than one process (quietly: create.world_size warns about a bad value once)."""
    try:
        return int(world_size) > 1
    except (TypeError, ValueError, OverflowError):
        return False


def _shared_run_id(given: str | None) -> str | None:
    """A run id every rank of the job computes alike, or None (rank 0 then makes one up)."""
    if given or os.environ.get("RUNCAST_RUN_ID"):
        return str(given or os.environ.get("RUNCAST_RUN_ID"))
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic.lower() != "none":
        # torchrun's rendezvous id: the same on every rank and on every restart of the job.
        return "torchrun-" + re.sub(r"[^A-Za-z0-9_.\-]", "_", elastic)[:55]
    return None


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw not in (None, "") else None
    except ValueError:
        return None
