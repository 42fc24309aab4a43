"""Small pieces of the client in isolation."""

from __future__ import annotations

import json
import socket
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest
import runcast
from runcast import spool, transport
from runcast.batcher import Batcher
from runcast.delivery import Verdict, classify
from runcast.settings import Settings, from_env, resolve


def test_retry_after_parsing() -> None:
    assert transport.retry_after_seconds({"Retry-After": "3"}) == 3.0
    assert transport.retry_after_seconds({"retry-after": " 0.5 "}) == 0.5
    assert transport.retry_after_seconds({}) is None
    assert transport.retry_after_seconds({"Retry-After": "soon"}) is None
    now = 1_700_000_000.0
    date = formatdate(now + 10, usegmt=True)
    assert transport.retry_after_seconds({"Retry-After": date}, now=now) == pytest.approx(10)


@pytest.mark.parametrize(
    ("kind", "status", "verdict"),
    [
        ("batch", 200, Verdict.OK),
        ("create", 201, Verdict.OK),
        ("batch", 0, Verdict.TRANSIENT),
        ("batch", 408, Verdict.TRANSIENT),
        ("batch", 429, Verdict.TRANSIENT),
        ("batch", 503, Verdict.TRANSIENT),
        ("batch", 400, Verdict.DROP),
        ("batch", 413, Verdict.DROP),
        ("batch", 401, Verdict.BLOCKED),
        ("batch", 403, Verdict.BLOCKED),
        ("batch", 404, Verdict.BLOCKED),
        ("create", 400, Verdict.BLOCKED),
        ("finish", 400, Verdict.DROP),
    ],
)
def test_classify(kind: str, status: int, verdict: Verdict) -> None:
    assert classify(kind, status) is verdict


def test_post_json_closed_port_is_status_zero() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    status, body, headers = transport.post_json(f"http://127.0.0.1:{port}/x", {}, "t", 1.0)
    assert status == 0
    assert "error" in body
    assert headers == {}
    assert transport.post_json("file:///etc/passwd", {}, None, 1.0)[0] == 0


def test_post_json_does_not_follow_redirects() -> None:
    hits: list[str] = []

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(self.path)
            self.send_response(307)
            self.send_header("Location", "http://example.invalid/steal")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/api"
        status, _, _ = transport.post_json(url, {"a": 1}, "rc_x_y", 2.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert status == 307
    assert hits == ["/api"]


def test_encode_keeps_nan_and_infinity() -> None:
    raw = transport.encode({"v": [float("nan"), float("inf"), float("-inf")]})
    assert raw == b'{"v":[NaN,Infinity,-Infinity]}'


def test_batcher_splits_by_points_and_keeps_seq_order() -> None:
    batcher = Batcher("s", batch_points=3, max_body_bytes=1 << 20)
    for step in range(4):
        batcher.add(step, 1.0, {"a": 1.0, "b": 2.0})
    batcher.seal()
    sealed = batcher.take_sealed()
    assert [s.seq for s in sealed] == [1, 2, 3]
    assert [s.points for s in sealed] == [3, 3, 2]
    bodies = [json.loads(s.body) for s in sealed]
    assert all(body["session"] == "s" for body in bodies)


def test_batcher_heartbeat_only_batch() -> None:
    batcher = Batcher("s", batch_points=10, max_body_bytes=1 << 20)
    batcher.seal()
    assert batcher.take_sealed() == []
    batcher.seal(heartbeat=5.0)
    (sealed,) = batcher.take_sealed()
    assert json.loads(sealed.body) == {
        "session": "s",
        "seq": 1,
        "metrics": {},
        "events": [],
        "heartbeat": 5.0,
    }


def test_settings_env_and_override_order() -> None:
    env = {"RUNCAST_URL": "http://a/", "RUNCAST_TIMEOUT": "3", "RUNCAST_MAX_QUEUE": "oops"}
    settings = from_env(environ=env)
    assert (settings.url, settings.timeout, settings.max_queue) == ("http://a/", 3.0, 100_000)
    resolved = resolve(None, {"url": "http://b/", "token": None}, environ=env)
    assert resolved.url == "http://b"
    assert resolve(Settings(mode="OFFLINE"), {}).mode == "offline"


def test_safe_spool_names() -> None:
    assert spool.safe_name("../../etc") == "_.._etc"
    assert spool.safe_name("run/1") == "run_1"
    assert spool.batch_name(7) == "batch-0000000007.json"


def test_disabled_mode_and_bad_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNCAST_MODE", "disabled")
    assert isinstance(runcast.init(name="x"), runcast.NoOpRun)
    with pytest.raises(ValueError, match="unit"):
        runcast.init(unit="epochs")


@pytest.mark.parametrize("bad", ["exp/lr=3e-4", "-leading-dash", "x" * 65, "sp ace"])
def test_it_refuses_a_run_id_the_server_would_refuse_before_training(bad, tmp_path):
    with pytest.raises(ValueError, match="run id"):
        runcast.init(id=bad, mode="offline", dir=tmp_path)
