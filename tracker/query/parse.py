"""The MLflow search-filter language, read into comparisons (the AST the compiler takes).

    metrics.loss < 0.5 AND params.lr = '0.001' AND tags.`mlflow.parentRunId` = 'abc'
    attributes.status = 'FINISHED'    run_name LIKE 'bert-%'    tags.team IS NULL

Comparisons are joined by AND; operators are =, !=, <, <=, >, >=, LIKE, ILIKE (`%` and `_`
wildcards), IN / NOT IN with a parenthesised list of strings, and IS [NOT] NULL (tags and params,
as in MLflow). Values are quoted strings or numbers. An identifier is `<entity>.<key>` or a bare
attribute; a key may be quoted with backticks or double quotes, or be bare words (spaces allowed,
as MLflow's key names allow them, but never a keyword: `tags.team IS NULL` is the key `team`).
Anything else raises QueryError naming the text not understood and its position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tracker.limits import echo

ENTITIES = {
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
_KEYWORDS = frozenset(("AND", "IS", "IN", "NOT", "LIKE", "ILIKE", "NULL"))
_WORD = re.compile(r"[\w.:/\-]+")
_QUOTED_KEY = re.compile(r"""(?:[A-Za-z_]+\.)?(?:`[^`]+`|"[^"]+")""")
_OP = re.compile(
    r"IS\s+NOT\s+NULL\b|IS\s+NULL\b|NOT\s+IN\b|IN\b|ILIKE\b|LIKE\b|!=|<=|>=|=|<|>", re.IGNORECASE
)
_STRING = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\"""")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
_LIST = re.compile(r"\(([^)]*)\)")
_LIST_ITEM = re.compile(r"""\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\s*(?:,|$)""")
_AND = re.compile(r"AND\b", re.IGNORECASE)
_SPACE = re.compile(r"\s*")

Value = str | float | tuple[str, ...] | None


class QueryError(ValueError):
    """A filter or order the language does not allow; `position` is where in the text, if known."""

    def __init__(self, message: str, *, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


@dataclass(frozen=True)
class Comparison:
    entity: str  # metrics, params, tags, attributes
    key: str
    op: str  # =, !=, <, <=, >, >=, LIKE, ILIKE, IN, NOT IN, IS NULL, IS NOT NULL
    value: Value  # str or float; a tuple of str for IN; None for IS [NOT] NULL
    # Where the comparison starts in the filter text, so that an error found while compiling
    # (a key the schema does not have) points at it as a parse error does; not part of equality.
    position: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class OrderKey:
    entity: str
    key: str
    ascending: bool


def unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"`":
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def identifier(text: str, *, default_entity: str = "attributes") -> tuple[str, str]:
    """(entity, key) of `<entity>.<key>`, or of a bare key (the default entity's)."""
    text = text.strip()
    head, dot, rest = text.partition(".")
    if dot and head.lower() in ENTITIES:
        return ENTITIES[head.lower()], unquote(rest.strip())
    return default_entity, unquote(text)


