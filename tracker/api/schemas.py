"""Request and response shapes of /api/v1/. Validation errors name the field path."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, Field, field_validator

from tracker import limits

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
SESSION_PATTERN = r"^[A-Za-z0-9_\-]{1,64}$"


def text_problem(value: str) -> str | None:
    """Why a string cannot be stored, or None. PostgreSQL text and jsonb cannot hold U+0000,
    and a lone surrogate (JSON allows "\\udc00"; Python decodes it to an unpaired code point)
    is no Unicode text at all: jsonb refuses it and neither UTF-8 driver can even send it."""
    if "\x00" in value:
        return "must not contain NUL (U+0000) characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must not contain a lone surrogate (U+D800-U+DFFF): not valid Unicode"
    return None


def _storable(value: str) -> str:
    # Refused here, naming the field, rather than failing the INSERT with a 500.
    problem = text_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Text = Annotated[str, AfterValidator(_storable)]
# Epoch seconds a datetime can hold; a time in milliseconds is refused, not stored as year 55,000.
EpochSeconds = Annotated[
    float, Field(ge=limits.MIN_EPOCH_S, le=limits.MAX_EPOCH_S, allow_inf_nan=False)
]
Step = Annotated[int, Field(ge=-limits.MAX_ABS_STEP, le=limits.MAX_ABS_STEP)]


class RunCreateIn(Schema):
    id: str = Field(pattern=RUN_ID_PATTERN)
    session: str = Field(pattern=SESSION_PATTERN)
    project: Text | None = None
    name: Text | None = Field(default=None, max_length=200)
    total_steps: int | None = Field(default=None, ge=1, le=2**62)
    progress_unit: Literal["steps", "tokens", "samples"] = "steps"
    config: dict[str, Any] = Field(default_factory=dict)
    tags: list[Text] = Field(default_factory=list, max_length=limits.MAX_TAGS)
    world_size: int | None = Field(default=None, ge=1, le=10_000_000)
    hosts: list[Text] = Field(default_factory=list, max_length=limits.MAX_HOSTS)
    deadline: Text | None = Field(default=None, max_length=64)
    started_at: EpochSeconds | None = None
    # The training process's identity for GPU attribution (runcast.procinfo.self_registration).
    process: dict[str, Any] | None = None
    # Seconds between the heartbeats this process sends while it is alive (the runcast client
    # declares its RUNCAST_HEARTBEAT_INTERVAL when online): until the run has a cadence of its
    # own, the liveness sweep judges its silence against this (forecasting/liveness.py).
    heartbeat_interval: float | None = Field(
        default=None, gt=0, le=limits.MAX_HEARTBEAT_INTERVAL_S, allow_inf_nan=False
    )


class RunOut(Schema):
    id: str
    project: str
    name: str
    status: str
    attempt: int
    segment: int
    last_step: int | None
    total_steps: int | None
    points: int
    url: str


class SeriesPayload(Schema):
    steps: list[Step]
    values: list[float]
    # Epoch seconds per point; when omitted the server's receive time is used. Checked for range
    # in tracker.api.parsing with numpy: per-item validation of 50k floats would cost more.
    times: list[float] | None = None


class EventPayload(Schema):
    kind: Literal["checkpoint", "eval", "resume", "restart", "lr_change", "arch_change", "custom"]
    step: Step | None = None
    time: EpochSeconds | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


class BatchIn(Schema):
    session: str = Field(pattern=SESSION_PATTERN)
    seq: int = Field(ge=0, le=2**62)
    metrics: dict[str, SeriesPayload] = Field(default_factory=dict)
    events: list[EventPayload] = Field(default_factory=list)
    heartbeat: EpochSeconds | None = None
    # Only rank 0 (or a process that names no rank) logs metrics; other ranks send timings.
    rank: int | None = Field(default=None, ge=0, le=limits.MAX_RANK)

    @field_validator("metrics")
    @classmethod
    def _keys_valid(cls, value: dict[str, SeriesPayload]) -> dict[str, SeriesPayload]:
        for key in value:
            if not key or len(key) > limits.MAX_KEY_LENGTH or not key.isprintable():
                raise ValueError(
                    f"metric key {key[:50]!r} must be 1-{limits.MAX_KEY_LENGTH} printable chars"
                )
        return value


# A part of a step not measured on this rank is null (NaN); checked for range in parsing.
Seconds = list[float | None] | None


class TimingsIn(Schema):
    """One rank's step timings: `compute_s` the rank's own work, `wait_s` its wait inside the
    collective, `total_s` the whole step (or the interval between log() calls)."""

    session: str = Field(pattern=SESSION_PATTERN)
    seq: int = Field(ge=0, le=2**62)
    rank: int = Field(ge=0, le=limits.MAX_RANK)
    local_rank: int | None = Field(default=None, ge=0, le=limits.MAX_RANK)
    host: Text = Field(default="", max_length=255)
    steps: list[Step]
    compute_s: Seconds = None
    wait_s: Seconds = None
    total_s: Seconds = None


class BatchOut(Schema):
    accepted: int
    duplicate: bool
    # Seconds the server asks between this run's batches (tracker/pacing.py); the client waits
    # at least this long, never less than its own flush_interval.
    flush_interval: float | None = None


class FinishIn(Schema):
    status: Literal["finished", "failed", "crashed"] = "finished"
    time: EpochSeconds | None = None
    session: Text | None = Field(default=None, max_length=64)


class ErrorOut(Schema):
    error: str
    field: str | None = None
