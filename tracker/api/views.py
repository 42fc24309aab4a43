"""/api/v1/ ingestion and read endpoints. Views parse, authorise, call one service, respond."""

from __future__ import annotations

import json
import time
from typing import Literal

from django.http import HttpRequest
from ninja import Router, Status

from tracker import limits, pacing, selectors, services
from tracker.access import run_for_token
from tracker.api.auth import TokenAuth, require_scope
from tracker.api.parsing import (
    events_from_batch,
    json_check,
    series_from_batch,
    timings_from_payload,
)
from tracker.api.schemas import (
    BatchIn,
    BatchOut,
    ErrorOut,
    FinishIn,
    RunCreateIn,
    RunOut,
    TimingsIn,
)
from tracker.gpu.services import run_process_record
from tracker.links import run_url
from tracker.models import ApiToken, Run

router = Router(auth=TokenAuth(), tags=["runs"])
RunStatus = Literal["running", "finished", "failed", "crashed", "stalled"]
ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 413: ErrorOut}


def _run_out(run: Run) -> RunOut:
    return RunOut(
        id=run.public_id,
        project=run.project.slug,
        name=run.name,
        status=run.status,
        attempt=run.current_segment,
        segment=run.current_segment,
        last_step=run.last_step,
        total_steps=run.total_steps,
        points=run.points_count,
        url=run_url(run),
    )


@router.post("/runs", response={200: RunOut, 201: RunOut, **ERRORS}, summary="Create or resume")
def run_create(request: HttpRequest, payload: RunCreateIn) -> Status:
    """Create a run, or resume it when the id exists (a new segment per process session).

    Idempotent: repeating a create with the same id and session returns the same segment.
    """
    token = require_scope(request, ApiToken.Scope.WRITE)
    if payload.project and payload.project != token.project.slug:
        raise services.NotFound(f"no project {payload.project!r} for this token", field="project")
    json_check(payload.config, field="config")
    config_size = len(json.dumps(payload.config, default=str))
    if config_size > limits.MAX_CONFIG_BYTES:
        raise services.ServiceError(
            f"config of {config_size} bytes exceeds MAX_CONFIG_BYTES ({limits.MAX_CONFIG_BYTES})",
            field="config",
        )
    started = services.from_epoch(payload.started_at or time.time())
    result = services.run_start(
        project=token.project,
        public_id=payload.id,
        session=payload.session,
        started_at=started,
        deadline_slug=payload.deadline,
        created_by_token=token,
        heartbeat_interval_s=payload.heartbeat_interval,
        fields={
            "name": payload.name or "",
            "total_steps": payload.total_steps,
            "progress_unit": payload.progress_unit,
            "config": payload.config,
            "tags": payload.tags,
            "world_size": payload.world_size,
            "hosts": payload.hosts,
        },
    )
    result.run.project = token.project
    if payload.process:
        run_process_record(
            run=result.run,
            session=payload.session,
            host=payload.hosts[0] if payload.hosts else "",
            info=payload.process,
        )
    return Status(201 if result.created else 200, _run_out(result.run))


# exclude_none: without pacing (tracker/pacing.py) the answer is what it always was.
@router.post(
    "/runs/{run_id}/batches",
    response={200: BatchOut, **ERRORS},
    summary="Send points",
    exclude_none=True,
)
def batch_create(request: HttpRequest, run_id: str, payload: BatchIn) -> BatchOut:
    """Metrics in columnar form, events and a heartbeat. A retried (session, seq) is a no-op."""
    token = require_scope(request, ApiToken.Scope.WRITE)
    if payload.rank:
        raise services.ServiceError(
            f"rank {payload.rank} may only send timings (POST /api/v1/runs/{{id}}/timings);"
            " metrics and events come from rank 0",
            field="rank",
        )
    run = run_for_token(token=token, run_id=run_id)
    received = time.time()
    result = services.batch_ingest(
        run=run,
        session=payload.session,
        seq=payload.seq,
        series=series_from_batch(payload, received=received),
        events=events_from_batch(payload, received=received),
        heartbeat=services.from_epoch(payload.heartbeat) if payload.heartbeat else None,
    )
    return BatchOut(
        accepted=result.accepted,
        duplicate=result.duplicate,
        flush_interval=pacing.flush_interval_hint(),
    )


# Timings are paced by the client's timing_interval alone: their answer carries no hint.
@router.post(
    "/runs/{run_id}/timings",
    response={200: BatchOut, **ERRORS},
    summary="Send rank timings",
    exclude_none=True,
)
def timings_create(request: HttpRequest, run_id: str, payload: TimingsIn) -> BatchOut:
    """One rank's step timings (every rank, 0 included, under the run rank 0 created).

    A retried (session, seq) is a no-op. 404 while rank 0 has not created the run yet: the
    client keeps the batch and retries.
    """
    token = require_scope(request, ApiToken.Scope.WRITE)
    timings = timings_from_payload(payload)
    run = run_for_token(token=token, run_id=run_id)
    result = services.rank_timings_ingest(
        run=run, session=payload.session, seq=payload.seq, timings=timings
    )
    return BatchOut(accepted=result.accepted, duplicate=result.duplicate)


@router.post("/runs/{run_id}/finish", response={200: RunOut, **ERRORS}, summary="Finish a run")
def run_finish(request: HttpRequest, run_id: str, payload: FinishIn) -> RunOut:
    token = require_scope(request, ApiToken.Scope.WRITE)
    run = run_for_token(token=token, run_id=run_id)
    ended = services.from_epoch(payload.time or time.time())
    finished = services.run_finish(
        run=run, status=payload.status, ended_at=ended, session=payload.session
    )
    return _run_out(finished)


@router.get("/runs", response={200: list[RunOut], **ERRORS}, summary="List runs")
def run_list(request: HttpRequest, status: RunStatus | None = None) -> list[RunOut]:
    token = require_scope(request, ApiToken.Scope.READ)
    return [_run_out(r) for r in selectors.run_list(project=token.project, status=status)]


@router.get("/runs/{run_id}", response={200: RunOut, **ERRORS}, summary="Read a run")
def run_detail(request: HttpRequest, run_id: str) -> RunOut:
    token = require_scope(request, ApiToken.Scope.READ)
    return _run_out(run_for_token(token=token, run_id=run_id))