class _Reader:
    """A cursor over the filter text; every failure names the text near it and its position."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def fail(self, what: str, at: int | None = None) -> QueryError:
        at = self.pos if at is None else at
        near = echo(self.text[at:])
        return QueryError(
            f"Invalid filter '{echo(self.text)}': {what} near '{near}' (position {at})",
            position=at,
        )

    def skip_space(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def take(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        m = pattern.match(self.text, self.pos)
        if m is not None:
            self.pos = m.end()
            self.skip_space()
        return m

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def key(self) -> str:
        quoted = self.take(_QUOTED_KEY)
        if quoted is not None:
            return quoted.group()
        start, end = self.pos, None
        # Words up to the operator: a key may hold spaces, but a keyword ends it.
        while (word := _WORD.match(self.text, self.pos)) and word.group().upper() not in _KEYWORDS:
            end = word.end()
            self.pos = end
            self.skip_space()
        if end is None:
            raise self.fail("could not parse", start)
        return self.text[start:end]

    def value(self, op: str) -> Value:
        if op in ("IS NULL", "IS NOT NULL"):
            return None
        if op in ("IN", "NOT IN"):
            start = self.pos
            items = self.take(_LIST)
            if items is None:
                raise self.fail(f"{op} needs a list like ('a', 'b')")
            return _list(items.group(1), self.text[start : items.end()])
        string = self.take(_STRING)
        if string is not None:
            return unquote(string.group())
        number = self.take(_NUMBER)
        if number is None:
            raise self.fail("expected a quoted string or a number")
        return float(number.group())


def _list(inner: str, raw: str) -> tuple[str, ...]:
    items, pos = [], 0
    while pos < len(inner):
        m = _LIST_ITEM.match(inner, pos)
        if m is None:
            raise QueryError(f"Invalid list in filter: {echo(raw)!r}; use ('a', 'b')")
        items.append(unquote(m.group(1)))
        pos = m.end()
    return tuple(items)


def parse(text: str | None, *, default_entity: str = "attributes") -> list[Comparison]:
    """The comparisons of a filter (all must hold); an empty filter has none."""
    reader = _Reader(text or "")
    reader.skip_space()
    out: list[Comparison] = []
    while not reader.at_end():
        start = reader.pos
        entity, key = identifier(reader.key(), default_entity=default_entity)
        op_match = reader.take(_OP)
        if op_match is None:
            raise reader.fail("could not parse")
        op = re.sub(r"\s+", " ", op_match.group().upper())
        comparison = Comparison(entity, key, op, reader.value(op), position=start)
        try:
            out.append(_checked(comparison))
        except QueryError as exc:
            raise at(exc, comparison) from None
        if reader.at_end():
            break
        if reader.take(_AND) is None:
            raise reader.fail("expected AND")
        if reader.at_end():
            raise reader.fail("expected a comparison after AND")
    return out


def at(exc: QueryError, c: Comparison) -> QueryError:
    """The error pointing at the comparison it is about, unless it points somewhere already."""
    if exc.position is not None or c.position is None:
        return exc
    return QueryError(f"{exc} (position {c.position})", position=c.position)


def _checked(c: Comparison) -> Comparison:
    """The rules that hang on the entity alone (MLflow's); attribute rules need the schema."""
    if c.op in ("IS NULL", "IS NOT NULL") and c.entity not in ("tags", "params"):
        raise QueryError(
            "IS NULL / IS NOT NULL is only supported for tags and params, "
            f"not for {c.entity} '{echo(c.key)}'"
        )
    if c.entity == "metrics":
        if c.op in ("LIKE", "ILIKE", "IN", "NOT IN"):
            raise QueryError(f"metrics.{echo(c.key)}: metrics compare with =, !=, <, <=, > or >=")
        if not isinstance(c.value, float):
            raise QueryError(f"metrics.{echo(c.key)} compares with a number, not a string")
    if c.op in ("LIKE", "ILIKE") and not isinstance(c.value, str):
        raise QueryError(f"{c.op} needs a quoted pattern for {c.entity}.{echo(c.key)}")
    return c


def parse_order_by(items: list[str]) -> list[OrderKey]:
    """`<entity>.<key> [ASC|DESC]` each; ascending unless DESC."""
    out = []
    for item in items:
        text = item.strip()
        ascending = True
        word = text.rsplit(None, 1)
        if len(word) == 2 and word[1].upper() in ("ASC", "DESC"):
            text, ascending = word[0], word[1].upper() == "ASC"
        text = text.strip()
        entity, key = identifier(text)
        # A key with a space must be quoted here, as in MLflow: `metrics.loss UP` is a clause
        # with a bad direction, not the key "loss UP".
        if not key or (re.search(r"\s", text) and not _QUOTED_KEY.fullmatch(text)):
            raise QueryError(f"Invalid order_by clause '{echo(item)}'")
        out.append(OrderKey(entity, key, ascending))
    return out
