"""The outbound HTTP seam against a real loopback server that trickles its answer.

A socket timeout restarts at every byte received, so a peer sending one byte a second never
trips a 2 s timeout: only a deadline over the whole request does. The timeouts here are small
parameters of the seam, and the elapsed-time checks are behaviour bounds (3x the deadline,
against a trickle that would take 40 s), not performance figures.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.core.mail import EmailMessage, get_connection

from bench.harness import free_port
from config import outbound as http
from tests.alerts.fixtures import TRICKLED_ANSWER, Trickler

DEADLINE_S = 2.0


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost: (certificate, key)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    extensions = [
        "subjectAltName=DNS:localhost",
        "keyUsage=digitalSignature,keyCertSign",
        "extendedKeyUsage=serverAuth",
    ]
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *(arg for ext in extensions for arg in ("-addext", ext)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def loopback_allowed(settings: object) -> None:
    # The trickler listens on 127.0.0.1: the operator's on-premise switch lets the seam reach
    # it (tests/security/test_ssrf.py proves loopback is refused without it).
    settings.RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS = True  # type: ignore[attr-defined]


@pytest.mark.parametrize("at_once", [0, len(TRICKLED_ANSWER) - 8], ids=["headers", "body"])
def test_it_gives_up_on_an_answer_trickled_a_byte_a_second_at_the_deadline(
    loopback_allowed: None, trickler: Trickler, at_once: int
) -> None:
    trickler.at_once = at_once
    started = time.monotonic()
    with pytest.raises(http.TransportError) as e:
        http.post_json(trickler.url(), {"a": 1}, timeout=DEADLINE_S)
    elapsed = time.monotonic() - started
    assert e.value.message == f"timed out after {DEADLINE_S:g} s"
    assert not e.value.permanent
    assert trickler.sent, "bytes kept arriving: no single read waited the timeout"
    assert elapsed < 3 * DEADLINE_S


def test_the_web_probe_gives_up_on_a_trickled_answer_at_the_deadline(trickler: Trickler) -> None:
    started = time.monotonic()
    assert http.get_status(trickler.url("/healthz"), timeout=DEADLINE_S) is None
    assert trickler.sent
    assert time.monotonic() - started < 3 * DEADLINE_S


def test_an_answer_that_arrives_in_time_is_read(loopback_allowed: None, trickler: Trickler) -> None:
    # The deadline is over the whole request, not a cut-off that also fails prompt answers.
    trickler.interval, trickler.at_once = 0.01, 0
    response = http.post_json(trickler.url(), {"a": 1}, timeout=DEADLINE_S)
    assert (response.status, response.text) == (200, "x" * 8)


def test_it_gives_up_on_a_trickled_answer_over_tls_at_the_deadline(
    loopback_allowed: None,
    trickler: Trickler,
    certificate: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The seam verifies certificates against the system's store: this one trusts only ours.
    cert, key = certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    trickler.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    trickler.tls.load_cert_chain(cert, key)
    trickler.interval = 0.01
    assert http.post_json(trickler.url(), {}, timeout=DEADLINE_S).status == 200, "TLS works"
    trickler.interval, trickler.sent = 1.0, []
    started = time.monotonic()
    with pytest.raises(http.TransportError) as e:
        http.post_json(trickler.url(), {"a": 1}, timeout=DEADLINE_S)
    assert e.value.message == f"timed out after {DEADLINE_S:g} s"
    assert trickler.sent
    assert time.monotonic() - started < 3 * DEADLINE_S


def test_an_email_over_starttls_keeps_to_the_deadline_and_arrives(
    certificate: tuple[Path, Path], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SMTP backend's TLS socket carries the deadline too, and a prompt server gets its mail."""
    cert, key = certificate
    received: list[bytes] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            received.append(envelope.content)
            return "250 OK"

    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    controller = Controller(
        Handler(), hostname="127.0.0.1", port=free_port(), tls_context=tls, require_starttls=True
    )
    controller.start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client trusts the test certificate
    settings.EMAIL_BACKEND = "config.outbound.SMTPBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "localhost", controller.port
    settings.EMAIL_USE_TLS, settings.EMAIL_TIMEOUT = True, DEADLINE_S
    try:
        backend = get_connection()
        assert isinstance(backend, http.SMTPBackend) and backend.open()
        assert backend.connection is not None
        sock = backend.connection.sock
        assert isinstance(sock, ssl.SSLSocket) and getattr(sock, "deadline", None) is not None
        sent = EmailMessage("s", "over TLS", "a@example.com", ["b@example.com"], connection=backend)
        assert sent.send() == 1
        backend.close()
    finally:
        controller.stop()
    assert b"over TLS" in received[0]
