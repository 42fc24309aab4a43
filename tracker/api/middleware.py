from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from tracker import limits

ARTIFACTS_PATH = "/api/2.0/mlflow-artifacts/"


class RequestSizeLimitMiddleware:
    """Refuse an oversized API body with 413 before anything reads it.

    Django's own DATA_UPLOAD_MAX_MEMORY_SIZE check (set to the same size in settings) answers a
    bare 400; a client needs 413 and the limit's name to know it must split its batches.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # Artifact uploads are files, streamed to storage under their own limit
        # (RUNCAST_ARTIFACT_MAX_BYTES, tracker.artifacts), never read into memory.
        if request.path.startswith("/api/") and not request.path.startswith(ARTIFACTS_PATH):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > limits.MAX_REQUEST_BYTES:
                return JsonResponse(
                    {
                        "error": f"request body of {length} bytes exceeds MAX_REQUEST_BYTES "
                        f"({limits.MAX_REQUEST_BYTES} bytes); send smaller batches",
                        "field": None,
                    },
                    status=413,
                )
        return self.get_response(request)
