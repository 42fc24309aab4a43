"""Done-when: the real agent (NVML faked at its one seam) and the real training client against the
live server. A foreign process's burst shows on the host page and raises one alert naming the
process; a logged eval of the same size on the same GPUs raises none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import runcast
from django.test import Client
from django.urls import reverse
from runcast.agent import Agent
from runcast.settings import Settings

from alerts import services as alert_services
from alerts.models import Channel
from forecasting import tasks
from forecasting.estimators import formatting as fmt
from forecasting.gpu import selectors as gpu_selectors
from forecasting.models import Flag
from tests.alerts.fixtures import HttpSink
from tests.client.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tracker.models import ApiToken, GpuEpisode, Host, Membership, Project, Run
from tracker.services import token_create

# The flag raised by the sweep is dispatched and delivered in-process, as a worker would.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.eager]

GPUS = 8
SPAN_S = 420
FOREIGN = (120, 160)  # seconds into the timeline
EVAL = (SPAN_S - 40, SPAN_S)  # the last 40 s; the run logs it when it ends
TRAIN_SM = 55.0
EXTRA = 35.0


def wait_for(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sweep(tmp_path: Path) -> Any:
    """Somebody else's job: a real process, not a descendant of this one, named by its command.

    Started through a shell that exits at once, so it is re-parented away from the test process
    (a child of the trainer would rightly count as the trainer's).
    """
    script = tmp_path / "sweep.py"
    script.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    out = subprocess.run(
        ["/bin/sh", "-c", f"{sys.executable} {script} --trial 7 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    yield pid
    os.kill(pid, signal.SIGKILL)


def test_a_foreign_burst_alerts_once_and_a_logged_eval_does_not(
    live_server: Any,
    sink: HttpSink,
    no_default_slack: None,
    django_user_model: Any,
    tmp_path: Path,
    sweep: int,
) -> None:
    owner = django_user_model.objects.create_user("ops", "ops@example.com", "pw-ops-12345")
    project = Project.objects.create(
        slug="hpc", name="HPC", gpu_hour_price=2.0, timezone="Asia/Shanghai"
    )
    Membership.objects.create(project=project, user=owner, role=Membership.Role.OWNER)
    alert_services.channel_create(
        project=project, kind=Channel.Kind.SLACK, name="slack", target=sink.url("/slack")
    )
    token = token_create(project=project, name="t", scope=ApiToken.Scope.WRITE)
    settings = Settings(
        url=live_server.url, token=token, dir=tmp_path / "spool", flush_interval=0.05
    )

    start = time.time() - SPAN_S
    clock = Clock(start)

    def offset() -> float:
        return clock.now - start

    def trainer_sm(t: float) -> float:
        in_eval = EVAL[0] <= offset() < EVAL[1]
        return TRAIN_SM + (EXTRA if in_eval else 0.0) + (offset() % 7) * 0.3

    def foreign_sm(t: float) -> float:
        return EXTRA if FOREIGN[0] <= offset() < FOREIGN[1] else -1.0  # -1: not on the GPU

    def util(t: float) -> float:
        return trainer_sm(t) + max(0.0, foreign_sm(t))

    trainer = FakeProcess(pid=os.getpid(), sm=trainer_sm)
    foreign = FakeProcess(pid=sweep, sm=foreign_sm)
    nvml = FakeNvml([FakeGpu(util=util, processes=[trainer, foreign]) for _ in range(GPUS)], clock)

    # The training process registers its identity at init (this very process).
    run = runcast.init(
        project="hpc",
        id="pretrain-7b",
        total_steps=10_000,
        settings=settings,
        started_at=start,
        world_size=GPUS,
    )
    agent = Agent(settings, nvml=nvml, host="node-3", interval=0.0)
    for second in range(SPAN_S):
        clock.now = start + second
        agent.sample(clock.now)  # queued; its sender starts below
        if second % 10 == 0:
            run.log({"loss": 3.0 - second * 1e-3}, step=second, time=clock.now)
    # The run logs its eval as it ends, with its duration: the eval burst is the run's own.
    run.event("eval", step=SPAN_S, duration_s=EVAL[1] - EVAL[0])
    run.finish()
    # The agent's sender runs after the run's has finished: the test database is SQLite's shared
    # in-memory one, which does not take two writers at once (PostgreSQL, in CI, would).
    agent.start()
    agent.close(timeout=90.0)
    assert not list((tmp_path / "spool").rglob("batch-*.json")), "the agent left batches spooled"

    host = Host.objects.get(project=project, name="node-3")
    tasks.sweep_gpu_hosts()
    tasks.sweep_gpu_hosts()  # a second sweep changes nothing

    unexplained = list(GpuEpisode.objects.filter(host=host, explained=False))
    assert len(unexplained) == 1, [(e.start - start, e.end - start, e.kind) for e in unexplained]
    burst = unexplained[0]
    assert FOREIGN[0] - 5 <= burst.start - start <= FOREIGN[0] + 5
    assert burst.attribution["top"]["pid"] == sweep
    assert "sweep.py" in burst.text and "not part of any run" in burst.text
    explained = GpuEpisode.objects.filter(host=host, explained=True)
    assert any(e.start - start >= EVAL[0] - 5 for e in explained)

    flags = Flag.objects.filter(run__public_id="pretrain-7b", kind=Flag.Kind.GPU_UNEXPLAINED)
    assert flags.count() == 1
    wait_for(lambda: len(sink.to("/slack")) >= 1)
    time.sleep(1.0)  # a duplicate would arrive now
    messages = [r.body.decode() for r in sink.to("/slack") if "GPU" in r.body.decode()]
    assert len(messages) == 1, messages
    assert f"pid {sweep}" in messages[0] and "sweep.py" in messages[0]
    # The clock rule: the burst's time in the message is the project's, with its zone and
    # offset (it read "at 12-04 06:29", Shanghai's clock with no zone, beside CET pages).
    burst_at = fmt.when(burst.start, project.tzinfo)
    assert f"at {burst_at} (" in messages[0] and burst_at.endswith("CST (UTC+8)")

    browser = Client()
    browser.force_login(owner)
    page = browser.get(reverse("dashboard:host", args=["hpc", "node-3"]) + "?hours=1")
    assert page.status_code == 200
    html = page.content.decode()
    assert "sweep.py" in html
    assert html.count('class="episode unexplained"') == 1
    # The page writes the burst's time, and its window, in the viewer's zone.
    # Both stored times in the viewer's zone: the burst's, and that of the eval which explains
    # the other episode ("explained (eval at ...)"); none in the project's.
    assert html.count('<time data-fmt="when" datetime=') == 2 and "CST" not in html
    assert html.count('<time data-fmt="local" datetime=') >= 2
    assert 'class="event-tick"' in html
    # The run page's cost line splits the measured GPU time: the run's own vs the stranger's.
    run_page = browser.get(reverse("dashboard:run-summary", args=["hpc", "pretrain-7b"]))
    text = run_page.content.decode()
    assert "measured on its GPUs" in text and "node-3" in text
    split = gpu_selectors.run_gpu_hours(run=Run.objects.get(public_id="pretrain-7b"))
    assert split is not None
    hours = split["hours"]
    expected_run = GPUS * SPAN_S * (TRAIN_SM + 0.9) / 100 / 3600
    assert hours["run"] == pytest.approx(expected_run, rel=0.1)
    expected_foreign = GPUS * (FOREIGN[1] - FOREIGN[0]) * EXTRA / 100 / 3600
    assert hours["unknown"] == pytest.approx(expected_foreign, rel=0.1)
