"""An in-memory Runcast server speaking the /api/v1 contract, on a real local socket.

Its limits and enumerations are the real server's (tracker.limits, tracker.models, the API
schemas), imported rather than copied, so a changed limit reaches the client tests too.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, get_args

from tracker import limits
from tracker.api.schemas import FinishIn
from tracker.models import Event

TOKEN = "rc_testprefix_s3cretvalue"
# The real server's contract, not a copy of it (tests/client/test_contract.py checks that the
# client's own constants equal these).
EVENT_KINDS = frozenset(Event.Kind.values)
FINISH_STATUSES = frozenset(get_args(FinishIn.model_fields["status"].annotation))

# A scripted answer: (status, json body, extra headers). Returned instead of the real
# handling for the next matching request.
Scripted = tuple[int, dict, dict]


@dataclass
class RunState:
    id: str
    body: dict
    attempts: dict[str, int] = field(default_factory=dict)
    seqs: set[tuple[str, int]] = field(default_factory=set)
    points: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    heartbeats: list[float] = field(default_factory=list)
    finishes: list[dict] = field(default_factory=list)
    # /timings bodies as accepted (one per rank batch), deduplicated by (session, seq).
    timings: list[dict] = field(default_factory=list)


@dataclass
class State:
    runs: dict[str, RunState] = field(default_factory=dict)
    requests: list[tuple[float, str, int]] = field(default_factory=list)
    duplicates: int = 0
    auth_headers: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    # kind ("create" | "batch" | "finish") -> queue of scripted answers
    script: dict[str, list[Scripted]] = field(default_factory=dict)
    # Optional hook deciding a batch answer from its body (e.g. reject one seq).
    batch_hook: Callable[[dict], Scripted | None] | None = None
    delay_s: float = 0.0
    # kind -> gate: requests of that kind are held unanswered until the gate is set.
    gates: dict[str, threading.Event] = field(default_factory=dict)
    stalled: int = 0  # requests that have reached a closed gate

    def total_points(self) -> int:
        return sum(len(p) for run in self.runs.values() for p in run.points.values())

    def count(self, kind: str) -> int:
        return sum(1 for _, k, _ in self.requests if k == kind)


class FakeServer:
    def __init__(self, port: int = 0) -> None:
        self.state = State()
        self.lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # A short poll interval keeps stop() (shutdown) from costing 0.5 s per test.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        for gate in list(self.state.gates.values()):
            gate.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def run(self, run_id: str | None = None) -> RunState:
        with self.lock:
            if run_id is None:
                (only,) = self.state.runs.values()
                return only
            return self.state.runs[run_id]

    def stall(self, kind: str) -> threading.Event:
        """Hold every `kind` request unanswered until the returned event is set."""
        gate = threading.Event()
        with self.lock:
            self.state.gates[kind] = gate
        return gate

    def script(self, kind: str, *answers: Scripted) -> None:
        with self.lock:
            self.state.script.setdefault(kind, []).extend(answers)

    # -- request handling ---------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                status, body, headers = server.handle(
                    self.path, self.headers.get("Authorization", ""), raw
                )
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                return None

        return Handler

    def handle(self, path: str, auth: str, raw: bytes) -> Scripted:
        if self.state.delay_s:
            time.sleep(self.state.delay_s)
        kind, run_id = _route(path)
        gate = self.state.gates.get(kind)
        if gate is not None and not gate.is_set():
            with self.lock:
                self.state.stalled += 1
            gate.wait(60)  # bounded, so a forgotten gate cannot hang the suite
        with self.lock:
            self.state.requests.append((time.time(), kind, len(raw)))
            self.state.auth_headers.append(auth)
            self.state.paths.append(path)
            scripted = self.state.script.get(kind)
            if scripted:
                return scripted.pop(0)
            if auth != f"Bearer {TOKEN}":
                return 401, {"error": "invalid token"}, {}
            if len(raw) > limits.MAX_REQUEST_BYTES:
                return 413, {"error": "body too large"}, {}
            try:
                body = json.loads(raw)
            except ValueError:
                return 400, {"error": "invalid json"}, {}
            return self._dispatch(kind, run_id, body)

    def _dispatch(self, kind: str, run_id: str | None, body: dict) -> Scripted:
        if kind == "create":
            return self._create(body)
        run = self.state.runs.get(run_id or "")
        if run is None:
            return 404, {"error": "run not found"}, {}
        if kind == "batch":
            return self._batch(run, body)
        if kind == "timings":
            key = (body["session"], body["seq"])
            if key in run.seqs:
                self.state.duplicates += 1
                return 200, {"accepted": 0, "duplicate": True}, {}
            run.seqs.add(key)
            run.timings.append(body)
            return 200, {"accepted": len(body["steps"]), "duplicate": False}, {}
        if kind == "finish":
            if body.get("status", "finished") not in FINISH_STATUSES:
                return 400, {"error": "bad status", "field": "status"}, {}
            run.finishes.append(body)
            return 200, {"ok": True}, {}
        return 404, {"error": "no route"}, {}

    def _create(self, body: dict) -> Scripted:
        for key in ("id", "session", "progress_unit", "config", "tags", "hosts", "started_at"):
            if key not in body:
                return 400, {"error": "missing", "field": key}, {}
        run = self.state.runs.get(body["id"])
        if run is None:
            run = self.state.runs[body["id"]] = RunState(body["id"], body)
        if body["session"] not in run.attempts:
            run.attempts[body["session"]] = len(run.attempts) + 1
        attempt = run.attempts[body["session"]]
        reply = {"id": run.id, "attempt": attempt, "segment": attempt, "url": f"/runs/{run.id}"}
        return 201, reply, {}

    def _batch(self, run: RunState, body: dict) -> Scripted:
        hook = self.state.batch_hook
        if hook is not None:
            answer = hook(body)
            if answer is not None:
                return answer
        error = _validate_batch(run, body)
        if error is not None:
            return error
        key = (body["session"], body["seq"])
        if key in run.seqs:
            self.state.duplicates += 1
            return 200, {"accepted": 0, "duplicate": True}, {}
        run.seqs.add(key)
        accepted = 0
        for name, column in body["metrics"].items():
            pairs = list(zip(column["steps"], column["values"], strict=True))
            run.points.setdefault(name, []).extend(pairs)
            accepted += len(pairs)
        run.events.extend(body["events"])
        if body.get("heartbeat") is not None:
            run.heartbeats.append(body["heartbeat"])
        return 200, {"accepted": accepted + len(body["events"]), "duplicate": False}, {}


def _route(path: str) -> tuple[str, str | None]:
    if path == "/api/v1/runs":
        return "create", None
    match = re.fullmatch(r"/api/v1/runs/([^/]+)/(batches|finish|timings)", path)
    if match is None:
        return "unknown", None
    kind = {"batches": "batch", "finish": "finish", "timings": "timings"}[match.group(2)]
    return kind, match.group(1)


def _validate_batch(run: RunState, body: dict) -> Scripted | None:
    if body.get("session") not in run.attempts:
        return 400, {"error": "unknown session", "field": "session"}, {}
    if not isinstance(body.get("seq"), int) or body["seq"] < 1:
        return 400, {"error": "bad seq", "field": "seq"}, {}
    points = 0
    for column in body["metrics"].values():
        n = len(column["steps"])
        if not n == len(column["values"]) == len(column["times"]):
            return 400, {"error": "ragged columns", "field": "metrics"}, {}
        points += n
    for event in body["events"]:
        if event.get("kind") not in EVENT_KINDS:
            return 400, {"error": "bad event kind", "field": "events"}, {}
    if len(body["metrics"]) > limits.MAX_KEYS_PER_BATCH:
        return 413, {"error": "too many keys", "field": "metrics"}, {}
    if points > limits.MAX_POINTS_PER_BATCH:
        return 413, {"error": "too many points", "field": "metrics"}, {}
    if len(body["events"]) > limits.MAX_EVENTS_PER_BATCH:
        return 413, {"error": "too many events", "field": "events"}, {}
    return None
