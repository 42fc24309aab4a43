"""docker-compose.yml brings back whatever exits (issue 24: the worker died with Redis and
nothing restarted it). No Docker engine runs here: the file itself is checked."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_service_restarts_by_itself() -> None:
    yaml = pytest.importorskip("yaml")
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert {"web", "worker", "beat", "postgres", "redis"} <= services.keys()
    assert {name: s.get("restart") for name, s in services.items()} == dict.fromkeys(
        services, "unless-stopped"
    )
