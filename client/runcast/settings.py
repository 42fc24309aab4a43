"""Client settings: defaults, overridable from the environment and then from code."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("runcast")

MODES = ("online", "offline", "disabled")

# Server limits are 50,000 points and 8 MiB per request; stay well below both so a
# batch never earns a 413 (the JSON for one point can vary with key length).
DEFAULT_BATCH_POINTS = 10_000
DEFAULT_MAX_BODY_BYTES = 6 * 1024 * 1024
# What one run's process may keep on disk while the server is away: about a month of a run
# logging a few keys a step a second, or ~40 minutes of a 10,000-points-a-second firehose.
# Beyond it the oldest spooled batches go first; 0 means no cap.
DEFAULT_MAX_SPOOL_BYTES = 1024**3


@dataclass
class Settings:
    """Everything tunable about a run's transport. Tests shrink the timings."""

    url: str | None = None
    # repr=False so a logged or printed Settings never shows the secret.
    token: str | None = field(default=None, repr=False)
    mode: str = "online"
    dir: Path | None = None
    flush_interval: float = 1.0
    heartbeat_interval: float = 15.0
    timeout: float = 10.0
    max_retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    # Longest Retry-After we sleep through inline before spooling instead.
    retry_after_max: float = 60.0
    probe_interval: float = 2.0
    probe_interval_max: float = 60.0
    max_queue: int = 100_000
    batch_points: int = DEFAULT_BATCH_POINTS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    finish_timeout: float = 30.0
    # Seconds of step timings each rank collects per request (docs: "Stragglers").
    timing_interval: float = 20.0
    max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES
    # Seconds between two warnings that the spool cannot be written (each with the count lost
    # so far): a warning every batch would flood the training log, a single one scroll away.
    spool_warning_interval: float = 600.0

    def spool_root(self) -> Path:
        if self.dir is not None:
            return Path(self.dir).expanduser()
        return Path("~/.cache/runcast").expanduser()


# Env var -> (field, converter). Kept as data so the README table and the code agree.
_ENV_FIELDS: dict[str, tuple[str, type]] = {
    "RUNCAST_URL": ("url", str),
    "RUNCAST_TOKEN": ("token", str),
    "RUNCAST_MODE": ("mode", str),
    "RUNCAST_DIR": ("dir", Path),
    "RUNCAST_FLUSH_INTERVAL": ("flush_interval", float),
    "RUNCAST_HEARTBEAT_INTERVAL": ("heartbeat_interval", float),
    "RUNCAST_TIMEOUT": ("timeout", float),
    "RUNCAST_MAX_RETRIES": ("max_retries", int),
    "RUNCAST_BACKOFF_BASE": ("backoff_base", float),
    "RUNCAST_BACKOFF_MAX": ("backoff_max", float),
    "RUNCAST_PROBE_INTERVAL": ("probe_interval", float),
    "RUNCAST_MAX_QUEUE": ("max_queue", int),
    "RUNCAST_BATCH_POINTS": ("batch_points", int),
    "RUNCAST_FINISH_TIMEOUT": ("finish_timeout", float),
    "RUNCAST_TIMING_INTERVAL": ("timing_interval", float),
    "RUNCAST_MAX_SPOOL_BYTES": ("max_spool_bytes", int),
}


def from_env(base: Settings | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Return `base` (or defaults) with any RUNCAST_* variables applied on top."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, (attr, convert) in _ENV_FIELDS.items():
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            values[attr] = convert(raw)
        except ValueError:
            # A typo in an env var must not kill a training job; keep the default.
            logger.warning("runcast: ignoring %s: not a valid %s", name, convert.__name__)
    return dataclasses.replace(base or Settings(), **values)


def resolve(
    settings: Settings | None,
    overrides: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Defaults < environment < explicit Settings object < explicit keyword arguments.

    An explicit Settings object is taken as-is (tests use it for full control); keyword
    arguments given to init() (url, token, mode, dir) win over everything.
    """
    resolved = settings if settings is not None else from_env(environ=environ)
    given = {key: value for key, value in overrides.items() if value is not None}
    resolved = dataclasses.replace(resolved, **given)
    if resolved.url:
        resolved.url = resolved.url.rstrip("/")
    if resolved.token:
        # A token read from a file keeps its newline, which no HTTP header may carry.
        resolved.token = resolved.token.strip() or None
    resolved.mode = (resolved.mode or "online").strip().lower()
    if resolved.mode not in MODES:
        logger.warning("runcast: unknown RUNCAST_MODE %r, using 'online'", resolved.mode)
        resolved.mode = "online"
    resolved.batch_points = max(1, min(resolved.batch_points, 40_000))
    resolved.max_queue = max(1, resolved.max_queue)
    resolved.max_spool_bytes = max(0, resolved.max_spool_bytes)
    return resolved
