"""Pages of a sorted queryset: by offset, with MLflow's opaque `page_token` (base64 JSON), or by
keyset, after the last row read (its sort values in a base64 JSON cursor)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from tracker.query.compile import Compiled, SortColumn
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


# --- keyset pages: the next page starts after the last row read, whatever its offset ---------


# How many rows of the unfiltered order a filtered page first looks among (`unfiltered`).
PROBE_ROWS = 5_000


def keyset_page(
    compiled: Compiled,
    *,
    after: str | None,
    limit: int,
    fetch: Callable[[list[Any]], dict[Any, Any]] | None = None,
    unfiltered: Compiled | None = None,
) -> tuple[list[Any], str | None]:
    """One page of at most `limit` rows after the row a cursor names, and the cursor of the
    next page, if any. The cursor holds that row's sort values, so the page is one indexed
    range read however deep it is, and a row added or removed earlier moves nothing.

    With `fetch` (tie values -> rows by tie value), the sort reads the sort values alone and
    `fetch` reads the page's rows whole (2 queries): a sort that cannot use an index (a
    metric's) then orders narrow tuples, not every candidate's JSON config and joined rows.

    With `unfiltered` (the same order without the filter), the page is first looked for among
    the first PROBE_ROWS rows of that order, which its index reads in order: the matches there
    are the filtered order's first rows. PostgreSQL has no statistics for a JSON param or a
    tag regex, guesses that almost nothing matches, and scans and sorts every run rather than
    walk the index to the 51st match (bench/runs_page.py); only when the probe finds too few
    does the full query run."""
    names = [c.name for c in compiled.columns]
    decoded = _cursor_decode(after, compiled.columns) if after else None

    def read(qs: QuerySet[Any], n: int) -> list[Any]:
        if n <= 0:
            return []
        if fetch is None:
            return list(qs[:n])
        return [list(v) for v in qs.values_list(*names)[:n]]

    got: list[Any] = []
    complete = False
    if unfiltered is not None:
        # The candidates' ids as a list, not a subquery: PostgreSQL met `IN (subquery)` with
        # the subquery re-read for each of 100,000 runs when the indexes were missing (13 s).
        tie = unfiltered.columns[-1].name
        head = _in_order(unfiltered, decoded, head_only=True)
        candidates = list(head.values_list(tie, flat=True)[:PROBE_ROWS])
        within = _in_order(compiled, decoded, head_only=False)
        got = read(within.filter(**{f"{names[-1]}__in": candidates}), limit + 1)
        complete = len(got) > limit
    if not complete:
        got = _segmented(compiled, decoded, read, limit + 1)
    values: list[list[Any]]
    if fetch is None:
        found, values = got, [[getattr(row, name) for name in names] for row in got]
    else:
        values = got
        by_tie = fetch([v[-1] for v in values[:limit]])
        found = [by_tie[v[-1]] for v in values[:limit] if v[-1] in by_tie]
    cursor = _cursor_encode(values[limit - 1]) if len(values) > limit else None
    return found[:limit], cursor


def _past_values(compiled: Compiled, decoded: list[Any] | None) -> bool:
    """Whether the first sort term has no value here (NULLS LAST), or the cursor is past them."""
    return not compiled.columns[0].nullable or (decoded is not None and decoded[0] is None)


def _in_order(compiled: Compiled, decoded: list[Any] | None, *, head_only: bool) -> QuerySet[Any]:
    """The rows after the cursor in order; `head_only`: only those with a first sort value,
    ordered so that an index on it serves (see _segmented), unless the order has no NULLs."""
    rows = compiled.rows
    if decoded is not None:
        rows = rows.filter(_after(compiled.columns, decoded))
    if head_only and not _past_values(compiled, decoded):
        first = compiled.columns[0].name
        rows = rows.filter(**{f"{first}__isnull": False})
        rows = rows.order_by(*compiled.order(first_has_values=True))
    return rows


def _segmented(
    compiled: Compiled,
    decoded: list[Any] | None,
    read: Callable[[QuerySet[Any], int], list[Any]],
    n: int,
) -> list[Any]:
    """The first n rows after the cursor. The rows with a first sort value sort before those
    without (NULLS LAST): they are read first, as a query of their own that an index on that
    value serves in order (a metric's (key, value) index: 51 index entries, not a hash join of
    every run), then the rest."""
    if _past_values(compiled, decoded):
        return read(_in_order(compiled, decoded, head_only=False), n)
    got = read(_in_order(compiled, decoded, head_only=True), n)
    rest = _in_order(compiled, decoded, head_only=False)
    return got + read(rest.filter(**{f"{compiled.columns[0].name}__isnull": True}), n - len(got))


def _after(columns: list[SortColumn], values: list[Any]) -> Q:
    """Rows strictly after `values` in the order of `columns` (each NULLS LAST):
    (a after x) or (a = x and (b after y) or ...), the last column unique."""
    column, value = columns[0], values[0]
    if value is None:
        later = Q(pk__in=[])  # nothing sorts after a null
        same = Q(**{f"{column.name}__isnull": True})
    else:
        later = Q(**{f"{column.name}__{'gt' if column.ascending else 'lt'}": value})
        if column.nullable:
            later |= Q(**{f"{column.name}__isnull": True})
        same = Q(**{column.name: value})
    if len(columns) == 1:
        return later
    return later | (same & _after(columns[1:], values[1:]))


def _cursor_encode(values: list[Any]) -> str:
    typed = [["t", v.isoformat()] if isinstance(v, datetime) else ["v", v] for v in values]
    return base64.urlsafe_b64encode(json.dumps(typed).encode()).decode()


def _cursor_decode(cursor: str, columns: list[SortColumn]) -> list[Any]:
    try:
        typed = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        values = [datetime.fromisoformat(v) if kind == "t" else v for kind, v in typed]
    except (ValueError, TypeError) as exc:
        raise QueryError("not a page cursor this server gave; start from the first page") from exc
    if len(values) != len(columns) or any(
        not isinstance(v, str | int | float | datetime | None) for v in values
    ):
        # A cursor of another sort (the order changed under a kept URL): not this page's.
        raise QueryError("not a page cursor of this order; start from the first page")
    return values
