"""A live Runcast server (pytest-django's, on the test database) and a project to log into."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tracker.models import ApiToken, Membership, Project
from tracker.services import token_create

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "docs" / "examples"
# The examples' tiny GPT (docs/examples/tiny_gpt.py) is shared with the in-process tests.
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))


@pytest.fixture
def live_token(django_user_model) -> str:
    user = django_user_model.objects.create_user("trainer", password="pw-trainer-123")
    project = Project.objects.create(slug="live", name="Live")
    Membership.objects.create(project=project, user=user, role=Membership.Role.OWNER)
    return token_create(project=project, name="t", scope=ApiToken.Scope.WRITE)


@pytest.fixture
def example_env(live_server, live_token, tmp_path: Path) -> Callable[..., dict[str, str]]:
    """The environment a user's training script gets: the server, a token, a project."""

    def build(**extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNCAST_")}
        env.update(
            RUNCAST_URL=live_server.url,
            RUNCAST_TOKEN=live_token,
            RUNCAST_PROJECT="live",
            RUNCAST_DIR=str(tmp_path / "spool"),
            # Several points per batch, so the first forecast already has a curve to fit.
            RUNCAST_FLUSH_INTERVAL="2",
            PYTHONPATH=os.pathsep.join([str(ROOT / "client"), str(EXAMPLES)]),
            OMP_NUM_THREADS="1",  # a tiny model gains nothing from threads on a shared CPU
            PYTHONUNBUFFERED="1",
            **extra,
        )
        return env

    return build


def run_example(name: str, env: dict[str, str], cwd: Path, *args: str) -> str:
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout
