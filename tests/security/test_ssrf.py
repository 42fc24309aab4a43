"""Alert channels cannot make the server request internal addresses (SSRF).

Every listener here binds loopback: the test proves loopback is refused unless the operator's
switch (RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS) is on, and that with it on the guard still follows
no redirect and reads no more than MAX_BODY. The only stand-in is DNS (socket.getaddrinfo, one
seam): a rebinding name server cannot exist on this machine.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from alerts import services
from alerts.models import Channel, Notification
from alerts.transports import TransportError
from config import outbound as http
from tests.alerts.fixtures import flag_raise
from tracker.models import Project, Run

pytestmark = pytest.mark.django_db


@dataclass
class Listener:
    """A loopback HTTP server that records every request and answers from a script."""

    host: str
    port: int = 0
    hits: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)

    def url(self, path: str = "/hook") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"


def _serve(listener: Listener, family: socket.AddressFamily) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            listener.hits.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            try:
                self.send_response(listener.status)
                for k, v in listener.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(listener.body)))
                self.end_headers()
                self.wfile.write(listener.body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading at its cap

        def log_message(self, format: str, *args: Any) -> None:
            return

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

    server = Server((listener.host, 0), Handler)
    listener.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def guard_on(settings: Any) -> None:
    """The default: private targets refused (set explicitly: the sink fixture turns it off)."""
    settings.RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS = False


@pytest.fixture
def on_premise(settings: Any) -> None:
    settings.RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener("127.0.0.1")
    server = _serve(lst, socket.AF_INET)
    yield lst
    server.shutdown()
    server.server_close()


@pytest.fixture
def listener6() -> Iterator[Listener]:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    lst = Listener("::1")
    try:
        server = _serve(lst, socket.AF_INET6)
    except OSError:
        pytest.skip("cannot bind ::1")
    yield lst
    server.shutdown()
    server.server_close()


# --- which addresses are refused -------------------------------------------------------------

REFUSED = [
    "127.0.0.1",
    "127.1.2.3",
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "100.64.0.1",  # shared address space (carrier-grade NAT)
    "0.0.0.0",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "192.0.2.1",  # documentation
    "198.18.0.1",  # benchmarking
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "fd12:3456::1",
    "fec0::1",  # deprecated site-local
    "ff02::1",
    "2001:db8::1",
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "151.101.1.69", "2606:4700:4700::1111", "2a00:1450:4001::200e"]


@pytest.mark.parametrize("address", REFUSED)
def test_it_classifies_internal_addresses_as_not_public(address: str) -> None:
    assert not http.address_is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", PUBLIC)
def test_it_classifies_internet_addresses_as_public(address: str) -> None:
    assert http.address_is_public(ipaddress.ip_address(address))


# --- the request itself ----------------------------------------------------------------------


def test_it_refuses_a_loopback_listener_without_the_operator_switch(
    guard_on: None, listener: Listener
) -> None:
    with pytest.raises(TransportError) as e:
        http.post_json(listener.url(), {"a": 1}, timeout=2)
    assert e.value.permanent
    assert (
        "refused" in e.value.message and "RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS" in e.value.message
    )
    assert listener.hits == []


@pytest.mark.parametrize(
    "host",
    ["localhost", "127.0.0.2", "0.0.0.0", "[::ffff:127.0.0.1]", "2130706433", "0x7f000001"],
)
def test_it_refuses_every_spelling_of_loopback(
    guard_on: None, listener: Listener, host: str
) -> None:
    # 2130706433 and 0x7f000001 are 127.0.0.1 to the C resolver; 0.0.0.0 connects to loopback.
    with pytest.raises(TransportError) as e:
        http.post_json(f"http://{host}:{listener.port}/hook", {}, timeout=2)
    assert e.value.permanent, e.value.message
    assert listener.hits == []


def test_it_refuses_ipv6_loopback(guard_on: None, listener6: Listener) -> None:
    with pytest.raises(TransportError) as e:
        http.post_json(listener6.url(), {}, timeout=2)
    assert e.value.permanent
    assert listener6.hits == []


def test_it_reaches_ipv6_loopback_with_the_operator_switch(
    on_premise: None, listener6: Listener
) -> None:
    assert http.post_json(listener6.url("/v6"), {}, timeout=2).status == 200
    assert [path for path, _ in listener6.hits] == ["/v6"]


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.com/x",
        "gopher://127.0.0.1:70/_x",
        "dict://127.0.0.1:11211/",
        "http:///no-host",
        "http://user:secret@example.com/",
        "http://example.com:99999/",
        "javascript:alert(1)",
    ],
)
def test_it_refuses_other_schemes_and_malformed_urls(guard_on: None, url: str) -> None:
    with pytest.raises(TransportError) as e:
        http.post_json(url, {})
    assert e.value.permanent


def test_it_reaches_a_loopback_listener_with_the_operator_switch(
    on_premise: None, listener: Listener
) -> None:
    response = http.post_json(listener.url("/ok"), {"a": 1}, timeout=2)
    assert response.status == 200 and response.text == "ok"
    assert [path for path, _ in listener.hits] == ["/ok"]


@pytest.mark.parametrize(("value", "allowed"), [("0", "False"), ("1", "True"), ("", "False")])
def test_the_switch_also_comes_from_the_environment(value: str, allowed: str) -> None:
    # Settings are read once, at import, from the environment: a fresh process shows its value.
    code = "from django.conf import settings; print(settings.RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS)"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS": value,
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == allowed


def test_it_does_not_follow_a_redirect(on_premise: None, listener: Listener) -> None:
    target = Listener("127.0.0.1")
    server = _serve(target, socket.AF_INET)
    try:
        listener.status = 302
        listener.headers = {"Location": target.url("/latest/meta-data/")}
        response = http.post_json(listener.url(), {}, timeout=2)
    finally:
        server.shutdown()
        server.server_close()
    assert response.status == 302
    assert target.hits == []


def test_a_webhook_channel_says_it_did_not_follow_a_redirect(
    on_premise: None, listener: Listener, project: Project
) -> None:
    listener.status = 307
    listener.headers = {"Location": "http://169.254.169.254/"}
    channel = services.channel_create(
        project=project, kind="webhook", name="w", target=listener.url()
    )
    assert services.channel_test(channel=channel) == (
        "webhook answered 307 (redirects are not followed)"
    )


def test_it_reads_at_most_max_body_of_an_answer(on_premise: None, listener: Listener) -> None:
    listener.body = b"A" * 20_000_000
    response = http.post_json(listener.url(), {}, timeout=5)
    assert response.status == 200
    assert len(response.text) == http.MAX_BODY


# --- DNS: checked once, at connect, on the address actually used -----------------------------


class Resolver:
    """Stands in for DNS: answers each lookup of one name from a script, others as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, *answers: str) -> None:
        self.name, self.answers, self.calls = name, list(answers), 0
        self.real = socket.getaddrinfo
        monkeypatch.setattr(socket, "getaddrinfo", self)

    def __call__(self, host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != self.name:
            return self.real(host, port, *args, **kwargs)
        self.calls += 1
        address = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return self.real(address, port, *args, **kwargs)


def test_a_name_that_rebinds_to_loopback_after_the_form_check_is_refused_at_connect(
    guard_on: None,
    listener: Listener,
    client: Client,
    owner: User,
    project: Project,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # First answer (the form's check): a public address. Every later one: loopback.
    dns = Resolver(monkeypatch, "hooks.rebind.test", "8.8.8.8", "127.0.0.1")
    client.force_login(owner)
    url = f"http://hooks.rebind.test:{listener.port}/hook"
    response = client.post(
        "/projects/llm/alerts/channels/", {"kind": "webhook", "name": "rb", "target": url}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    channel = Channel.objects.get(name="rb")

    page = client.post(f"/projects/llm/alerts/channels/{channel.pk}/test/", follow=True)
    assert "refused: hooks.rebind.test is a private" in page.content.decode()
    assert listener.hits == []
    assert dns.calls == 2  # one lookup at save, one at connect: none between check and connect


def test_it_connects_to_the_address_it_checked_and_keeps_the_name(
    on_premise: None, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    dns = Resolver(monkeypatch, "hooks.internal.test", "127.0.0.1")
    response = http.post_json(f"http://hooks.internal.test:{listener.port}/named", {}, timeout=2)
    assert response.status == 200
    assert dns.calls == 1
    [(path, headers)] = listener.hits
    assert path == "/named" and headers["host"] == f"hooks.internal.test:{listener.port}"


def test_a_name_with_only_internal_addresses_is_refused(
    guard_on: None, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    Resolver(monkeypatch, "metadata.google.internal", "169.254.169.254")
    with pytest.raises(TransportError) as e:
        http.post_json("http://metadata.google.internal/computeMetadata/v1/", {}, timeout=2)
    assert e.value.permanent
    assert "169.254" not in e.value.message  # internal DNS is not mapped for the member


def test_a_name_that_does_not_resolve_is_a_transient_error(guard_on: None) -> None:
    with pytest.raises(TransportError) as e:
        http.post_json("http://no-such-host.invalid/hook", {}, timeout=2)
    assert not e.value.permanent and "could not resolve" in e.value.message


# --- the pages: save-time errors, the test button, delivery ----------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:8000/hook",
        "http://localhost/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.1.2.3/hook",
        "http://[::1]:8080/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "https://[fd00::1]/hook",
    ],
)
def test_the_form_refuses_an_internal_target_with_a_clear_error(
    guard_on: None, client: Client, member: User, project: Project, target: str
) -> None:
    client.force_login(member)
    response = client.post(
        "/projects/llm/alerts/channels/", {"kind": "slack", "name": "x", "target": target}
    )
    assert response.status_code == 400
    assert "private, loopback, link-local or reserved" in response.content.decode()
    assert Channel.objects.count() == 0


def test_the_form_accepts_an_internal_target_with_the_operator_switch(
    on_premise: None, client: Client, member: User, project: Project
) -> None:
    client.force_login(member)
    response = client.post(
        "/projects/llm/alerts/channels/",
        {"kind": "webhook", "name": "onprem", "target": "http://10.1.2.3/hook"},
    )
    assert response.status_code == 302
    assert Channel.objects.get().target == "http://10.1.2.3/hook"


def test_the_edit_form_refuses_an_internal_target(
    guard_on: None, client: Client, member: User, project: Project
) -> None:
    channel = services.channel_create(
        project=project, kind="webhook", name="w", target="https://hooks.example.com/x"
    )
    client.force_login(member)
    response = client.post(
        f"/projects/llm/alerts/channels/{channel.pk}/",
        {"kind": "webhook", "name": "w", "target": "http://169.254.169.254/", "enabled": "on"},
    )
    assert response.status_code == 200  # the form again, with its error
    assert "private, loopback, link-local or reserved" in response.content.decode()
    channel.refresh_from_db()
    assert channel.target == "https://hooks.example.com/x"


def test_the_test_button_never_shows_the_answers_body(
    on_premise: None, listener: Listener, client: Client, member: User, project: Project
) -> None:
    listener.status = 500
    listener.body = b'{"AccessKeyId": "ASIA-SECRET", "Token": "instance-credentials"}'
    for kind in ("webhook", "slack"):
        channel = services.channel_create(
            project=project, kind=kind, name=kind, target=listener.url()
        )
        client.force_login(member)
        page = client.post(
            f"/projects/llm/alerts/channels/{channel.pk}/test/", follow=True
        ).content.decode()
        assert "answered 500" in page
        assert "ASIA-SECRET" not in page and "instance-credentials" not in page


def test_the_test_button_shows_a_short_slack_error_code(
    on_premise: None, listener: Listener, client: Client, member: User, project: Project
) -> None:
    listener.status = 403
    listener.body = b"invalid_token"
    channel = services.channel_create(
        project=project, kind="slack", name="s", target=listener.url()
    )
    client.force_login(member)
    page = client.post(f"/projects/llm/alerts/channels/{channel.pk}/test/", follow=True)
    assert "Slack answered 403 invalid_token" in page.content.decode()


def test_the_test_button_refuses_loopback_without_the_operator_switch(
    guard_on: None, listener: Listener, client: Client, member: User, project: Project
) -> None:
    # Saved while the operator allowed it, tested after the switch went off.
    channel = services.channel_create(
        project=project, kind="webhook", name="w", target=listener.url()
    )
    client.force_login(member)
    page = client.post(f"/projects/llm/alerts/channels/{channel.pk}/test/", follow=True)
    assert "Test message to w failed: refused" in page.content.decode()
    assert listener.hits == []


def test_a_delivery_to_an_internal_target_disables_the_channel(
    guard_on: None, listener: Listener, run: Run
) -> None:
    channel = services.channel_create(
        project=run.project, kind="slack", name="s", target=listener.url()
    )
    flag_raise(run)
    services.flags_dispatch()
    assert Notification.objects.filter(status=Notification.Status.PENDING).count() == 1
    for n in Notification.objects.filter(status=Notification.Status.PENDING):
        services.notification_deliver(notification_id=n.pk)
    channel.refresh_from_db()
    assert not channel.enabled and channel.disabled_reason.startswith("refused")
    assert listener.hits == []
