"""Deployment security that settings alone cannot express: the embedded secret key and the
Content-Security-Policy header (Django 5.2 has no CSP of its own)."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.http import HttpRequest, HttpResponse


def embedded_secret_key(path: Path) -> str:
    """The embedded install's key: made once, random, kept in var/ (never a key known to all).

    Several processes start at once in `scripts/dev` (web workers, the Celery worker): the key
    is written to a temporary file and linked into place, which fails if another process won,
    so every process reads the same key.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".secret-key-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(50))
            # Another process may have made it first: then theirs is the key.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    return path.read_text().strip()


class ContentSecurityPolicyMiddleware:
    """Adds settings.CONTENT_SECURITY_POLICY to every response that sets none of its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.policy: str = settings.CONTENT_SECURITY_POLICY

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response
