"""A forecast's input series, read from its stored sample and the chunks logged since.

Every forecast (one per 15 s per live run) used to load and unpack every chunk of the run's
loss and lr and resolve a million points to use 200,000 of them. Here each (run, key) has a
`SeriesSample` row: the kept points of `forecasting.sampling` up to a cursor. A forecast reads
the row, checks the cursor still describes the chunks (one aggregate), reads the chunks after
it and extends the sample in memory. The row is rewritten only when the points after the
cursor reach FOLD_POINTS, or rebuilt from every chunk when the check fails, so a forecast reads
a bounded sample plus at most FOLD_POINTS raw points whatever the history's length.

Correctness rests on the check, not on who wrote what when:

* Storage order is (segment, min_step, chunk id), the order `tracker.selectors.series_load`
  reads. Points logged later land after the cursor (a newer chunk of the current segment, or
  a resumed attempt's new segment) and only extend the sample.
* A chunk that lands at or before the cursor (an ingest transaction that took its id before
  the row was written and committed after), a merge that reaches across the cursor
  (tracker.compaction keeps a merged chunk at its first chunk's place) or a purge changes how
  many points lie at or before the cursor: the row no longer matches and is rebuilt from every
  chunk, exactly as a first forecast builds it. A merge wholly before the cursor keeps every
  point in its place and changes nothing.
* The row is written in the forecast's transaction (`forecast_compute` is atomic): a worker
  killed half-way leaves the previous row, which is still correct. Two computations of one run
  at once each write a row consistent with what they read (an upsert: the later one wins).
"""

from __future__ import annotations

import zlib

import numpy as np
from django.db.models import Q, QuerySet, Sum

from forecasting.models import SeriesSample
from forecasting.sampling import Sample, sample_extend
from tracker.models import MetricChunk, Run
from tracker.series import FLOAT_DTYPE, STEP_DTYPE, Series, concat

# Points after the cursor that a forecast reads raw before the row is rewritten to cover them:
# ~200 KB of chunk arrays per key. Larger makes every forecast read more; smaller rewrites the
# row (up to 200,000 kept points, ~8 MB) more often.
FOLD_POINTS = 8192


def series_input(*, run: Run, key: str, limit: int, keep_nonfinite: bool) -> Sample:
    """The sample of every point of `key` (see forecasting.sampling), kept up to date in its
    `SeriesSample` row. Call inside the forecast's transaction."""
    chunks = MetricChunk.objects.filter(run=run, key=key)
    row = SeriesSample.objects.filter(
        run=run, key=key, limit=limit, keep_nonfinite=keep_nonfinite
    ).first()
    sample: Sample | None = None
    tail: QuerySet[MetricChunk] = chunks
    if row is not None:
        covered = chunks.filter(_at_or_before(row)).aggregate(n=Sum("n"))["n"] or 0
        if covered == row.points:
            sample = _sample_of(row)
            tail = chunks.exclude(_at_or_before(row))
    rows = list(
        tail.order_by("segment", "min_step", "id").values_list(
            "id", "segment", "min_step", "steps", "values", "times"
        )
    )
    new = concat([(seg, bytes(s), bytes(v), bytes(t)) for _, seg, _, s, v, t in rows])
    grown = sample_extend(sample or Sample.empty(), new, limit=limit, keep_nonfinite=keep_nonfinite)
    if rows and (sample is None or len(new) >= FOLD_POINTS or grown.stride != sample.stride):
        chunk_id, segment, min_step = rows[-1][:3]
        _store(
            run=run,
            key=key,
            limit=limit,
            keep_nonfinite=keep_nonfinite,
            sample=grown,
            cursor=(segment, min_step, chunk_id),
        )
    return grown


def _at_or_before(row: SeriesSample) -> Q:
    seg, low, chunk = row.cursor_segment, row.cursor_min_step, row.cursor_chunk
    return (
        Q(segment__lt=seg)
        | Q(segment=seg, min_step__lt=low)
        | Q(segment=seg, min_step=low, id__lte=chunk)
    )


def _sample_of(row: SeriesSample) -> Sample:
    return Sample(
        stride=row.stride,
        points=row.points,
        positions=_unpack_ints(row.positions),
        kept=Series(
            _unpack_ints(row.steps),
            _unpack_floats(row.values),
            _unpack_floats(row.times),
            _unpack_ints(row.segments),
        ),
        firsts={int(seg): int(step) for seg, step in row.firsts.items()},
        last=Series(
            _unpack_ints(row.last_steps),
            _unpack_floats(row.last_values),
            _unpack_floats(row.last_times),
            _unpack_ints(row.last_segments),
        ),
    )


