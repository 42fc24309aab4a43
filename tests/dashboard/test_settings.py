from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tracker import tokens
from tracker.models import ApiToken, Deadline, Membership
from tracker.project_settings.services import deadline_create

pytestmark = pytest.mark.django_db

DEADLINE = {
    "name": "Blind eval",
    "cutoff_local": "2031-03-15T23:59",
    "timezone": "Asia/Shanghai",
    "buffer_hours": "6",
    "notes": "",
}

# (url, data, least role that may POST, what it answers that role: the new token is shown
# once on the page its POST answers, every other change redirects)
POSTS = (
    ("/projects/llm/settings/project/", {"currency": "EUR", "timezone": "UTC"}, "owner", 302),
    ("/projects/llm/settings/targets/", {"targets": "loss = 3.2"}, "member", 302),
    ("/projects/llm/settings/members/", {"user": "outsider", "role": "viewer"}, "owner", 302),
    ("/projects/llm/settings/tokens/", {"name": "ci", "scope": "read"}, "member", 201),
    ("/projects/llm/deadlines/new/", DEADLINE, "member", 302),
)


@pytest.fixture
def users(owner, member, viewer, outsider, project, other_project):
    return {"owner": owner, "member": member, "viewer": viewer, "outsider": outsider}


def test_every_settings_url_is_404_for_an_outsider(client, users):
    deadline_create(
        project=users["owner"].memberships.first().project,
        name="d",
        slug="d",
        cutoff=datetime(2031, 1, 1, tzinfo=UTC),
        timezone="UTC",
    )
    client.force_login(users["outsider"])
    gets = ["/projects/llm/settings/", "/projects/llm/deadlines/new/", "/projects/llm/deadlines/d/"]
    for url in gets:
        assert client.get(url).status_code == 404, url
    for url, data, _, _ in POSTS:
        assert client.post(url, data).status_code == 404, url
    assert client.post("/projects/llm/settings/tokens/1/revoke/").status_code == 404
    assert client.post("/projects/llm/settings/members/1/", {"remove": "1"}).status_code == 404


def test_anonymous_users_are_sent_to_log_in(client, users):
    assert client.get("/projects/llm/settings/").status_code == 302
    for url, data, _, _ in POSTS:
        assert client.post(url, data).status_code == 302


@pytest.mark.parametrize(("url", "data", "least", "ok"), POSTS)
@pytest.mark.parametrize("role", ["viewer", "member", "owner"])
def test_each_change_needs_its_role(client, users, url, data, least, ok, role):
    client.force_login(users[role])
    status = client.post(url, data).status_code
    rank = {"viewer": 0, "member": 1, "owner": 2}
    if rank[role] < rank[least]:
        assert status == 403
    else:
        assert status == ok, status


def test_a_viewer_sees_settings_read_only(client, users):
    client.force_login(users["viewer"])
    html = client.get("/projects/llm/settings/").content.decode()
    assert "Create token" not in html and "New deadline" not in html
    assert "Add member" not in html and "rc_" not in html


def test_token_is_shown_once_and_stored_hashed(client, users, project):
    client.force_login(users["member"])
    res = client.post("/projects/llm/settings/tokens/", {"name": "ci", "scope": "write"})
    assert res.status_code == 201 and res["Cache-Control"] == "no-store"
    html = res.content.decode()
    full = html.split('id="new-token-value">')[1].split("<")[0]
    parts = tokens.parse(full)
    assert parts is not None
    row = ApiToken.objects.get(prefix=parts.prefix)
    assert row.hashed == tokens.hash_secret(parts.secret) and parts.secret not in row.hashed
    assert row.created_by == users["member"]
    listing = client.get("/projects/llm/settings/").content.decode()
    assert parts.secret not in listing
    assert f"rc_{parts.prefix}_…" in listing


def test_a_member_revokes_a_token(client, users, project):
    client.force_login(users["member"])
    client.post("/projects/llm/settings/tokens/", {"name": "ci", "scope": "write"})
    token = ApiToken.objects.get(name="ci")
    assert client.post(f"/projects/llm/settings/tokens/{token.pk}/revoke/").status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_deadline_cutoff_is_read_in_its_timezone(client, users, project):
    client.force_login(users["member"])
    assert client.post("/projects/llm/deadlines/new/", DEADLINE).status_code == 302
    d = Deadline.objects.get(project=project)
    assert d.slug == "blind-eval" and d.timezone == "Asia/Shanghai"
    assert d.cutoff == datetime(2031, 3, 15, 15, 59, tzinfo=UTC)  # 23:59 at UTC+8
    assert d.buffer == timedelta(hours=6)
    page = client.get("/projects/llm/settings/").content.decode()
    assert "2031-03-15 23:59 Asia/Shanghai" in page
    assert 'datetime="2031-03-15T15:59:00+00:00"' in page


