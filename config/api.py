"""The versioned API: one NinjaAPI, routers from each app, one error shape for everything."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, ValidationError
from ninja.errors import HttpError as NinjaHttpError

from config import errors
from forecasting.api import router as forecasting_router
from tracker.api.gpu import router as gpu_router
from tracker.api.views import router as tracker_router
from tracker.services import ServiceError

api = NinjaAPI(
    title="Runcast API",
    version="1",
    urls_namespace="api-v1",
    description="Ingestion and reads for Runcast. Authenticate with `Authorization: Bearer rc_…`.",
)
api.add_router("/", tracker_router)
api.add_router("/", forecasting_router)
api.add_router("/", gpu_router)


def _field_path(loc: tuple[object, ...] | list[object]) -> str:
    # ninja prefixes body errors with ("body", "<param name>"); clients think in their JSON.
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[2:]
    elif parts and parts[0] in ("path", "query"):
        parts = parts[1:]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


@api.exception_handler(ServiceError)
def _service_error(request: HttpRequest, exc: ServiceError) -> HttpResponse:
    return api.create_response(
        request, {"error": exc.message, "field": exc.field}, status=exc.status
    )


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    first = exc.errors[0] if exc.errors else {}
    field = _field_path(first.get("loc", ()))
    message = first.get("msg", "invalid request")
    body = {"error": f"{field}: {message}" if field else message, "field": field or None}
    return api.create_response(request, body, status=400)


@api.exception_handler(AuthenticationError)
def _auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    body = {
        "error": "missing or invalid API token (send Authorization: Bearer rc_…)",
        "field": None,
    }
    return api.create_response(request, body, status=401)


@api.exception_handler(NinjaHttpError)
def _http_error(request: HttpRequest, exc: NinjaHttpError) -> HttpResponse:
    return api.create_response(request, {"error": str(exc), "field": None}, status=exc.status_code)


@api.exception_handler(Exception)
def _unhandled_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    # Replaces ninja's default, which re-raises to Django's HTML 500 page (or, with DEBUG, answers
    # the traceback as text): a database outage is 503 with Retry-After, anything else 500.
    return errors.api_error_response(request, exc)
