"""The host page in Chromium (issue 28): reached from the board and from a run's hosts, its header
names only the runs seen on that host's GPUs in the window, every strip has a time axis whose
ticks sit at their times, and the episodes link to the runs and processes involved."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.dashboard.test_browser import CHROMIUM, bare_page, browser  # noqa: F401
from tests.gpu.host_fixtures import STRANGER, TRAINER, gpu_host  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXIS = """(strip) => {
  const axis = document.querySelector(`.host-axis[data-strip='${strip}']`);
  const area = axis.getBoundingClientRect();
  return {
    t0: Number(axis.dataset.t0), t1: Number(axis.dataset.t1),
    left: area.left, width: area.width,
    ticks: [...axis.querySelectorAll("time.tick")].map((el) => {
      const r = el.getBoundingClientRect();
      return {epoch: Number(el.dataset.epoch), x: r.left + r.width / 2, text: el.textContent};
    }),
  };
}"""

CELLS = """() => {
  const cells = document.querySelectorAll("#util-strip .gpu-row:first-child .cell");
  return {left: cells[0].getBoundingClientRect().left,
          right: cells[cells.length - 1].getBoundingClientRect().right};
}"""


def test_every_strip_has_a_time_axis_at_its_times(
    bare_page: Any,  # noqa: F811
    gpu_host: dict[str, Any],  # noqa: F811
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/hosts/llm/node-3/?hours=0.25")
    strips = pg.eval_on_selector_all(".strip", "els => els.map((el) => el.id)")
    assert strips == ["util-strip", "event-strip"]
    cells = pg.evaluate(CELLS)
    berlin = ZoneInfo("Europe/Berlin")
    for strip in strips:
        axis = pg.evaluate(AXIS, strip)
        # The axis spans the heat map's cells, not its label column.
        assert axis["left"] == pytest.approx(cells["left"], abs=1)
        assert axis["left"] + axis["width"] == pytest.approx(cells["right"], abs=1)
        assert len(axis["ticks"]) >= 3, axis
        for tick in axis["ticks"]:
            share = (tick["epoch"] - axis["t0"]) / (axis["t1"] - axis["t0"])
            assert tick["x"] == pytest.approx(axis["left"] + share * axis["width"], abs=2)
            # Labelled in the viewer's zone (the context runs in Berlin).
            local = datetime.fromtimestamp(tick["epoch"], tz=berlin).strftime("%H:%M")
            assert tick["text"] == local, tick


def test_the_header_names_only_the_runs_seen_on_the_hosts_gpus(
    bare_page: Any,  # noqa: F811
    gpu_host: dict[str, Any],  # noqa: F811
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/hosts/llm/node-3/?hours=0.25")
    header = pg.locator("#host-runs")
    assert header.locator("a").all_inner_texts() == ["pretrain"]
    assert "bystander" not in pg.inner_text("body")


def test_episodes_link_to_their_runs_and_processes(
    bare_page: Any,  # noqa: F811
    gpu_host: dict[str, Any],  # noqa: F811
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/hosts/llm/node-3/?hours=0.25")
    stranger = pg.locator("ul.episodes li.unexplained")
    assert stranger.count() == 1
    assert stranger.inner_text().startswith("GPU 1 on node-3")
    assert stranger.locator("a.episode-run").get_attribute("href") == "/runs/llm/pretrain/"
    stranger.locator("a.episode-process").click()
    assert pg.url.endswith(f"#pid-{STRANGER}")
    row = pg.locator(f"#pid-{STRANGER}")
    assert "sweep.py" in row.inner_text() and "unknown (no run)" in row.inner_text()
    checkpoint = pg.locator("ul.episodes li.explained", has_text="checkpoint")
    assert checkpoint.count() == 1
    assert "on GPU 0" in checkpoint.inner_text()
    assert checkpoint.locator("a.episode-process").get_attribute("href") == f"#pid-{TRAINER}"
    assert "run pretrain" in pg.inner_text(f"#pid-{TRAINER}")
    # The band on the strip leads to its line in the list.
    band = pg.locator(".gpu-episodes a.episode.unexplained")
    assert band.get_attribute("href") == f"#{stranger.get_attribute('id')}"


def test_the_board_and_a_runs_hosts_link_to_the_host_page(
    bare_page: Any,  # noqa: F811
    gpu_host: dict[str, Any],  # noqa: F811
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/")
    pg.locator("#board-hosts a", has_text="node-3").click()
    pg.wait_for_url(f"{pg.base}/hosts/llm/node-3/")
    assert pg.inner_text("h1").startswith("node-3")

    pg.goto(f"{pg.base}/runs/llm/pretrain/")
    pg.locator("a.host-link", has_text="node-3").click()
    pg.wait_for_url(f"{pg.base}/hosts/llm/node-3/")
    # A host no agent reports from has no page: its name stays text.
    pg.goto(f"{pg.base}/runs/llm/bystander-b/")
    hosts = pg.locator("table.kv tr", has_text="hosts")
    assert "login-1" in hosts.inner_text()
    assert hosts.locator("a.host-link").all_inner_texts() == ["node-3"]
