"""What the bench reads back from the stack's database (psycopg2, plain SQL: the bench process
has no Django): the stored points of each run, its forecasts, its liveness marks, its status.

Times are epoch seconds. The database's timestamps are written by the web and worker processes
on this machine, so they share the bench's clock.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.trainers import key_names, values_at
from tracker.series import FLOAT_DTYPE, STEP_DTYPE

Point = tuple[str, int, float]


@contextmanager
def cursor(dsn: str) -> Iterator[Any]:
    import psycopg2

    conn = psycopg2.connect(dsn, connect_timeout=3)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


def reachable(dsn: str) -> bool:
    import psycopg2

    try:
        with cursor(dsn) as cur:
            cur.execute("SELECT 1")
        return True
    except psycopg2.OperationalError:
        return False


# -- points -----------------------------------------------------------------------------------


def sent_points(*, keys: int, steps: int) -> Counter[Point]:
    """Exactly what a bench trainer logged: `keys` values at each of steps 0 .. steps-1."""
    names = key_names(keys)
    return Counter(
        (names[k], step, value)
        for step in range(steps)
        for k, value in enumerate(values_at(step, keys))
    )


def stored_points(dsn: str, run_id: str) -> Counter[Point]:
    """Every stored point of a run, as (key, step, value), each as often as it is stored."""
    with cursor(dsn) as cur:
        cur.execute(
            "SELECT c.key, c.steps, c.values FROM tracker_metricchunk c "
            "JOIN tracker_run r ON r.id = c.run_id WHERE r.public_id = %s",
            [run_id],
        )
        rows = cur.fetchall()
    stored: Counter[Point] = Counter()
    for key, steps, values in rows:
        steps_ = np.frombuffer(bytes(steps), STEP_DTYPE).tolist()
        values_ = np.frombuffer(bytes(values), FLOAT_DTYPE).tolist()
        stored.update(zip(itertools.repeat(key), steps_, values_, strict=False))
    return stored


def lost_and_duplicated(sent: Counter[Point], stored: Counter[Point]) -> tuple[int, int]:
    """Points sent and not stored, and points stored more often than sent (or never sent)."""
    return sum((sent - stored).values()), sum((stored - sent).values())


# -- forecasts --------------------------------------------------------------------------------


def first_forecasts_since(dsn: str, run_ids: Iterable[str], since: float) -> dict[str, float]:
    """For each run that has one, the time of its first forecast computed at or after `since`."""
    with cursor(dsn) as cur:
        cur.execute(
            "SELECT r.public_id, min(extract(epoch FROM f.computed_at)) "
            "FROM forecasting_forecast f JOIN tracker_run r ON r.id = f.run_id "
            "WHERE r.public_id = ANY(%s) AND f.computed_at >= to_timestamp(%s) "
            "GROUP BY r.public_id",
            [list(run_ids), since],
        )
        return {run_id: float(at) for run_id, at in cur.fetchall()}


def kinds_stored_since(cur: Any, *, run_pk: int, since: float) -> set[str]:
    """The forecast kinds a computation of the run begun at or after `since` has stored so far
    (an open cursor: polled every few milliseconds while a forecast runs)."""
    cur.execute(
        "SELECT DISTINCT kind FROM forecasting_forecast WHERE run_id = %s "
        "AND computed_at >= to_timestamp(%s)",
        [run_pk, since],
    )
    return {kind for (kind,) in cur.fetchall()}


# -- liveness ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CrashMark:
    """A sign that the server took a run for stalled or crashed: a flag or a notification."""

    run_id: str
    at: float
    what: str


def crash_marks(dsn: str) -> list[CrashMark]:
    with cursor(dsn) as cur:
        cur.execute(
            "SELECT r.public_id, extract(epoch FROM f.created_at), 'flag ' || f.state || ': ' "
            "|| f.explanation FROM forecasting_flag f JOIN tracker_run r ON r.id = f.run_id "
            "WHERE f.kind = 'stalled' AND f.state IN ('raised', 'updated') "
            "UNION ALL "
            "SELECT r.public_id, extract(epoch FROM n.created_at), 'notification ' || n.rule_kind "
            "|| ' ' || n.event || ' (' || n.status || ')' FROM alerts_notification n "
            "JOIN tracker_run r ON r.id = n.run_id WHERE n.rule_kind IN ('stalled', 'failed')"
        )
        return [CrashMark(run_id, float(at), what) for run_id, at, what in cur.fetchall()]


def run_states(dsn: str) -> dict[str, dict[str, Any]]:
    with cursor(dsn) as cur:
        cur.execute(
            "SELECT r.public_id, r.status, r.ended_at IS NOT NULL, "
            "(SELECT count(*) FROM tracker_ingestbatch b WHERE b.run_id = r.id) FROM tracker_run r"
        )
        return {
            run_id: {"status": status, "ended": ended, "batches": batches}
            for run_id, status, ended, batches in cur.fetchall()
        }
