"""The part of MLflow's search syntax that clients' common calls send, for runs and experiments.

    metrics.loss < 0.5 AND params.lr = '0.001' AND tags.`mlflow.parentRunId` = 'abc'
    attributes.status = 'FINISHED'    run_name LIKE 'bert-%'    attributes.run_id IN ('a', 'b')

Clauses are joined by AND; comparisons are =, !=, <, <=, >, >= (numbers for metrics and times,
strings otherwise), LIKE / ILIKE (`%` and `_` wildcards), IN / NOT IN with a parenthesised list.
`order_by` takes `<entity>.<key> [ASC|DESC]`. Anything else is refused with
INVALID_PARAMETER_VALUE naming the part not understood, never silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracker.mlflow.errors import invalid

_ENTITIES = {
    "metric": "metrics",
    "metrics": "metrics",
    "param": "params",
    "params": "params",
    "parameter": "params",
    "parameters": "params",
    "tag": "tags",
    "tags": "tags",
    "attribute": "attributes",
    "attributes": "attributes",
    "attr": "attributes",
    "run": "attributes",
}
_CLAUSE = re.compile(
    r"""\s*
    (?P<ident>
        (?:[A-Za-z_]+\.)?(?:`[^`]+`|"[^"]+"|[\w.:/\- ]+?)
    )
    \s*(?P<op>!=|<=|>=|=|<|>|\bNOT\s+IN\b|\bIN\b|\bILIKE\b|\bLIKE\b)\s*
    (?P<value>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\([^)]*\)|[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)
    \s*""",
    re.VERBOSE | re.IGNORECASE,
)
_AND = re.compile(r"\s*AND\s+", re.IGNORECASE)
_QUOTED_ITEM = re.compile(r"""\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\s*(?:,|$)""")


@dataclass(frozen=True)
class Clause:
    entity: str  # metrics, params, tags, attributes
    key: str
    op: str
    value: Any  # str, float, or a tuple of str for IN


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"`":
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _identifier(ident: str, *, default_entity: str) -> tuple[str, str]:
    ident = ident.strip()
    head, dot, rest = ident.partition(".")
    if dot and head.lower() in _ENTITIES:
        return _ENTITIES[head.lower()], _unquote(rest.strip())
    return default_entity, _unquote(ident)


def _value(raw: str, op: str) -> Any:
    if op in ("IN", "NOT IN"):
        inner = raw.strip()[1:-1]
        items, pos = [], 0
        while pos < len(inner):
            m = _QUOTED_ITEM.match(inner, pos)
            if not m:
                raise invalid(f"Invalid list in filter: {raw!r}; use ('a', 'b')")
            items.append(_unquote(m.group(1)))
            pos = m.end()
        return tuple(items)
    if raw[0] in "'\"":
        return _unquote(raw)
    return float(raw)


def parse_filter(text: str, *, default_entity: str = "attributes") -> list[Clause]:
    clauses: list[Clause] = []
    pos, text = 0, text or ""
    while pos < len(text.strip()):
        m = _CLAUSE.match(text, pos)
        if m is None:
            raise invalid(f"Invalid filter '{text}': could not parse near '{text[pos:][:60]}'")
        op = re.sub(r"\s+", " ", m.group("op").upper())
        entity, key = _identifier(m.group("ident"), default_entity=default_entity)
        clauses.append(Clause(entity, key, op, _value(m.group("value"), op)))
        pos = m.end()
        if pos < len(text):
            and_ = _AND.match(text, pos)
            if and_ is None:
                raise invalid(f"Invalid filter '{text}': expected AND near '{text[pos:][:60]}'")
            pos = and_.end()
    return clauses


def _like(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    parts = [".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern]
    return re.compile("^" + "".join(parts) + "$", (re.IGNORECASE if ignore_case else 0) | re.DOTALL)


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def matches(clause: Clause, actual: Any) -> bool:
    """Does one entity's value satisfy the clause? A missing key never matches (as in MLflow)."""
    if actual is None:
        return False
    if clause.op in ("IN", "NOT IN"):
        inside = str(actual) in clause.value
        return inside if clause.op == "IN" else not inside
    if clause.op in ("LIKE", "ILIKE"):
        if not isinstance(clause.value, str):
            raise invalid(f"{clause.op} needs a quoted pattern for {clause.entity}.{clause.key}")
        return bool(_like(clause.value, ignore_case=clause.op == "ILIKE").match(str(actual)))
    expected = clause.value
    if isinstance(expected, float):
        try:
            actual = float(actual)
        except (TypeError, ValueError):
            return False
    elif clause.entity == "metrics" or isinstance(actual, int | float):
        raise invalid(f"{clause.entity}.{clause.key} compares with a number, not a string")
    else:
        actual = str(actual)
        if clause.op not in ("=", "!="):
            raise invalid(
                f"{clause.entity}.{clause.key}: strings compare with =, !=, LIKE, ILIKE or IN"
            )
    return _COMPARE[clause.op](actual, expected)


@dataclass(frozen=True)
class OrderKey:
    entity: str
    key: str
    ascending: bool


def parse_order_by(items: list[str]) -> list[OrderKey]:
    out = []
    for item in items:
        text = item.strip()
        ascending = True
        word = text.rsplit(None, 1)
        if len(word) == 2 and word[1].upper() in ("ASC", "DESC"):
            text, ascending = word[0], word[1].upper() == "ASC"
        entity, key = _identifier(text, default_entity="attributes")
        if not key:
            raise invalid(f"Invalid order_by clause '{item}'")
        out.append(OrderKey(entity, key, ascending))
    return out
