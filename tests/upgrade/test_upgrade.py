"""Upgrading from the previous release keeps the data: a database at release 0.1's schema
(release_0_1.json names its migrations), filled with a team's data through that schema's own
models, migrated forward to this version, then read back through today's models and pages.

The release's migration files are the ones in the tree (migrations are only ever added), so
migrating to those names yields exactly the schema that release created. Runs on SQLite by
default and on PostgreSQL in CI (.ci/run sets DATABASE_URL)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.apps.registry import Apps
from django.contrib.auth.hashers import make_password
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from alerts.models import Channel, Notification, Rule
from forecasting.models import Flag, Forecast
from tracker import selectors, tokens
from tracker.models import ApiToken, Deadline, Event, Membership, Project, Run
from tracker.series import pack_floats, pack_steps, rollup

# The new batch's forecast runs in-process, on the upgraded rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.eager]

RELEASE = json.loads((Path(__file__).parent / "release_0_1.json").read_text())
TARGETS = sorted(RELEASE["migrations"].items())
T0 = datetime(2031, 3, 1, 8, 0, tzinfo=UTC)
PASSWORD = "a-long-passphrase-42"


def _latest() -> list[tuple[str, str]]:
    return sorted(MigrationExecutor(connection).loader.graph.leaf_nodes())


@pytest.fixture
def release_db() -> Iterator[Apps]:
    """The test database taken back to release 0.1's schema; forward again afterwards, whatever
    the test did, so the tests after it find today's schema."""
    executor = MigrationExecutor(connection)
    executor.migrate(TARGETS)
    try:
        yield MigrationExecutor(connection).loader.project_state(TARGETS).apps
    finally:
        MigrationExecutor(connection).migrate(_latest())


def _fill(old: Apps) -> dict[str, Any]:
    """A team's data as release 0.1 stored it: people, a project, a token, a deadline, a run
    with points and a checkpoint, its forecast, a NaN flag and the alert it sent."""
    user = old.get_model("auth", "User").objects.create(
        username="lead", email="lead@example.com", password=make_password(PASSWORD)
    )
    viewer = old.get_model("auth", "User").objects.create(username="viewer", password="!")
    project = old.get_model("tracker", "Project").objects.create(
        slug="llm", name="LLM pretraining", gpu_hour_price=2.5, targets={"val_loss": 3.28}
    )
    membership = old.get_model("tracker", "Membership")
    membership.objects.create(project=project, user=user, role="owner")
    membership.objects.create(project=project, user=viewer, role="viewer")
    full, prefix, hashed = tokens.generate()
    old.get_model("tracker", "ApiToken").objects.create(
        project=project, name="trainer", scope="write", prefix=prefix, hashed=hashed
    )
    deadline = old.get_model("tracker", "Deadline").objects.create(
        project=project,
        slug="blind-eval",
        name="Blind eval",
        cutoff=T0 + timedelta(days=3),
        timezone="Asia/Shanghai",
        buffer=timedelta(hours=6),
    )
    run = old.get_model("tracker", "Run").objects.create(
        project=project,
        public_id="pretrain-3.0",
        name="pretrain 3.0",
        status="running",
        started_at=T0,
        last_seen_at=T0 + timedelta(hours=2),
        total_steps=10_000,
        config={"lr": 3e-4},
        tags=["llm"],
        world_size=8,
        deadline=deadline,
        last_step=999,
        current_segment=1,
        points_count=1000,
    )
    old.get_model("tracker", "RunSegment").objects.create(
        run=run, number=1, session="s1", started_at=T0, first_step=0
    )
    batch = old.get_model("tracker", "IngestBatch").objects.create(
        run=run, session="s1", seq=1, received_at=T0 + timedelta(hours=2), points=1000
    )
    steps = np.arange(1000, dtype=np.int64)
    values = 5.0 * np.exp(-steps / 400.0) + 2.0
    times = T0.timestamp() + steps * 7.2
    old.get_model("tracker", "MetricChunk").objects.create(
        run=run,
        batch=batch,
        key="loss",
        segment=1,
        n=1000,
        first_step=0,
        last_step=999,
        min_step=0,
        max_step=999,
        min_value=float(values.min()),
        max_value=float(values.max()),
        nonfinite=0,
        steps=pack_steps(steps),
        values=pack_floats(values),
        times=pack_floats(times),
        rollup=rollup(steps, values),
    )
    old.get_model("tracker", "Event").objects.create(
        run=run, batch=batch, kind="checkpoint", step=500, time=T0, segment=1, payload={"p": "c"}
    )
    old.get_model("forecasting", "Forecast").objects.create(
        run=run, kind="eta", segment=1, input_last_step=999, finish_p50=T0.timestamp() + 9e4
    )
    flag = old.get_model("forecasting", "Flag").objects.create(
        run=run, kind="nan", state="raised", explanation="Loss became NaN at step 999.", data={}
    )
    channel = old.get_model("alerts", "Channel").objects.create(
        project=project, kind="email", name="lead", target="lead@example.com"
    )
    rule = old.get_model("alerts", "Rule").objects.create(project=project, kind="nan")
    rule.channels.add(channel)
    old.get_model("alerts", "Notification").objects.create(
        channel=channel,
        run=run,
        flag=flag,
        event_key=f"flag:{flag.pk}",
        rule_kind="nan",
        kind="nan",
        event="raised",
        severity="critical",
        status="sent",
        tries=1,
    )
    return {"token": full, "values": values}


