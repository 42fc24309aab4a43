from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe

from config import errors


@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers and compose: the process answers and the database does.

    A database that does not answer is 503 JSON (load balancers and the liveness sweep's web
    probe read any non-200 as down), never Django's HTML 500.
    """
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except errors.DATABASE_DOWN:
        return errors.unavailable_response({"ok": False, "error": errors.DATABASE_UNAVAILABLE})
    return JsonResponse({"ok": True})
