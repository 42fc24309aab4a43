"""The single HTTP seam: POST a JSON body, get (status, json, headers) back.

Status 0 means no HTTP response at all (refused, reset, timed out, DNS failure); callers
treat it like a 5xx. Nothing here raises for network trouble, so the sender's control
flow stays a plain match on the status code.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Union

from runcast.version import __version__

Body = Union[bytes, Mapping[str, Any]]
Response = tuple[int, dict, dict]

TRANSIENT_STATUSES = frozenset({0, 408, 429})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse redirects: urllib would replay the Authorization header to the new host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect())


def encode(body: Mapping[str, Any]) -> bytes:
    # allow_nan=True (the default) on purpose: the server accepts NaN/Infinity literals
    # and a diverging loss is exactly the value a user wants to see.
    return json.dumps(body, separators=(",", ":"), allow_nan=True).encode("utf-8")


def post_json(url: str, body: Body, token: str | None, timeout: float) -> Response:
    """POST `body` (a dict, or bytes already encoded) to `url`."""
    if not url.startswith(("http://", "https://")):
        return 0, {"error": f"unsupported URL scheme in {url.split(':', 1)[0]!r}"}, {}
    data = body if isinstance(body, bytes) else encode(body)
    # Scheme checked just above, so urllib cannot be steered to file:// and friends.
    request = urllib.request.Request(url, data=data, method="POST")  # noqa: S310
    request.add_header("Content-Type", "application/json")
    request.add_header("Accept", "application/json")
    request.add_header("User-Agent", f"runcast-client/{__version__}")
    if token:
        if not token.isascii() or not token.isprintable():
            # http.client would refuse it with a message quoting the whole header: the secret.
            return 0, {"error": "the token holds characters an HTTP header cannot carry"}, {}
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with _opener.open(request, timeout=timeout) as response:
            return response.status, _parse(response.read()), dict(response.headers.items())
    except urllib.error.HTTPError as exc:
        headers = dict(exc.headers.items()) if exc.headers is not None else {}
        return exc.code, _parse(_read_quietly(exc)), headers
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # URLError, timeouts and resets are OSErrors; ValueError covers a malformed URL.
        return 0, {"error": f"{type(exc).__name__}: {_reason(exc)}"}, {}


def is_success(status: int) -> bool:
    return 200 <= status < 300


def is_transient(status: int) -> bool:
    return status in TRANSIENT_STATUSES or status >= 500


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Parse Retry-After (delta seconds or an HTTP date); None when absent or garbage."""
    raw = next((value for key, value in headers.items() if key.lower() == "retry-after"), None)
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def _parse(raw: bytes) -> dict:
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"error": raw[:200].decode("utf-8", "replace")}
    return parsed if isinstance(parsed, dict) else {"data": parsed}


def _read_quietly(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read()
    except (OSError, http.client.HTTPException):
        return b""


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc)
