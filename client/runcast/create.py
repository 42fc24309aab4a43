"""The create request's fields, made into values the server takes.

The server refuses a create it cannot store (tracker/api/schemas.py RunCreateIn,
tracker/api/views.py run_create), and a refused create blocks the whole run: every batch
waits in the spool for it. So each optional field the server would refuse is dropped or
trimmed here, with one warning naming it, and the run goes on without it.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from runcast.batcher import MAX_EPOCH_S, MIN_EPOCH_S

logger = logging.getLogger("runcast")

# The server's limits (tracker/limits.py and RunCreateIn).
MAX_TAGS = 64
MAX_HOSTS = 4_096
MAX_CONFIG_BYTES = 256 * 1024
MAX_NAME_LENGTH = 200
MAX_TOTAL_STEPS = 2**62
MAX_WORLD_SIZE = 10_000_000
MAX_HEARTBEAT_INTERVAL_S = 3600.0
# The server sets no per-tag or per-host limit; these keep the create far below its 8 MiB
# request limit (a host name is at most 255 characters anyway).
MAX_TAG_LENGTH = 200
MAX_HOST_LENGTH = 255
# Deadline slugs are only ever made by slugify() (at most 64 characters): nothing else can
# name one, and an unknown deadline is refused. Project slugs follow the same rule.
SLUG_PATTERN = re.compile(r"[-a-zA-Z0-9_]{1,64}")


def _warn(field: str, message: str) -> None:
    logger.warning("runcast: %s %s; the run goes on without it", field, message)


def text(value: Any) -> str:
    """`value` as a string the server can store: no NUL, no unpaired surrogate."""
    value = str(value)
    if "\x00" in value:
        value = value.replace("\x00", "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # e.g. a file name decoded with surrogateescape; UTF-8 (and the database) cannot hold it.
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


def name(value: Any) -> str | None:
    if value is None:
        return None
    cleaned = text(value)
    if cleaned != str(value):
        _warn("name", "held NUL or unpaired surrogate characters (removed)")
    if len(cleaned) > MAX_NAME_LENGTH:
        _warn("name", f"is over {MAX_NAME_LENGTH} characters (trimmed)")
        cleaned = cleaned[:MAX_NAME_LENGTH]
    return cleaned


def _count(field: str, value: Any, low: int, high: int) -> int | None:
    """A whole number in low..high, or None (with a warning) for anything else."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        _warn(field, f"{str(value)[:50]!r} is not a whole number (not sent)")
        return None
    if not low <= number <= high:
        _warn(field, f"{number} is outside {low}..{high} (not sent)")
        return None
    return number


def total_steps(value: Any) -> int | None:
    return _count("total_steps", value, 1, MAX_TOTAL_STEPS)


def world_size(value: Any) -> int | None:
    return _count("world_size", value, 1, MAX_WORLD_SIZE)


def heartbeat_interval(value: Any, *, online: bool) -> float | None:
    """The interval this process beats at while alive, declared so the server can tell a young
    run that died from one slow to log its first steps (a compile, a checkpoint load). None
    when it sends no heartbeats (offline: `runcast sync` delivers its spool later) or beats at
    an interval the server would refuse (the server then judges the run without one)."""
    if not online:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if 0 < seconds <= MAX_HEARTBEAT_INTERVAL_S else None  # NaN fails both


def started_at(value: Any, now: float) -> float:
    """When the run started (epoch seconds, as the server takes it), or `now` with a warning."""
    if value is None:
        return now
    try:
        when = float(value)
    except (TypeError, ValueError, OverflowError):
        when = math.nan
    if MIN_EPOCH_S <= when <= MAX_EPOCH_S:  # NaN fails both
        return when
    logger.warning(
        "runcast: started_at %s is not epoch seconds (1970-2106); the run starts now instead",
        str(value)[:50],
    )
    return now


