"""The Redis visibility timeout against the tasks' time limits and countdowns (issue 24 item 7:
a killed task's message waited kombu's default hour in Redis's `unacked` set)."""

from __future__ import annotations

import json

from django.conf import settings

from alerts.receivers import RUN_END_DELAY_S
from config.celery import app
from forecasting.tasks import FORECAST_DEBOUNCE_S
from tests.security.test_deploy_settings import KEY, compose_environment, run_settings

HOUR_S = 3600


def hard_time_limits() -> dict[str, float]:
    """Every project task's hard time limit: its own, or the app's global one."""
    app.loader.import_default_modules()  # what a worker imports: every app's tasks module
    return {
        name: float(task.time_limit or app.conf.task_time_limit)
        for name, task in app.tasks.items()
        if name.split(".")[0] in ("tracker", "forecasting", "alerts")
    }


def test_it_outlasts_every_task_and_countdown_but_not_by_an_hour() -> None:
    limits = hard_time_limits()
    assert "alerts.tasks.send_digests" in limits and "forecasting.tasks.forecast_run" in limits
    assert all(limit > 0 for limit in limits.values())  # none runs unbounded
    longest = max(limits.values())
    visibility = settings.RUNCAST_BROKER_VISIBILITY_TIMEOUT_S
    # A message held for its countdown and then run to its hard limit is never handed out
    # twice; a killed worker's message is back well within the hour it waited before.
    assert longest + settings.RUNCAST_MAX_COUNTDOWN_S < visibility < longest + HOUR_S
    assert max(FORECAST_DEBOUNCE_S, RUN_END_DELAY_S) <= settings.RUNCAST_MAX_COUNTDOWN_S


def test_the_compose_worker_gives_redis_that_visibility_timeout() -> None:
    code = (
        "import json, django; django.setup(); from config.celery import app; "
        "print(json.dumps([app.conf.broker_transport, app.conf.broker_transport_options]))"
    )
    done = run_settings(compose_environment({"SECRET_KEY": KEY}), code)
    assert done.returncode == 0, done.stderr
    transport, options = json.loads(done.stdout.strip().splitlines()[-1])
    assert transport == "config.broker:RedisTransport"
    assert options == {"visibility_timeout": settings.RUNCAST_BROKER_VISIBILITY_TIMEOUT_S}
