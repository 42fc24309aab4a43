"""The one query module of the MLflow search-filter language: `parse` reads a filter into
comparisons, `parse_order_by` reads sort keys, `apply` compiles both onto a queryset for a
`Schema` (where the model keeps attributes, tags, params and metrics), `page` reads one page by
offset (MLflow's tokens) and `keyset_page` one page after the last row read (the runs explorer).
Nothing here knows the MLflow API: its views, and the runs explorer, describe their model with a
Schema and turn QueryError into their own error."""

from __future__ import annotations

from tracker.query.compile import (
    Attribute,
    Compiled,
    Kind,
    Schema,
    SortColumn,
    apply,
    compile_search,
    metric_value,
)
from tracker.query.paging import keyset_page, page, token_decode, token_encode
from tracker.query.parse import Comparison, OrderKey, QueryError, parse, parse_order_by

__all__ = [
    "Attribute",
    "Comparison",
    "Compiled",
    "Kind",
    "OrderKey",
    "QueryError",
    "Schema",
    "SortColumn",
    "apply",
    "compile_search",
    "keyset_page",
    "metric_value",
    "page",
    "parse",
    "parse_order_by",
    "token_decode",
    "token_encode",
]
