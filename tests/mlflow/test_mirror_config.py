"""Setting up an MLflow mirror: the settings page (owners only, the token never shown back, a
private address only for an administrator), the management command, and the outbound seam's
whole-answer reads the mirror's client makes. No mlflow package needed."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from config import outbound
from tracker.mlflow import mirror as mirror_module
from tracker.mlflow.models import Mirror
from tracker.mlflow.remote import RemoteError, RemoteMlflow
from tracker.models import Membership, Project

pytestmark = pytest.mark.django_db
TOKEN = "mlflow-bearer-secret-ABCDEFGH-9876"


@pytest.fixture
def users(ml_project: Project) -> dict[str, User]:
    found = {"owner": User.objects.get(username="trainer")}
    for role in ("member", "viewer"):
        user = User.objects.create_user(role, password="pw-123456789")
        Membership.objects.create(project=ml_project, user=user, role=role)
        found[role] = user
    found["outsider"] = User.objects.create_user("outsider", password="pw-123456789")
    admin = User.objects.create_user("admin", password="pw-123456789", is_staff=True)
    Membership.objects.create(project=ml_project, user=admin, role=Membership.Role.OWNER)
    found["admin"] = admin
    return found


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _post(user: User, **data: str) -> Any:
    url = reverse("dashboard:settings-mirror", args=["ml"])
    return _client(user).post(url, {"enabled": "on", **data})


def test_an_owner_sets_up_a_mirror_and_the_token_is_never_shown_back(
    users: dict[str, User], ml_project: Project
) -> None:
    answer = _post(
        users["owner"], url="https://mlflow.example.com/", experiment_name="bert", token=TOKEN
    )
    assert answer.status_code == 302
    mirror = Mirror.objects.get(project=ml_project)
    assert (mirror.url, mirror.experiment_name, mirror.enabled) == (
        "https://mlflow.example.com/",
        "bert",
        True,
    )
    assert mirror.token == TOKEN and not mirror.private_ok
    for role in ("owner", "viewer"):
        page = _client(users[role]).get(reverse("dashboard:settings", args=["ml"]))
        text = page.content.decode()
        assert page.status_code == 200 and "mlflow.example.com" in text
        assert TOKEN not in text and TOKEN[:8] not in text
        assert "…9876" in text
    # A browser must not fill in the owner's own password as the MLflow token.
    owner_page = _client(users["owner"]).get(reverse("dashboard:settings", args=["ml"]))
    assert 'name="token" autocomplete="new-password"' in owner_page.content.decode()
    # A blank token field keeps the token; the checkbox removes it.
    assert _post(users["owner"], url="https://mlflow.example.com/").status_code == 302
    assert Mirror.objects.get(pk=mirror.pk).token == TOKEN
    _post(users["owner"], url="https://mlflow.example.com/", clear_token="on")
    assert Mirror.objects.get(pk=mirror.pk).token == ""
    # Unchecked "enabled" pauses it.
    _client(users["owner"]).post(
        reverse("dashboard:settings-mirror", args=["ml"]), {"url": "https://mlflow.example.com/"}
    )
    assert not Mirror.objects.get(pk=mirror.pk).enabled
    assert mirror_module.mirror_ids_enabled() == []


def test_only_owners_change_it(users: dict[str, User], ml_project: Project) -> None:
    assert _post(users["member"], url="https://mlflow.example.com").status_code == 403
    assert _post(users["viewer"], url="https://mlflow.example.com").status_code == 403
    assert _post(users["outsider"], url="https://mlflow.example.com").status_code == 404
    assert not Mirror.objects.exists()
    page = _client(users["member"]).get(reverse("dashboard:settings", args=["ml"]))
    assert b'id="mlflow-mirror"' in page.content
    assert reverse("dashboard:settings-mirror", args=["ml"]).encode() not in page.content


def test_a_private_address_is_an_administrators_choice(
    users: dict[str, User], ml_project: Project
) -> None:
    refused = _post(users["owner"], url="http://127.0.0.1:5000")
    assert refused.status_code == 400
    assert "private" in refused.content.decode() and not Mirror.objects.exists()
    assert _post(users["admin"], url="http://127.0.0.1:5000").status_code == 302
    mirror = Mirror.objects.get(project=ml_project)
    assert mirror.private_ok
    # The owner may still change the token or experiment of that mirror…
    assert _post(users["owner"], url="http://127.0.0.1:5000", token=TOKEN).status_code == 302
    assert Mirror.objects.get(pk=mirror.pk).private_ok
    # …but not point it at another private address.
    assert _post(users["owner"], url="http://10.0.0.7:5000").status_code == 400
    assert Mirror.objects.get(pk=mirror.pk).url == "http://127.0.0.1:5000"


@pytest.mark.parametrize(
    "url",
    ["ftp://mlflow:21", "http://user:pw@mlflow:5000", "http://mlflow:5000/?token=x", ""],
)
def test_it_refuses_urls_it_would_not_request(url: str, ml_project: Project) -> None:
    with pytest.raises(mirror_module.MirrorConfigError):
        mirror_module.mirror_configure(project=ml_project, url=url, operator=True)


def test_a_sync_of_a_private_address_nobody_allowed_is_refused_and_recorded(
    ml_project: Project, mlflow_json: str
) -> None:
    mirror = mirror_module.mirror_configure(project=ml_project, url=mlflow_json, operator=True)
    Mirror.objects.filter(pk=mirror.pk).update(private_ok=False)
    assert mirror_module.mirror_sync_one(mirror_id=mirror.pk) is None
    mirror.refresh_from_db()
    assert "private" in mirror.last_error and mirror.failures == 1


def _command(*args: str, stdin: str = "") -> str:
    out = io.StringIO()
    import sys

    before = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        call_command("runcast_mirror_mlflow", *args, stdout=out)
    finally:
        sys.stdin = before
    return out.getvalue()


def test_the_command_sets_up_changes_and_pauses_a_mirror(ml_project: Project) -> None:
    out = _command(
        "--project", "ml", "--url", "http://mlflow:5000", "--experiment", "bert",
        "--token-stdin", stdin=TOKEN + "\n",
    )  # fmt: skip
    assert "Saved. Mirror of http://mlflow:5000 into ml (bert), enabled" in out
    assert TOKEN not in out and "…9876" in out
    mirror = Mirror.objects.get(project=ml_project)
    assert mirror.private_ok and mirror.token == TOKEN
    assert "paused" in _command("--project", "ml", "--disable")
    mirror.refresh_from_db()
    assert not mirror.enabled and mirror.url == "http://mlflow:5000" and mirror.token == TOKEN
    shown = _command("--project", "ml")
    assert "not synced yet" in shown and TOKEN not in shown
    assert "(basic auth as alice)" in _command("--project", "ml", "--username", "alice")
    assert Mirror.objects.get(pk=mirror.pk).username == "alice"
    _command("--project", "ml", "--enable", "--clear-token", "--experiment", "", "--username", "")
    mirror.refresh_from_db()
    assert mirror.enabled and mirror.token == "" and mirror.experiment_name == ""
    with pytest.raises(CommandError, match="no Runcast project"):
        _command("--project", "nope", "--url", "http://mlflow:5000")
    with pytest.raises(CommandError, match="--token-stdin"):
        _command("--project", "ml", "--token-stdin", stdin="")


def test_the_command_syncs_once(ml_project: Project, mlflow_json: str) -> None:
    _command("--project", "ml", "--url", mlflow_json)
    out = _command("--project", "ml", "--sync")
    assert f"Imported from {mlflow_json}: 0 experiments" in out


# --- the seam and the client over a plain loopback HTTP server ---------------------------


class _Handler(BaseHTTPRequestHandler):
    status = 200
    body = b"{}"
    seen: list[dict[str, str]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        _Handler.seen.append({"path": self.path, "auth": self.headers.get("Authorization", "")})
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def mlflow_json() -> Iterator[str]:
    """A loopback server answering `{}` to everything: an MLflow server with nothing in it."""
    _Handler.status, _Handler.body, _Handler.seen = 200, b"{}", []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_whole_answer_is_read_up_to_its_bound(mlflow_json: str) -> None:
    _Handler.body = json.dumps({"experiments": [], "pad": "x" * 5000}).encode()
    url = f"{mlflow_json}/api/2.0/mlflow/experiments/search"
    answer = outbound.request_json("POST", url, body={}, max_bytes=10_000, private_ok=True)
    assert answer.status == 200 and json.loads(answer.text)["pad"] == "x" * 5000
    with pytest.raises(outbound.TransportError, match="larger than 1,000 bytes") as e:
        outbound.request_json("POST", url, body={}, max_bytes=1000, private_ok=True)
    assert e.value.permanent
    # Without the operator's say-so a loopback server is refused before any request.
    before = len(_Handler.seen)
    with pytest.raises(outbound.TargetRefused):
        outbound.request_json("GET", url, max_bytes=10_000)
    assert len(_Handler.seen) == before


def test_the_client_sends_the_token_in_a_header_only(mlflow_json: str) -> None:
    client = RemoteMlflow(mlflow_json, token=TOKEN, private_ok=True)
    assert list(client.search_experiments()) == []
    assert client.get_metric_history("abc", "loss") == []
    assert all(s["auth"] == f"Bearer {TOKEN}" for s in _Handler.seen)
    assert all(TOKEN not in s["path"] for s in _Handler.seen)
    assert TOKEN not in repr(client)
    basic = RemoteMlflow(mlflow_json, token="pw", username="alice", private_ok=True)
    basic.search_experiments()
    assert _Handler.seen[-1]["auth"] == "Basic YWxpY2U6cHc="  # alice:pw
    _Handler.status, _Handler.body = 401, b"You are not authenticated."
    with pytest.raises(RemoteError, match="HTTP 401, the token was refused"):
        basic.search_experiments()
    _Handler.status, _Handler.body = 200, b"<html>proxy error</html>"
    not_json = f"MLflow server {mlflow_json}: .*other than MLflow's JSON"
    with pytest.raises(RemoteError, match=not_json):
        client.search_experiments()


def test_an_answer_not_shaped_as_mlflows_is_a_remote_error(
    mlflow_json: str, ml_project: Project
) -> None:
    _Handler.body = json.dumps({"experiments": [{"name": "no id"}]}).encode()
    with pytest.raises(RemoteError, match="experiments/search answered JSON not shaped"):
        RemoteMlflow(mlflow_json, private_ok=True).search_experiments()
    mirror = mirror_module.mirror_configure(project=ml_project, url=mlflow_json, operator=True)
    assert mirror_module.mirror_sync_one(mirror_id=mirror.pk) is None
    mirror.refresh_from_db()
    assert "not shaped as MLflow's" in mirror.last_error and mirror.lease_until is None


def test_the_page_shows_the_last_error_and_the_counters(
    users: dict[str, User], ml_project: Project
) -> None:
    mirror = mirror_module.mirror_configure(
        project=ml_project, url="http://mlflow:5000", operator=True
    )
    Mirror.objects.filter(pk=mirror.pk).update(
        last_error="MLflow server http://mlflow:5000: connection failed: refused",
        syncs=7,
        failures=2,
        runs_created=3,
        points_copied=1234,
    )
    text = _client(users["viewer"]).get(reverse("dashboard:settings", args=["ml"])).content
    page = text.decode()
    assert 'id="mirror-error"' in page and "connection failed: refused" in page
    assert "3 runs, 1234 points in 7 syncs (2 failed)" in page