# The row is read by every forecast: its size is its cost (PostgreSQL sends bytea as hex text;
# a million-point run's 125,000 kept points are 5 MB raw), and so is decoding it. Integers
# (positions, steps, segments) are stored as runs of equal deltas: a regular log's are a handful
# of runs (the stride, a resume, the NaN kept off the stride), decoded by np.repeat and cumsum.
# Floats are stored as the XOR of each value's bits with the previous one's, deflated when that
# halves them (a regular clock), else as they are (a noisy loss, which deflate cannot shrink and
# would only slow down every read). Decoding is exact (NaN payloads and -0.0 included). The
# first byte says which; zlib level 1, as the row is written only every FOLD_POINTS points.
_RUNS, _DEFLATED, _PLAIN = b"r", b"z", b"p"


def _body(blob: bytes | memoryview) -> tuple[int, memoryview]:
    # psycopg2 hands bytea over as a memoryview of format "c", which never equals bytes.
    view = memoryview(blob).cast("B")
    return view[0], view[1:]


def _pack_ints(a: np.ndarray) -> bytes:
    d = np.diff(np.ascontiguousarray(a, dtype=STEP_DTYPE), prepend=STEP_DTYPE.type(0))
    starts = np.flatnonzero(np.diff(d, prepend=d[:1] + 1)) if d.size else d
    if starts.size * 2 >= d.size:
        return _PLAIN + d.tobytes()
    counts = np.diff(starts, append=d.size)
    return _RUNS + np.concatenate([d[starts], counts]).astype(STEP_DTYPE).tobytes()


def _unpack_ints(blob: bytes | memoryview) -> np.ndarray:
    kind, body = _body(blob)
    d = np.frombuffer(body, dtype=STEP_DTYPE)
    if kind == _RUNS[0]:
        values, counts = np.split(d, 2)
        d = np.repeat(values, counts)
    return np.cumsum(d, dtype=STEP_DTYPE)


def _pack_floats(a: np.ndarray) -> bytes:
    bits = np.ascontiguousarray(a, dtype=FLOAT_DTYPE).view(STEP_DTYPE)
    previous = np.concatenate((np.zeros(min(1, bits.size), STEP_DTYPE), bits[:-1]))
    raw = np.bitwise_xor(bits, previous).tobytes()
    packed = zlib.compress(raw, 1)
    return _DEFLATED + packed if len(packed) * 2 <= len(raw) else _PLAIN + raw


def _unpack_floats(blob: bytes | memoryview) -> np.ndarray:
    kind, body = _body(blob)
    bits = np.frombuffer(zlib.decompress(body) if kind == _DEFLATED[0] else body, STEP_DTYPE)
    return (
        np.bitwise_xor.accumulate(bits).view(FLOAT_DTYPE) if bits.size else bits.view(FLOAT_DTYPE)
    )


def _store(
    *,
    run: Run,
    key: str,
    limit: int,
    keep_nonfinite: bool,
    sample: Sample,
    cursor: tuple[int, int, int],
) -> None:
    segment, min_step, chunk_id = cursor
    row = SeriesSample(
        run=run,
        key=key,
        limit=limit,
        keep_nonfinite=keep_nonfinite,
        stride=sample.stride,
        points=sample.points,
        cursor_segment=segment,
        cursor_min_step=min_step,
        cursor_chunk=chunk_id,
        positions=_pack_ints(sample.positions),
        steps=_pack_ints(sample.kept.steps),
        values=_pack_floats(sample.kept.values),
        times=_pack_floats(sample.kept.times),
        segments=_pack_ints(sample.kept.segments),
        last_steps=_pack_ints(sample.last.steps),
        last_values=_pack_floats(sample.last.values),
        last_times=_pack_floats(sample.last.times),
        last_segments=_pack_ints(sample.last.segments),
        firsts={str(seg): step for seg, step in sorted(sample.firsts.items())},
    )
    # An upsert: a computation of the same run running at the same time may have written the
    # row since this one read it; both rows are right for what each read.
    SeriesSample.objects.bulk_create(
        [row],
        update_conflicts=True,
        unique_fields=["run", "key", "limit", "keep_nonfinite"],
        update_fields=[
            "stride",
            "points",
            "cursor_segment",
            "cursor_min_step",
            "cursor_chunk",
            "positions",
            "steps",
            "values",
            "times",
            "segments",
            "last_steps",
            "last_values",
            "last_times",
            "last_segments",
            "firsts",
            "updated_at",
        ],
    )
