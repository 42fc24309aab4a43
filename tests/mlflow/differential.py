"""The machinery of tests/mlflow/test_differential.py: run one scenario with the stock client
against a server, record what it answered as flat `path -> value` fields, and normalise what two
servers may legitimately answer differently (ids, times, page tokens) before comparing."""

from __future__ import annotations

import enum
import fnmatch
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Set by the server when a thing is made or changed: compared as present or not, and through the
# orderings a scenario records itself (`end_time >= start_time`).
SERVER_TIMES = {
    "start_time",
    "end_time",
    "creation_time",
    "last_update_time",
    "creation_timestamp",
    "last_updated_timestamp",
}
# Opaque to a client: only whether there is a next page is compared.
TOKENS = {"token", "next_page_token"}
# Values that cannot be equal across servers: the server's own storage location.
LOCATIONS = {"artifact_location", "artifact_uri", "model_uri"}


class Side:
    """One server as a scenario sees it: the stock `MlflowClient`, names unique to the scenario
    (the MLflow server lives for the module; Runcast's database is emptied after each test),
    and what the scenario recorded."""

    def __init__(self, uri: str, prefix: str) -> None:
        from mlflow import MlflowClient

        self.uri = uri
        self.prefix = prefix
        self.client = MlflowClient(tracking_uri=uri)
        self.ids: dict[str, str] = {}
        self.fields: dict[str, Any] = {}

    def name(self, text: str) -> str:
        return f"{self.prefix}-{text}"

    def made(self, raw: str, kind: str) -> str:
        """Note an id the server made; it is compared as `<kind>#<n>`, n counting creations."""
        if raw not in self.ids:
            self.ids[raw] = f"{kind}#{sum(v.startswith(kind) for v in self.ids.values()) + 1}"
        return raw

    def record(self, label: str, value: Any) -> None:
        assert label not in self.fields, f"{label} recorded twice"
        self.fields[label] = plain(value)

    def attempt(self, label: str, call: Callable[[], Any]) -> Any:
        """Record what `call` answers, or the error code it raises (never the message, which
        differs in words)."""
        from mlflow.exceptions import MlflowException

        try:
            answer = call()
        except MlflowException as error:
            self.record(label, {"error_code": error.error_code})
            return None
        self.record(label, answer if answer is not None else "ok")
        return answer

    def rest(self, endpoint: str, body: dict[str, Any] | None = None, **params: Any) -> Any:
        """A GET (or with a body, a POST) the client has no method for, or sends only in
        pieces, through the client's own HTTP layer."""
        from mlflow.utils.rest_utils import http_request

        creds = self.client._tracking_client.store.get_host_creds()
        if body is None:
            answer = http_request(creds, endpoint, "GET", params=params, max_retries=0)
        else:
            answer = http_request(creds, endpoint, "POST", json=body, max_retries=0)
        body = answer.json()
        return body if answer.ok else {"error_code": body.get("error_code")}


def plain(value: Any) -> Any:
    """An MLflow entity, paged list or proto value as dicts, lists and scalars."""
    from mlflow.entities._mlflow_object import _MlflowObject
    from mlflow.store.entities.paged_list import PagedList

    if isinstance(value, PagedList):
        return {"items": [plain(v) for v in value], "token": value.token}
    if isinstance(value, _MlflowObject):
        return {k: plain(v) for k, v in value}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def flatten(value: Any, path: str, into: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            flatten(item, f"{path}.{key}", into)
    elif isinstance(value, list) and value:
        into[f"{path}.len"] = len(value)
        for i, item in enumerate(value):
            flatten(item, f"{path}[{i}]", into)
    else:
        into[path] = value


def normalise(side: Side) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for label, value in side.fields.items():
        flatten(value, label, flat)
    return {path: normal_value(path, value, side.ids) for path, value in flat.items()}


def normal_value(path: str, value: Any, ids: dict[str, str]) -> Any:
    last = path.rsplit(".", 1)[-1]
    if last in SERVER_TIMES or last in TOKENS:
        return "set" if value else value
    if last in LOCATIONS:
        return "set" if value else value
    if isinstance(value, str):
        # An MLflow server's experiment ids are small integers ("3"), which a param or tag value
        # can equal: they are mapped only where the field says it is one. Run and model ids
        # (32 hex digits, `m-` and 32) are mapped wherever they appear, in tags and paths too.
        if value in ids and (not ids[value].startswith("exp#") or last == "experiment_id"):
            return ids[value]
        if "/" in value:  # a run or model id inside a path
            return "/".join(_long_id(part, ids) for part in value.split("/"))
    return value


def _long_id(part: str, ids: dict[str, str]) -> str:
    mapped = ids.get(part, part)
    return part if mapped.startswith("exp#") else mapped


@dataclass
class Comparison:
    theirs: dict[str, Any]
    ours: dict[str, Any]
    expected: dict[str, str]
    differing: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path in sorted(self.theirs.keys() | self.ours.keys()):
            a, b = self.theirs.get(path, "<absent>"), self.ours.get(path, "<absent>")
            if a != b:
                self.differing[path] = (a, b)

    def explained(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in self.expected)

    def new(self) -> dict[str, tuple[Any, Any]]:
        return {p: v for p, v in self.differing.items() if not self.explained(p)}

    def stale(self) -> list[str]:
        """Expected differences that no longer occur: fixed, so the entry must go."""
        return [
            pattern
            for pattern in self.expected
            if not any(fnmatch.fnmatchcase(p, pattern) for p in self.differing)
        ]

    def every(self) -> dict[str, tuple[Any, Any]]:
        paths = sorted(self.theirs.keys() | self.ours.keys())
        return {p: (self.theirs.get(p, "<absent>"), self.ours.get(p, "<absent>")) for p in paths}

    def describe(self, paths: dict[str, tuple[Any, Any]], limit: int = 40) -> str:
        lines = [f"  {path}: mlflow={a!r} runcast={b!r}" for path, (a, b) in paths.items()]
        more = f"\n  … and {len(lines) - limit} more" if len(lines) > limit else ""
        return "\n".join(lines[:limit]) + more

    def figures(self) -> dict[str, int]:
        fields = len(self.theirs.keys() | self.ours.keys())
        return {
            "fields": fields,
            "identical": fields - len(self.differing),
            "expected_differences": len(self.differing),
        }
