"""Every URL, every role: a new page cannot ship unprotected.

The tests walk Django's URL resolver and request every named pattern, with real object ids for
its path parameters, as anonymous, an outsider (logged in, no membership), viewer, member and
owner, by GET and by POST, and every POST again without a CSRF token. API endpoints get the
same walk with no token, a read token, a write token and another project's token.

What each URL may do is written down below (PAGES, API, ADMIN_NAMESPACE). A URL the resolver
knows and the tables do not fails `test_every_url_is_classified` and its own matrix cases with a
message saying where to classify it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import NoReverseMatch, URLPattern, URLResolver, get_resolver, reverse

from alerts import services as alert_services
from alerts.models import Channel
from tracker import artifacts, invitations
from tracker.gpu import services as gpu_services
from tracker.models import ApiToken, Deadline, Membership, Project, Run, SavedView
from tracker.project_settings import services as settings_services
from tracker.services import token_create

pytestmark = pytest.mark.django_db

# Who may do something, from least to most: a level is met by every role at or above it.
# "staff": Django staff only (no project role reaches it).
LEVELS = ("public", "user", "viewer", "member", "owner", "staff")
ROLES = ("anonymous", "outsider", "viewer", "member", "owner")
RANK = {role: i for i, role in enumerate(ROLES)}  # anonymous 0 ... owner 4
NEED = {"public": 0, "user": 1, "viewer": 2, "member": 3, "owner": 4, "staff": 5}


@dataclass(frozen=True)
class Page:
    """A session-authenticated URL. get/post: the least level that may use the method (None:
    the method answers 405). project: scoped to a project, so an outsider gets 404 (the project's
    existence is not disclosed). data: a POST body (the matrix checks who gets past the access
    check; an allowed POST with a body a form refuses still answers 400, not 403).
    get_ok/post_ok: the exact status an allowed request answers, so a page that starts refusing
    (or stops saving) a role it should serve fails here."""

    get: str | None
    post: str | None
    project: bool = True
    data: dict[str, str] = field(default_factory=dict)
    # Where an allowed POST lands is the login page (logging out), not a sign of refusal.
    ends_at_login: bool = False
    get_ok: int = 200
    post_ok: int = 302
    # Where a signed-in user's allowed POST answers otherwise than an anonymous one's.
    post_ok_signed_in: int | None = None


PAGES: dict[str, Page] = {
    "healthz": Page(get="public", post=None, project=False),
    # An empty login form is shown again with its errors.
    "login": Page(get="public", post="public", project=False, post_ok=200),
    "logout": Page(get=None, post="public", project=False, ends_at_login=True),
    "dashboard:home": Page(get="user", post=None, project=False),
    "dashboard:board-partial": Page(get="user", post=None, project=False),
    "dashboard:run": Page(get="viewer", post=None),
    "dashboard:run-summary": Page(get="viewer", post=None),
    "dashboard:run-ranks": Page(get="viewer", post=None),
    "dashboard:run-file": Page(get="viewer", post=None),
    "dashboard:run-plan": Page(get=None, post="member", data={"total_steps": "20"}),
    "dashboard:host": Page(get="viewer", post=None),
    "dashboard:run-series": Page(get="viewer", post=None),
    "dashboard:run-throughput": Page(get="viewer", post=None),
    "dashboard:run-overview": Page(get="viewer", post=None),
    "dashboard:compare": Page(get="viewer", post=None),
    # The runs explorer and the deadline page read; saving a view is a member's.
    "dashboard:runs": Page(get="viewer", post=None),
    "dashboard:runs-csv": Page(get="viewer", post=None),
    "dashboard:deadlines": Page(get="viewer", post=None),
    "dashboard:runs-all": Page(get="user", post=None, project=False),
    "dashboard:runs-all-csv": Page(get="user", post=None, project=False),
    "dashboard:view-save": Page(get=None, post="member", data={"name": "mine", "query": "s=1"}),
    "dashboard:view-delete": Page(get=None, post="member"),
    # Tag, untag, delete, restore (or forward to compare) the selected runs: members.
    "dashboard:runs-bulk": Page(get=None, post="member", data={"action": "compare"}),
    "dashboard:settings": Page(get="viewer", post=None),
    "dashboard:settings-project": Page(
        get=None,
        post="owner",
        data={"gpu_hour_price": "3.5", "currency": "EUR", "timezone": "Europe/Paris"},
    ),
    # An empty URL: the form refuses it after the access check (no request leaves the server).
    "dashboard:settings-mirror": Page(get=None, post="owner", data={"url": ""}, post_ok=400),
    "dashboard:settings-targets": Page(
        get=None, post="member", data={"targets": "loss 1.5"}, post_ok=400
    ),
    # No user "x": the form refuses it after the access check.
    "dashboard:member-add": Page(
        get=None, post="owner", data={"user": "x", "role": "viewer"}, post_ok=400
    ),
    "dashboard:member-update": Page(get=None, post="owner", data={"role": "member"}),
    # The new token is shown once, on the page the POST answers.
    "dashboard:token-new": Page(
        get=None, post="member", data={"name": "t", "scope": "read"}, post_ok=201
    ),
    # Projects are created by staff unless RUNCAST_USERS_CAN_CREATE_PROJECTS (off in tests); the
    # matrix posts an empty form, which the page refuses (400).
    "dashboard:project-new": Page(get="staff", post="staff", project=False, post_ok=400),
    "dashboard:member-invite": Page(
        get=None, post="owner", data={"email": "new@example.com", "role": "viewer"}, post_ok=400
    ),
    "dashboard:member-create": Page(get=None, post="owner", post_ok=400),
    "dashboard:invitation-revoke": Page(get=None, post="owner"),
    # The invitation link's token is the credential: anyone holding it may see and spend it.
    # An empty form is refused (400); a user signed in as someone else is told to sign out (409).
    "dashboard:invite-accept": Page(
        get="public", post="public", project=False, post_ok=400, post_ok_signed_in=409
    ),
    "password_change": Page(get="user", post="user", project=False, post_ok=200),
    "password_change_done": Page(get="user", post=None, project=False),
    "dashboard:token-revoke": Page(get=None, post="member"),
    "dashboard:deadline-new": Page(get="member", post="member", post_ok=400),
    "dashboard:deadline-edit": Page(get="member", post="member", post_ok=400),
    "alerts:history": Page(get="viewer", post=None),
    "alerts:run-history": Page(get="viewer", post=None),
    "alerts:channels": Page(
        get="viewer",
        post="member",
        data={"kind": "email", "name": "new", "target": "b@example.com"},
    ),
    "alerts:channel-edit": Page(
        get="member",
        post="member",
        data={"kind": "email", "name": "renamed", "target": "c@example.com", "enabled": "on"},
    ),
    "alerts:channel-delete": Page(get=None, post="member"),
    "alerts:channel-test": Page(get=None, post="member"),
    "alerts:rules": Page(get="viewer", post=None),
    "alerts:rule-edit": Page(
        get="member", post="member", data={"severity": "warning", "cooldown": "01:00:00"}
    ),
}


@dataclass(frozen=True)
class Api:
    """A token-authenticated /api/v1/ operation: its method and the scope it needs (None:
    public). body: a request that a token of the right scope gets accepted. ok: what that
    request answers; other_ok: what another project's token of that scope gets, where it differs
    (it creates in its own project what this project already has)."""

    method: str
    scope: str | None
    body: dict[str, Any] = field(default_factory=dict)
    public_status: int = 200
    ok: int = 200
    other_ok: int | None = None


API: dict[str, Api] = {
    # ninja names its prefix for reverse(); nothing is served there.
    "api-v1:api-root": Api("GET", None, public_status=404),
    "api-v1:openapi-json": Api("GET", None),
    "api-v1:openapi-view": Api("GET", None),
    # "pretrain" exists here (resumed: 200); another project's token creates its own (201).
    "api-v1:run_create": Api("POST", "write", {"id": "pretrain", "session": "s2"}, other_ok=201),
    "api-v1:run_list": Api("GET", "read"),
    "api-v1:run_detail": Api("GET", "read"),
    "api-v1:run_forecast": Api("GET", "read"),
    "api-v1:batch_create": Api(
        "POST",
        "write",
        {"session": "s1", "seq": 1, "metrics": {"loss": {"steps": [1], "values": [2.0]}}},
    ),
    "api-v1:run_finish": Api("POST", "write", {"status": "failed"}),
    "api-v1:timings_create": Api(
        "POST", "write", {"session": "r1", "seq": 1, "rank": 1, "steps": [1], "compute_s": [0.5]}
    ),
    "api-v1:host_create": Api("POST", "write", {"host": "node-9", "session": "a1"}, ok=201),
    "api-v1:host_batch": Api("POST", "write", {"session": "a1", "seq": 1}),
    "api-v1:host_finish": Api("POST", "write"),
}
# The MLflow tracking API (tracker/mlflow): token-authenticated like /api/v1/, but it answers
# in MLflow's error JSON; its own matrix is test_the_mlflow_api_answers_each_token_as_mlflow_does.
MLFLOW = {"mlflow-api", "mlflow-artifacts"}
# Django's admin guards its own views (staff only); every page of it, whatever models other
# apps register, must send our non-staff users to its login.
ADMIN_NAMESPACE = "admin"
ADMIN_PUBLIC = {"admin:login"}
# Logging out takes a POST; a GET is sent back to the admin's index (and from there to login).
ADMIN_BOUNCE = {"admin:logout": "/admin/"}


# --- walking the resolver --------------------------------------------------------------------


@dataclass(frozen=True)
class Url:
    name: str
    params: tuple[str, ...]
    route: str  # the full route, prefixes included, as the URLconf writes it


def _walk(
    resolver: URLResolver, namespace: tuple[str, ...] = (), prefix: str = ""
) -> Iterator[Url]:
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            ns = (*namespace, entry.namespace) if entry.namespace else namespace
            yield from _walk(entry, ns, route)
        elif isinstance(entry, URLPattern):
            name = ":".join((*namespace, entry.name or "<unnamed>"))
            yield Url(name, tuple(entry.pattern.regex.groupindex), route)


def resolver_urls() -> list[Url]:
    """Every pattern once; of patterns sharing a name (the API's GET and POST on one route),
    the first, which is the one reverse() and the resolver pick."""
    seen: dict[str, Url] = {}
    for url in _walk(get_resolver()):
        seen.setdefault(url.route if _is_admin(url.name) else url.name, url)
    return sorted(seen.values(), key=lambda u: (u.name, u.route))


def _is_admin(name: str) -> bool:
    return name.split(":")[0] == ADMIN_NAMESPACE


def _where_to_classify(name: str) -> str:
    table = "API" if name.startswith("api-v1:") else "PAGES"
    if name in MLFLOW:
        return f"{name!r} is an MLflow route: test it in the MLflow matrix below"
    return (
        f"URL name {name!r} is not classified: add it to {table} in "
        "tests/security/test_url_matrix.py with the least role that may GET and POST it "
        "(None where the method must answer 405)"
    )


URLS = resolver_urls()
PAGE_URLS = [
    u
    for u in URLS
    if not u.name.startswith("api-v1:") and not _is_admin(u.name) and u.name not in MLFLOW
]
API_URLS = [u for u in URLS if u.name.startswith("api-v1:")]
ADMIN_URLS = [u for u in URLS if _is_admin(u.name)]


def test_every_url_is_classified() -> None:
    names = {u.name for u in URLS}
    unknown = sorted(
        n for n in names if not _is_admin(n) and n not in PAGES and n not in API and n not in MLFLOW
    )
    assert not unknown, "\n".join(_where_to_classify(n) for n in unknown)
    stale = sorted((set(PAGES) | set(API) | MLFLOW) - names)
    assert not stale, f"classified but no longer routed (remove them): {stale}"
    unnamed = [u.route for u in URLS if u.name.endswith("<unnamed>") and not _is_admin(u.name)]
    assert not unnamed, f"every URL pattern needs a name to be classified: {unnamed}"


# --- a project with one of everything ---------------------------------------------------------


@dataclass
class World:
    project: Project
    other: Project
    users: dict[str, User | None]
    run: Run
    channel: Channel
    deadline: Deadline
    tokens: dict[str, str]
    token_row: ApiToken
    membership: Membership
    invitation_id: int
    invitation_token: str
    view_id: int

    def kwargs(self, url: Url, project: str | None = None) -> dict[str, Any]:
        values: dict[str, Any] = {
            "project": project or self.project.slug,
            "run_id": self.run.public_id,
            "channel_id": self.channel.pk,
            "membership_id": self.membership.pk,
            "token_id": self.token_row.pk,
            "slug": self.deadline.slug,
            "kind": "nan",
            "invitation_id": self.invitation_id,
            "token": self.invitation_token,
            "host": "node-3",
            "path": "notes.txt",
            "view_id": self.view_id,
        }
        missing = [p for p in url.params if p not in values]
        assert not missing, f"{url.name}: no real value for path parameter(s) {missing}"
        return {p: values[p] for p in url.params}

    def path(self, url: Url, project: str | None = None) -> str:
        return reverse(url.name, kwargs=self.kwargs(url, project))

    def state(self) -> tuple[Any, ...]:
        """What a refused request must leave as it was."""
        project = Project.objects.get(pk=self.project.pk)
        return (
            project.gpu_hour_price,
            project.currency,
            project.timezone,
            project.targets,
            sorted(Membership.objects.filter(project=project).values_list("user_id", "role")),
            sorted(ApiToken.objects.filter(project=project).values_list("pk", "revoked_at")),
            sorted(Channel.objects.filter(project=project).values_list("pk", "name", "target")),
            sorted(Deadline.objects.filter(project=project).values_list("slug", "name")),
            sorted(project.invitations.values_list("email", "revoked_at", "accepted_at")),
            Project.objects.count(),
            list(project.alert_rules.values_list("kind", "severity", "cooldown")),
            sorted(project.saved_views.values_list("pk", "name", "query")),
            list(
                Run.objects.filter(project=project).values_list(
                    "public_id", "status", "total_steps"
                )
            ),
        )


@pytest.fixture
def world(
    project: Project,
    other_project: Project,
    owner: User,
    member: User,
    viewer: User,
    outsider: User,
) -> World:
    run = Run.objects.create(project=project, public_id="pretrain", name="pretrain", total_steps=10)
    prefix = artifacts.run_prefix(project_id=project.pk, run_id=run.pk)
    artifacts.artifact_store().write(f"{prefix}/notes.txt", io.BytesIO(b"notes"), max_bytes=100)
    channel = alert_services.channel_create(
        project=project, kind="email", name="lead", target="lead@example.com"
    )
    deadline = settings_services.deadline_create(
        project=project,
        name="Blind eval",
        cutoff=datetime.now(UTC) + timedelta(days=30),
        timezone="UTC",
    )
    read = token_create(project=project, name="reader", scope=ApiToken.Scope.READ)
    gpu_services.host_register(project=project, name="node-3", boot_id="", gpus=[])
    issued = invitations.invitation_create(
        project=project, email="invited@example.com", role="viewer", invited_by=owner
    )
    tokens = {
        "read": read,
        "write": token_create(project=project, name="writer", scope=ApiToken.Scope.WRITE),
        "other-read": token_create(project=other_project, name="r", scope=ApiToken.Scope.READ),
        "other-write": token_create(project=other_project, name="w", scope=ApiToken.Scope.WRITE),
    }
    return World(
        project=project,
        other=other_project,
        users={
            "anonymous": None,
            "outsider": outsider,
            "viewer": viewer,
            "member": member,
            "owner": owner,
        },
        run=run,
        channel=channel,
        deadline=deadline,
        tokens=tokens,
        token_row=ApiToken.objects.get(project=project, name="reader"),
        membership=Membership.objects.get(project=project, user=viewer),
        invitation_id=issued.invitation.pk,
        invitation_token=issued.link.rstrip("/").rsplit("/", 1)[-1],
        view_id=SavedView.objects.create(project=project, name="mine", query="sort=name").pk,
    )


def _client(world: World, role: str, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    user = world.users[role]
    if user is not None:
        client.force_login(user)
    return client


def _is_login_redirect(response: Any, login: str = "/login/") -> bool:
    return response.status_code == 302 and urlsplit(response["Location"]).path == login


# --- pages: every role, GET and POST ----------------------------------------------------------


def _expect(level: str | None, role: str, project_scoped: bool, other: str | None) -> str:
    """'allowed', 'login', 'hidden' (404), 'forbidden' (403) or 'method' (405). other: the
    level of the page's other method."""
    if role == "anonymous" and (level or other) != "public":
        # A page behind login sends anonymous users there before it looks at the method.
        return "login"
    if level is None:
        return "method"
    if role == "outsider" and project_scoped and NEED[level] >= NEED["viewer"]:
        return "hidden"
    return "allowed" if RANK[role] >= NEED[level] else "forbidden"


def _check(response: Any, expected: str, what: str, ok: int, ends_at_login: bool = False) -> None:
    """ok: the exact status the page answers a request it allows."""
    status = response.status_code
    if expected == "login":
        assert _is_login_redirect(response), f"{what}: anonymous must go to login, got {status}"
    elif expected == "hidden":
        assert status == 404, f"{what}: an outsider must get 404, got {status}"
    elif expected == "forbidden":
        assert status == 403, f"{what}: must be refused with 403, got {status}"
    elif expected == "method":
        assert status == 405, f"{what}: must answer 405, got {status}"
    else:
        assert status == ok, f"{what}: must be allowed with {ok}, got {status}"
        assert ends_at_login or not _is_login_redirect(response), (
            f"{what}: allowed, but sent to login"
        )


def _post_ok(page: Page, role: str) -> int:
    if role != "anonymous" and page.post_ok_signed_in is not None:
        return page.post_ok_signed_in
    return page.post_ok


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("url", PAGE_URLS, ids=lambda u: u.name)
def test_every_page_answers_each_role_as_classified(world: World, url: Url, role: str) -> None:
    page = PAGES.get(url.name)
    assert page is not None, _where_to_classify(url.name)
    client = _client(world, role)
    path = world.path(url)

    expected = _expect(page.get, role, page.project, page.post)
    _check(client.get(path), expected, f"GET {path} as {role}", page.get_ok)

    before = world.state()
    expected = _expect(page.post, role, page.project, page.get)
    response = client.post(path, page.data)
    _check(response, expected, f"POST {path} as {role}", _post_ok(page, role), page.ends_at_login)
    if expected != "allowed":
        assert world.state() == before, f"POST {path} as {role} was refused but changed data"


OPEN_TO_USERS = [
    u
    for u in PAGE_URLS
    if u.name in PAGES and not PAGES[u.name].project and PAGES[u.name].get == "user"
]


@pytest.mark.parametrize("url", OPEN_TO_USERS, ids=lambda u: u.name)
def test_the_pages_every_user_opens_show_an_outsider_nothing_of_the_project(
    world: World, url: Url
) -> None:
    response = _client(world, "outsider").get(world.path(url))
    raw = (
        b"".join(response.streaming_content)  # the CSV export streams its rows
        if response.streaming
        else response.content
    )
    body = raw.decode()
    assert world.run.public_id not in body and world.project.name not in body


OBJECT_PARAMS = {"run_id", "channel_id", "membership_id", "token_id", "slug", "invitation_id"}


@pytest.mark.parametrize(
    "url", [u for u in PAGE_URLS if OBJECT_PARAMS & set(u.params)], ids=lambda u: u.name
)
def test_an_owner_of_another_project_cannot_reach_its_objects_through_their_own(
    world: World, url: Url
) -> None:
    # The outsider owns "other": the ids of llm's objects under /projects/other/ must be 404.
    client = _client(world, "outsider")
    path = world.path(url, project=world.other.slug)
    before = world.state()
    page = PAGES[url.name]
    for method in ("get", "post"):
        response = getattr(client, method)(path, page.data if method == "post" else None)
        # A method the page does not serve is 405 before any lookup; one it serves finds nothing.
        expected = 405 if getattr(page, method) is None else 404
        assert response.status_code == expected, f"{method.upper()} {path}: {response.status_code}"
    assert world.state() == before


@pytest.mark.parametrize(
    "url", [u for u in PAGE_URLS if PAGES.get(u.name, Page(None, None)).post], ids=lambda u: u.name
)
def test_every_post_without_a_csrf_token_is_refused(world: World, url: Url) -> None:
    page = PAGES[url.name]
    role = "owner" if page.post != "public" else "anonymous"
    if page.post == "staff":
        User.objects.filter(pk=world.users["owner"].pk).update(is_staff=True)
    client = _client(world, role, csrf=True)
    path = world.path(url)
    before = world.state()
    response = client.post(path, page.data)
    assert response.status_code == 403, f"POST {path} without CSRF: {response.status_code}"
    assert world.state() == before

    # The same request with the token passes: the 403 above was the CSRF check's.
    client.get(reverse("login") if role == "anonymous" else reverse("dashboard:home"))
    token = client.cookies["csrftoken"].value
    response = client.post(path, {**page.data, "csrfmiddlewaretoken": token})
    ok = _post_ok(page, role)
    assert response.status_code == ok, f"POST {path} with CSRF: {response.status_code}"


# --- the API: no token, read, write, another project's ----------------------------------------

TOKENS = ("none", "read", "write", "other")


def _api_call(world: World, url: Url, token: str) -> Any:
    api = API[url.name]
    headers = {}
    if token != "none":
        scope = api.scope or "read"
        raw = world.tokens[f"other-{scope}"] if token == "other" else world.tokens[token]
        headers["HTTP_AUTHORIZATION"] = f"Bearer {raw}"
    path = world.path(url)
    client = Client(enforce_csrf_checks=True)  # tokens, not cookies: no CSRF needed
    if api.method == "GET":
        return client.get(path, **headers)
    return client.post(path, data=api.body, content_type="application/json", **headers)


@pytest.mark.parametrize("token", TOKENS)
@pytest.mark.parametrize("url", API_URLS, ids=lambda u: u.name)
def test_every_api_operation_answers_each_token_as_classified(
    world: World, url: Url, token: str
) -> None:
    api = API.get(url.name)
    assert api is not None, _where_to_classify(url.name)
    before = world.state()
    response = _api_call(world, url, token)
    status, what = response.status_code, f"{api.method} {url.name} with {token} token"
    if api.scope is None:
        assert status == api.public_status, f"{what}: public, got {status}"
        return
    if token == "none":
        assert status == 401, f"{what}: {status}"
    elif token == "other":
        # Another project's token of the right scope sees and changes only its own project.
        if "run_id" in url.params or "host" in url.params:
            assert status == 404, f"{what}: {status}"
        else:
            other_ok = api.ok if api.other_ok is None else api.other_ok
            assert status == other_ok, f"{what}: {status}"
            assert world.run.public_id not in response.content.decode() or api.method == "POST"
        assert world.state() == before
        return
    elif token != api.scope:
        assert status == 403, f"{what}: {status}"
    else:
        assert status == api.ok, f"{what}: {status} {response.content[:200]!r}"
        return
    assert world.state() == before


def test_another_projects_token_cannot_create_into_this_project(world: World) -> None:
    client = Client()
    response = client.post(
        "/api/v1/runs",
        data={"id": "intruder", "session": "s", "project": world.project.slug},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {world.tokens['other-write']}",
    )
    assert response.status_code == 404
    assert not Run.objects.filter(public_id="intruder").exists()


# --- Django's admin ---------------------------------------------------------------------------


def _admin_path(url: Url) -> str | None:
    values = {"app_label": "auth", "object_id": "1", "id": "1", "content_type_id": "1", "url": "x/"}
    if url.name.endswith("<unnamed>"):
        # Unnamed (the admin's "<object_id>/" redirect): fill the route's own parameters.
        return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m.group(1)], url.route)
    try:
        return reverse(url.name, kwargs={p: values[p] for p in url.params})
    except NoReverseMatch:  # an app_label pattern that does not list "auth"
        return None


