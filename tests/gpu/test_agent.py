"""The host agent with NVML faked at its one seam, /proc and the server real."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.test import Client as HttpClient
from runcast.agent import NVML_RETRY_S, Agent
from runcast.settings import Settings

from tests.client.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tracker.gpu import selectors
from tracker.models import ApiToken, Host, HostBatch, HostProcess, Project
from tracker.services import token_create


def settings_for(url: str | None, spool: Path, token: str = "rc_x_y") -> Settings:  # noqa: S107 - not a secret
    return Settings(
        url=url,
        token=token,
        dir=spool,
        flush_interval=0.05,
        timeout=2.0,
        max_retries=1,
        backoff_base=0.01,
        backoff_max=0.05,
        probe_interval=0.05,
        probe_interval_max=0.2,
    )


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def queued(agent: Agent) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for _, _, _, data in list(agent.queue):
        if isinstance(data, dict):
            for key, value in data.items():
                out.setdefault(key, []).append(value)
    return out


class Tick:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_it_reads_every_gpu_field_and_sub_second_samples(tmp_path: Path) -> None:
    clock = Tick()
    trainer = FakeProcess(pid=os.getpid(), sm=lambda t: 60.0)
    nvml = FakeNvml([FakeGpu(util=lambda t: 60.0, processes=[trainer]) for _ in range(2)], clock)
    agent = Agent(settings_for(None, tmp_path), nvml=nvml, host="n1")
    for _second in range(3):
        clock.now += 1
        agent.sample(clock.now)
    seen = queued(agent)
    for field in ("mem_util", "mem_used", "power_w", "sm_clock", "temp", "throttle"):
        assert len(seen[f"gpu/1/{field}"]) == 3, field
    # Six NVML samples a second, each sent with its own time: a short burst is not averaged away.
    assert len(seen["gpu/0/util"]) == 18
    assert seen[f"gpu/0/proc/{os.getpid()}/sm"] == [60.0, 60.0, 60.0]
    described = [d.payload for _, _, _, d in agent.queue if not isinstance(d, dict)]
    assert len(described) == 1  # once per process, not per sample
    info = described[0]
    assert info["pid"] == os.getpid() and info["key"][1] == os.getpid()
    # This process's own command line, as the kernel records it (at most 500 characters).
    assert info["cmdline"] == " ".join(sys.orig_argv)[:500]


def test_it_falls_back_to_the_rates_without_sub_second_samples(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeGpu(util=lambda t: 40.0, sub_second=False)])
    agent = Agent(settings_for(None, tmp_path), nvml=nvml, host="n1")
    agent.sample(1_800_000_000.0)
    assert queued(agent)["gpu/0/util"] == [40.0]


def test_it_says_so_and_goes_on_when_nvml_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = FakeNvml([FakeGpu(util=lambda t: 10.0)])
    nvml.missing = True
    agent = Agent(settings_for(None, tmp_path), nvml=nvml, host="n1")
    with caplog.at_level(logging.WARNING, logger="runcast"):
        for k in range(5):
            agent.sample(1_800_000_000.0 + k)
    assert not queued(agent)
    assert sum("NVML unavailable" in r.message for r in caplog.records) == 1
    assert nvml.calls["init"] == 1  # retried once a minute, not every second
    nvml.missing = False
    agent.sample(1_800_000_000.0 + NVML_RETRY_S + 1)
    assert "gpu/0/util" in queued(agent)


def test_it_skips_a_gpu_that_fell_off_the_bus(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = [FakeGpu(util=lambda t: 50.0) for _ in range(3)]
    agent = Agent(settings_for(None, tmp_path), nvml=FakeNvml(gpus), host="n1")
    agent.sample(1_800_000_000.0)
    gpus[1].lost = True
    with caplog.at_level(logging.WARNING, logger="runcast"):
        for k in range(1, 4):
            agent.sample(1_800_000_000.0 + k)
    seen = queued(agent)
    assert len(seen["gpu/0/power_w"]) == 4 and len(seen["gpu/2/power_w"]) == 4
    assert len(seen["gpu/1/power_w"]) == 1
    lost = [r for r in caplog.records if "GPU 1" in r.message]
    assert lost and len(lost) <= 3  # said once per field, not once per second


def test_a_process_that_exited_between_reads_is_left_out(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    procs = [FakeProcess(gone.pid, lambda t: 30.0), FakeProcess(os.getpid(), lambda t: 50.0)]
    agent = Agent(
        settings_for(None, tmp_path), nvml=FakeNvml([FakeGpu(processes=procs)]), host="n1"
    )
    agent.sample(1_800_000_000.0)
    seen = queued(agent)
    assert f"gpu/0/proc/{gone.pid}/sm" not in seen
    assert f"gpu/0/proc/{os.getpid()}/sm" in seen


# -- against the live server ----------------------------------------------------------------


@pytest.fixture
def write_token(db: Any) -> tuple[Project, str]:
    project = Project.objects.create(slug="gpus", name="GPUs")
    return project, token_create(project=project, name="agent", scope=ApiToken.Scope.WRITE)


@pytest.mark.django_db(transaction=True)
def test_an_outage_spools_and_the_next_agent_replays_it(
    live_server: Any, write_token: tuple[Project, str], tmp_path: Path
) -> None:
    project, token = write_token
    clock = Tick()
    trainer = FakeProcess(pid=os.getpid(), sm=lambda t: 70.0)
    nvml = FakeNvml([FakeGpu(util=lambda t: 70.0, processes=[trainer])], clock)
    spool = tmp_path / "spool"
    # The server is away for the first agent: everything it sampled goes to disk.
    away = Agent(settings_for(closed_port_url(), spool, token), nvml=nvml, host="node-1")
    away.start()
    for _k in range(20):
        clock.now += 1
        away.sample(clock.now)
    away.close(timeout=2.0)
    assert list(spool.rglob("batch-*.json"))
    # Restarted with the server up: the earlier spool is replayed first, then it samples live.
    back = Agent(settings_for(live_server.url, spool, token), nvml=nvml, host="node-1")
    back.start()
    stop = threading.Event()
    clock.now += 1
    back.sample(clock.now)
    stop.set()
    back.close(timeout=5.0)
    host = Host.objects.get(project=project, name="node-1")
    series = selectors.host_series(host=host, t0=0, t1=2e9)
    times = series["gpu/0/power_w"][0]
    assert np.array_equal(np.unique(times), 1_800_000_000.0 + np.arange(1, 22))
    assert HostProcess.objects.filter(host=host, pid=os.getpid()).count() == 1
    assert not list(spool.rglob("batch-*.json"))
    # Replaying again (a duplicate) stores nothing twice.
    batches = HostBatch.objects.filter(host=host).count()
    again = Agent(settings_for(live_server.url, spool, token), nvml=nvml, host="node-1")
    again._replay_earlier_spools()
    assert HostBatch.objects.filter(host=host).count() == batches


@pytest.mark.django_db
def test_the_api_names_the_bad_field_and_checks_the_token(
    write_token: tuple[Project, str], member: Any
) -> None:
    project, token = write_token
    http = HttpClient()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    created = http.post(
        "/api/v1/hosts",
        {"host": "node-9", "session": "s1", "boot_id": "b", "gpus": [{"index": 0}]},
        content_type="application/json",
        **auth,
    )
    assert created.status_code == 201
    bad = {
        "session": "s1",
        "seq": 1,
        "metrics": {"gpu/0/util": {"steps": [0], "values": [50.0], "times": [1.7e9]}},
        "events": [{"kind": "custom", "time": 1.7e9, "payload": {"name": "process", "pid": 3}}],
    }
    answer = http.post("/api/v1/hosts/node-9/batches", bad, content_type="application/json", **auth)
    assert answer.status_code == 400
    assert answer.json()["field"] == "events[0].payload.key"
    assert not HostBatch.objects.exists()  # nothing half-stored
    mismatched = {
        **bad,
        "events": [],
        "metrics": {"gpu/0/util": {"steps": [0, 1], "values": [1.0, 2.0], "times": [1.7e9]}},
    }
    answer = http.post(
        "/api/v1/hosts/node-9/batches", mismatched, content_type="application/json", **auth
    )
    assert answer.status_code == 400 and answer.json()["field"] == "metrics.gpu/0/util.times"
    assert (
        http.post(
            "/api/v1/hosts/nope/batches",
            {**bad, "events": []},
            content_type="application/json",
            **auth,
        ).status_code
        == 404
    )
    reader = token_create(project=project, name="r", scope=ApiToken.Scope.READ)
    assert (
        http.post(
            "/api/v1/hosts",
            {"host": "x", "session": "s"},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {reader}",
        ).status_code
        == 403
    )
    # Another project's write token does not see this host.
    other = Project.objects.create(slug="other", name="Other")
    foreign = token_create(project=other, name="w", scope=ApiToken.Scope.WRITE)
    answer = http.post(
        "/api/v1/hosts/node-9/batches",
        {**bad, "events": []},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {foreign}",
    )
    assert answer.status_code == 404


@pytest.mark.django_db
def test_the_host_page_checks_project_access(
    write_token: tuple[Project, str], outsider: Any
) -> None:
    project, _ = write_token
    Host.objects.create(project=project, name="node-2")
    http = HttpClient()
    http.force_login(outsider)
    assert http.get("/hosts/gpus/node-2/").status_code == 404


def test_the_fake_nvml_only_uses_what_the_real_bindings_have() -> None:
    pynvml = pytest.importorskip("pynvml")
    from tests.client import fake_nvml

    names = [n for n in dir(fake_nvml.FakeNvml) if n.startswith(("nvml", "NVML_"))]
    assert names and [n for n in names if not hasattr(pynvml, n)] == []


def test_with_the_real_bindings_and_no_driver_it_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pytest.skip("this machine has a working NVIDIA driver")
    agent = Agent(settings_for(None, tmp_path), nvml=pynvml, host="n1")
    with caplog.at_level(logging.WARNING, logger="runcast"):
        agent.sample(1_800_000_000.0)
    assert not queued(agent)
    assert any("NVML unavailable" in r.message for r in caplog.records)
