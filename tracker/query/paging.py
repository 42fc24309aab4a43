"""Pages of a sorted queryset by offset, with MLflow's opaque `page_token` (base64 JSON)."""

from __future__ import annotations

import base64
import json
from typing import Any

from django.db.models import QuerySet

from tracker.query.parse import QueryError


def token_encode(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def token_decode(token: str | None) -> int:
    """The offset a token stands for; no token is the first page."""
    if not token:
        return 0
    try:
        offset = int(json.loads(base64.urlsafe_b64decode(token.encode()))["offset"])
    except (ValueError, KeyError, TypeError) as exc:
        raise QueryError("not a token this server gave") from exc
    if offset < 0:
        raise QueryError("not a token this server gave")
    return offset


def page(queryset: QuerySet[Any], *, token: str | None, limit: int) -> tuple[list[Any], str | None]:
    """One page of at most `limit` rows in one query, and the token of the next page, if any
    (one row more than the page is read to know)."""
    offset = token_decode(token)
    rows = list(queryset[offset : offset + limit + 1])
    if len(rows) <= limit:
        return rows, None
    return rows[:limit], token_encode(offset + limit)