# Staff status is all the admin looks at: project roles give nothing there.
@pytest.mark.parametrize("role", ["anonymous", "owner"])
@pytest.mark.parametrize("url", ADMIN_URLS, ids=lambda u: u.route)
def test_the_admin_sends_every_non_staff_role_to_its_login(
    world: World, url: Url, role: str
) -> None:
    path = _admin_path(url)
    assert path is not None, f"{url.name}: no path for parameters {url.params}"
    response = _client(world, role).get(path)
    if url.name in ADMIN_PUBLIC:
        assert response.status_code == 200
    elif url.name in ADMIN_BOUNCE:
        assert response.status_code == 302 and response["Location"] == ADMIN_BOUNCE[url.name]
    else:
        assert _is_login_redirect(response, "/admin/login/"), (
            f"GET {path} as {role}: {response.status_code}"
        )


# --- the MLflow tracking API ------------------------------------------------------------------


# Per token: (status, error_code) of reading the run and of logging to it; None: no error.
MLFLOW_ANSWERS: dict[str, tuple[tuple[int, str | None], tuple[int, str | None]]] = {
    "none": ((401, "UNAUTHENTICATED"), (401, "UNAUTHENTICATED")),
    "read": ((200, None), (403, "PERMISSION_DENIED")),
    "write": ((200, None), (200, None)),
    # Another project's tokens, each of the scope the call needs: the run does not exist for them.
    "other": ((404, "RESOURCE_DOES_NOT_EXIST"), (404, "RESOURCE_DOES_NOT_EXIST")),
}