def labels(field: str, values: Iterable[Any] | str | None, most: int, longest: int) -> list[str]:
    """Tags or hosts: at most `most` strings without NUL, each at most `longest` characters."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]  # tags="baseline" means one tag, not eight
    given = [str(value) for value in values]
    cleaned = [text(value)[:longest] for value in given]
    problems = []
    if cleaned != given:
        problems.append(f"NUL characters removed or values cut to {longest} characters")
    if len(cleaned) > most:
        problems.append(f"{len(cleaned)} given, the first {most} sent")
        cleaned = cleaned[:most]
    if problems:
        logger.warning("runcast: %s: %s (the server refuses more)", field, "; ".join(problems))
    return cleaned


def deadline(value: Any) -> str | None:
    if value is None or value == "":
        return None
    slug = str(value)
    if not SLUG_PATTERN.fullmatch(slug):
        _warn("deadline", f"{slug[:80]!r} is not a deadline slug (1-64 of a-z, 0-9, '-', '_')")
        return None
    return slug


def config(value: Any) -> dict[str, Any]:
    """The config as JSON the server stores: no NaN/Infinity, no NUL, at most 256 KiB."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) and hasattr(value, "__dict__"):
        value = vars(value)  # argparse.Namespace and simple objects
    try:
        # default=str: a Path or a dtype in the config should not stop the run.
        cleaned: dict[str, Any] = json.loads(json.dumps(dict(value), default=str))
        changed = _scrub(cleaned)
    except (TypeError, ValueError, RecursionError) as exc:
        logger.warning("runcast: config is not JSON-serialisable (%s); sent empty", exc)
        return {}
    if changed:
        logger.warning(
            "runcast: config held %s, which the server cannot store; sent as %s",
            " and ".join(sorted(changed)),
            "strings ('NaN', 'Infinity') and without NUL or unpaired surrogates",
        )
    return _fit(cleaned)


def _scrub(document: dict[str, Any]) -> set[str]:
    """Make a fresh json.loads() document storable, in place; says what it changed.

    Iterative, so any depth json.loads() produced is fine here.
    """
    changed: set[str] = set()

    def leaf(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            changed.add("NaN/Infinity")
            return json.dumps(value)  # 'NaN', 'Infinity', '-Infinity'
        if isinstance(value, str):
            cleaned = text(value)
            if cleaned != value:
                changed.add("NUL characters or unpaired surrogates")
            return cleaned
        return value

    stack: list[Any] = [document]
    while stack:
        container = stack.pop()
        if isinstance(container, dict):
            items = list(container.items())
            container.clear()
            for key, item in items:
                container[leaf(key)] = leaf(item)
            children = container.values()
        else:
            container[:] = [leaf(item) for item in container]
            children = container
        stack.extend(child for child in children if isinstance(child, dict | list))
    return changed


def _fit(document: dict[str, Any]) -> dict[str, Any]:
    """Drop the largest top-level entries until the config is within MAX_CONFIG_BYTES.

    Measured as the server measures it: len(json.dumps(config)), default separators, so
    non-ASCII counts as its \\uXXXX escape. The small entries (lr, batch size) are the useful ones.
    """
    sizes = {key: len(json.dumps(key)) + 2 + len(json.dumps(val)) for key, val in document.items()}
    total = sum(sizes.values())

    def encoded() -> int:
        return 2 + total + 2 * max(len(sizes) - 1, 0)

    if encoded() <= MAX_CONFIG_BYTES:
        return document
    dropped = []
    for key in sorted(sizes, key=sizes.__getitem__, reverse=True):
        if encoded() <= MAX_CONFIG_BYTES:
            break
        total -= sizes.pop(key)
        dropped.append(key)
    logger.warning(
        "runcast: config is over the server's %d bytes; sent without its largest entries %s",
        MAX_CONFIG_BYTES,
        ", ".join(repr(key[:50]) for key in dropped[:10]) + (" ..." if len(dropped) > 10 else ""),
    )
    return {key: item for key, item in document.items() if key in sizes}