def test_it_upgrades_a_release_0_1_database_with_its_data_in_place(release_db: Apps) -> None:
    assert "created_by_token" not in {
        f.name for f in release_db.get_model("tracker", "Run")._meta.get_fields()
    }
    filled = _fill(release_db)

    MigrationExecutor(connection).migrate(_latest())

    project = Project.objects.get(slug="llm")
    assert project.targets == {"val_loss": 3.28} and float(project.gpu_hour_price) == 2.5
    assert sorted(Membership.objects.values_list("user__username", "role")) == [
        ("lead", "owner"),
        ("viewer", "viewer"),
    ]
    run = Run.objects.get(public_id="pretrain-3.0")
    assert (run.last_step, run.points_count, run.deadline, run.world_size) == (
        999,
        1000,
        Deadline.objects.get(slug="blind-eval"),
        8,
    )
    assert run.created_by_token is None  # unknown for runs from before provenance
    loss = selectors.series_load(run=run, key="loss")
    assert np.array_equal(loss.values, filled["values"])
    assert Event.objects.get(run=run).payload == {"p": "c"}
    assert Forecast.objects.get(run=run).input_last_step == 999
    flag = Flag.objects.get(run=run)
    notification = Notification.objects.get(run=run)
    assert notification.flag == flag and notification.status == "sent"
    assert list(Rule.objects.get(kind="nan").channels.all()) == [Channel.objects.get()]

    # The pages and the API work on the upgraded data, with the old password and token.
    client = Client()
    assert client.login(username="lead", password=PASSWORD)
    page = client.get("/runs/llm/pretrain-3.0/")
    assert page.status_code == 200 and "pretrain 3.0" in page.content.decode()
    assert client.get("/").status_code == 200
    assert client.get("/projects/llm/settings/").status_code == 200
    history = client.get("/projects/llm/alerts/")
    assert history.status_code == 200 and "pretrain 3.0" in history.content.decode()
    more = {"steps": list(range(1000, 1010)), "values": [2.0] * 10, "times": [T0.timestamp()] * 10}
    api = client.post(
        "/api/v1/runs/pretrain-3.0/batches",
        data=json.dumps({"session": "s1", "seq": 2, "metrics": {"loss": more}}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {filled['token']}",
    )
    assert api.status_code == 200 and api.json() == {"accepted": 10, "duplicate": False}
    run.refresh_from_db()
    assert (run.last_step, run.points_count) == (1009, 1010)
    assert Forecast.objects.filter(run=run, kind=Forecast.Kind.ETA, input_last_step=1009).exists()
    assert ApiToken.objects.get().last_used_at is not None
