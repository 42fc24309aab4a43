"""Reads from a real PostgreSQL streaming replica (config/replica.py).

A primary cluster of this module's own (initdb, pg_ctl) and a hot standby made from it with
`pg_basebackup -R`, each on a free port; Runcast under gunicorn (one worker, one thread: the
deployed shape, whose requests reuse a connection) with DATABASE_URL on the primary and
DATABASE_REPLICA_URL on the replica. Which database served a read is told by what the page
shows while the replica's WAL replay is paused: the replica still has the old value.
"""

from __future__ import annotations

import http.cookiejar
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.servers import postgres_bin
from tests.servers import LocalPostgres, manage, server_env, web_server

pytestmark = pytest.mark.slow

DB = "runcast_replica"
CSRF = "c" * 32  # an unmasked token, sent as cookie and header (what a form page would give)

SETUP = """
import json
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from tracker.models import ApiToken, Membership, Project
from tracker.services import token_create
user = User.objects.create_user("owner", password="pw-owner-123")
project = Project.objects.create(slug="rep", name="Replica")
Membership.objects.create(project=project, user=user, role=Membership.Role.OWNER)
session = SessionStore()
session[SESSION_KEY] = str(user.pk)
session[BACKEND_SESSION_KEY] = "dashboard.login.ThrottledModelBackend"
session[HASH_SESSION_KEY] = user.get_session_auth_hash()
session.create()
print(json.dumps({
    "write": token_create(project=project, name="w", scope=ApiToken.Scope.WRITE),
    "read": token_create(project=project, name="r", scope=ApiToken.Scope.READ),
    "session": session.session_key,
}))
"""


@dataclass
class Cluster:
    primary: LocalPostgres
    replica: LocalPostgres
    env: dict[str, str]
    write: str
    read: str
    session: str

    def replica_backends(self, app: str) -> int:
        """Connections of the web server named `app` that the replica serves."""
        # Both names are this module's constants.
        query = (
            "SELECT count(*) FROM pg_stat_activity "  # noqa: S608
            f"WHERE datname = '{DB}' AND application_name = '{app}'"
        )
        return int(self.replica.sql(query))

    def web_env(self, app: str) -> dict[str, str]:
        # application_name tells this server's connections from psql's and other servers'.
        return {
            **self.env,
            "DATABASE_URL": f"{self.primary.url(DB)}?application_name={app}",
            "DATABASE_REPLICA_URL": f"{self.replica.url(DB)}?application_name={app}",
        }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    bin_dir = postgres_bin()
    if bin_dir is None or not (bin_dir / "pg_basebackup").exists():
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) are not installed")
    primary = LocalPostgres(bin_dir).init()
    primary.start()
    replica: LocalPostgres | None = None
    try:
        primary.createdb(DB)
        env = server_env(primary.url(DB), tmp_path_factory.mktemp("var"))
        # The replica is made after migrating: it starts with the schema, as a real one would.
        manage("migrate", "--noinput", env=env)
        ids = json.loads(manage("shell", "-c", SETUP, env=env).strip().splitlines()[-1])
        replica = primary.standby()
        replica.start()
        env["RUNCAST_REPLICA_RETRY_S"] = "1"
        yield Cluster(primary, replica, env, ids["write"], ids["read"], ids["session"])
    finally:
        if replica is not None:
            replica.remove()
        primary.remove()


@pytest.fixture
def replay_paused(cluster: Cluster) -> Iterator[Cluster]:
    """The replica stops applying the primary's WAL: it answers as of this moment."""
    cluster.replica.sql("SELECT pg_wal_replay_pause()")
    try:
        yield cluster
    finally:
        cluster.replica.sql("SELECT pg_wal_replay_resume()")


