"""Settings for bench/flagstream.py: the test settings, with tasks left to the replay (it calls
the services at the service's cadence instead of running a worker)."""

from __future__ import annotations

from config.settings.test import *  # noqa: F403

CELERY_TASK_ALWAYS_EAGER = False
