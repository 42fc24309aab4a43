"""The one outbound HTTP seam: every Slack and webhook request goes through post_json.

Standard library only, and always with a timeout: a hung endpoint must cost a worker seconds,
not its whole time limit.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from alerts.transports.base import TransportError

USER_AGENT = "Runcast-Alerts/1.0"
DEFAULT_TIMEOUT_S = 10.0
# Enough of an error body to show why it failed; never the whole page.
MAX_BODY = 2_000


@dataclass(frozen=True)
class Response:
    status: int
    text: str


def encode(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def post_json(
    url: str,
    body: Any,
    headers: dict[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Response:
    """POST body (already-encoded bytes or a JSON-able object); return status and text.

    HTTP error statuses are returned for the transport to judge; only network failures and
    timeouts raise (as transient TransportError).
    """
    if not url.startswith(("https://", "http://")):
        raise TransportError(f"not an http(s) URL: {url[:80]}", permanent=True)
    data = body if isinstance(body, bytes) else encode(body)
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": USER_AGENT, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310
            return Response(resp.status, resp.read(MAX_BODY).decode("utf-8", "replace"))
    except urllib.error.HTTPError as e:
        return Response(e.code, e.read(MAX_BODY).decode("utf-8", "replace"))
    except TimeoutError as e:
        raise TransportError(f"timed out after {timeout:g} s", permanent=False) from e
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError | socket.timeout):
            raise TransportError(f"timed out after {timeout:g} s", permanent=False) from e
        raise TransportError(f"connection failed: {e.reason}", permanent=False) from e
    except (ConnectionError, OSError) as e:
        raise TransportError(f"connection failed: {e}", permanent=False) from e
