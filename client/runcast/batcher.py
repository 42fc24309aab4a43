"""Turns queued log entries into sealed, numbered batch request bodies.

Runs only on the sender thread, so none of this needs a lock. The conversion of values to
float happens here rather than in log(): it keeps log() cheap and lets numpy / torch
scalars be converted off the training thread.
"""

from __future__ import annotations

import json
import logging
import operator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("runcast")

# Numbers per json.dumps() call when encoding a batch (see Batcher._encode).
_CHUNK = 1_000

# The server's Event.Kind (tracker/models.py); tests/client/test_contract.py keeps them equal.
EVENT_KINDS = frozenset(
    {"checkpoint", "eval", "resume", "restart", "lr_change", "arch_change", "custom"}
)

# The server's per-entry and per-batch limits (tracker/limits.py, tracker/api/schemas.py).
# It answers a whole batch that breaks one with a 400/413 and the client drops that batch,
# so one bad key, step or event must be skipped here instead of costing its neighbours.
# Steps are stored as int64: the server takes -2**62..2**62, negative steps included.
MAX_ABS_STEP = 2**62
MIN_EPOCH_S = 0.0  # times are epoch seconds, 1970 to 2106 (not milliseconds)
MAX_EPOCH_S = float(2**32)
MAX_KEY_LENGTH = 200
MAX_KEYS_PER_BATCH = 1_000
MAX_EVENTS_PER_BATCH = 1_000
MAX_EVENT_PAYLOAD_BYTES = 16 * 1024


def points_in(body: bytes) -> int:
    """The points of a batch or timings request body, as Sealed.points counts them; 0 for one
    that cannot be read. For a spooled file dropped on replay, where only the bytes are left."""
    try:
        data = json.loads(body)
        if "metrics" in data:
            metrics = data["metrics"].values()
            return sum(len(m["steps"]) for m in metrics) + len(data.get("events") or [])
        return len(data.get("steps") or [])
    except (ValueError, TypeError, KeyError, AttributeError):
        return 0


@dataclass(frozen=True)
class Event:
    """A queued run.event(); distinguished from a metrics dict by its type."""

    kind: str
    payload: dict


@dataclass(frozen=True)
class Sealed:
    """One batch with its final seq; `body` is exactly what is POSTed or spooled."""

    seq: int
    body: bytes
    points: int


