"""The one outbound HTTP seam: every Slack and webhook request goes through post_json, and the
liveness sweep's probe of the web tier through get_status. Email goes through SMTPBackend
(the default EMAIL_BACKEND), which keeps the same one-deadline rule for the operator's server.

Any project member chooses where these requests go, so the seam is a guard against server-side
request forgery (the rule healthchecks applies to its integrations):
- http and https only;
- the host is resolved once, when connecting, and every address it resolves to is checked; the
  socket connects to a checked address, never to the name again, so a DNS answer that changes
  between a check and the connect (DNS rebinding) cannot reach another address. TLS still sends
  the name (SNI) and verifies the certificate against it; Host carries the name;
- loopback, private, link-local, shared (CGNAT), multicast, reserved and unspecified addresses
  are refused, IPv4 and IPv6 alike, including IPv4 written inside IPv6 (::ffff:127.0.0.1,
  NAT64, 6to4) unless the operator allows private targets (RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS,
  for an on-premise Mattermost or webhook receiver);
- redirects are never followed (a 3xx is an answer like any other non-2xx);
- at most MAX_BODY bytes of the answer are read, and the whole request (connect, TLS
  handshake, sending, the status line, headers and body) has one wall-clock deadline.
Proxies from the environment are not used: the check must see the address actually connected.

Standard library only: a hung endpoint must cost a worker seconds, not its whole time limit. A
socket timeout alone does not do that: it restarts at every byte received, so an endpoint
trickling a byte every few seconds held a request (and the web thread of "Send test message")
for minutes. Every socket operation here waits at most until the request's deadline instead.
Name resolution counts against the deadline but cannot be cut short by it (getaddrinfo cannot
be interrupted; the system resolver has its own timeouts).
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import json
import logging
import re
import smtplib
import socket
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail.backends import smtp

logger = logging.getLogger(__name__)

USER_AGENT = "Runcast-Alerts/1.0"
DEFAULT_TIMEOUT_S = 10.0
# Enough of an error body to show why it failed; never the whole page.
MAX_BODY = 2_000
# A body shown to users at all must look like a vendor's error code ("invalid_token"), not a page.
_CODE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class TransportError(Exception):
    """A failed request. permanent=True means retrying cannot help (bad address, revoked
    webhook): the channel is disabled and the reason shown. Otherwise it is retried."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


@dataclass(frozen=True)
class Response:
    status: int
    text: str


class TargetRefused(TransportError):
    """The URL may never be requested as configured: its scheme, or where its host resolves."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


def encode(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def error_code(text: str) -> str:
    """The part of an error answer that is safe to show: a short code or nothing."""
    text = text.strip()
    return text if _CODE.fullmatch(text) else ""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    # IPv6 forms that carry an IPv4 address a gateway or the kernel would reach.
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo:
        found.extend(ip.teredo)
    if ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def address_is_public(ip: IpAddress) -> bool:
    """True only for a globally routable unicast address (and any IPv4 inside it)."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return False
        if not all(address_is_public(v4) for v4 in _embedded_ipv4(ip)):
            return False
        if ip.is_site_local:
            return False
    blocked = (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )
    return ip.is_global and not blocked


