"""Comparisons and orders compiled onto a Django queryset: every filter and sort runs in SQL.

A `Schema` says where a model keeps each entity: attributes by name (a column path and its kind),
tags and params as JSON objects of key -> value, metrics as the `LatestMetric` rows of a run. The
same language thus searches MLflow run links, experiments or Runcast runs alike.

Semantics are MLflow's: a missing key never matches a comparison; a NaN metric matches only `!=`;
text compared with a number matches when the text reads as one; sorting puts a NaN metric after
every number in both directions and a missing value last, then the caller's tie-break.
"""

from __future__ import annotations

import enum
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import (
    Case,
    F,
    FilteredRelation,
    FloatField,
    OrderBy,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from tracker.limits import echo
from tracker.query.parse import Comparison, OrderKey, QueryError, at


class Kind(enum.Enum):
    TEXT = "text"
    NUMBER = "number"
    # A datetime column that the language reads as integer epoch milliseconds (floored).
    MILLIS = "millis"


@dataclass(frozen=True)
class Attribute:
    path: str
    kind: Kind = Kind.TEXT
    # A column that is never NULL sorts without NULLS LAST, so that a plain index serves it
    # (PostgreSQL reads an index in NULLS LAST order only if it was built so).
    nullable: bool = True


@dataclass(frozen=True)
class Schema:
    noun: str  # what is searched, for messages: "Runs", "Experiments"
    attributes: Mapping[str, Attribute]
    aliases: Mapping[str, str] = field(default_factory=dict)
    tags: str | None = None  # path of a JSON object of tag -> value
    # Tags as a JSON list of labels instead (Runcast's own runs): "team:nlp" or "team=nlp" is the
    # tag `team` with the value `nlp`, a bare "baseline" the tag `baseline` with the value ''.
    tag_labels: bool = False
    params: str | None = None  # path of a JSON object of param -> value
    metrics: str | None = None  # path of the Run whose LatestMetric rows are the metrics
    tie: str = "pk"  # the last sort key, unique, so that pages never overlap


_COMPARE = {"=": "exact", "<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}
# What Python's float() reads, less inf/nan spellings; text matching it is cast in SQL.
_NUMERIC_TEXT = r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MIN_MS = (datetime(1, 1, 2, tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1)
_MAX_MS = (datetime(9999, 12, 30, tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1)


class _Aliases:
    """Fresh alias names for one compilation (a key may appear in several comparisons)."""

    def __init__(self, prefix: str = "_rq") -> None:
        self._prefix = prefix
        self._n = itertools.count()
        # One join per metric key, shared by its comparisons and its sort: a filter on the key
        # then makes the join an inner one that its (key, value) index can drive.
        self.metric_joins: dict[str, str] = {}

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._n)}"


@dataclass(frozen=True)
class SortColumn:
    """One ORDER BY term of a compiled search: an annotation of the queryset, so that a page's
    last row carries the values its keyset cursor holds (tracker.query.paging)."""

    name: str
    ascending: bool
    nullable: bool = True


@dataclass(frozen=True)
class Compiled:
    rows: QuerySet[Any]
    columns: list[SortColumn]

    def order(self, *, first_has_values: bool = False) -> list[OrderBy]:
        """The ORDER BY terms; `first_has_values`: for rows whose first term is never NULL,
        which then sorts without NULLS LAST, so that an index on it serves either direction
        (PostgreSQL scans an ASC index backwards as DESC NULLS FIRST only)."""
        first = replace(self.columns[0], nullable=False) if first_has_values else self.columns[0]
        return [_direction(c) for c in [first, *self.columns[1:]]]


def apply(
    queryset: QuerySet[Any], schema: Schema, comparisons: list[Comparison], order: list[OrderKey]
) -> QuerySet[Any]:
    """The queryset narrowed to the rows matching every comparison, sorted by `order` and then
    by the schema's tie-break. Raises QueryError for an entity, key or operator not allowed."""
    return compile_search(queryset, schema, comparisons, order).rows


def compile_search(
    queryset: QuerySet[Any], schema: Schema, comparisons: list[Comparison], order: list[OrderKey]
) -> Compiled:
    """As `apply`, with the sort's terms named: every one is selected (an annotation), the
    schema's tie-break last, so that a keyset page can continue after a row."""
    names = _Aliases()
    for c in comparisons:
        try:
            queryset, condition = _condition(queryset, schema, c, names)
        except QueryError as exc:
            raise at(exc, c) from None
        queryset = queryset.filter(condition)
    columns: list[SortColumn] = []
    for key in order:
        queryset, keys = _sort(queryset, schema, key, names)
        columns += keys
    tie = names()
    queryset = queryset.annotate(**{tie: F(schema.tie)})
    columns.append(SortColumn(tie, ascending=True, nullable=False))
    return Compiled(queryset.order_by(*(_direction(c) for c in columns)), columns)


def metric_value(qs: QuerySet[Any], schema: Schema, key: str) -> tuple[QuerySet[Any], str]:
    """The queryset joined to each row's latest `key` (LEFT JOIN), and the path of its value
    (NULL for a NaN or no metric): what an aggregate over a metric reads. Its aliases are its
    own, so it joins a queryset another compilation made."""
    qs, value, _nan = _metric_aliases(qs, _entity_path(schema, "metrics"), key, _Aliases("_rm"))
    return qs, value


def _entity_path(schema: Schema, entity: str) -> str:
    path = {"tags": schema.tags, "params": schema.params, "metrics": schema.metrics}.get(entity)
    if path is None:
        allowed = ["attributes"] + [e for e in ("params", "tags", "metrics") if _has(schema, e)]
        said = ", ".join(allowed[:-1]) + " and " + allowed[-1] if len(allowed) > 1 else allowed[0]
        raise QueryError(f"{schema.noun} are searched by {said}, not {entity}")
    return path


def _has(schema: Schema, entity: str) -> bool:
    return getattr(schema, entity) is not None


def _attribute(schema: Schema, key: str) -> Attribute:
    name = schema.aliases.get(key, key)
    if name not in schema.attributes:
        raise QueryError(
            f"Invalid attribute key '{echo(key)}' specified. "
            f"Valid keys are {sorted(schema.attributes)}"
        )
    return schema.attributes[name]


def _condition(
    qs: QuerySet[Any], schema: Schema, c: Comparison, names: _Aliases
) -> tuple[QuerySet[Any], Q]:
    if c.entity == "attributes":
        attr = _attribute(schema, c.key)
        if attr.kind is Kind.MILLIS:
            return qs, _millis(attr.path, c)
        name = names()
        qs = qs.alias(**{name: F(attr.path)})
        if attr.kind is Kind.NUMBER:
            return qs, _number(name, c)
        return _text(qs, name, c, names)
    path = _entity_path(schema, c.entity)
    if c.entity == "metrics":
        return _metric(qs, path, c, names)
    if c.entity == "tags" and schema.tag_labels:
        name = names()
        return qs.alias(**{name: Cast(F(path), TextField())}), _label(name, c)
    name = names()
    qs = qs.alias(**{name: _json_text(c.key, path)})
    return _text(qs, name, c, names)


def _json_text(key: str, path: str) -> Cast:
    # Cast to plain text: a JSON key's own lookups would read the right-hand side as JSON.
    return Cast(KeyTextTransform(key, path), TextField())


def _text(qs: QuerySet[Any], name: str, c: Comparison, names: _Aliases) -> tuple[QuerySet[Any], Q]:
    present = Q(**{f"{name}__isnull": False})
    if c.op in ("IS NULL", "IS NOT NULL"):
        return qs, ~present if c.op == "IS NULL" else present
    if c.op in ("IN", "NOT IN"):
        inside = Q(**{f"{name}__in": list(c.value if isinstance(c.value, tuple) else ())})
        return qs, inside if c.op == "IN" else present & ~inside
    if c.op in ("LIKE", "ILIKE"):
        lookup = "regex" if c.op == "LIKE" else "iregex"
        return qs, Q(**{f"{name}__{lookup}": _like_regex(str(c.value))})
    if isinstance(c.value, float):
        # Text compared with a number: as a number where the text reads as one, else no match.
        number = names()
        as_number = Case(
            When(Q(**{f"{name}__regex": _NUMERIC_TEXT}), then=Cast(name, FloatField())),
            default=Value(None),
            output_field=FloatField(),
        )
        return qs.alias(**{number: as_number}), _number(number, c)
    if c.op not in ("=", "!="):
        raise QueryError(f"{c.entity}.{echo(c.key)}: strings compare with =, !=, LIKE, ILIKE or IN")
    equal = Q(**{name: Value(c.value, output_field=TextField())})
    return qs, equal if c.op == "=" else present & ~equal


# One character of a JSON string as stored: plain, \uXXXX, or another backslash escape.
_JSON_CHAR = r'(?:[^"\\]|\\u[0-9a-fA-F]{4}|\\.)'


def _label(name: str, c: Comparison) -> Q:
    """A comparison on a tag kept as a label, matched on the list's JSON text: a regex that
    spans one whole string element, so `team` never matches inside "my-team:nlp"."""
    if isinstance(c.value, float) or c.op in ("<", "<=", ">", ">="):
        raise QueryError(
            f"tags.{echo(c.key)}: tags are labels and compare with =, !=, LIKE, ILIKE, IN "
            "or IS [NOT] NULL, with a quoted string"
        )
    key = _json_literal(c.key)

    def element(value: str | None) -> str:
        # `value` is a regex of the part after the separator; None: any value or none.
        body = f"{key}(?:[:=]{_JSON_CHAR}*)?" if value is None else f"{key}[:=]{value}"
        if value == "":
            body = f"{key}(?:[:=])?"
        return rf'(^|[\[,])\s*"{body}"\s*(,|\])'

    present = Q(**{f"{name}__regex": element(None)})
    if c.op in ("IS NULL", "IS NOT NULL"):
        return ~present if c.op == "IS NULL" else present
    if c.op in ("LIKE", "ILIKE"):
        pattern = "".join(
            f"{_JSON_CHAR}*" if ch == "%" else _JSON_CHAR if ch == "_" else _json_literal(ch)
            for ch in str(c.value)
        )
        return Q(**{f"{name}__{'regex' if c.op == 'LIKE' else 'iregex'}": element(pattern)})
    values = c.value if isinstance(c.value, tuple) else (str(c.value),)
    if not values:
        inside = Q(pk__in=[])
    else:
        either = "|".join(_json_literal(v) for v in values)
        inside = Q(**{f"{name}__regex": element(f"(?:{either})")})
        if "" in values:
            inside |= Q(**{f"{name}__regex": element("")})
    return inside if c.op in ("=", "IN") else present & ~inside


def _json_literal(text: str) -> str:
    """A regex of `text` as a JSON string body stores it: PostgreSQL's jsonb keeps non-ASCII
    characters as they are, Django's JSON on SQLite writes them as \\uXXXX; both match."""
    out = []
    for ch in text:
        kept = json.dumps(ch, ensure_ascii=False)[1:-1]
        ascii_ = json.dumps(ch)[1:-1]
        out.append(
            re.escape(kept) if kept == ascii_ else f"(?:{re.escape(kept)}|{re.escape(ascii_)})"
        )
    return "".join(out)


def _like_regex(pattern: str) -> str:
    # LIKE's wildcards as a regex, the rest literal; (?s) reads the same in Python (SQLite's
    # REGEXP) and PostgreSQL: `.` matches a newline too.
    body = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return f"(?s)^{body}$"


def _number(name: str, c: Comparison) -> Q:
    if not isinstance(c.value, float):
        raise QueryError(f"{c.entity}.{echo(c.key)} compares with a number, not a string")
    if c.op not in ("!=", *_COMPARE):
        raise QueryError(f"{c.entity}.{echo(c.key)}: numbers compare with =, !=, <, <=, > or >=")
    rhs = Value(c.value, output_field=FloatField())
    if c.op == "!=":
        return Q(**{f"{name}__isnull": False}) & ~Q(**{name: rhs})
    return Q(**{f"{name}__{_COMPARE[c.op]}": rhs})


def _millis(path: str, c: Comparison) -> Q:
    """A datetime column read as floored epoch milliseconds, compared through its bounds so that
    the column's index serves the comparison."""
    if not isinstance(c.value, float):
        raise QueryError(f"{c.entity}.{echo(c.key)} compares with a number, not a string")
    # Clamped first: 1e400 reads as infinity, which has no floor.
    v = min(max(c.value, _MIN_MS - 1.0), _MAX_MS + 1.0)
    if c.op in ("=", "!="):
        # floor(ms) = v  <=>  v <= ms < v + 1, for an integer v; no time equals a fraction.
        same = (
            Q(**{f"{path}__gte": _at(v), f"{path}__lt": _at(v + 1)})
            if v == math.floor(v)
            else Q(pk__in=[])
        )
        return same if c.op == "=" else ~same
    bounds = {
        "<": ("lt", math.ceil(v)),
        "<=": ("lt", math.floor(v) + 1),
        ">": ("gte", math.floor(v) + 1),
        ">=": ("gte", math.ceil(v)),
    }
    if c.op not in bounds:
        raise QueryError(f"{c.entity}.{echo(c.key)}: numbers compare with =, !=, <, <=, > or >=")
    lookup, ms = bounds[c.op]
    return Q(**{f"{path}__{lookup}": _at(ms)})


def _at(ms: float) -> datetime:
    # Clamped to the datetimes a column holds: beyond them every comparison still reads right.
    return _EPOCH + timedelta(milliseconds=int(min(max(ms, _MIN_MS), _MAX_MS)))


def _metric_aliases(
    qs: QuerySet[Any], run_path: str, key: str, names: _Aliases
) -> tuple[QuerySet[Any], str, str]:
    """The run's latest value of `key` and whether it is a NaN, read through a LEFT JOIN on
    (run, key) rather than two subqueries per row: PostgreSQL hash-joins the key's rows once,
    where a correlated subquery probed the index for each of 100,000 runs (bench/runs_page.py)."""
    relation = "latest_metrics" if run_path == "pk" else f"{run_path}__latest_metrics"
    joined = names.metric_joins.get(key)
    if joined is None:
        joined = names.metric_joins[key] = names()
        on_key = FilteredRelation(relation, condition=Q(**{f"{relation}__key": key}))
        qs = qs.alias(**{joined: on_key})
    return qs, f"{joined}__value", f"{joined}__is_nan"


def _metric(
    qs: QuerySet[Any], run_path: str, c: Comparison, names: _Aliases
) -> tuple[QuerySet[Any], Q]:
    qs, value, nan = _metric_aliases(qs, run_path, c.key, names)
    # A NaN is stored as a null value: it fails every comparison but `!=`, as in IEEE and MLflow.
    condition = _number(value, c)
    return qs, condition | Q(**{nan: True}) if c.op == "!=" else condition


def _sort(
    qs: QuerySet[Any], schema: Schema, key: OrderKey, names: _Aliases
) -> tuple[QuerySet[Any], list[SortColumn]]:
    if key.entity == "metrics":
        qs, value, nan = _metric_aliases(qs, _entity_path(schema, "metrics"), key.key, names)
        number, is_nan = names(), names()
        # MLflow's order: numbers, then NaN, then runs without the metric, in either direction.
        # A NaN's value is NULL (numbers first, NULLS LAST) and among the NULLs is_nan sorts
        # true (a NaN) before NULL (no row: no metric); plain columns, so no CASE per row.
        qs = qs.annotate(**{number: F(value), is_nan: F(nan)})
        return qs, [
            SortColumn(number, key.ascending),
            SortColumn(is_nan, ascending=False),
        ]
    if key.entity == "attributes":
        attribute = _attribute(schema, key.key)
        name = names()
        qs = qs.annotate(**{name: F(attribute.path)})
        return qs, [SortColumn(name, key.ascending, nullable=attribute.nullable)]
    if key.entity == "tags" and schema.tag_labels:
        raise QueryError(f"{schema.noun} are not sorted by a tag")
    name = names()
    expression = _json_text(key.key, _entity_path(schema, key.entity))
    return qs.annotate(**{name: expression}), [SortColumn(name, key.ascending)]


def _direction(column: SortColumn) -> OrderBy:
    if not column.nullable:
        return F(column.name).asc() if column.ascending else F(column.name).desc()
    return (
        F(column.name).asc(nulls_last=True)
        if column.ascending
        else F(column.name).desc(nulls_last=True)
    )
