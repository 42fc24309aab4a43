"""Model instances from hand-written SQL, for the lookups every API request makes.

Compiling a queryset costs more than running it: in a cProfile of 300 one-point MLflow
`log-metric` requests, the token lookup and the MLflow run lookup (four tables joined) took
~40% of each request, most of it building SQL that never changes. Here their SQL is
written once, from the models' own field lists (a field added to a model is selected without
touching this module), and each row is turned into instances as the ORM does: the database
converters of each field (JSON text into objects, ...), then `Model.from_db`, related instances
cached as `select_related` caches them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)
_Converter = Callable[[Any, Any, Any], Any]


def columns(model: type[Model], alias: str) -> str:
    """The select list of every concrete field of `model`, in field order, under `alias`."""
    qn = connection.ops.quote_name
    return ", ".join(f"{alias}.{qn(str(f.column))}" for f in model._meta.concrete_fields)


def table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


@functools.cache
def _converters(model: type[Model]) -> list[list[tuple[_Converter, Any]]]:
    # As SQLCompiler.get_converters: the backend's, then the field's own, per column. One
    # database per process, so they are worked out once per model.
    out = []
    for f in model._meta.concrete_fields:
        col = f.get_col(model._meta.db_table)
        convs = connection.ops.get_db_converters(col) + f.get_db_converters(connection)
        out.append([(conv, col) for conv in convs])
    return out


def instance(model: type[M], row: Sequence[Any], start: int = 0) -> tuple[M, int]:
    """The instance of `model` whose columns (as `columns(model, ...)` lists them) begin at
    `row[start]`, and the index after them."""
    fields = model._meta.concrete_fields
    values = list(row[start : start + len(fields)])
    for i, convs in enumerate(_converters(model)):
        for conv, col in convs:
            values[i] = conv(values[i], col, connection)
    obj = model.from_db(connection.alias, [f.attname for f in fields], values)
    return obj, start + len(fields)
