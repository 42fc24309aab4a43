"""The database goes away under a running web server: /api/v1 and /healthz answer JSON 503 with
Retry-After (they answered Django's HTML 500 page), the real client spools through it, and
everything it logged is stored once the database is back.

The server is `manage.py runserver` in a subprocess on a PostgreSQL cluster of this test's own
(tests/servers.py), stopped and started again mid-test: the suite's database must stay up.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import runcast
from runcast.delivery import Verdict, classify
from runcast.settings import Settings

from config.errors import DATABASE_RETRY_AFTER_S
from tests.servers import LocalPostgres, manage, server_env, web_server

SETUP = """
import json
from django.contrib.auth.models import User
from tracker.models import ApiToken, Membership, Project
from tracker.services import token_create
user = User.objects.create_user("trainer", password="pw-trainer-123")
project = Project.objects.create(slug="outage", name="Outage")
Membership.objects.create(project=project, user=user, role=Membership.Role.OWNER)
print(json.dumps({
    "write": token_create(project=project, name="w", scope=ApiToken.Scope.WRITE),
    "read": token_create(project=project, name="r", scope=ApiToken.Scope.READ),
}))
"""


@dataclass
class Stack:
    postgres: LocalPostgres
    url: str
    write: str
    read: str


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(url: str, *, token: str | None = None, body: Any = None) -> Answer:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, dict(response.headers.items()), response.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, dict(e.headers.items()), e.read())


@pytest.fixture(scope="module")
def stack(
    local_postgres: LocalPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    local_postgres.createdb("runcast_outage")
    env = server_env(local_postgres.url("runcast_outage"), tmp_path_factory.mktemp("var"))
    manage("migrate", "--noinput", env=env)
    tokens = json.loads(manage("shell", "-c", SETUP, env=env).strip().splitlines()[-1])
    with web_server(env) as url:
        yield Stack(local_postgres, url, tokens["write"], tokens["read"])


@pytest.fixture
def database_down(stack: Stack) -> Iterator[Stack]:
    """The test stops the database; it is started again whatever the test's outcome."""
    yield stack
    stack.postgres.start()


def assert_unavailable(answer: Answer, *, echoes: tuple[str, ...] = ()) -> None:
    assert answer.status == 503, answer.body[:500]
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
    text = answer.body.decode()
    assert "Traceback" not in text and "<html" not in text.lower()
    for echoed in echoes:
        assert echoed not in text


def wait_healthy(stack: Stack) -> list[int]:
    """Poll /healthz until 200 (the cluster recovers from its crash); the statuses seen."""
    seen = []
    for _ in range(60):
        seen.append(call(f"{stack.url}/healthz").status)
        if seen[-1] == 200:
            return seen
        time.sleep(0.5)
    raise AssertionError(f"/healthz never came back: {seen}")


def test_it_answers_json_503_while_the_database_is_down(database_down: Stack) -> None:
    stack = database_down
    api = f"{stack.url}/api/v1"
    created = call(
        f"{api}/runs",
        token=stack.write,
        body={"id": "db-down-1", "session": "s1", "project": "outage"},
    )
    assert created.status == 201, created.body
    assert call(f"{stack.url}/healthz").json() == {"ok": True}

    stack.postgres.stop()

    health = call(f"{stack.url}/healthz")
    assert_unavailable(health)
    assert health.json() == {"ok": False, "error": "database unavailable; retry later"}
    batch = {
        "session": "s1",
        "seq": 1,
        "metrics": {"loss-secret-key": {"steps": [1, 2], "values": [0.5, 0.4]}},
    }
    for answer in (
        call(f"{api}/runs/db-down-1/batches", token=stack.write, body=batch),
        call(f"{api}/runs", token=stack.write, body={"id": "db-down-2", "session": "s2"}),
        call(f"{api}/runs/db-down-1/finish", token=stack.write, body={"status": "finished"}),
        call(f"{api}/runs", token=stack.read),
        call(f"{api}/runs/db-down-1/forecast", token=stack.read),
    ):
        assert_unavailable(answer, echoes=("loss-secret-key", "db-down", stack.write))
        assert answer.json() == {"error": "database unavailable; retry later", "field": None}

    stack.postgres.start()
    seen = wait_healthy(stack)
    assert set(seen[:-1]) <= {503}, seen
    again = call(f"{api}/runs/db-down-1/batches", token=stack.write, body=batch)
    assert (again.status, again.json()["accepted"]) == (200, 2)


def test_the_client_retries_and_spools_through_it_and_loses_nothing(
    database_down: Stack, tmp_path: Path
) -> None:
    # What the client makes of the answer: 503 is retried (and spooled), never dropped.
    assert classify("batch", 503) is Verdict.TRANSIENT
    assert classify("create", 503) is Verdict.TRANSIENT
    stack = database_down
    settings = Settings(
        url=stack.url,
        token=stack.write,
        dir=tmp_path / "spool",
        flush_interval=0.05,
        heartbeat_interval=60.0,
        timeout=10.0,
        max_retries=2,
        backoff_base=0.05,
        backoff_max=0.2,
        # The server's Retry-After is longer: the client spools rather than sleep through it.
        retry_after_max=1.0,
        probe_interval=0.1,
        probe_interval_max=0.5,
        finish_timeout=90.0,
    )
    run = runcast.init(project="outage", name="through", id="through-1", settings=settings)
    for step in range(300):
        if step == 100:
            time.sleep(0.5)  # the first hundred arrive; then the database goes
            stack.postgres.stop()
        if step == 200:
            time.sleep(1.0)  # the client meets the 503s and spools
            assert run.stats()["batches_spooled"] > 0
            stack.postgres.start()
            wait_healthy(stack)
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    run.finish()

    summary = call(f"{stack.url}/api/v1/runs/through-1", token=stack.read).json()
    assert (summary["status"], summary["points"], summary["last_step"]) == ("finished", 300, 299)
