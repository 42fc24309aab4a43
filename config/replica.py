"""Reads of the heavy pages and read-only API calls from a PostgreSQL streaming replica.

Installed only when DATABASE_REPLICA_URL is set (config/settings/base.py): the `replica` alias,
`ReplicaRouter` and `ReplicaReadMiddleware`. Without it nothing here runs.

A query goes to the replica only inside a replica-read scope, which the middleware opens around
a GET of one of READ_VIEWS or of /api/v1, and nothing else opens. Everything else reads the
primary: a Celery worker, a management command, a POST, a page not listed. A replica is behind
the primary by its replication lag (usually well under a second): a worker that wrote a forecast
and read it back from the replica would act on the old one, so reads outside a scope are never
routed. Inside a scope the primary is still read

* by a query inside a transaction (it may read what the transaction wrote);
* once the request has written anything (db_for_write marks the scope), for the rest of it;
* for sessions, users, API tokens and memberships (PRIMARY_ONLY_*): who may read is decided
  on the primary, so a login or a revocation counts at once;
* for STICKY_COOKIE's lifetime after a browser's own POST, so the page a form redirects to
  shows the change it made (a page read from the replica could show the state before it).

A replica that refuses connections, or fails during a request, is left alone for
RUNCAST_REPLICA_RETRY_S: the request is answered from the primary (a failed read-only view is run
again there), so pages keep working with the replica gone and use it again once it is back. A
query the replica cancels (a conflict with the WAL it replays) is read again from the primary.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import Model
from django.http import HttpRequest, HttpResponseBase
from django.urls import ResolverMatch

from config.errors import DATABASE_DOWN

logger = logging.getLogger(__name__)

PRIMARY = "default"
REPLICA = "replica"
STICKY_COOKIE = "rc_primary"

# Who may read is decided on the primary: a session just created by a login, a password just
# changed, a token or membership just revoked must count at once, not a replication lag later.
# These are point lookups by key. Writing them (a token's last use, a session's messages) does
# not send the request's other reads to the primary: nothing else reads what they hold.
PRIMARY_ONLY_APPS = frozenset({"sessions", "auth", "contenttypes"})
PRIMARY_ONLY_MODELS = frozenset({"tracker.apitoken", "tracker.membership"})


def _primary_only(model: type[Model]) -> bool:
    meta = model._meta
    return meta.app_label in PRIMARY_ONLY_APPS or meta.label_lower in PRIMARY_ONLY_MODELS


# Dashboard pages that only read and that cost the most queries: the board (and its poll), the
# run page, its polled summary and chart data, compare, the runs explorer and its CSV, the
# deadlines and host pages. Forms, settings, invitations stay on the primary.
READ_VIEWS = frozenset(
    {
        "home",
        "board-partial",
        "run",
        "run-summary",
        "run-series",
        "run-throughput",
        "run-overview",
        "run-ranks",
        "compare",
        "runs",
        "runs-csv",
        "runs-all",
        "runs-all-csv",
        "deadlines",
        "host",
    }
)
DASHBOARD_NAMESPACE = "dashboard"
# /api/v1: every GET operation is a read (ninja's router decorators make the method explicit).
API_NAMESPACE = "api-v1"


@dataclass
class _Scope:
    wrote: bool = False


_scope: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "replica_scope", default=None
)


class _Health:
    """When this process may next try the replica after it failed (one per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._retry_at = 0.0

    def usable(self) -> bool:
        return time.monotonic() >= self._retry_at

    def failed(self, exc: BaseException | None) -> None:
        with self._lock:
            first = self.usable()
            self._retry_at = time.monotonic() + settings.RUNCAST_REPLICA_RETRY_S
        if first:
            logger.warning(
                "replica unavailable, reading the primary for %.0f s: %s",
                settings.RUNCAST_REPLICA_RETRY_S,
                exc,
            )


health = _Health()


@contextlib.contextmanager
def replica_reads() -> Iterator[_Scope]:
    """Route this context's reads (outside transactions, before any write) to the replica."""
    scope = _Scope()
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


class ReplicaRouter:
    """Settings' DATABASE_ROUTERS when a replica is configured.

    Always names the alias: with no router answer Django sends an instance's reads and writes
    to the database it was loaded from, so a row read from the replica and saved would be
    written to it.
    """

    def db_for_read(self, model: type[Model], **hints: Any) -> str:
        scope = _scope.get()
        if scope is None or scope.wrote or _primary_only(model):
            return PRIMARY
        if connections[PRIMARY].in_atomic_block:
            return PRIMARY
        return REPLICA

    def db_for_write(self, model: type[Model], **hints: Any) -> str:
        scope = _scope.get()
        if scope is not None and not _primary_only(model):
            scope.wrote = True
        return PRIMARY

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool:
        # The replica holds the primary's rows: a run read from one is the run on the other.
        return {obj1._state.db, obj2._state.db} <= {PRIMARY, REPLICA, None}

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        # The replica gets its schema by replication; it refuses writes.
        return db != REPLICA


def routes(request: HttpRequest, match: ResolverMatch | None) -> bool:
    """Whether this request's reads may come from the replica."""
    if request.method not in ("GET", "HEAD") or STICKY_COOKIE in request.COOKIES:
        return False
    if match is None:
        return False
    if match.namespace == API_NAMESPACE:
        return True
    return match.namespace == DASHBOARD_NAMESPACE and match.url_name in READ_VIEWS


def _replica_connects() -> bool:
    if not health.usable():
        return False
    try:
        connections[REPLICA].ensure_connection()
    except DATABASE_DOWN as exc:
        health.failed(exc)
        return False
    return True


def _replica_errored(exc: BaseException | None) -> bool:
    """Whether a query on the replica failed in this request. A broken connection is closed and
    the replica left alone for RUNCAST_REPLICA_RETRY_S; a query it cancelled (a conflict with
    the WAL it replays) costs only this request's second reading, from the primary."""
    connection = connections[REPLICA]
    if not connection.errors_occurred:
        return False
    if not connection.is_usable():
        with contextlib.suppress(*DATABASE_DOWN):
            connection.close()
        health.failed(exc)
    return True


class ReplicaReadMiddleware:
    """Runs READ_VIEWS and API GETs in a replica-read scope; keeps a browser on the primary for
    RUNCAST_REPLICA_STICKY_S after each of its writes. Last in MIDDLEWARE: it calls the view
    itself, so every other middleware's process_view (CSRF, auth) has run before it; a view it
    calls skips process_exception hooks, of which none is installed."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        # Token clients (ingest, MLflow) read no pages: their writes set no cookie.
        writes = request.method not in ("GET", "HEAD", "OPTIONS", "TRACE")
        if writes and "HTTP_AUTHORIZATION" not in request.META:
            response.set_cookie(
                STICKY_COOKIE,
                "1",
                max_age=settings.RUNCAST_REPLICA_STICKY_S,
                secure=settings.SESSION_COOKIE_SECURE,
                httponly=True,
                samesite="Lax",
            )
        return response

    def process_view(
        self,
        request: HttpRequest,
        view: Callable[..., HttpResponseBase],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        if not routes(request, request.resolver_match) or not _replica_connects():
            return None
        try:
            with replica_reads() as scope:
                response = view(request, *args, **kwargs)
        except DATABASE_DOWN as exc:
            # Read again from the primary: safe, these views only read (had this one written,
            # the error could be the primary's and a second run would write twice).
            if scope.wrote or not _replica_errored(exc):
                raise
            return view(request, *args, **kwargs)
        # /api/v1 turns a database error into a 503 answer itself: look at the connection.
        if not scope.wrote and _replica_errored(None):
            return view(request, *args, **kwargs)
        return response


__all__ = [
    "PRIMARY",
    "REPLICA",
    "ReplicaReadMiddleware",
    "ReplicaRouter",
    "replica_reads",
    "routes",
]
