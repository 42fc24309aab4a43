"""Settings shared by every environment, driven by environment variables.

The defaults are the embedded mode: SQLite and a filesystem Celery broker under ./var, so one
command runs Runcast on a laptop with no external services. Production sets DATABASE_URL and
CELERY_BROKER_URL (see docs/deployment.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from config.security import embedded_secret_key
from tracker.limits import MAX_REQUEST_BYTES

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(environ.Env().str("RUNCAST_VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env(
    DEBUG=(bool, False),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "[::1]"]),
)
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# Embedded mode is the install without DATABASE_URL (scripts/dev: SQLite under var/). There a
# random key is made once and kept in var/secret-key; anywhere else SECRET_KEY must be set, and
# starting without it is refused rather than signing sessions with a key someone else knows.
EMBEDDED = "DATABASE_URL" not in os.environ
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not EMBEDDED:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Set it to a long random string (for example the output of "
            "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`); only the embedded "
            "install (no DATABASE_URL) makes its own, in var/secret-key."
        )
    SECRET_KEY = embedded_secret_key(VAR_DIR / "secret-key")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# The embedded install serves on PORT (scripts/dev, docs/deployment.md); links and the login URL
# runcast_bootstrap prints follow it unless SITE_URL names the public address.
PORT = env.int("PORT", default=8000)
SITE_URL = env.str("SITE_URL", default=f"http://127.0.0.1:{PORT}")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    # Listed so /api/v1/docs serves Swagger UI from ninja's bundled static files, not a CDN.
    "ninja",
    "tracker",
    "tracker.mlflow",
    "forecasting",
    "alerts",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "config.security.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "tracker.api.middleware.RequestSizeLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Django refuses a body over this with a bare 400 before any view runs (HttpRequest.body checks
# it, not only form parsing); its 2.5 MiB default would cut the API's documented 8 MiB to 2.5.
# RequestSizeLimitMiddleware answers 413 above MAX_REQUEST_BYTES first. Pages post small forms.
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'runcast.sqlite3'}"),
}
# Pages and ingestion open many short transactions; keep connections for a minute.
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # WAL lets the web server read while the worker writes; the timeout rides out write bursts.
    # IMMEDIATE takes the write lock when a transaction starts: a deferred transaction that
    # upgrades from read to write fails at once with "database is locked", whatever the timeout.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )

# A PostgreSQL streaming replica of DATABASE_URL (docs/deployment.md "Scaling to 10,000 active
# runs"). When set, the dashboard's heavy read pages and /api/v1 GETs read it; writes, workers,
# transactions and everything else use the primary (config/replica.py). Unset: nothing changes.
DATABASE_REPLICA_URL = env.str("DATABASE_REPLICA_URL", default="")
# Seconds a browser reads the primary after each of its own writes (a POST), so the page a form
# redirects to shows the change; longer than the replica's usual lag.
RUNCAST_REPLICA_STICKY_S = env.int("RUNCAST_REPLICA_STICKY_S", default=10)
# Seconds a process leaves a replica alone after it refused a connection or failed mid-request
# (its reads go to the primary meanwhile); then it tries again.
RUNCAST_REPLICA_RETRY_S = env.float("RUNCAST_REPLICA_RETRY_S", default=30.0)
if DATABASE_REPLICA_URL:
    DATABASES["replica"] = env.db_url_config(DATABASE_REPLICA_URL)
    if not DATABASES["replica"]["ENGINE"].endswith("postgresql"):
        raise ImproperlyConfigured("DATABASE_REPLICA_URL must be a postgres:// URL")
    DATABASES["replica"].setdefault("CONN_MAX_AGE", DATABASES["default"]["CONN_MAX_AGE"])
    # A replica host that does not answer costs a page 2 s once per RUNCAST_REPLICA_RETRY_S,
    # not the kernel's connect timeout (minutes).
    DATABASES["replica"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 2)
    # Tests read and write one database: the replica alias is the default's under test.
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
    DATABASE_ROUTERS = ["config.replica.ReplicaRouter"]
    # Last: it runs the view itself once every other process_view (CSRF, auth) has run.
    MIDDLEWARE.append("config.replica.ReplicaReadMiddleware")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- HTTP security (docs/deployment.md "Security") ------------------------------------------
# HTTPS is on when SITE_URL is https (Runcast serves TLS itself or, usually, behind a proxy that
# terminates it): the http site redirects there, cookies are Secure, browsers are told by HSTS
# to use nothing else. RUNCAST_TLS=false/true overrides the guess.
TLS = env.bool("RUNCAST_TLS", default=SITE_URL.startswith("https://"))
if env.bool("TRUST_X_FORWARDED_PROTO", default=False):
    # Only behind a proxy that sets this header itself (and drops a client's): otherwise a
    # client could claim https. gunicorn also honours it from FORWARDED_ALLOW_IPS.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=TLS)
# The compose healthcheck asks the container over plain http.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SESSION_COOKIE_SECURE = TLS
CSRF_COOKIE_SECURE = TLS
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=365 * 86400 if TLS else 0)
# Subdomains of Runcast's own host name only; preload has no effect until the registrable
# domain is submitted to the browsers' preload list, which is the operator's decision.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=TLS)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=TLS)
SESSION_COOKIE_HTTPONLY = True
# No script reads the CSRF cookie: forms carry the token, htmx only GETs.
CSRF_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Scripts and stylesheets only from static/ (htmx and uPlot are vendored; the pages have no
# inline script). Inline style *attributes* stay allowed (style-src-attr): the board and progress
# bars position themselves with computed `style="left:…%"`; <style> elements do not.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "style-src-attr 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
# Failed logins per (username, client address): after this many, 429 for the lockout.
RUNCAST_LOGIN_MAX_FAILURES = env.int("RUNCAST_LOGIN_MAX_FAILURES", default=5)
RUNCAST_LOGIN_LOCKOUT_S = env.int("RUNCAST_LOGIN_LOCKOUT_S", default=15 * 60)
AUTHENTICATION_BACKENDS = ["dashboard.login.ThrottledModelBackend"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- Celery: the app, queues and every periodic schedule live in config/celery.py.
# Redis hands a message that a worker took but has not acknowledged (acks_late: its task runs,
# or waits out its countdown) to another worker after this many seconds. kombu's default is an
# hour: that long a killed worker's task waited to run again (issue 24). It must outlast the
# longest countdown plus the longest hard time limit (send_digests' 330 s; config/celery.py has
# the global one), or a task still waiting or running is handed out twice; the margin covers a
# message that waits in the worker for a free process. tests/config/test_celery_limits.py holds
# it to the tasks' limits.
RUNCAST_BROKER_VISIBILITY_TIMEOUT_S = 600
# The longest a task is sent ahead of time (a countdown): the forecast debounce (15 s), a run
# end's alert (20 s), a delivery retry due that soon. A retry due later is not queued: the alerts
# sweep enqueues due notifications every minute.
RUNCAST_MAX_COUNTDOWN_S = 60
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    # The embedded broker: messages are files in var/broker, so no server is needed.
    _broker_dir = VAR_DIR / "broker"
    # kombu's filesystem transport fails on a missing folder rather than creating it.
    (_broker_dir / "processed").mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir),
        "data_folder_out": str(_broker_dir),
        "processed_folder": str(_broker_dir / "processed"),
        # Worker control messages (ping, shutdown) default to ./control: keep them in var/ too.
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # kombu's Redis transport with a channel that closes cleanly on a dead server: with the
    # stock one a kill of Redis made the worker exit instead of reconnecting (config/broker.py).
    CELERY_BROKER_TRANSPORT = "config.broker:RedisTransport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": RUNCAST_BROKER_VISIBILITY_TIMEOUT_S}
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)

# Django's SMTP backend with one deadline per email (config/outbound.py SMTPBackend): its own
# timeout is per socket operation, and a server answering a byte at a time held a worker.
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="config.outbound.SMTPBackend")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="runcast@localhost")

# --- Alerts (docs/alerts.md "Configuration").
# Defaults for a project's first rules: a "Slack (default)" channel posting to this webhook, and
# an "Email (default)" channel to these addresses (comma-separated).
RUNCAST_SLACK_WEBHOOK_URL = env.str("RUNCAST_SLACK_WEBHOOK_URL", default="")
RUNCAST_ALERT_EMAIL = env.str("RUNCAST_ALERT_EMAIL", default="")
# Seconds: the deadline of a whole Slack/webhook request (connect to last byte read,
# config/outbound.py). RUNCAST_ALERTS_SMTP_TIMEOUT: the same for a whole email (connect,
# greeting, TLS, login, every command) through config.outbound.SMTPBackend.
RUNCAST_ALERTS_HTTP_TIMEOUT = env.float("RUNCAST_ALERTS_HTTP_TIMEOUT", default=10.0)
# The same deadline for "Send test message", which a member waits for on the page while a web
# thread is held: a slower endpoint is reported as timed out (alerts.services.channel_test).
RUNCAST_ALERTS_TEST_TIMEOUT = env.float("RUNCAST_ALERTS_TEST_TIMEOUT", default=5.0)
RUNCAST_ALERTS_SMTP_TIMEOUT = env.float("RUNCAST_ALERTS_SMTP_TIMEOUT", default=20.0)
# Delivery attempts before a notification is failed; the first retry waits the base (x4 each time).
RUNCAST_ALERTS_MAX_TRIES = env.int("RUNCAST_ALERTS_MAX_TRIES", default=5)
RUNCAST_ALERTS_BACKOFF_BASE = env.float("RUNCAST_ALERTS_BACKOFF_BASE", default=30.0)
# Local hour (each project's timezone) from which the daily digest goes out.
RUNCAST_ALERTS_DIGEST_HOUR = env.int("RUNCAST_ALERTS_DIGEST_HOUR", default=8)
# Let Slack and webhook channels reach loopback, private and link-local addresses, for an
# on-premise receiver. Off by default: any project member chooses these URLs (SSRF).
RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS = env.bool(
    "RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS", default=False
)

# --- Teams (docs/deployment.md "Projects and people").
# Staff and superusers create projects in the UI; true lets every logged-in user create one.
RUNCAST_USERS_CAN_CREATE_PROJECTS = env.bool("RUNCAST_USERS_CAN_CREATE_PROJECTS", default=False)

# How long a run deleted from the runs explorer (or MLflow's delete_run) is promised to stay
# restorable (the explorer's "Show deleted" view lists it with its deletion time). After it,
# the hourly purge (tracker.bulk.runs_purge, beat entry purge-deleted-runs) deletes the run for
# good: its points, forecasts and alerts with it, its artifact files by the next artifacts sweep.
RUNCAST_DELETED_RUN_KEEP_DAYS = env.int("RUNCAST_DELETED_RUN_KEEP_DAYS", default=30)

# Invitations are emailed when an SMTP server is configured (EMAIL_HOST set); without one,
# owners create the account with a generated password shown to them once.
RUNCAST_INVITE_EMAIL = env.bool("RUNCAST_INVITE_EMAIL", default=bool(env.str("EMAIL_HOST", "")))
RUNCAST_INVITE_MAX_AGE_HOURS = env.int("RUNCAST_INVITE_MAX_AGE_HOURS", default=72)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        # Request lines would carry nothing secret (tokens travel in headers only) but are noise.
        "django.server": {"level": "WARNING"},
    },
}

# The liveness sweep (the worker) probes this URL, the web tier's /healthz, each minute: while it
# does not answer, clients cannot reach the server and spool, so no run's silence is judged
# (docs/deployment.md#outages). Empty: no probe (a worker-and-web outage is still seen by the
# sweep's own ticks). docker-compose and scripts/dev set it.
RUNCAST_WEB_PROBE_URL = env.str("RUNCAST_WEB_PROBE_URL", default="")

# Flush pacing (tracker/pacing.py): once live runs sending a batch a second each would exceed
# RUNCAST_INGEST_BATCHES_PER_S, each batch's answer asks its run to wait live runs / budget
# seconds between batches, at most RUNCAST_FLUSH_INTERVAL_MAX_S, so a thousand live runs do not
# send a thousand requests a second. The maximum stays well under the liveness sweep's one-minute
# floor on silence (STALL_MIN_S) and the clients' 15-s heartbeat. 0 turns pacing off.
RUNCAST_INGEST_BATCHES_PER_S = env.float("RUNCAST_INGEST_BATCHES_PER_S", default=100.0)
RUNCAST_FLUSH_INTERVAL_MAX_S = env.float("RUNCAST_FLUSH_INTERVAL_MAX_S", default=10.0)

# Forecast pacing (forecasting/tasks.py forecast_interval): each live run is forecast every 15 s
# while live runs / 15 fit RUNCAST_FORECASTS_PER_S, else every live runs / budget seconds, at
# most RUNCAST_FORECAST_INTERVAL_MAX_S (the freshness a lead is promised under load). The default
# is what one worker process computes a second (~75 ms a forecast, docs/benchmarks.md
# "Capacity") with a third spare for the liveness sweep and bursts: raise it with the worker
# processes. 0: always every 15 s.
RUNCAST_FORECASTS_PER_S = env.float("RUNCAST_FORECASTS_PER_S", default=8.0)
RUNCAST_FORECAST_INTERVAL_MAX_S = env.float("RUNCAST_FORECAST_INTERVAL_MAX_S", default=30.0)

# The liveness sweep's period: the `sweep-active-runs` beat entry (config/celery.py) runs this
# often, and the sweep judges a gap of a few periods in its own ticks as a worker outage.
RUNCAST_SWEEP_PERIOD_S = env.float("RUNCAST_SWEEP_PERIOD_S", default=60.0)

# How long a run too young to have a cadence of its own (fewer than 3 contacts: its create and
# up to two batches) may stay silent before the liveness sweep takes it for crashed, when its
# client declared no heartbeat interval (an MLflow client, an older runcast client; the
# runcast client declares its 15 s and is judged by that, 75 s). Such a client says nothing
# until its training loop logs, and a first step can take long (a 20-minute torch.compile, a
# checkpoint loaded from object storage): an hour is three such compiles, and a false "looks
# crashed" at night costs more than an hour's wait to hear of a job that died that young.
RUNCAST_STALL_UNKNOWN_CADENCE_S = env.float("RUNCAST_STALL_UNKNOWN_CADENCE_S", default=3600.0)


def cache_config(url: str) -> dict[str, Any]:
    """The cache of a CACHE_URL. A Redis one degrades: while Redis is down, calls are served
    from a cache local to each process, logged once, instead of raising (the login page
    answered 500): config/cache.py. Timeouts bound what an unreachable host costs (an
    unanswered connect would otherwise wait for the kernel's)."""
    config: dict[str, Any] = environ.Env.cache_url_config(url)
    if config["BACKEND"] == "django.core.cache.backends.redis.RedisCache":
        config["BACKEND"] = "config.cache.DegradingRedisCache"
        options = config.setdefault("OPTIONS", {})
        options.setdefault("socket_connect_timeout", 2.0)
        options.setdefault("socket_timeout", 2.0)
    return config


# The forecast debounce marker and the login throttle's counts live here; production points it
# at Redis so every web worker shares them (an in-process cache would allow one forecast per
# worker per interval, and count failed logins per worker).
CACHES = {"default": cache_config(env.str("CACHE_URL", default="locmemcache://"))}

# Retention (docs/deployment.md#retention; applied hourly by the `retention` beat entries).
# Every forecast of the last RUNCAST_FORECAST_FULL_DAYS is kept (slip reads 3 days, the board
# 24 h; at least 4); older ones are thinned to one per run, kind and interval. The flags' working
# rows (CONDITIONS) are read for 80 minutes; ingest-batch rows exist for dedupe and heartbeats.
RUNCAST_FORECAST_FULL_DAYS = env.float("RUNCAST_FORECAST_FULL_DAYS", default=7.0)
RUNCAST_FORECAST_THIN_INTERVAL_S = env.float("RUNCAST_FORECAST_THIN_INTERVAL_S", default=3600.0)
RUNCAST_CONDITIONS_KEEP_HOURS = env.float("RUNCAST_CONDITIONS_KEEP_HOURS", default=24.0)
RUNCAST_BATCH_KEEP_DAYS = env.float("RUNCAST_BATCH_KEEP_DAYS", default=7.0)

# Artifacts (MLflow's log_artifact, log_model; docs/mlflow.md#artifacts): files under this folder
# (a volume in compose), each at most RUNCAST_ARTIFACT_MAX_BYTES (a larger upload is refused
# naming the limit; it is streamed to disk, never held in memory).
RUNCAST_ARTIFACT_ROOT = env.str("RUNCAST_ARTIFACT_ROOT", default=str(VAR_DIR / "artifacts"))
RUNCAST_ARTIFACT_MAX_BYTES = env.int("RUNCAST_ARTIFACT_MAX_BYTES", default=2 * 1024**3)
