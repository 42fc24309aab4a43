"""Turn validated request schemas into service inputs, checking what pydantic cannot."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np

from tracker import limits
from tracker.api.schemas import BatchIn, TimingsIn, text_problem
from tracker.services import EventIn, RankTimingsIn, SeriesIn, ServiceError, from_epoch


class TooLarge(ServiceError):
    status = 413


def series_from_batch(payload: BatchIn, *, received: float | None = None) -> list[SeriesIn]:
    if len(payload.metrics) > limits.MAX_KEYS_PER_BATCH:
        raise TooLarge(
            f"{len(payload.metrics)} keys exceed MAX_KEYS_PER_BATCH ({limits.MAX_KEYS_PER_BATCH})",
            field="metrics",
        )
    total = sum(len(s.steps) for s in payload.metrics.values())
    if total > limits.MAX_POINTS_PER_BATCH:
        raise TooLarge(
            f"{total} points exceed MAX_POINTS_PER_BATCH ({limits.MAX_POINTS_PER_BATCH})",
            field="metrics",
        )
    now = received if received is not None else time.time()
    out = []
    for key, s in payload.metrics.items():
        n = len(s.steps)
        if len(s.values) != n:
            raise ServiceError(
                f"{len(s.values)} values for {n} steps", field=f"metrics.{key}.values"
            )
        if s.times is not None and len(s.times) != n:
            raise ServiceError(f"{len(s.times)} times for {n} steps", field=f"metrics.{key}.times")
        steps = np.asarray(s.steps, dtype=np.int64)
        times = np.full(n, now) if s.times is None else np.asarray(s.times, dtype=np.float64)
        bad = np.flatnonzero(
            ~((times >= limits.MIN_EPOCH_S) & (times <= limits.MAX_EPOCH_S))  # NaN fails both
        )
        if bad.size:
            raise ServiceError(
                f"time must be epoch seconds from {limits.MIN_EPOCH_S:.0f} to "
                f"{limits.MAX_EPOCH_S:.0f}",
                field=f"metrics.{key}.times[{bad[0]}]",
            )
        out.append(
            SeriesIn(
                key=key, steps=steps, values=np.asarray(s.values, dtype=np.float64), times=times
            )
        )
    return out


def events_from_batch(payload: BatchIn, *, received: float | None = None) -> list[EventIn]:
    if len(payload.events) > limits.MAX_EVENTS_PER_BATCH:
        raise TooLarge(
            f"{len(payload.events)} events exceed MAX_EVENTS_PER_BATCH "
            f"({limits.MAX_EVENTS_PER_BATCH})",
            field="events",
        )
    now = received if received is not None else time.time()
    out = []
    for i, e in enumerate(payload.events):
        json_check(e.payload, field=f"events[{i}].payload")
        size = len(json.dumps(e.payload, default=str))
        if size > limits.MAX_EVENT_PAYLOAD_BYTES:
            raise TooLarge(
                f"event payload of {size} bytes exceeds MAX_EVENT_PAYLOAD_BYTES "
                f"({limits.MAX_EVENT_PAYLOAD_BYTES})",
                field=f"events[{i}].payload",
            )
        out.append(
            EventIn(kind=e.kind, step=e.step, time=from_epoch(e.time or now), payload=e.payload)
        )
    return out


TIMING_PARTS = ("compute_s", "wait_s", "total_s")


def timings_from_payload(payload: TimingsIn) -> RankTimingsIn:
    """Columns of one rank's timings as float arrays (NaN: not measured), checked per value."""
    n = len(payload.steps)
    if n > limits.MAX_TIMING_STEPS_PER_BATCH:
        raise TooLarge(
            f"{n} steps exceed MAX_TIMING_STEPS_PER_BATCH ({limits.MAX_TIMING_STEPS_PER_BATCH})",
            field="steps",
        )
    columns: dict[str, np.ndarray] = {}
    for name in TIMING_PARTS:
        given = getattr(payload, name)
        if given is None:
            columns[name] = np.full(n, np.nan)
            continue
        if len(given) != n:
            raise ServiceError(f"{len(given)} values for {n} steps", field=name)
        values = np.array([np.nan if v is None else v for v in given], dtype=np.float64)
        # NaN is "not measured"; a negative, infinite or day-long step time is a unit mistake.
        bad = np.flatnonzero(
            ~np.isnan(values) & ~((values >= 0) & (values <= limits.MAX_STEP_SECONDS))
        )
        if bad.size:
            raise ServiceError(
                f"seconds must be from 0 to {limits.MAX_STEP_SECONDS:.0f} (or null)",
                field=f"{name}[{bad[0]}]",
            )
        columns[name] = values
    if n and all(np.isnan(c).all() for c in columns.values()):
        raise ServiceError("give at least one of compute_s, wait_s, total_s", field="compute_s")
    return RankTimingsIn(
        rank=payload.rank,
        local_rank=payload.local_rank,
        host=payload.host,
        steps=np.asarray(payload.steps, dtype=np.int64),
        compute=columns["compute_s"],
        wait=columns["wait_s"],
        total=columns["total_s"],
    )


def json_check(value: Any, *, field: str) -> None:
    """Refuse free-form JSON the database cannot store: PostgreSQL's jsonb (and SQLite's
    JSON_VALID) reject NaN and Infinity, and jsonb rejects U+0000 and lone surrogates in strings
    and keys. Nesting deeper than MAX_JSON_DEPTH is refused too.

    Iterative, so a deeply nested document costs no recursion.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ServiceError("NaN and Infinity cannot be stored here", field=field)
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                raise ServiceError(f"strings here {problem}", field=field)
        if isinstance(item, dict | list | tuple):
            if depth >= limits.MAX_JSON_DEPTH:
                raise ServiceError(
                    f"nested deeper than MAX_JSON_DEPTH ({limits.MAX_JSON_DEPTH})", field=field
                )
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
