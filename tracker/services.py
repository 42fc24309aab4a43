"""Writes to tracked data. Each service is keyword-only, typed and atomic."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Coalesce, Greatest
from django.dispatch import Signal
from django.http import Http404
from django.utils import timezone

from tracker import rows, tokens
from tracker.models import (
    ApiToken,
    Deadline,
    Event,
    IngestBatch,
    LatestMetric,
    MetricChunk,
    Project,
    RankTimingChunk,
    Run,
    RunSegment,
)
from tracker.series import chunk_columns, pack_steps, pack_timings
from tracker.signals import run_finished, run_ingested

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """A request that cannot be carried out; `field` names the offending input."""

    status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class Forbidden(ServiceError, PermissionDenied):
    # Also Django's PermissionDenied, so a page that meets it answers 403 like any other.
    status = 403


class NotFound(ServiceError, Http404):
    # Also Django's Http404: pages answer 404; the API's ServiceError handler keeps its shape.
    status = 404


class Conflict(ServiceError):
    status = 409


@dataclass(frozen=True)
class SeriesIn:
    """One key's points of a batch, already validated and converted."""

    key: str
    steps: np.ndarray
    values: np.ndarray
    times: np.ndarray


@dataclass(frozen=True)
class EventIn:
    kind: str
    step: int | None
    time: datetime
    payload: dict[str, Any]


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicate: bool


def _notify(signal: Signal, run_id: int) -> None:
    # The data is committed: a receiver failing (e.g. the broker is down) must not turn the
    # client's request into an error it would retry. The periodic sweep catches up later.
    for receiver, result in signal.send_robust(sender=Run, run_id=run_id):
        if isinstance(result, Exception):
            logger.error("receiver %r failed for run %s: %r", receiver, run_id, result)


def from_epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


# --- tokens ----------------------------------------------------------------------------------


def token_create(*, project: Project, name: str, scope: str, created_by: Any = None) -> str:
    """Create a token and return it in full: the only time it is ever visible."""
    full, prefix, hashed = tokens.generate()
    ApiToken.objects.create(
        project=project, name=name, scope=scope, prefix=prefix, hashed=hashed, created_by=created_by
    )
    return full


