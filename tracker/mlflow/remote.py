"""A small client of MLflow's tracking REST API, for the mirror: the few calls the importer and
the mirror make, with the names and shapes of `mlflow.MlflowClient`'s, so the server needs no
mlflow package. Every request goes through the outbound seam (config/outbound.py): one deadline
per request, a bounded answer, no redirects, and the address check unless an operator chose
the server. Errors are `RemoteError`s whose message names the server and never the token.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from config import outbound

API = "/api/2.0/mlflow"
TIMEOUT_S = 15.0
# A page of 1,000 runs with their params, tags and latest metrics, or of 25,000 history points
# (~100 bytes each in MLflow's JSON), fits well inside this; a larger answer is refused whole.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
# MLflow's server caps a page of metric history at 25,000 (GET_METRIC_HISTORY_MAX_RESULTS).
HISTORY_PAGE_MAX = 25_000


class RemoteError(Exception):
    """The MLflow server could not be read; `message` is safe to show and to log."""

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Page(list[Any]):
    """A page of results with the next page's token, as MLflow's PagedList."""

    def __init__(self, items: list[Any], token: str | None) -> None:
        super().__init__(items)
        self.token = token


@dataclass(frozen=True)
class RemoteExperiment:
    experiment_id: str
    name: str
    tags: dict[str, str]


@dataclass(frozen=True)
class RemoteMetric:
    key: str
    value: float
    timestamp: int
    step: int


@dataclass(frozen=True)
class RemoteRunInfo:
    run_id: str
    run_name: str
    user_id: str
    status: str
    start_time: int | None
    end_time: int | None


@dataclass(frozen=True)
class RemoteRunData:
    params: dict[str, str]
    tags: dict[str, str]
    # Each key's latest value, as MlflowClient's Run.data.metrics; `latest` has the whole point.
    metrics: dict[str, float]
    latest: dict[str, RemoteMetric] = field(default_factory=dict)


@dataclass(frozen=True)
class RemoteRun:
    info: RemoteRunInfo
    data: RemoteRunData


def _pairs(items: Any) -> dict[str, str]:
    return {str(i["key"]): str(i.get("value", "")) for i in items or [] if "key" in i}


def _int_or_none(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


def _metric(m: dict[str, Any]) -> RemoteMetric:
    # MLflow writes NaN and infinities as the strings "NaN" and "Infinity"; float() reads both.
    return RemoteMetric(
        key=str(m["key"]),
        value=float(m.get("value", "NaN")),
        timestamp=int(m.get("timestamp", 0)),
        step=int(m.get("step", 0)),
    )


def _run(raw: dict[str, Any]) -> RemoteRun:
    info, data = raw.get("info", {}), raw.get("data", {})
    latest = {m.key: m for m in (_metric(x) for x in data.get("metrics") or [])}
    return RemoteRun(
        info=RemoteRunInfo(
            run_id=str(info.get("run_id") or info["run_uuid"]),
            run_name=str(info.get("run_name", "")),
            user_id=str(info.get("user_id", "")),
            status=str(info.get("status", "RUNNING")),
            start_time=_int_or_none(info.get("start_time")),
            end_time=_int_or_none(info.get("end_time")),
        ),
        data=RemoteRunData(
            params=_pairs(data.get("params")),
            tags=_pairs(data.get("tags")),
            metrics={k: m.value for k, m in latest.items()},
            latest=latest,
        ),
    )


def _shape_error(url: str, endpoint: str, e: Exception) -> RemoteError:
    return RemoteError(
        f"MLflow server {url}: {endpoint} answered JSON not shaped as MLflow's "
        f"({type(e).__name__}: {str(e)[:80]})"
    )


class RemoteMlflow:
    """`search_experiments`, `search_runs` and `get_metric_history` as MlflowClient answers them
    (what tracker.mlflow.importer calls), and `metric_history_page` for the mirror's cursors."""

    def __init__(
        self,
        url: str,
        *,
        token: str = "",
        username: str = "",
        private_ok: bool = False,
        timeout: float = TIMEOUT_S,
    ) -> None:
        self.url = url.strip().rstrip("/")
        self._auth = ""
        if username:
            pair = base64.b64encode(f"{username}:{token}".encode()).decode()
            self._auth = f"Basic {pair}"
        elif token:
            self._auth = f"Bearer {token}"
        self.private_ok = private_ok
        self.timeout = timeout

    def __repr__(self) -> str:  # never the token
        return f"RemoteMlflow({self.url!r})"

    def _call(
        self,
        method: str,
        endpoint: str,
        *,
        query: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        url = f"{self.url}{API}/{endpoint}"
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v not in (None, "")})
        headers = {"Authorization": self._auth} if self._auth else {}
        try:
            answer = outbound.request_json(
                method,
                url,
                body=body,
                headers=headers,
                timeout=self.timeout,
                max_bytes=MAX_ANSWER_BYTES,
                private_ok=self.private_ok,
            )
        except outbound.TransportError as e:
            raise RemoteError(f"MLflow server {self.url}: {e.message}") from e
        # Before the body is read as JSON: MLflow's basic-auth app and proxies answer a refused
        # credential with text or HTML.
        if answer.status in (401, 403):
            raise RemoteError(
                f"MLflow server {self.url}: HTTP {answer.status}, the token was refused "
                "(set the mirror's token)",
                code="UNAUTHENTICATED",
            )
        try:
            parsed = json.loads(answer.text) if answer.text.strip() else {}
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise RemoteError(
                f"MLflow server {self.url}: {endpoint} answered HTTP {answer.status} with "
                "something other than MLflow's JSON (is this the tracking server's address?)"
            )
        if not 200 <= answer.status < 300:
            code = str(parsed.get("error_code", ""))[:64]
            message = str(parsed.get("message", ""))[:200]
            raise RemoteError(
                f"MLflow server {self.url}: {endpoint} answered HTTP {answer.status} "
                f"{code}: {message}".rstrip(": "),
                code=code,
            )
        return parsed

    def search_experiments(self, *, max_results: int = 1000, page_token: str | None = None) -> Page:
        answer = self._call(
            "POST",
            "experiments/search",
            body={
                "max_results": max_results,
                "page_token": page_token or "",
                "view_type": "ACTIVE_ONLY",
            },
        )
        try:
            experiments = [
                RemoteExperiment(
                    experiment_id=str(e["experiment_id"]),
                    name=str(e["name"]),
                    tags=_pairs(e.get("tags")),
                )
                for e in answer.get("experiments") or []
            ]
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise _shape_error(self.url, "experiments/search", e) from e
        return Page(experiments, answer.get("next_page_token") or None)

    def search_runs(
        self,
        experiment_ids: list[str],
        filter_string: str = "",
        max_results: int = 1000,
        page_token: str | None = None,
    ) -> Page:
        answer = self._call(
            "POST",
            "runs/search",
            body={
                "experiment_ids": experiment_ids,
                "filter": filter_string,
                "max_results": max_results,
                "page_token": page_token or "",
                "run_view_type": "ACTIVE_ONLY",
            },
        )
        try:
            runs = [_run(r) for r in answer.get("runs") or []]
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise _shape_error(self.url, "runs/search", e) from e
        return Page(runs, answer.get("next_page_token") or None)

    def metric_history_page(
        self, run_id: str, key: str, *, page_token: str | None, max_results: int
    ) -> Page:
        """One page of a key's history in MLflow's order (timestamp, step, value)."""
        answer = self._call(
            "GET",
            "metrics/get-history",
            query={
                "run_id": run_id,
                "metric_key": key,
                "max_results": max_results,
                "page_token": page_token,
            },
        )
        try:
            points = [_metric(m) for m in answer.get("metrics") or []]
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise _shape_error(self.url, "metrics/get-history", e) from e
        return Page(points, answer.get("next_page_token") or None)

    def get_metric_history(self, run_id: str, key: str) -> list[RemoteMetric]:
        points: list[RemoteMetric] = []
        token = None
        while True:
            page = self.metric_history_page(
                run_id, key, page_token=token, max_results=HISTORY_PAGE_MAX
            )
            points += page
            token = page.token
            if not token:
                return points