def test_deadline_edit_keeps_the_slug_and_shows_the_announced_wall_clock(client, users, project):
    client.force_login(users["member"])
    client.post("/projects/llm/deadlines/new/", DEADLINE)
    form = client.get("/projects/llm/deadlines/blind-eval/").content.decode()
    assert 'value="2031-03-15T23:59"' in form
    edited = {**DEADLINE, "cutoff_local": "2031-03-16T08:00", "timezone": "America/New_York"}
    assert client.post("/projects/llm/deadlines/blind-eval/", edited).status_code == 302
    d = Deadline.objects.get(project=project, slug="blind-eval")
    assert d.cutoff == datetime(2031, 3, 16, 12, 0, tzinfo=UTC)  # EDT, UTC-4


def test_a_deadline_needs_a_real_timezone(client, users):
    client.force_login(users["member"])
    res = client.post("/projects/llm/deadlines/new/", {**DEADLINE, "timezone": "Mars/Olympus"})
    assert res.status_code == 400 and not Deadline.objects.exists()


def test_owner_changes_price_currency_and_timezone(client, users, project):
    client.force_login(users["owner"])
    data = {"gpu_hour_price": "3.10", "currency": "eur", "timezone": "Europe/Berlin"}
    assert client.post("/projects/llm/settings/project/", data).status_code == 302
    project.refresh_from_db()
    assert (str(project.gpu_hour_price), project.currency, project.timezone) == (
        "3.1000",
        "EUR",
        "Europe/Berlin",
    )


def test_targets_are_parsed_per_line(client, users, project):
    client.force_login(users["member"])
    res = client.post("/projects/llm/settings/targets/", {"targets": "loss = 3.2\nval_loss=3.28"})
    assert res.status_code == 302
    project.refresh_from_db()
    assert project.targets == {"loss": 3.2, "val_loss": 3.28}
    bad = client.post("/projects/llm/settings/targets/", {"targets": "loss = low"})
    assert bad.status_code == 400


def test_owner_manages_members_but_never_removes_the_last_owner(client, users, project):
    client.force_login(users["owner"])
    client.post(
        "/projects/llm/settings/members/", {"user": "outsider@example.com", "role": "viewer"}
    )
    added = Membership.objects.get(project=project, user=users["outsider"])
    assert added.role == "viewer"
    url = f"/projects/llm/settings/members/{added.pk}/"
    assert client.post(url, {"role": "member"}).status_code == 302
    added.refresh_from_db()
    assert added.role == "member"
    assert client.post(url, {"remove": "1"}).status_code == 302
    assert not Membership.objects.filter(pk=added.pk).exists()
    mine = Membership.objects.get(project=project, user=users["owner"])
    res = client.post(f"/projects/llm/settings/members/{mine.pk}/", {"role": "viewer"})
    assert res.status_code == 409
    mine.refresh_from_db()
    assert mine.role == "owner"


def test_settings_page_queries_are_bounded(client, users, django_assert_max_num_queries):
    client.force_login(users["owner"])
    with django_assert_max_num_queries(8):
        assert client.get("/projects/llm/settings/").status_code == 200


@pytest.mark.parametrize(
    "change",
    [
        {"buffer_hours": "1e12"},
        {"buffer_hours": "20000000"},
        {"cutoff_local": "0001-01-01T00:30"},
        {"cutoff_local": "0001-01-02T00:30", "buffer_hours": "100"},
    ],
)
def test_it_refuses_a_cutoff_or_buffer_that_would_break_the_pages(client, users, change):
    client.force_login(users["member"])
    res = client.post("/projects/llm/deadlines/new/", {**DEADLINE, **change})
    assert res.status_code == 400 and not Deadline.objects.exists()
    for url in ("/", "/board/", "/projects/llm/settings/"):
        assert client.get(url).status_code == 200, url


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_it_refuses_a_target_that_is_not_a_finite_number(client, users, project, value):
    client.force_login(users["member"])
    res = client.post("/projects/llm/settings/targets/", {"targets": f"loss = {value}"})
    assert res.status_code == 400
    project.refresh_from_db()
    assert project.targets == {}
