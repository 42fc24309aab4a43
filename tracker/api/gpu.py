"""/api/v1/hosts: the GPU host agent's registration and batches (write tokens)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema, Status
from pydantic import Field

from tracker.api.auth import TokenAuth, require_scope
from tracker.api.parsing import json_check
from tracker.api.schemas import SESSION_PATTERN, BatchIn, BatchOut, ErrorOut, Text
from tracker.gpu import selectors, services
from tracker.models import ApiToken
from tracker.services import ServiceError

router = Router(auth=TokenAuth(), tags=["hosts"])
ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 413: ErrorOut}
MAX_GPUS = 64


class HostIn(Schema):
    host: Text = Field(min_length=1, max_length=200)
    session: str = Field(pattern=SESSION_PATTERN)
    boot_id: Text = Field(default="", max_length=64)
    gpus: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_GPUS)


class HostOut(Schema):
    host: str
    project: str
    gpus: int


@router.post("/hosts", response={200: HostOut, 201: HostOut, **ERRORS}, summary="Register a host")
def host_create(request: HttpRequest, payload: HostIn) -> Status:
    token = require_scope(request, ApiToken.Scope.WRITE)
    # Free-form JSON, stored as it came: what the database cannot store is refused by name.
    json_check(payload.gpus, field="gpus")
    host, created = services.host_register(
        project=token.project, name=payload.host, boot_id=payload.boot_id, gpus=payload.gpus
    )
    out = HostOut(host=host.name, project=token.project.slug, gpus=len(host.gpus))
    return Status(201 if created else 200, out)


@router.post("/hosts/{host}/batches", response={200: BatchOut, **ERRORS}, summary="GPU samples")
def host_batch(request: HttpRequest, host: str, payload: BatchIn) -> BatchOut:
    """GPU and process series (`gpu/<i>/...`) and process descriptions (custom events named
    "process"). A retried (session, seq) is a no-op."""
    token = require_scope(request, ApiToken.Scope.WRITE)
    target = selectors.host_for_token(project=token.project, name=host)
    series = services.check_series(payload.metrics)
    for i, event in enumerate(payload.events):
        json_check(event.payload, field=f"events[{i}].payload")
    processes = [_process(i, e.payload, e.time) for i, e in enumerate(payload.events)]
    result = services.host_batch_ingest(
        host=target,
        session=payload.session,
        seq=payload.seq,
        series=series,
        processes=[p for p in processes if p is not None],
    )
    return BatchOut(accepted=result.accepted, duplicate=result.duplicate)


@router.post("/hosts/{host}/finish", response={200: HostOut, **ERRORS}, summary="Agent stopped")
def host_finish(request: HttpRequest, host: str) -> HostOut:
    token = require_scope(request, ApiToken.Scope.WRITE)
    target = selectors.host_for_token(project=token.project, name=host)
    return HostOut(host=target.name, project=token.project.slug, gpus=len(target.gpus))


def _process(index: int, payload: dict[str, Any], when: float | None) -> dict[str, Any] | None:
    if payload.get("name") != "process":
        return None
    field = f"events[{index}].payload"
    key = payload.get("key")
    if not (isinstance(key, list) and len(key) == 3 and all(isinstance(k, int) for k in key[1:])):
        raise ServiceError(
            "key must be [boot id, namespace pid, start ticks]", field=f"{field}.key"
        )
    if not isinstance(payload.get("pid"), int):
        raise ServiceError("pid must be an integer", field=f"{field}.pid")
    ancestors = payload.get("ancestors") or []
    if not isinstance(ancestors, list):
        raise ServiceError("ancestors must be a list of keys", field=f"{field}.ancestors")
    return {**payload, "time": when or 0.0}