def token_revoke(*, token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


@functools.cache
def _token_sql() -> str:
    return (
        f"SELECT {rows.columns(ApiToken, 't')}, {rows.columns(Project, 'p')} "  # noqa: S608
        f"FROM {rows.table(ApiToken)} t JOIN {rows.table(Project)} p ON p.id = t.project_id "
        "WHERE t.prefix = %s AND t.revoked_at IS NULL"
    )


def _token_by_prefix(prefix: str) -> ApiToken | None:
    """The unrevoked token with this prefix and its project: `select_related("project")`,
    written out once (tracker.rows: every API request makes this lookup)."""
    with connection.cursor() as cursor:
        cursor.execute(_token_sql(), [prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    token, end = rows.instance(ApiToken, row)
    token.project, _ = rows.instance(Project, row, end)
    return token


def token_authenticate(*, raw: str) -> ApiToken | None:
    parts = tokens.parse(raw)
    if parts is None:
        return None
    token = _token_by_prefix(parts.prefix)
    if token is None or not tokens.matches(parts.secret, token.hashed):
        return None
    now = timezone.now()
    # Written at most once a minute: a hot ingest loop must not update this row per batch.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


# --- runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunStart:
    run: Run
    segment: RunSegment
    created: bool


@transaction.atomic
def run_start(
    *,
    project: Project,
    public_id: str,
    session: str,
    started_at: datetime,
    fields: dict[str, Any],
    deadline_slug: str | None = None,
    created_by_token: ApiToken | None = None,
    heartbeat_interval_s: float | None = None,
) -> RunStart:
    """Create a run, or resume it as a new segment. Idempotent on (run id, session).

    `created_by_token` is recorded only when the run is created: a resume keeps the provenance.
    `heartbeat_interval_s`: how often this attempt's process says it will beat while alive.
    """
    deadline = None
    if deadline_slug:
        deadline = Deadline.objects.filter(project=project, slug=deadline_slug).first()
        if deadline is None:
            raise ServiceError(f"no deadline {deadline_slug!r} in this project", field="deadline")
    run, created = Run.objects.select_for_update().get_or_create(
        project=project,
        public_id=public_id,
        defaults={
            **fields,
            "deadline": deadline,
            "started_at": started_at,
            "created_by_token": created_by_token,
        },
    )
    existing = run.segments.filter(session=session).first()
    if existing is not None:
        return RunStart(run=run, segment=existing, created=False)
    if not created:
        _run_update_on_resume(run=run, fields=fields, deadline=deadline)
    segment = _segment_open(run=run, session=session, heartbeat_interval_s=heartbeat_interval_s)
    return RunStart(run=run, segment=segment, created=created)


def _run_update_on_resume(*, run: Run, fields: dict[str, Any], deadline: Deadline | None) -> None:
    # A resumed job may change its plan (more steps, another deadline); keep what it omits.
    for name, value in fields.items():
        if value not in (None, "", [], {}):
            setattr(run, name, value)
    if deadline is not None:
        run.deadline = deadline
    for name, value in Run.reopened().items():
        setattr(run, name, value)
    run.last_seen_at = timezone.now()
    run.save()


def _segment_open(
    *, run: Run, session: str, heartbeat_interval_s: float | None = None
) -> RunSegment:
    number = run.current_segment + 1
    segment = RunSegment.objects.create(
        run=run,
        number=number,
        session=session,
        previous_last_step=run.last_step,
        heartbeat_interval_s=heartbeat_interval_s,
    )
    # The new segment's steps start over: last_step follows the newest segment.
    Run.objects.filter(pk=run.pk).update(current_segment=number, last_step=None)
    run.current_segment, run.last_step = number, None
    return segment


def _segment_for_session(*, run: Run, session: str) -> RunSegment:
    segment = run.segments.filter(session=session).first()
    if segment is not None:
        return segment
    # A batch from a process whose create call never arrived (e.g. replayed from a spool):
    # accept its data as a new segment rather than lose it.
    run = Run.objects.select_for_update().get(pk=run.pk)
    # Look again under the lock: a concurrent batch of the same new session may have opened it
    # while this one waited, and a second segment for one session breaks its unique key.
    segment = run.segments.filter(session=session).first()
    if segment is not None:
        return segment
    # A new attempt speaking is a resume, even of a run an earlier attempt ended.
    Run.objects.filter(pk=run.pk).update(**Run.reopened())
    return _segment_open(run=run, session=session)


def batch_ingest(
    *,
    run: Run,
    session: str,
    seq: int,
    series: list[SeriesIn],
    events: list[EventIn],
    heartbeat: datetime | None,
    ordered: bool = True,
) -> IngestResult:
    """Store one batch exactly once. A retry of the same (session, seq) changes nothing.

    `ordered`: the client numbers a session's batches in the order it sends them, as the
    runcast client does, so a seq under the session's retention floor was stored long ago.
    The MLflow API's seq is a hash of the batch's content (it dedupes by content instead):
    no floor says anything about it, and one would refuse new batches at random."""
    points = sum(int(s.steps.size) for s in series)
    if _one_statement_applies(series=series, events=events):
        stored = _one_key_ingest(
            run=run,
            session=session,
            seq=seq,
            series=series[0],
            heartbeat=heartbeat,
            ordered=ordered,
        )
        if stored is not None:
            return stored
    try:
        with transaction.atomic():
            batch = IngestBatch.objects.create(
                run=run, session=session, seq=seq, points=points, heartbeat_at=heartbeat
            )
            segment = _segment_for_session(run=run, session=session)
            if ordered and segment.seq_floor is not None and seq <= segment.seq_floor:
                # Stored long ago; retention has deleted its row (tracker.retention).
                raise _AlreadyStored
            _chunks_store(run=run, batch=batch, segment=segment.number, series=series)
            _events_store(run=run, batch=batch, segment=segment.number, events=events)
            _run_touch(run=run, segment=segment, series=series, points=points)
            transaction.on_commit(lambda: _notify(run_ingested, run.pk))
    except _AlreadyStored:
        return IngestResult(accepted=0, duplicate=True)
    except IntegrityError:
        if IngestBatch.objects.filter(run=run, session=session, seq=seq).exists():
            return IngestResult(accepted=0, duplicate=True)
        raise
    return IngestResult(accepted=points, duplicate=False)


def _one_statement_applies(*, series: list[SeriesIn], events: list[EventIn]) -> bool:
    # One key's points and no events: a synchronous MLflow log_metric (one point a request)
    # and most small batches. Their every statement was a round trip and an ORM compilation
    # for one row; PostgreSQL can write them all in one statement. SQLite has no writing CTEs
    # and takes the general path, as do batches of several keys (one request carries many
    # points there, so the per-request cost is spread over them).
    return (
        connection.vendor == "postgresql"
        and not events
        and len(series) == 1
        and series[0].steps.size > 0
    )


def _one_key_ingest(
    *,
    run: Run,
    session: str,
    seq: int,
    series: SeriesIn,
    heartbeat: datetime | None,
    ordered: bool,
) -> IngestResult | None:
    """`batch_ingest` of one key's points in one statement, with the general path's effects
    in its order: the batch row (its (run, session, seq) key: a retry inserts nothing and so
    writes nothing else), the chunk, the key's LatestMetric, the segment's first step, the run's
    summary; forecasts after commit. None, having written nothing, when the session has no
    segment yet: the general path opens it."""
    columns = chunk_columns(series.steps, series.values, series.times)
    [latest] = _latest_rows(run=run, series=[series]).values()
    now = timezone.now()
    params: dict[str, Any] = {
        "run": run.pk,
        "session": session,
        "seq": seq,
        "ordered": ordered,
        "now": now,
        "points": int(series.steps.size),
        "heartbeat": heartbeat,
        "key": series.key,
        **{f"c_{name}": value for name, value in columns.items()},
        **{f"l_{name}": value for name, value in zip(_LATEST_COLUMNS, latest, strict=True)},
        "top": int(series.steps.max()),
        "low": int(series.steps.min()),
        "stalled": Run.Status.STALLED,
        "crashed": Run.Status.CRASHED,
        "running": Run.Status.RUNNING,
    }
    with connection.cursor() as cursor:
        cursor.execute(_one_key_sql(), params)
        segments, inserted = cursor.fetchone()
    if not segments:
        return None
    if not inserted:
        return IngestResult(accepted=0, duplicate=True)
    transaction.on_commit(lambda: _notify(run_ingested, run.pk))
    return IngestResult(accepted=params["points"], duplicate=False)


@functools.cache
def _one_key_sql() -> str:
    """The statement of `_one_key_ingest`, built once per process."""
    qn = connection.ops.quote_name
    chunk_names = ["run_id", "batch_id", "key", "segment", *_CHUNK_CASTS]
    chunk_values = ", ".join(f"%(c_{name})s::{_CHUNK_CASTS[name]}" for name in _CHUNK_CASTS)
    latest_sets = ", ".join(f"{c} = excluded.{c}" for c in _LATEST_COLUMNS[2:])
    batch, chunk, latest_t = (
        qn(IngestBatch._meta.db_table),
        qn(MetricChunk._meta.db_table),
        qn(LatestMetric._meta.db_table),
    )
    segment_t, run_t = qn(RunSegment._meta.db_table), qn(Run._meta.db_table)
    # Table and column names are the models' own; every value is a parameter. Each CTE reads
    # `b`, the batch row inserted: empty for a retried batch or one under the retention floor
    # (tracker.retention), which then changes nothing. Run.status_when_heard and _run_touch's
    # last_step rule, in SQL.
    return f"""
        WITH seg AS (
            SELECT id, number, seq_floor FROM {segment_t}
            WHERE run_id = %(run)s AND session = %(session)s
        ), b AS (
            INSERT INTO {batch} (run_id, session, seq, received_at, points, heartbeat_at)
            SELECT %(run)s, %(session)s, %(seq)s, %(now)s, %(points)s, %(heartbeat)s::timestamptz
            FROM seg WHERE NOT %(ordered)s OR seg.seq_floor IS NULL OR %(seq)s > seg.seq_floor
            ON CONFLICT (run_id, session, seq) DO NOTHING
            RETURNING id
        ), c AS (
            INSERT INTO {chunk} ({", ".join(qn(n) for n in chunk_names)})
            SELECT %(run)s, b.id, %(key)s, seg.number, {chunk_values} FROM b, seg
        ), l AS (
            INSERT INTO {latest_t} ({", ".join(_LATEST_COLUMNS)})
            SELECT %(l_run_id)s, %(l_key)s, %(l_value)s::double precision, %(l_is_nan)s,
                   %(l_step)s, %(l_timestamp_ms)s
            FROM b
            ON CONFLICT (run_id, key) DO UPDATE SET {latest_sets}
            WHERE {latest_t}.step <= excluded.step
        ), f AS (
            UPDATE {segment_t} s SET first_step = %(low)s FROM b
            WHERE s.id = (SELECT id FROM seg) AND s.first_step IS NULL
        ), r AS (
            UPDATE {run_t} SET
                last_seen_at = %(now)s,
                points_count = {run_t}.points_count + %(points)s,
                last_step = CASE WHEN {run_t}.current_segment = seg.number
                    THEN GREATEST(COALESCE({run_t}.last_step, %(top)s), %(top)s)
                    ELSE {run_t}.last_step END,
                status = CASE
                    WHEN {run_t}.status = %(stalled)s THEN %(running)s
                    WHEN {run_t}.status = %(crashed)s AND {run_t}.ended_at IS NULL
                        THEN %(running)s
                    ELSE {run_t}.status END
            FROM b, seg WHERE {run_t}.id = %(run)s
        )
        SELECT (SELECT count(*) FROM seg), (SELECT count(*) FROM b)
    """  # noqa: S608


# PostgreSQL types of chunk_columns' values, for the SELECT that inserts them (a NULL or a
# bytes parameter has no type of its own there).
_CHUNK_CASTS = {
    "n": "integer",
    "first_step": "bigint",
    "last_step": "bigint",
    "min_step": "bigint",
    "max_step": "bigint",
    "min_value": "double precision",
    "max_value": "double precision",
    "nonfinite": "integer",
    "steps": "bytea",
    "values": "bytea",
    "times": "bytea",
    "rollup": "bytea",
}


class _AlreadyStored(Exception):
    """Rolls back a batch whose key lies under its session's retention floor."""


def _chunks_store(*, run: Run, batch: IngestBatch, segment: int, series: list[SeriesIn]) -> None:
    chunks = []
    for s in series:
        if s.steps.size == 0:
            continue
        chunks.append(
            MetricChunk(
                run=run,
                batch=batch,
                key=s.key,
                segment=segment,
                **chunk_columns(s.steps, s.values, s.times),
            )
        )
    MetricChunk.objects.bulk_create(chunks)
    _latest_metrics_store(run=run, series=series)


# Keys per statement of _latest_metrics_store (six parameters each).
_LATEST_KEYS_PER_STATEMENT = 500
_LATEST_COLUMNS = ("run_id", "key", "value", "is_nan", "step", "timestamp_ms")


def _latest_metrics_store(*, run: Run, series: list[SeriesIn]) -> None:
    """Move each key's LatestMetric to this batch's latest point unless a stored one has a
    higher step: the order `MetricChunk` rows define (highest max_step, later chunk on a tie)."""
    latest = _latest_rows(run=run, series=series)
    keys = list(latest)
    for i in range(0, len(keys), _LATEST_KEYS_PER_STATEMENT):
        _latest_upsert([latest[k] for k in keys[i : i + _LATEST_KEYS_PER_STATEMENT]])


def _latest_rows(*, run: Run, series: list[SeriesIn]) -> dict[str, tuple[Any, ...]]:
    """Each key's latest point of these series, as a LatestMetric row (_LATEST_COLUMNS)."""
    out: dict[str, tuple[Any, ...]] = {}
    for s in series:
        if s.steps.size == 0:
            continue
        top = s.steps == s.steps.max()
        j = int(np.flatnonzero(top)[np.argmax(s.times[top])])
        value, step = float(s.values[j]), int(s.steps[j])
        nan = bool(np.isnan(value))
        if s.key not in out or step >= out[s.key][4]:
            stamp = round(float(s.times[j]) * 1000)
            out[s.key] = (run.pk, s.key, None if nan else value, nan, step, stamp)
    return out


def _latest_upsert(rows: list[tuple[Any, ...]]) -> None:
    # One conditional upsert (the same syntax on SQLite and PostgreSQL; the ORM's upsert cannot
    # say WHERE): a concurrent batch of the same run cannot write an older point over a newer
    # one, and a batch costs one statement whatever its number of keys.
    table = LatestMetric._meta.db_table
    columns = ", ".join(_LATEST_COLUMNS)
    values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(rows))
    sets = ", ".join(f"{c} = excluded.{c}" for c in _LATEST_COLUMNS[2:])
    # Names are the model's own constants; every value is a parameter.
    sql = (
        f"INSERT INTO {table} ({columns}) VALUES {values} "  # noqa: S608
        f"ON CONFLICT (run_id, key) DO UPDATE SET {sets} WHERE {table}.step <= excluded.step"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [v for row in rows for v in row])


def _events_store(*, run: Run, batch: IngestBatch, segment: int, events: list[EventIn]) -> None:
    Event.objects.bulk_create(
        Event(
            run=run,
            batch=batch,
            kind=e.kind,
            step=e.step,
            time=e.time,
            segment=segment,
            payload=e.payload,
        )
        for e in events
    )


def _run_touch(*, run: Run, segment: RunSegment, series: list[SeriesIn], points: int) -> None:
    updates: dict[str, Any] = {
        "last_seen_at": timezone.now(),
        "points_count": F("points_count") + points,
    }
    nonempty = [s.steps for s in series if s.steps.size]
    if nonempty:
        top = int(max(int(a.max()) for a in nonempty))
        # Only the newest segment moves last_step. Compared in the UPDATE, not on `run` (read
        # before this batch, perhaps before a resume opened a newer segment or before this
        # batch's own session opened one): a late batch of an old attempt must not push it.
        updates["last_step"] = Case(
            When(
                current_segment=segment.number,
                then=Greatest(Coalesce(F("last_step"), Value(top)), Value(top)),
            ),
            default=F("last_step"),
        )
        if segment.first_step is None:
            low = int(min(int(a.min()) for a in nonempty))
            RunSegment.objects.filter(pk=segment.pk, first_step__isnull=True).update(first_step=low)
    # A stalled run that speaks again is running again, and so is one the sweeper took for
    # crashed (e.g. a network outage the client spooled through); a reported ending stays.
    updates["status"] = Run.status_when_heard()
    Run.objects.filter(pk=run.pk).update(**updates)


@dataclass(frozen=True)
class RankTimingsIn:
    """One rank's batch of step timings, validated; NaN where a part was not measured."""

    rank: int
    local_rank: int | None
    host: str
    steps: np.ndarray  # int64
    compute: np.ndarray  # float64 seconds
    wait: np.ndarray
    total: np.ndarray


def rank_timings_ingest(
    *, run: Run, session: str, seq: int, timings: RankTimingsIn
) -> IngestResult:
    """Store one rank's batch of timings exactly once (a retried (session, seq) is a no-op).

    It neither opens an attempt nor moves the run's progress or heartbeat: ranks other than 0
    speak for their own step times only, and the run's liveness stays rank 0's.
    """
    n = int(timings.steps.size)
    if n == 0:
        return IngestResult(accepted=0, duplicate=False)
    try:
        with transaction.atomic():
            RankTimingChunk.objects.create(
                run=run,
                session=session,
                seq=seq,
                rank=timings.rank,
                local_rank=timings.local_rank,
                host=timings.host,
                n=n,
                min_step=int(timings.steps.min()),
                max_step=int(timings.steps.max()),
                steps=pack_steps(timings.steps),
                compute=pack_timings(timings.compute),
                wait=pack_timings(timings.wait),
                total=pack_timings(timings.total),
            )
    except IntegrityError:
        if RankTimingChunk.objects.filter(run=run, session=session, seq=seq).exists():
            return IngestResult(accepted=0, duplicate=True)
        raise
    return IngestResult(accepted=n, duplicate=False)


@transaction.atomic
def run_finish(*, run: Run, status: str, ended_at: datetime, session: str | None = None) -> Run:
    """End a run as its client reports it. A repeated finish changes nothing and tells no one
    again; a finish from an attempt older than the current one (a spool replayed after a
    resume) does not end the resumed run."""
    if status not in Run.FINISH_STATUSES:
        raise ServiceError(f"cannot finish a run as {status!r}", field="status")
    run = Run.objects.select_for_update().get(pk=run.pk)
    attempt = None
    if session is not None:
        # An unknown session is no attempt of this run's: treated as older than any.
        attempt = run.segments.filter(session=session).values_list("number", flat=True).first()
        attempt = attempt if attempt is not None else -1
    if not run.finish_applies(attempt=attempt):
        logger.info("finish of run %s from an older attempt ignored", run.pk)
        return Run.objects.select_related("project", "deadline").get(pk=run.pk)
    changed = (
        Run.objects.filter(pk=run.pk)
        .exclude(status=status, ended_at__isnull=False)
        .update(status=status, ended_at=ended_at, last_seen_at=timezone.now())
    )
    if changed:
        transaction.on_commit(lambda: _notify(run_finished, run.pk))
    return Run.objects.select_related("project", "deadline").get(pk=run.pk)
