"""The server's flush hint: fewer, larger batches once many runs are live (tracker/pacing.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from tests.tracker.test_ingest_api import batch, create, series
from tracker import pacing
from tracker.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_count():
    pacing.forget()
    yield
    pacing.forget()


def live_runs(project, n, *, seen_ago=timedelta(0), status=Run.Status.RUNNING):
    for i in range(n):
        Run.objects.create(
            project=project,
            public_id=f"{status}-{seen_ago.total_seconds():.0f}-{i}",
            name="r",
            status=status,
            last_seen_at=timezone.now() - seen_ago,
        )


def test_a_lightly_loaded_server_asks_nothing(api, write_token):
    create(api, write_token)
    res = batch(api, write_token, metrics={"loss": series(0, 10)})
    assert res.json() == {"accepted": 10, "duplicate": False}


@override_settings(RUNCAST_INGEST_BATCHES_PER_S=2.0, RUNCAST_FLUSH_INTERVAL_MAX_S=10.0)
def test_many_live_runs_are_asked_for_batches_that_fit_the_budget(api, write_token, project):
    live_runs(project, 6)
    # Neither runs gone quiet nor ended ones are live.
    live_runs(project, 50, seen_ago=timedelta(hours=1))
    live_runs(project, 50, status=Run.Status.FINISHED)
    create(api, write_token)  # the 7th live run
    res = batch(api, write_token, metrics={"loss": series(0, 10)})
    assert res.json() == {"accepted": 10, "duplicate": False, "flush_interval": 3.5}


@override_settings(RUNCAST_INGEST_BATCHES_PER_S=2.0, RUNCAST_FLUSH_INTERVAL_MAX_S=2.5)
def test_the_hint_never_exceeds_its_maximum(api, write_token, project):
    live_runs(project, 40)
    create(api, write_token)
    assert batch(api, write_token).json()["flush_interval"] == 2.5


@override_settings(RUNCAST_INGEST_BATCHES_PER_S=0)
def test_a_zero_budget_turns_pacing_off(project):
    live_runs(project, 1000)
    assert pacing.flush_interval_hint() is None


@override_settings(RUNCAST_INGEST_BATCHES_PER_S=1.0)
def test_the_count_is_cached_not_queried_per_batch(project, django_assert_num_queries):
    live_runs(project, 3)
    assert pacing.flush_interval_hint() == 3.0
    live_runs(project, 3, seen_ago=timedelta(seconds=1))
    with django_assert_num_queries(0):
        assert pacing.flush_interval_hint() == 3.0  # until the count's TTL runs out


@override_settings(
    RUNCAST_INGEST_BATCHES_PER_S=1.0,
    CACHES={
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            # A port nothing listens on: the cache is down.
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    },
)
def test_a_dead_cache_costs_the_hint_nothing(api, write_token, project):
    live_runs(project, 4)
    create(api, write_token)
    res = batch(api, write_token, metrics={"loss": series(0, 10)})
    assert res.status_code == 200, res.content
    assert res.json()["flush_interval"] == 5.0
