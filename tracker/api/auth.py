from __future__ import annotations

from django.http import HttpRequest
from ninja.security import HttpBearer

from tracker.models import ApiToken
from tracker.services import Forbidden, token_authenticate


class TokenAuth(HttpBearer):
    """Bearer token in the Authorization header only: a token in a URL ends up in logs."""

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        return token_authenticate(raw=token)


def require_scope(request: HttpRequest, scope: str) -> ApiToken:
    token: ApiToken = request.auth  # type: ignore[attr-defined]
    if token.scope != scope:
        raise Forbidden(f"this token has the {token.scope!r} scope; {scope!r} is needed")
    return token
