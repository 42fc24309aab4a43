"""Test overrides: the same settings as production, made fast and deterministic.

DATABASE_URL and CELERY_BROKER_URL still come from the environment, so CI runs the suite on
PostgreSQL and Redis while a laptop falls back to SQLite.
"""

from __future__ import annotations

import os

# Base refuses to start without SECRET_KEY outside the embedded mode (CI sets DATABASE_URL).
os.environ.setdefault("SECRET_KEY", "test-only-key-" + "x" * 50)

from config.settings.base import *  # noqa: F403

# Hashing passwords slowly protects nothing in tests and costs seconds per login.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tasks run in-process unless a test starts a real worker against the broker.
CELERY_TASK_ALWAYS_EAGER = True
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

if CELERY_BROKER_URL.startswith("filesystem://"):  # noqa: F405
    # A broker folder of this test process's own: a running `scripts/dev` worker shares var/broker
    # and would otherwise take the tasks a test sends to its own worker.
    import tempfile
    from pathlib import Path

    _broker = Path(tempfile.gettempdir()) / f"runcast-test-broker-{os.getpid()}"
    (_broker / "processed").mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker),
        "data_folder_out": str(_broker),
        "processed_folder": str(_broker / "processed"),
        "control_folder": str(_broker / "control"),
        "store_processed": False,
    }
