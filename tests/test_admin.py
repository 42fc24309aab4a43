"""Every model an operator needs is in /admin/, its pages load with data in them, derived and
ledger rows are read-only, and no hash or secret reaches a page."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from alerts import services as alert_services
from alerts.models import Channel, Digest
from forecasting import inputs
from forecasting.models import ConditionReading, Forecast, ServerClock
from tests.alerts.fixtures import flag_raise
from tracker import invitations, rank_timings
from tracker.admin import ReadOnlyAdmin
from tracker.models import ApiToken, GpuEpisode, Host, Invitation, Membership, Project, Run
from tracker.project_settings.services import deadline_create
from tracker.saved_views import saved_view_save

pytestmark = pytest.mark.django_db

APPS = ("tracker", "forecasting", "alerts")
MODELS = [m for app in APPS for m in apps.get_app_config(app).get_models()]
# Written only by services (or a ledger of what was sent): never added or edited by hand.
READ_ONLY = {
    "tracker.apitoken",
    "tracker.invitation",
    "tracker.run",
    "tracker.runsegment",
    "tracker.ingestbatch",
    "tracker.metricchunk",
    "tracker.ranktimingchunk",
    "tracker.ranktimingrollup",
    "tracker.ranktimingblock",
    "tracker.event",
    "tracker.host",
    "tracker.hostbatch",
    "tracker.hostprocess",
    "tracker.runprocess",
    "tracker.gpuepisode",
    "forecasting.forecast",
    "forecasting.flag",
    "forecasting.conditionreading",
    "forecasting.serverclock",
    "forecasting.seriessample",
    "tracker.latestmetric",
    "alerts.notification",
    "alerts.digest",
}


@pytest.fixture
def data(
    api: Any, project: Project, owner: User, write_token: str, no_default_slack: None
) -> dict[str, Any]:
    """One row of every model, made the way the product makes them."""
    assert (
        api(
            "POST",
            "/runs",
            write_token,
            {"id": "r1", "session": "s1", "total_steps": 100, "process": {"key": ["b", 7, 9]}},
        ).status_code
        == 201
    )
    points = {"steps": [1, 2, 3], "values": [3.0, 2.5, 2.0], "times": [1.7e9, 1.7e9 + 1, 1.7e9 + 2]}
    batch = {
        "session": "s1",
        "seq": 1,
        "metrics": {"loss": points},
        "events": [{"kind": "checkpoint", "step": 3, "payload": {"path": "ckpt/3"}}],
    }
    assert api("POST", "/runs/r1/batches", write_token, batch).status_code == 200
    run = Run.objects.get(public_id="r1")
    timings = {
        "session": "k1",
        "seq": 1,
        "rank": 1,
        "host": "n1",
        "steps": [1, 2],
        "compute_s": [0.5, 0.6],
    }
    assert api("POST", "/runs/r1/timings", write_token, timings).status_code == 200
    rank_timings.rank_rollup_fold(run=run)  # the straggler forecast's blocks
    # GPU telemetry: a host, an agent batch describing a process, an episode.
    assert api("POST", "/hosts", write_token, {"host": "n1", "session": "a"}).status_code == 201
    host_batch = {
        "session": "a",
        "seq": 1,
        "metrics": {"gpu/0/util": {"steps": [1], "values": [50.0], "times": [1.7e9]}},
        "events": [
            {
                "kind": "custom",
                "time": 1.7e9,
                "payload": {"name": "process", "pid": 7, "key": ["b", 7, 9]},
            }
        ],
    }
    assert api("POST", "/hosts/n1/batches", write_token, host_batch).status_code == 200
    GpuEpisode.objects.create(
        host=Host.objects.get(name="n1"),
        run=run,
        gpus=[0],
        start=1.7e9,
        end=1.7e9 + 30,
        kind="burst",
        explained=False,
        expected=50.0,
        observed=90.0,
    )
    deadline_create(
        project=project, name="Blind eval", cutoff=datetime(2031, 1, 1, tzinfo=UTC), timezone="UTC"
    )
    saved_view_save(project=project, user=owner, name="lr sweep", query="q=params.lr+%3D+%271%27")
    Forecast.objects.create(run=run, kind=Forecast.Kind.ETA, segment=1, input_last_step=3)
    inputs.series_input(run=run, key="loss", limit=200_000, keep_nonfinite=True)
    ConditionReading.objects.create(
        run=run, segment=1, second=1_700_000_000, computed_at=run.started_at, found=["rise"]
    )
    flag_raise(run)
    channel = alert_services.channel_create(
        project=project, kind=Channel.Kind.WEBHOOK, name="hook", target="http://127.0.0.1:9/x"
    )
    alert_services.flags_dispatch()
    ServerClock.objects.create()
    Digest.objects.create(project=project, day=date(2031, 1, 1))
    invitations.invitation_create(
        project=project, email="new@example.com", role="member", invited_by=owner
    )
    return {"channel": channel}


@pytest.fixture
def superuser_client(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root-123"))
    return client


def test_every_model_an_operator_needs_is_registered() -> None:
    missing = [m._meta.label for m in MODELS if m not in admin.site._registry]
    assert missing == []


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label_lower)
def test_its_list_search_and_detail_pages_load(
    superuser_client: Client, data: dict[str, Any], model: Any
) -> None:
    assert model.objects.exists(), f"the fixture made no {model._meta.label}"
    info = (model._meta.app_label, model._meta.model_name)
    listing = superuser_client.get(reverse("admin:{}_{}_changelist".format(*info)))
    assert listing.status_code == 200
    model_admin = admin.site._registry[model]
    if model_admin.search_fields:
        assert superuser_client.get(listing.request["PATH_INFO"], {"q": "r1"}).status_code == 200
    obj = model.objects.first()
    detail = superuser_client.get(reverse("admin:{}_{}_change".format(*info), args=[obj.pk]))
    assert detail.status_code == 200
    add = superuser_client.get(reverse("admin:{}_{}_add".format(*info)))
    if model._meta.label_lower in READ_ONLY:
        assert isinstance(model_admin, ReadOnlyAdmin)
        assert add.status_code == 403
        assert 'name="_save"' not in detail.content.decode()


def test_no_hash_or_secret_reaches_a_page(superuser_client: Client, data: dict[str, Any]) -> None:
    token = ApiToken.objects.get()
    invitation = Invitation.objects.get()
    pages = [
        reverse("admin:tracker_apitoken_changelist"),
        reverse("admin:tracker_apitoken_change", args=[token.pk]),
        reverse("admin:tracker_invitation_changelist"),
        reverse("admin:tracker_invitation_change", args=[invitation.pk]),
        reverse("admin:alerts_channel_change", args=[data["channel"].pk]),
    ]
    for page in pages:
        html = superuser_client.get(page).content.decode()
        for secret in (token.hashed, invitation.token_hash, data["channel"].secret):
            assert secret not in html, page
    assert f"rc_{token.prefix}_…" in superuser_client.get(pages[0]).content.decode()


def test_it_revokes_tokens_from_the_list(superuser_client: Client, data: dict[str, Any]) -> None:
    token = ApiToken.objects.get()
    url = reverse("admin:tracker_apitoken_changelist")
    res = superuser_client.post(url, {"action": "revoke", "_selected_action": [token.pk]})
    assert res.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_it_never_deletes_a_projects_last_owner(
    superuser_client: Client, project: Project, owner: User, member: User
) -> None:
    only_owner = Membership.objects.get(project=project, user=owner)
    url = reverse("admin:tracker_membership_delete", args=[only_owner.pk])
    assert superuser_client.post(url, {"post": "yes"}).status_code == 403
    assert Membership.objects.filter(pk=only_owner.pk).exists()
    viewer_row = Membership.objects.get(project=project, user=member)
    url = reverse("admin:tracker_membership_delete", args=[viewer_row.pk])
    assert superuser_client.post(url, {"post": "yes"}).status_code == 302
    assert not Membership.objects.filter(pk=viewer_row.pk).exists()


def test_an_operator_can_add_an_owner_to_rescue_a_project(
    superuser_client: Client, project: Project, outsider: User
) -> None:
    url = reverse("admin:tracker_membership_add")
    data = {"project": project.pk, "user": outsider.pk, "role": "owner"}
    assert superuser_client.post(url, data).status_code == 302
    assert Membership.objects.get(project=project, user=outsider).role == "owner"


@pytest.mark.parametrize("url", ["/", "/projects/llm/settings/", "/account/password/"])
def test_staff_see_a_link_to_the_admin_in_the_nav_and_others_do_not(
    client: Client, owner: User, project: Project, url: str
) -> None:
    admin_link = f'<a class="nav-admin" href="{reverse("admin:index")}">Admin</a>'
    client.force_login(owner)
    assert admin_link not in client.get(url).content.decode()  # an owner is not staff
    User.objects.filter(pk=owner.pk).update(is_staff=True)
    nav = client.get(url).content.decode().split("<nav>")[1].split("</nav>")[0]
    assert admin_link in nav
