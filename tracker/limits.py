"""Every ingestion limit in one place. Over a limit the API answers 413 naming it.

The client splits its batches well below these, so a healthy trainer never meets them.
"""

from __future__ import annotations

# A batch is one transaction; 50k points keeps it under ~100 ms on PostgreSQL.
MAX_POINTS_PER_BATCH = 50_000
# The JSON of 50k points with times is ~2.5 MB; 8 MiB leaves room for events and long keys.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
MAX_KEYS_PER_BATCH = 1_000
MAX_EVENTS_PER_BATCH = 1_000
MAX_KEY_LENGTH = 200
# Event payloads and run config are for small facts (a path, an optimizer), not blobs.
MAX_EVENT_PAYLOAD_BYTES = 16 * 1024
MAX_CONFIG_BYTES = 256 * 1024
# Nesting of run config and event payloads: real configs are a few levels deep, and a bound keeps
# every later reader (json.dumps, the run page, jsonb) far from any recursion limit.
MAX_JSON_DEPTH = 32
MAX_TAGS = 64
MAX_HOSTS = 4_096
# Every client-supplied time (epoch seconds): 1970 to 2106. Outside it a datetime cannot hold it
# (a time in milliseconds would be year 55,000) and forecasts would extrapolate from nonsense.
MIN_EPOCH_S = 0.0
MAX_EPOCH_S = float(2**32)
# The heartbeat interval a client declares at create (seconds): beyond an hour it promises
# nothing the liveness sweep could use, and a run that declares none is judged without one.
MAX_HEARTBEAT_INTERVAL_S = 3600.0
# Steps and event steps are stored as int64.
MAX_ABS_STEP = 2**62
# Per-rank step timings (POST /api/v1/runs/{id}/timings): a rank batching 30 s of 1 step/s
# sends 30 steps; 20,000 leaves room for a long outage's replay of a fast job.
MAX_TIMING_STEPS_PER_BATCH = 20_000
MAX_RANK = 10_000_000  # the same bound as a run's world size
# A step time is seconds; over a day it is a unit mistake (milliseconds), not a step.
MAX_STEP_SECONDS = 86_400.0
# An error message quotes at most this much of the input it refuses: a 100 KB run id once came
# back whole in a 404. Ids (64 characters at most) still show in full.
MAX_ECHO_CHARS = 64


def echo(text: str) -> str:
    """`text` as an error message may quote it: whole when short, else its head and length."""
    if len(text) <= MAX_ECHO_CHARS:
        return text
    return f"{text[:MAX_ECHO_CHARS]}… ({len(text):,} characters)"
