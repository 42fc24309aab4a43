"""Test overrides: the same settings as production, made fast and deterministic.

DATABASE_URL and CELERY_BROKER_URL still come from the environment, so CI runs the suite on
PostgreSQL and Redis while a laptop falls back to SQLite.
"""

from __future__ import annotations

from config.settings.base import *  # noqa: F403

# Hashing passwords slowly protects nothing in tests and costs seconds per login.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tasks run in-process unless a test starts a real worker against the broker.
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
SITE_URL = "http://testserver"
