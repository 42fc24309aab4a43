"""Production settings: `check --deploy` under docker-compose.yml's own environment, the refusal
to start without SECRET_KEY, the embedded key, and the headers and cookies on real responses.

The compose environment is read from docker-compose.yml itself (its `x-app` block with each
`${VAR:-default}` resolved), so a change there is checked here. Settings are evaluated in fresh
subprocesses: they are computed once at import, from the environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
KEY = "k" * 20 + "-Zq8vN3xT7pL2mR9wB4yC6dF1hJ5sG0aE-" + "u" * 10

# What docs/deployment.md tells a team to put in .env for an install served over https.
TEAM_HTTPS = {
    "SECRET_KEY": KEY,
    "SITE_URL": "https://runcast.example.com",
    "ALLOWED_HOSTS": "runcast.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://runcast.example.com",
    "TRUST_X_FORWARDED_PROTO": "true",
}


def compose_environment(operator: dict[str, str]) -> dict[str, str]:
    """The environment compose gives the web/worker/beat containers for this .env."""
    text = (ROOT / "docker-compose.yml").read_text()
    block = re.search(r"^x-app:.*?^  environment:\n((?:    .*\n|\s*\n)+)", text, re.M | re.S)
    assert block, "docker-compose.yml has no x-app environment block"
    env: dict[str, str] = {}
    for line in block.group(1).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(":")
        env[name.strip()] = _interpolate(value.strip(), operator)
    return env


def _interpolate(value: str, operator: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name, op, default = m.group(1), m.group(2), m.group(3)
        if name in operator:
            return operator[name]
        if op == ":?":
            raise AssertionError(f"compose requires {name}: {default}")
        return default or ""

    return re.sub(r"\$\{(\w+)(:-|:\?)?([^}]*)\}", sub, value)


def run_settings(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings.base", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


CHECK_DEPLOY = (
    "import django, sys; from django.core.management import call_command; django.setup(); "
    "call_command('check', deploy=True, fail_level='WARNING')"
)


def test_check_deploy_is_clean_under_the_compose_environment_served_over_https(
    tmp_path: Path,
) -> None:
    env = compose_environment(TEAM_HTTPS)
    assert env["DATABASE_URL"].startswith("postgres://")  # really compose's, not the embedded
    result = run_settings({**env, "RUNCAST_VAR_DIR": str(tmp_path)}, CHECK_DEPLOY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout + result.stderr


def test_over_plain_http_check_deploy_names_only_the_https_settings(tmp_path: Path) -> None:
    """Compose's own default SITE_URL is http://localhost:8000 (a first look on one machine):
    the only deploy warnings left are the four that need https, which docs/deployment.md says
    to turn on by serving https."""
    env = compose_environment({"SECRET_KEY": KEY})
    assert env["SITE_URL"].startswith("http://")
    result = run_settings({**env, "RUNCAST_VAR_DIR": str(tmp_path)}, CHECK_DEPLOY)
    found = set(re.findall(r"\(security\.(W\d+)\)", result.stdout + result.stderr))
    assert found == {"W004", "W008", "W012", "W016"}, result.stdout + result.stderr


def test_it_refuses_to_start_without_a_secret_key_outside_the_embedded_mode(
    tmp_path: Path,
) -> None:
    env = compose_environment({"SECRET_KEY": ""})
    env.pop("SECRET_KEY")
    result = run_settings(
        {**env, "RUNCAST_VAR_DIR": str(tmp_path)}, "import django; django.setup()"
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is not set" in result.stderr
    assert not (tmp_path / "secret-key").exists()


def test_the_embedded_mode_makes_one_random_key_and_keeps_it(tmp_path: Path) -> None:
    code = (
        "import django; django.setup(); from django.conf import settings as s; print(s.SECRET_KEY)"
    )
    first = run_settings({"RUNCAST_VAR_DIR": str(tmp_path / "a")}, code)
    again = run_settings({"RUNCAST_VAR_DIR": str(tmp_path / "a")}, code)
    other = run_settings({"RUNCAST_VAR_DIR": str(tmp_path / "b")}, code)
    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    assert len(key) >= 50 and key == again.stdout.strip() != other.stdout.strip()
    assert (tmp_path / "a" / "secret-key").stat().st_mode & 0o077 == 0  # readable by its owner only


def test_debug_is_off_unless_asked_for(tmp_path: Path) -> None:
    code = "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)"
    env = compose_environment({"SECRET_KEY": KEY})
    assert run_settings({**env, "RUNCAST_VAR_DIR": str(tmp_path)}, code).stdout.strip() == "False"


def test_https_turns_on_hsts_secure_cookies_and_the_redirect(tmp_path: Path) -> None:
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE,"
        " s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER]))"
    )
    env = compose_environment(TEAM_HTTPS)
    out = run_settings({**env, "RUNCAST_VAR_DIR": str(tmp_path)}, code)
    assert json.loads(out.stdout) == [
        True,
        True,
        True,
        31_536_000,
        ["HTTP_X_FORWARDED_PROTO", "https"],
    ]
    plain = run_settings(
        {**compose_environment({"SECRET_KEY": KEY}), "RUNCAST_VAR_DIR": str(tmp_path)}, code
    )
    assert json.loads(plain.stdout) == [False, False, False, 0, None]


# --- on real responses ------------------------------------------------------------------------


@pytest.mark.django_db
def test_every_page_carries_the_security_headers(client: Client) -> None:
    response = client.get("/login/")
    csp = response["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "'unsafe-inline'" not in csp.split("style-src-attr")[0]  # only for style attributes
    assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"


@pytest.fixture
def https_on(settings: Any) -> None:
    # The values TEAM_HTTPS yields (test_https_turns_on_hsts_...), applied to this process.
    settings.SECURE_SSL_REDIRECT = True
    settings.SESSION_COOKIE_SECURE = True
    settings.CSRF_COOKIE_SECURE = True
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_HSTS_PRELOAD = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")


@pytest.mark.django_db
def test_over_https_plain_http_is_redirected_except_the_healthcheck(https_on: None) -> None:
    client = Client()
    response = client.get("/login/")
    assert response.status_code == 301 and response["Location"] == "https://testserver/login/"
    assert client.get("/healthz").status_code == 200  # compose probes the container over http
    secure = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert secure.status_code == 200
    assert secure["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"


@pytest.mark.django_db
def test_over_https_the_cookies_are_secure_and_hidden_from_scripts(
    https_on: None, owner: User
) -> None:
    client = Client(HTTP_X_FORWARDED_PROTO="https")
    client.get("/login/")
    response = client.post("/login/", {"username": "owner", "password": "pw-owner-123"})
    assert response.status_code == 302
    for name in ("sessionid", "csrftoken"):
        cookie = client.cookies[name]
        assert cookie["secure"] and cookie["httponly"], name