class Browser:
    """A logged-in member's cookie jar (session, CSRF and the sticky-primary cookie)."""

    def __init__(self, base: str, session: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        for name, value in (("sessionid", session), ("csrftoken", CSRF)):
            self.jar.set_cookie(_cookie(name, value))

    def get(self, path: str) -> tuple[int, str]:
        return self._open(urllib.request.Request(self.base + path))

    def post(self, path: str, form: dict[str, str]) -> tuple[int, str]:
        data = urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(self.base + path, data=data, method="POST")
        request.add_header("X-CSRFToken", CSRF)
        return self._open(request)

    def cookies(self) -> set[str]:
        return {c.name for c in self.jar}

    def _open(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self.opener.open(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


def _cookie(name: str, value: str) -> http.cookiejar.Cookie:
    return http.cookiejar.Cookie(
        0, name, value, None, False, "127.0.0.1", False, False, "/", True, False,
        None, False, None, None, {},
    )  # fmt: skip


def api(base: str, path: str, token: str, body: object = None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{base}/api/v1{path}", data=data)
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_replicated(cluster: Cluster, query: str, expected: str) -> None:
    deadline = time.monotonic() + 20
    while cluster.replica.sql(query, DB) != expected:
        assert time.monotonic() < deadline, f"the replica never showed {query} = {expected}"
        time.sleep(0.1)


def run_steps(page: str) -> str:
    marker = "P90 to step "
    assert marker in page, page[:2000]
    return page.split(marker, 1)[1].split("<", 1)[0].strip()


def test_it_writes_through_the_primary_only(cluster: Cluster, tmp_path: Path) -> None:
    with web_server(cluster.web_env("rc-writes"), gunicorn=True) as base:
        created = api(base, "/runs", cluster.write, {"id": "w-1", "session": "s1", "name": "w"})
        assert created[0] == 201, created
        batch = {"session": "s1", "seq": 1, "metrics": {"loss": {"steps": [1], "values": [1.0]}}}
        assert api(base, "/runs/w-1/batches", cluster.write, batch)[0] == 200
        browser = Browser(base, cluster.session)
        status, _ = browser.post("/runs/rep/w-1/plan/", {"total_steps": "500"})
        assert status == 200  # followed the redirect to the run page, which read the primary
        assert api(base, "/runs/w-1/finish", cluster.write, {"status": "finished"})[0] == 200
        assert cluster.replica_backends("rc-writes") == 0
        # What was written reaches the replica by replication.
        wait_replicated(
            cluster, "SELECT total_steps FROM tracker_run WHERE public_id = 'w-1'", "500"
        )


def test_pages_and_api_reads_come_from_the_replica_but_a_members_own_change_does_not(
    replay_paused: Cluster,
) -> None:
    cluster = replay_paused
    with web_server(cluster.web_env("rc-reads"), gunicorn=True) as base:
        run = {"id": "r-1", "session": "s1", "total_steps": 1000}
        # Written on the primary while the replica is paused: the replica has no such run.
        assert api(base, "/runs", cluster.write, run)[0] == 201
        assert api(base, "/runs/r-1", cluster.read)[0] == 404
        assert cluster.replica_backends("rc-reads") == 1
        cluster.replica.sql("SELECT pg_wal_replay_resume()")
        wait_replicated(
            cluster, "SELECT total_steps FROM tracker_run WHERE public_id = 'r-1'", "1000"
        )
        cluster.replica.sql("SELECT pg_wal_replay_pause()")
        status, body = api(base, "/runs/r-1", cluster.read)
        assert (status, body["total_steps"]) == (200, 1000)  # type: ignore[index]

        browser = Browser(base, cluster.session)
        assert run_steps(browser.get("/runs/rep/r-1/")[1]) == "1000"
        status, page = browser.post("/runs/rep/r-1/plan/", {"total_steps": "2000"})
        # The redirect's page and the next ones read the primary: the member sees the change.
        assert "rc_primary" in browser.cookies()
        assert (status, run_steps(page)) == (200, "2000")
        assert run_steps(browser.get("/runs/rep/r-1/")[1]) == "2000"
        # Another member's page is read from the replica, a replication delay behind (here,
        # as long as the replay is paused).
        other = Browser(base, cluster.session)
        assert run_steps(other.get("/runs/rep/r-1/")[1]) == "1000"
        assert api(base, "/runs/r-1", cluster.read)[1]["total_steps"] == 1000  # type: ignore[index]
        cluster.replica.sql("SELECT pg_wal_replay_resume()")
        wait_replicated(
            cluster, "SELECT total_steps FROM tracker_run WHERE public_id = 'r-1'", "2000"
        )
        assert run_steps(other.get("/runs/rep/r-1/")[1]) == "2000"


def test_pages_keep_working_from_the_primary_while_the_replica_is_down_and_use_it_again(
    cluster: Cluster,
) -> None:
    with web_server(cluster.web_env("rc-down"), gunicorn=True) as base:
        assert api(base, "/runs", cluster.write, {"id": "d-1", "session": "s1"})[0] == 201
        wait_replicated(cluster, "SELECT count(*) FROM tracker_run WHERE public_id = 'd-1'", "1")
        browser = Browser(base, cluster.session)
        assert browser.get("/runs/rep/d-1/")[0] == 200
        assert cluster.replica_backends("rc-down") == 1  # the one connection it keeps
        cluster.replica.stop()
        try:
            # The kept connection breaks mid-request: the page is read again from the primary.
            assert browser.get("/runs/rep/d-1/")[0] == 200
            assert api(base, "/runs/d-1", cluster.read)[0] == 200
            assert browser.get("/")[0] == 200
            assert browser.get("/runs/rep/d-1/series.json")[0] == 200
        finally:
            cluster.replica.start()
        # RUNCAST_REPLICA_RETRY_S (1 s here) after the failure the replica is tried again.
        deadline = time.monotonic() + 20
        while cluster.replica_backends("rc-down") == 0:
            assert time.monotonic() < deadline, "the server never went back to the replica"
            assert browser.get("/runs/rep/d-1/")[0] == 200
            time.sleep(0.3)
