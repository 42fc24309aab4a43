from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from tracker import limits


class RequestSizeLimitMiddleware:
    """Refuse an oversized API body with 413 before anything reads it.

    Django's own DATA_UPLOAD_MAX_MEMORY_SIZE check (set to the same size in settings) answers a
    bare 400; a client needs 413 and the limit's name to know it must split its batches.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
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
