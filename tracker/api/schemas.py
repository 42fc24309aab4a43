"""Request and response shapes of /api/v1/. Validation errors name the field path."""

from __future__ import annotations

from typing import Any, Literal

from ninja import Schema
from pydantic import Field, field_validator

from tracker import limits

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
SESSION_PATTERN = r"^[A-Za-z0-9_\-]{1,64}$"


class RunCreateIn(Schema):
    id: str = Field(pattern=RUN_ID_PATTERN)
    session: str = Field(pattern=SESSION_PATTERN)
    project: str | None = None
    name: str | None = Field(default=None, max_length=200)
    total_steps: int | None = Field(default=None, ge=1, le=2**62)
    progress_unit: Literal["steps", "tokens", "samples"] = "steps"
    config: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list, max_length=limits.MAX_TAGS)
    world_size: int | None = Field(default=None, ge=1, le=10_000_000)
    hosts: list[str] = Field(default_factory=list, max_length=limits.MAX_HOSTS)
    deadline: str | None = Field(default=None, max_length=64)
    started_at: float | None = Field(default=None, allow_inf_nan=False)


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
    steps: list[int]
    values: list[float]
    # Epoch seconds per point; when omitted the server's receive time is used.
    times: list[float] | None = None


class EventPayload(Schema):
    kind: Literal["checkpoint", "eval", "resume", "restart", "lr_change", "arch_change", "custom"]
    step: int | None = Field(default=None, ge=-(2**62), le=2**62)
    time: float | None = Field(default=None, allow_inf_nan=False)
    payload: dict[str, Any] = Field(default_factory=dict)


class BatchIn(Schema):
    session: str = Field(pattern=SESSION_PATTERN)
    seq: int = Field(ge=0, le=2**62)
    metrics: dict[str, SeriesPayload] = Field(default_factory=dict)
    events: list[EventPayload] = Field(default_factory=list)
    heartbeat: float | None = Field(default=None, allow_inf_nan=False)

    @field_validator("metrics")
    @classmethod
    def _keys_valid(cls, value: dict[str, SeriesPayload]) -> dict[str, SeriesPayload]:
        for key in value:
            if not key or len(key) > limits.MAX_KEY_LENGTH or not key.isprintable():
                raise ValueError(
                    f"metric key {key[:50]!r} must be 1-{limits.MAX_KEY_LENGTH} printable chars"
                )
        return value


class BatchOut(Schema):
    accepted: int
    duplicate: bool


class FinishIn(Schema):
    status: Literal["finished", "failed", "crashed"] = "finished"
    time: float | None = Field(default=None, allow_inf_nan=False)
    session: str | None = None


class ErrorOut(Schema):
    error: str
    field: str | None = None