def _mlflow_auth(world: World, token: str, scope: str) -> dict[str, str]:
    if token == "none":
        return {}
    raw = world.tokens[f"other-{scope}"] if token == "other" else world.tokens[token]
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def _mlflow_answer(response: Any) -> tuple[int, str | None]:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    return response.status_code, response.json().get("error_code")


@pytest.mark.parametrize("token", TOKENS)
def test_the_mlflow_api_answers_each_token_as_mlflow_does(world: World, token: str) -> None:
    """Reading a run needs a read token of its project; logging needs a write token; no token is
    401 and another project's token does not see the run: always MLflow's error JSON."""
    client = Client(enforce_csrf_checks=True)
    created = client.post(
        "/api/2.0/mlflow/runs/create",
        data={"experiment_id": "0"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {world.tokens['write']}",
    )
    assert created.status_code == 200, created.content[:200]
    run_id = created.json()["run"]["info"]["run_id"]
    before = world.state()
    got = client.get(
        "/api/2.0/mlflow/runs/get", {"run_id": run_id}, **_mlflow_auth(world, token, "read")
    )
    logged = client.post(
        "/api/2.0/mlflow/runs/log-parameter",
        data={"run_id": run_id, "key": "lr", "value": "0.1"},
        content_type="application/json",
        **_mlflow_auth(world, token, "write"),
    )
    listed = client.get(
        "/api/2.0/mlflow-artifacts/artifacts",
        {"path": f"0/{run_id}/artifacts"},
        **_mlflow_auth(world, token, "read"),
    )
    uploaded = client.put(
        f"/api/2.0/mlflow-artifacts/artifacts/0/{run_id}/artifacts/a.txt",
        data=b"a",
        content_type="text/plain",
        **_mlflow_auth(world, token, "write"),
    )
    assert (_mlflow_answer(got), _mlflow_answer(logged)) == MLFLOW_ANSWERS[token]
    # The run's artifacts answer as the run does: a read token lists, a write token uploads.
    assert (_mlflow_answer(listed), _mlflow_answer(uploaded)) == MLFLOW_ANSWERS[token]
    if got.status_code == 200:
        assert got.json()["run"]["info"]["run_id"] == run_id
    # Only the write token's param is logged; every refusal leaves the run as it was.
    auth = _mlflow_auth(world, "write", "read")
    run = client.get("/api/2.0/mlflow/runs/get", {"run_id": run_id}, **auth).json()["run"]
    logged_params = [{"key": "lr", "value": "0.1"}] if token == "write" else []
    assert run["data"].get("params", []) == logged_params
    assert world.state() == before
