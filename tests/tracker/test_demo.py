"""The demo resets only what its replay made: a run a person logged into the demo project keeps
its points, flags and alert history across a demo restart (`scripts/dev` runs demo_setup)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from alerts import services as alert_services
from alerts.models import Notification
from forecasting.models import Flag
from tests.alerts.fixtures import flag_raise
from tracker.demo import DEMO_PROJECT_SLUG
from tracker.models import ApiToken, Membership, Project, Run
from tracker.services import token_create

pytestmark = pytest.mark.django_db

DATA_DIR = Path(__file__).resolve().parents[2] / "demo" / "data"


def demo_setup(tmp_path: Path) -> str:
    token_file = tmp_path / "demo-token"
    call_command("demo_setup", token_file=str(token_file))
    return token_file.read_text()


def log_run(api: Any, token: str, run_id: str, **extra: Any) -> Run:
    body = {"id": run_id, "session": "s1", "name": run_id, "total_steps": 1000, **extra}
    assert api("POST", "/runs", token, body).status_code == 201
    points = {
        "steps": list(range(50)),
        "values": [2.0] * 50,
        "times": [1.7e9 + s for s in range(50)],
    }
    batch = {"session": "s1", "seq": 1, "metrics": {"loss": points}}
    assert api("POST", f"/runs/{run_id}/batches", token, batch).status_code == 200
    return Run.objects.get(project__slug=DEMO_PROJECT_SLUG, public_id=run_id)


def test_it_keeps_a_users_run_with_its_flags_and_alerts_across_a_demo_restart(
    api: Any, tmp_path: Path, no_default_slack: None
) -> None:
    replay_token = demo_setup(tmp_path)
    demo = Project.objects.get(slug=DEMO_PROJECT_SLUG)
    person = User.objects.create_user("alice", "alice@example.com", "pw-alice-123")
    Membership.objects.create(project=demo, user=person, role=Membership.Role.MEMBER)
    mine = token_create(project=demo, name="alice laptop", scope="write", created_by=person)
    # A token a person names like the demo's own is still a person's token.
    lookalike = token_create(project=demo, name="demo replay", scope="write", created_by=person)

    replayed = log_run(api, replay_token, "nanogpt-1b-scaleup", config={"source": "x.csv"})
    user_run = log_run(api, mine, "my-real-run", config={"lr": 3e-4})
    lookalike_run = log_run(api, lookalike, "another-real-run")
    flag = flag_raise(user_run)
    alert_services.flags_dispatch()
    history = list(Notification.objects.filter(run=user_run).values_list("pk", flat=True))
    assert history, "the flag made no alert history to keep"

    second_token = demo_setup(tmp_path)

    assert not Run.objects.filter(pk=replayed.pk).exists()
    kept = Run.objects.get(pk=user_run.pk)
    assert kept.points_count == 50 and kept.last_step == 49
    assert Flag.objects.filter(pk=flag.pk, run=kept).exists()
    assert list(Notification.objects.filter(run=kept).values_list("pk", flat=True)) == history
    assert Run.objects.filter(pk=lookalike_run.pk).exists()
    # The old replay token is revoked; the person's tokens are untouched.
    assert second_token != replay_token
    assert ApiToken.objects.filter(created_by=person, revoked_at__isnull=True).count() == 2
    assert (
        api(
            "POST", f"/runs/{kept.public_id}/batches", mine, {"session": "s1", "seq": 2}
        ).status_code
        == 200
    )


def test_it_resets_runs_of_a_replay_from_before_provenance_was_recorded(
    api: Any, tmp_path: Path
) -> None:
    demo_setup(tmp_path)
    demo = Project.objects.get(slug=DEMO_PROJECT_SLUG)
    data_file = sorted(DATA_DIR.glob("*.csv"))[0].name
    legacy = Run.objects.create(
        project=demo, public_id="bert-release-h100", config={"source": data_file}
    )
    unknown = Run.objects.create(project=demo, public_id="hand-made", config={"source": "mine.csv"})

    demo_setup(tmp_path)

    assert not Run.objects.filter(pk=legacy.pk).exists()
    assert Run.objects.filter(pk=unknown.pk).exists()


def test_it_is_idempotent_and_keeps_one_live_replay_token(tmp_path: Path) -> None:
    demo_setup(tmp_path)
    demo_setup(tmp_path)
    demo = Project.objects.get(slug=DEMO_PROJECT_SLUG)
    assert Project.objects.filter(slug=DEMO_PROJECT_SLUG).count() == 1
    assert ApiToken.objects.filter(project=demo, revoked_at__isnull=True).count() == 1
    assert demo.memberships.get().role == Membership.Role.OWNER