class Batcher:
    def __init__(self, session: str, batch_points: int, max_body_bytes: int) -> None:
        self.session = session
        self.batch_points = batch_points
        self.max_body_bytes = max_body_bytes
        self.seq = 0
        self.skipped = 0
        self.opened_at: float | None = None
        self._metrics: dict[str, tuple[list[int], list[float], list[float]]] = {}
        self._events: list[dict] = []
        self._points = 0
        self._sealed: list[Sealed] = []
        self._warned: set[str] = set()

    @property
    def points(self) -> int:
        return self._points

    def add(self, step: Any, when: float, data: Any) -> None:
        """Add one queue entry (a metrics dict or an Event)."""
        if data.__class__ is Event:
            self._add_event(step, when, data)
        else:
            self._add_metrics(step, when, data)

    def take_sealed(self) -> list[Sealed]:
        sealed, self._sealed = self._sealed, []
        return sealed

    def seal(self, heartbeat: float | None = None) -> None:
        """Close the open batch (even an empty one when it carries a heartbeat)."""
        if not self._points and heartbeat is None:
            return
        metrics = {
            key: {"steps": steps, "values": values, "times": times}
            for key, (steps, values, times) in self._metrics.items()
        }
        events = self._events
        self._metrics, self._events, self._points, self.opened_at = {}, [], 0, None
        self._emit_fitting(metrics, events, heartbeat)

    # -- metrics ------------------------------------------------------------------

    def _add_metrics(self, step: Any, when: float, data: dict) -> None:
        step = self._step(step)
        if step is None or not self._valid_time(when):
            return
        # Millisecond times are plenty for a tracker, and shorter floats make the JSON
        # both smaller and faster to encode.
        when = round(when, 3)
        for key, value in data.items():
            number = value if value.__class__ is float else self._number(key, value)
            if number is None:
                continue
            columns = self._metrics.get(key)
            if columns is None:
                if not self._valid_key(key):
                    continue
                if len(self._metrics) >= MAX_KEYS_PER_BATCH:
                    self.seal()
                columns = self._metrics[key] = ([], [], [])
            columns[0].append(step)
            columns[1].append(number)
            columns[2].append(when)
            self._count_point(when)

    def _count_point(self, when: float) -> None:
        if self.opened_at is None:
            self.opened_at = when
        self._points += 1
        if self._points >= self.batch_points:
            self.seal()

    def _step(self, step: Any) -> int | None:
        number = step if step.__class__ is int else _integer(step)
        if number is not None and -MAX_ABS_STEP <= number <= MAX_ABS_STEP:
            return number
        self._warn(
            "step",
            f"invalid step {_short(step)}; expected an int in [-2**62, 2**62], entry skipped",
        )
        self.skipped += 1
        return None

    def _valid_time(self, when: float) -> bool:
        if MIN_EPOCH_S <= when <= MAX_EPOCH_S:  # NaN fails both
            return True
        self._warn("time", f"invalid time {_short(when)}; expected epoch seconds, entry skipped")
        self.skipped += 1
        return False

    def _number(self, key: Any, value: Any) -> float | None:
        """float() of ints, bools, numpy and torch scalars; None (warn once) for the rest."""
        if isinstance(value, (str, bytes)):
            self._reject(key, value)
            return None
        try:
            return float(value)
        except Exception:
            # Anything float() can raise (torch: RuntimeError for multi-element tensors;
            # user objects: whatever their __float__ does) must stay on this thread.
            self._reject(key, value)
            return None

    def _reject(self, key: Any, value: Any) -> None:
        self._warn(
            f"value:{_short(key)}",
            f"metric {_short(key)}: {type(value).__name__} value {_short(value)} is not a number;"
            " skipped",
        )
        self.skipped += 1

    def _valid_key(self, key: Any) -> bool:
        if isinstance(key, str) and 0 < len(key) <= MAX_KEY_LENGTH and key.isprintable():
            return True
        shown = _short(key)
        self._warn(
            f"key:{shown}",
            f"metric key {shown} is not a str of 1-{MAX_KEY_LENGTH} printable chars; skipped",
        )
        self.skipped += 1
        return False

    # -- events -------------------------------------------------------------------

    def _add_event(self, step: Any, when: float, event: Event) -> None:
        if step is not None:
            step = self._step(step)
            if step is None:
                return
        kind, payload = event.kind, event.payload
        if kind not in EVENT_KINDS:
            # An unknown kind would make the server reject the whole batch (400).
            payload = {"name": str(kind), **payload}
            kind = "custom"
        try:
            # default=str: Paths, dtypes and the like become strings instead of failing.
            # allow_nan=False: the server cannot store NaN / Infinity in a payload (jsonb).
            encoded = json.dumps(payload, default=str, allow_nan=False)
            payload = json.loads(encoded)
        except (TypeError, ValueError) as exc:
            self._warn(f"event:{kind}", f"event {kind!r}: payload not JSON ({exc}); skipped")
            self.skipped += 1
            return
        if "\\u0000" in encoded and _has_nul(payload):
            self._warn(f"event-nul:{kind}", f"event {kind!r}: payload holds a NUL char; skipped")
            self.skipped += 1
            return
        if len(encoded) > MAX_EVENT_PAYLOAD_BYTES:
            # Measured the way the server measures it: json.dumps with default separators.
            self._warn(
                f"event-size:{kind}",
                f"event {kind!r}: payload of {len(encoded)} bytes is over"
                f" {MAX_EVENT_PAYLOAD_BYTES}; skipped",
            )
            self.skipped += 1
            return
        if len(self._events) >= MAX_EVENTS_PER_BATCH:
            self.seal()
        self._events.append({"kind": kind, "step": step, "time": when, "payload": payload})
        self._count_point(when)

    # -- sealing ------------------------------------------------------------------

    def _emit_fitting(self, metrics: dict, events: list, heartbeat: float | None) -> None:
        """Number and encode a batch, halving it until every part fits the byte limit.

        The common case encodes exactly once: the body is built with its final seq and
        only re-encoded when it turns out too big.
        """
        parts = [(metrics, events, heartbeat)]
        while parts:
            part_metrics, part_events, part_heartbeat = parts.pop(0)
            seq = self.seq + 1
            body = self._encode(part_metrics, part_events, part_heartbeat, seq)
            if len(body) <= self.max_body_bytes:
                self.seq = seq
                points = sum(len(c["steps"]) for c in part_metrics.values()) + len(part_events)
                self._sealed.append(Sealed(seq, body, points))
                continue
            halves = _halve(part_metrics, part_events, part_heartbeat)
            if halves is None:
                self._warn("oversize", "a single event or point exceeds the request size; skipped")
                self.skipped += 1
                continue
            parts[0:0] = halves

    def _encode(self, metrics: dict, events: list, heartbeat: float | None, seq: int) -> bytes:
        """JSON for one batch, assembled column by column.

        json.dumps holds the GIL for its whole call; one dumps() of a 10,000-point body is
        ~10 ms during which log() on the training thread cannot run. Encoding in slices of
        at most _CHUNK numbers lets the interpreter switch threads in between.
        """
        parts = ['{"session":', _dumps(self.session), ',"seq":', str(seq), ',"metrics":{']
        for index, (key, column) in enumerate(metrics.items()):
            parts += [
                "," if index else "",
                _dumps(key),
                ':{"steps":',
                _dump_list(column["steps"]),
                ',"values":',
                _dump_list(column["values"]),
                ',"times":',
                _dump_list(column["times"]),
                "}",
            ]
        parts += ['},"events":', _dumps(events), ',"heartbeat":', _dumps(heartbeat), "}"]
        return "".join(parts).encode("utf-8")

    def _warn(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        logger.warning("runcast: %s", message)


def _dumps(value: Any) -> str:
    # allow_nan: NaN / Infinity literals are part of the contract (a diverging loss).
    return json.dumps(value, separators=(",", ":"), allow_nan=True)


def _dump_list(values: list) -> str:
    if len(values) <= _CHUNK:
        return _dumps(values)
    pieces = [_dumps(values[i : i + _CHUNK])[1:-1] for i in range(0, len(values), _CHUNK)]
    return "[" + ",".join(pieces) + "]"


def _halve(
    metrics: dict, events: list, heartbeat: float | None
) -> list[tuple[dict, list, float | None]] | None:
    items: list[tuple[str | None, Any]] = [
        (key, point)
        for key, column in metrics.items()
        for point in zip(column["steps"], column["values"], column["times"])
    ]
    items += [(None, event) for event in events]
    if len(items) < 2:
        return None
    middle = len(items) // 2
    return [_rebuild(items[:middle], heartbeat), _rebuild(items[middle:], None)]


def _rebuild(items: list[tuple[str | None, Any]], heartbeat: float | None) -> tuple:
    metrics: dict[str, dict[str, list]] = {}
    events: list[dict] = []
    for key, item in items:
        if key is None:
            events.append(item)
            continue
        column = metrics.setdefault(key, {"steps": [], "values": [], "times": []})
        column["steps"].append(item[0])
        column["values"].append(item[1])
        column["times"].append(item[2])
    return metrics, events, heartbeat


def _integer(step: Any) -> int | None:
    """The exact int of a numpy / torch integer (or a whole float); None for anything else."""
    try:
        # __index__ first: float() would round an int64 above 2**53 to a different step.
        return operator.index(step)
    except TypeError:
        pass
    try:
        as_float = float(step)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(as_float) if as_float.is_integer() else None


def _has_nul(value: Any) -> bool:
    """Whether decoded JSON holds U+0000 in a string or key (PostgreSQL cannot store it)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."
