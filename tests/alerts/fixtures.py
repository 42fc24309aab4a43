"""Real local servers standing in for the outside world: an SMTP server (aiosmtpd) and an HTTP
sink (http.server in a thread) for Slack and webhooks. Both are started once per session and
emptied before each test; each test points settings at them through the `settings` fixture.
A trickler (a raw socket server answering a byte a second) stands for a slow endpoint."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.utils import timezone

from forecasting.models import Flag
from tracker.models import Project, Run

# aiosmtpd logs every SMTP command at INFO: noise in a failing test's output.
logging.getLogger("mail.log").setLevel(logging.WARNING)

# Any recipient at this domain is refused with a 550, like a mailbox that does not exist.
BOUNCE_DOMAIN = "bounce.example.com"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _SmtpHandler:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.envelopes: list[Any] = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.endswith("@" + BOUNCE_DOMAIN):
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.envelopes.append(envelope)
        self.messages.append(message_from_bytes(envelope.content, policy=policy.default))
        return "250 Message accepted"


@dataclass
class Mailbox:
    handler: _SmtpHandler

    @property
    def messages(self) -> list[EmailMessage]:
        return self.handler.messages

    def bodies(self, message: EmailMessage) -> tuple[str, str]:
        text = message.get_body(("plain",))
        html = message.get_body(("html",))
        return (text.get_content() if text else "", html.get_content() if html else "")


@pytest.fixture(scope="session")
def _smtp_server() -> Iterator[tuple[Controller, _SmtpHandler]]:
    handler = _SmtpHandler()
    controller = Controller(handler, hostname="127.0.0.1", port=_free_port())
    controller.start()
    yield controller, handler
    controller.stop()


@pytest.fixture
def mailbox(_smtp_server: tuple[Controller, _SmtpHandler], settings: Any) -> Mailbox:
    controller, handler = _smtp_server
    handler.messages.clear()
    handler.envelopes.clear()
    settings.EMAIL_BACKEND = "config.outbound.SMTPBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = controller.port
    settings.EMAIL_HOST_USER = ""
    settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_USE_TLS = False
    settings.DEFAULT_FROM_EMAIL = "runcast@example.com"
    return Mailbox(handler)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class HttpSink:
    """Records every POST; answers from a per-path script of (status, body, delay_s)."""

    port: int
    requests: list[Request] = field(default_factory=list)
    scripts: dict[str, list[tuple[int, str, float]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *answers: tuple[int, str] | tuple[int, str, float]) -> None:
        self.scripts[path] = [(a[0], a[1], a[2] if len(a) > 2 else 0.0) for a in answers]

    def to(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]

    def answer(self, request: Request) -> tuple[int, str, float]:
        with self.lock:
            self.requests.append(request)
            queue = self.scripts.get(request.path)
            return queue.pop(0) if queue else (200, "ok", 0.0)


def _handler_for(sink: HttpSink) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            status, text, delay = sink.answer(request)
            if delay:
                time.sleep(delay)
            payload = text.encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (the timeout test): nothing left to answer

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


@pytest.fixture(scope="session")
def _http_server() -> Iterator[tuple[ThreadingHTTPServer, HttpSink]]:
    sink = HttpSink(port=0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(sink))
    server.daemon_threads = True
    sink.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, sink
    server.shutdown()
    server.server_close()


@pytest.fixture
def sink(_http_server: tuple[ThreadingHTTPServer, HttpSink], settings: Any) -> HttpSink:
    _, sink = _http_server
    with sink.lock:
        sink.requests.clear()
        sink.scripts.clear()
    settings.RUNCAST_ALERTS_HTTP_TIMEOUT = 2.0
    # The sink listens on 127.0.0.1: reachable only with the operator's on-premise switch on
    # (tests/security/test_ssrf.py proves loopback is refused without it).
    settings.RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS = True
    return sink


# What the server would send, a byte a second: 40 s of answer if the client waited for it.
TRICKLED_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n" + b"x" * 8


@dataclass
class Trickler:
    """A loopback HTTP server: reads the request, then answers one byte every `interval` s.

    `at_once` bytes of the answer go out immediately (the status line and headers, to trickle
    only the body), the rest one at a time."""

    interval: float = 1.0
    at_once: int = 0
    port: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    sent: list[int] = field(default_factory=list)
    # Set once a whole request has arrived.
    received: threading.Event = field(default_factory=threading.Event)
    # Set: the answer comes over TLS (after a prompt handshake).
    tls: ssl.SSLContext | None = None

    def url(self, path: str = "/hook") -> str:
        if self.tls is not None:
            return f"https://localhost:{self.port}{path}"
        return f"http://127.0.0.1:{self.port}{path}"

    def serve(self, listener: socket.socket) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                return
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                request += chunk
            self.received.set()
            try:
                conn.sendall(TRICKLED_ANSWER[: self.at_once])
                for i in range(self.at_once, len(TRICKLED_ANSWER)):
                    if self.stop.wait(self.interval):
                        return
                    conn.sendall(TRICKLED_ANSWER[i : i + 1])
                    self.sent.append(i)
            except OSError:
                return  # the client gave up: what the tests want


@pytest.fixture
def trickler() -> Iterator[Trickler]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    server = Trickler(port=listener.getsockname()[1])
    thread = threading.Thread(target=server.serve, args=(listener,), daemon=True)
    thread.start()
    yield server
    server.stop.set()
    listener.close()


@pytest.fixture
def no_default_slack(settings: Any) -> None:
    settings.RUNCAST_SLACK_WEBHOOK_URL = ""
    settings.RUNCAST_ALERT_EMAIL = ""


@pytest.fixture
def run(project: Project, no_default_slack: None) -> Run:
    return Run.objects.create(
        project=project,
        public_id="pretrain-3.0",
        name="pretrain-3.0",
        world_size=512,
        total_steps=1_000_000,
        last_step=812_400,
    )


def flag_raise(run: Run, kind: str = "nan", state: str = Flag.State.RAISED, **fields: Any) -> Flag:
    """A Flag row as forecasting.flags.flags_sync writes it."""
    defaults: dict[str, Any] = {
        "explanation": "Loss became NaN/Inf at step 812,400 (3 non-finite values) still NaN.",
        "severity": 3.0,
        "onset_step": 812_400,
        "data": {
            "kind": kind,
            "onset_step": 812_400.0,
            "detected_step": 812_410.0,
            "rollback_step": 800_000.0,
            "wasted_s": 5.2 * 86400,
            "cost": 159_744.0,
        },
        "created_at": timezone.now(),
    }
    defaults.update(fields)
    return Flag.objects.create(run=run, kind=kind, state=state, **defaults)
