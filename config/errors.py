"""What a machine client gets when a request fails on the server's side: JSON, never a page.

A database that cannot be reached (down, restarting, refusing connections, a connection cut
mid-query) is an outage the client should wait out: 503 with Retry-After, which the runcast
client retries and spools through. Anything else unexpected is 500 with a fixed message: the
exception's text can quote the request (a run id, a value) or the schema, and the traceback
goes to the server log, not to the client.
"""

from __future__ import annotations

import logging
import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

logger = logging.getLogger(__name__)

# Seconds a client waits before retrying a request the database could not serve. Short: a
# restart or failover takes seconds, and the client's own backoff takes over beyond it.
DATABASE_RETRY_AFTER_S = 5
DATABASE_UNAVAILABLE = "database unavailable; retry later"
INTERNAL_ERROR = "internal server error"

# Paths whose callers are programs reading JSON (the pages keep Django's HTML 500).
JSON_PATHS = ("/api/v1/", "/healthz")


# What Django raises for a refused or dropped connection (psycopg's OperationalError and
# InterfaceError, wrapped); an IntegrityError or DataError is the request's fault or a bug, and
# retrying it cannot help.
DATABASE_DOWN = (OperationalError, InterfaceError)


def database_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, DATABASE_DOWN)


def unavailable_response(body: dict[str, object]) -> JsonResponse:
    response = JsonResponse(body, status=503)
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
    return response


def api_error_response(request: HttpRequest, exc: BaseException) -> JsonResponse:
    """/api/v1's answer to an exception nothing else handled: 503 or 500, one error shape."""
    if database_unavailable(exc):
        logger.warning("database unavailable on %s %s: %s", request.method, request.path, exc)
        return unavailable_response({"error": DATABASE_UNAVAILABLE, "field": None})
    logger.error(
        "unhandled error on %s %s",
        request.method,
        request.path,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return JsonResponse({"error": INTERNAL_ERROR, "field": None}, status=500)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: Django calls it inside its `except` for an exception no view handled (one
    raised by a middleware, or outside the API's own handler). Django has logged it already."""
    if not request.path.startswith(JSON_PATHS):
        return defaults.server_error(request)
    exc = sys.exc_info()[1]
    if exc is not None and database_unavailable(exc):
        return unavailable_response({"error": DATABASE_UNAVAILABLE, "field": None})
    return JsonResponse({"error": INTERNAL_ERROR, "field": None}, status=500)