def _split(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with query) of an http(s) URL, or TargetRefused."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise TargetRefused(f"not a valid URL: {e}") from e
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"not an http(s) URL: {url[:80]}")
    if not parts.hostname:
        raise TargetRefused("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("credentials in the URL are not supported")
    default = 443 if parts.scheme == "https" else 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.scheme, parts.hostname, port or default, path


def _resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    """getaddrinfo's answers for host; a failed lookup may succeed later (not permanent)."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise TransportError(f"could not resolve {host[:100]}", permanent=False) from e


def _allowed(infos: list[tuple[Any, ...]], host: str) -> list[tuple[Any, ...]]:
    if settings.RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS:
        return infos
    allowed = [i for i in infos if address_is_public(ipaddress.ip_address(i[4][0]))]
    if not allowed:
        # The address stays in the server log: telling a project member which private address
        # an internal name has would map the network for them.
        logger.warning("refused an alert request to %s (%s)", host, [i[4][0] for i in infos])
        raise TargetRefused(
            f"refused: {host[:100]} is a private, loopback, link-local or reserved address "
            "(an operator can allow private targets with RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS)"
        )
    return allowed


class Deadline:
    """One wall-clock budget for a whole request, on the monotonic clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left; TimeoutError once none are (a socket timeout of 0 would not block)."""
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"deadline of {self.seconds:g} s passed")
        return left


# mypy checks the mixin as the socket it is mixed into; at run time it sits in front of
# socket.socket or ssl.SSLSocket in the method resolution order.
if TYPE_CHECKING:
    _SocketBase = socket.socket
else:
    _SocketBase = object


class _DeadlineMixin(_SocketBase):
    """Before every send and receive, the socket's timeout is set to what is left of the
    request's deadline, so many short waits cannot add up past it. http.client reads through
    makefile(), whose raw reads are recv_into; TLS sockets send through send()."""

    deadline: Deadline | None = None

    def _arm(self) -> None:
        if self.deadline is not None:
            self.settimeout(self.deadline.remaining())

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        self._arm()
        return super().recv(*args, **kwargs)

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        self._arm()
        return super().recv_into(*args, **kwargs)

    def send(self, *args: Any, **kwargs: Any) -> int:
        self._arm()
        return super().send(*args, **kwargs)

    def sendall(self, *args: Any, **kwargs: Any) -> None:
        self._arm()
        super().sendall(*args, **kwargs)


class _DeadlineSocket(_DeadlineMixin, socket.socket):
    pass


class _DeadlineSSLSocket(_DeadlineMixin, ssl.SSLSocket):
    pass


def vetted_socket(
    host: str, port: int, deadline: Deadline, *, trusted: bool = False
) -> _DeadlineSocket:
    """A socket connected to an address of host that passed the check, resolved only here;
    every later send and receive on it ends by `deadline`.

    `trusted`: the operator's own URL from the settings (the web probe), not a member's
    channel: the address check is skipped, an internal name is what it is for."""
    error: OSError | None = None
    infos = _resolve(host, port)
    for family, socktype, proto, _, address in infos if trusted else _allowed(infos, host):
        sock = _DeadlineSocket(family, socktype, proto)
        try:
            sock.settimeout(deadline.remaining())
            sock.connect(address)
        except OSError as e:
            sock.close()
            error = e
            continue
        sock.deadline = deadline
        return sock
    assert error is not None  # _allowed never returns an empty list
    raise error


class _VettedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, *, deadline: Deadline, trusted: bool = False) -> None:
        super().__init__(host, port, timeout=deadline.seconds)
        self.deadline = deadline
        self.trusted = trusted

    def connect(self) -> None:
        self.sock = vetted_socket(self.host, self.port, self.deadline, trusted=self.trusted)


class _VettedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, *, deadline: Deadline, trusted: bool = False) -> None:
        self.tls = ssl.create_default_context()
        # This context's sockets keep to the deadline too (the handshake is one call that
        # keeps to the timeout set just before it).
        self.tls.sslsocket_class = _DeadlineSSLSocket
        super().__init__(host, port, timeout=deadline.seconds, context=self.tls)
        self.deadline = deadline
        self.trusted = trusted

    def connect(self) -> None:
        sock = vetted_socket(self.host, self.port, self.deadline, trusted=self.trusted)
        sock.settimeout(self.deadline.remaining())
        # SNI and certificate checks against the name, over the socket to the checked address.
        tls_sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        assert isinstance(tls_sock, _DeadlineSSLSocket)
        tls_sock.deadline = self.deadline
        self.sock = tls_sock


def target_problem(url: str) -> str | None:
    """Why a channel URL will be refused, for the form at save time, or None.

    A name that does not resolve now is accepted (DNS may be down, or the name not yet
    published); the check that counts runs again on every connect.
    """
    try:
        _, host, port, _ = _split(url)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            return None
        _allowed(infos, host)
    except TargetRefused as e:
        return e.message
    return None


def post_json(
    url: str,
    body: Any,
    headers: dict[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Response:
    """POST body (already-encoded bytes or a JSON-able object); return status and text.

    `timeout` is the deadline of the whole request, from connecting to the last byte read.
    HTTP error statuses (3xx included: redirects are not followed) are returned for the
    transport to judge. A refused target raises a permanent TransportError; network failures
    and timeouts raise a transient one.
    """
    data = body if isinstance(body, bytes) else encode(body)
    all_headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        **(headers or {}),
    }
    status, raw = _exchange("POST", url, data, all_headers, timeout=timeout, read=MAX_BODY)
    return Response(status, raw.decode("utf-8", "replace"))


def _exchange(
    method: str,
    url: str,
    data: bytes | None,
    headers: dict[str, str],
    *,
    timeout: float,
    read: int,
    trusted: bool = False,
) -> tuple[int, bytes]:
    """One request through a vetted connection under one deadline: its status and at most
    `read` bytes of its answer. Failures become TransportError (a refused target permanent,
    network failures and timeouts transient)."""
    scheme, host, port, path = _split(url)
    connection_class = _VettedHTTPSConnection if scheme == "https" else _VettedHTTPConnection
    connection = connection_class(host, port, deadline=Deadline(timeout), trusted=trusted)
    try:
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read(read)
    except TransportError:
        raise
    except TimeoutError as e:
        raise TransportError(f"timed out after {timeout:g} s", permanent=False) from e
    except ssl.SSLError as e:
        raise TransportError(f"TLS failed: {e.reason or e}", permanent=False) from e
    except (http.client.HTTPException, OSError) as e:
        raise TransportError(f"connection failed: {e}", permanent=False) from e
    finally:
        connection.close()


def get_status(
    url: str, *, host_header: str = "", timeout: float = DEFAULT_TIMEOUT_S
) -> int | None:
    """GET an operator-configured URL (from the settings, never user input); its status, or
    None when it cannot be reached within `timeout` (the deadline of the whole request).
    Redirects are not followed; the body is not read."""
    try:
        scheme, host, port, path = _split(url)
    except TargetRefused:
        return None  # a file: or other scheme is no web server
    connection_class = _VettedHTTPSConnection if scheme == "https" else _VettedHTTPConnection
    connection = connection_class(host, port, deadline=Deadline(timeout), trusted=True)
    headers = {"User-Agent": USER_AGENT, **({"Host": host_header} if host_header else {})}
    try:
        connection.request("GET", path, headers=headers)
        return connection.getresponse().status
    except (TransportError, http.client.HTTPException, OSError, ValueError):
        return None  # refused, timed out, not HTTP, a malformed URL
    finally:
        connection.close()


# --- SMTP: the operator's mail server (from the settings: no address check), one deadline ---


class _DeadlineSMTP(smtplib.SMTP):
    """smtplib.SMTP whose socket keeps to one deadline for the whole conversation: the
    connection's timeout alone is per socket operation, and a server answering a byte at a
    time held a worker for as long as it liked."""

    def __init__(self, host: str = "", port: int = 0, *, deadline: Deadline, **kwargs: Any):
        self.deadline = deadline  # before connect(), which __init__ calls
        super().__init__(host, port, **kwargs)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return vetted_socket(host, port, self.deadline, trusted=True)

    # Keyword context only (as Django calls it): smtplib's keyfile/certfile are deprecated.
    def starttls(self, *, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:  # type: ignore[override]
        context = context or ssl.create_default_context()
        context.sslsocket_class = _DeadlineSSLSocket
        if self.sock is not None:
            self.sock.settimeout(self.deadline.remaining())  # the handshake is one call
        reply = super().starttls(context=context)
        if isinstance(self.sock, _DeadlineSSLSocket):
            self.sock.deadline = self.deadline
        return reply


class _DeadlineSMTPSSL(smtplib.SMTP_SSL):
    def __init__(self, host: str = "", port: int = 0, *, deadline: Deadline, **kwargs: Any):
        self.deadline = deadline
        super().__init__(host, port, **kwargs)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        sock = vetted_socket(host, port, self.deadline, trusted=True)
        self.context.sslsocket_class = _DeadlineSSLSocket
        tls_sock = self.context.wrap_socket(sock, server_hostname=host)
        assert isinstance(tls_sock, _DeadlineSSLSocket)
        tls_sock.deadline = self.deadline
        return tls_sock


class SMTPBackend(smtp.EmailBackend):
    """Django's SMTP backend, with EMAIL_TIMEOUT (RUNCAST_ALERTS_SMTP_TIMEOUT for alerts) the
    deadline of a whole send from its connect: greeting, TLS, login, every command and reply."""

    @property
    def connection_class(self) -> Any:
        # Read once per open(): each connection gets its own deadline from that moment.
        cls = _DeadlineSMTPSSL if self.use_ssl else _DeadlineSMTP
        return functools.partial(cls, deadline=Deadline(self.timeout or DEFAULT_TIMEOUT_S))


# --- JSON APIs a project reads from (the MLflow mirror): larger answers, read whole ---


def request_json(
    method: str,
    url: str,
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    max_bytes: int,
    private_ok: bool = False,
) -> Response:
    """GET or POST `url` and return the whole answer, at most `max_bytes` of it.

    For APIs whose answer is the point (a mirrored MLflow server's runs and histories), unlike
    post_json, which reads only enough of an answer to say why a send failed. An answer longer
    than `max_bytes` raises a permanent TransportError rather than being cut (half a JSON page
    is no page). The same deadline, redirect and address rules as post_json, except that
    `private_ok` skips the address check: only for a destination an operator chose (a Django
    staff user, or the management command run on the server), never one a project member typed.
    """
    all_headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else encode(body)
        all_headers.setdefault("Content-Type", "application/json")
    status, raw = _exchange(
        method, url, data, all_headers, timeout=timeout, read=max_bytes + 1, trusted=private_ok
    )
    if len(raw) > max_bytes:
        raise TransportError(f"the answer is larger than {max_bytes:,} bytes", permanent=True)
    return Response(status, raw.decode("utf-8", "replace"))
