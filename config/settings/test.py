"""Test overrides: the same settings as production, made fast and deterministic.

DATABASE_URL and CELERY_BROKER_URL still come from the environment, so CI runs the suite on
PostgreSQL and Redis while a laptop falls back to SQLite.
"""

from __future__ import annotations

import atexit as _atexit
import os
import shutil as _shutil
import tempfile as _tempfile

# Base refuses to start without SECRET_KEY outside the embedded mode (CI sets DATABASE_URL).
os.environ.setdefault("SECRET_KEY", "test-only-key-" + "x" * 50)

from config.settings.base import *  # noqa: F403

# Hashing passwords slowly protects nothing in tests and costs seconds per login.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tasks go to the broker as on a server, where no worker runs them: a test that needs its
# tasks run asks for them in-process (the `eager` marker, tests/conftest.py) or starts a real
# worker. Eager for every test hid the path a real worker takes.
CELERY_TASK_ALWAYS_EAGER = False
# Where a test runs tasks in-process, a task's exception fails the test.
CELERY_TASK_EAGER_PROPAGATES = True
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# As on a server without SMTP; invitation tests turn email on against a local SMTP server.
RUNCAST_INVITE_EMAIL = False
RUNCAST_USERS_CAN_CREATE_PROJECTS = False
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
SITE_URL = "http://testserver"
# A test process's artifacts never land in var/ (tests that look at them set their own folder).
RUNCAST_ARTIFACT_ROOT = os.path.join(
    _tempfile.gettempdir(), f"runcast-test-artifacts-{os.getpid()}"
)


def _artifacts_remove(owner: int = os.getpid()) -> None:
    if os.getpid() == owner:  # a forked child leaves its parent's folder alone
        _shutil.rmtree(RUNCAST_ARTIFACT_ROOT, ignore_errors=True)


_atexit.register(_artifacts_remove)

if CELERY_BROKER_URL.startswith("filesystem://"):  # noqa: F405
    # A broker folder of this test process's own: a running `scripts/dev` worker shares var/broker
    # and would otherwise take the tasks a test sends to its own worker.
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    _broker = Path(tempfile.gettempdir()) / f"runcast-test-broker-{os.getpid()}"
    (_broker / "processed").mkdir(parents=True, exist_ok=True)

    def _broker_remove(owner: int = os.getpid()) -> None:
        # One folder per test process, gone with it (a forked child leaves its parent's alone).
        if os.getpid() == owner:
            shutil.rmtree(_broker, ignore_errors=True)

    atexit.register(_broker_remove)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker),
        "data_folder_out": str(_broker),
        "processed_folder": str(_broker / "processed"),
        "control_folder": str(_broker / "control"),
        "store_processed": False,
    }
