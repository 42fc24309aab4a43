from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from runcast.settings import Settings

from tests.client.fakeserver import TOKEN, FakeServer

MakeSettings = Callable[..., Settings]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The host environment must not leak a real server, token or rank into the tests.
    for name in list(os.environ):
        if name.startswith("RUNCAST_") or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer().start()
    yield fake
    fake.stop()


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def make_settings(spool_dir: Path) -> MakeSettings:
    """Settings with timings shrunk so outages, retries and probes take milliseconds."""

    def build(url: str | None = None, **overrides: object) -> Settings:
        base = Settings(
            url=url,
            token=TOKEN,
            dir=spool_dir,
            flush_interval=0.05,
            heartbeat_interval=60.0,
            timeout=2.0,
            max_retries=3,
            backoff_base=0.02,
            backoff_max=0.1,
            probe_interval=0.05,
            probe_interval_max=0.2,
            finish_timeout=10.0,
        )
        return dataclasses.replace(base, **overrides)

    return build
