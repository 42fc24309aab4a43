"""What a lead reads on the run page, checked in headless Chromium (fixtures of test_browser)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dashboard.test_browser import CHROMIUM, bare_page, browser  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _charts_js(pg: Any) -> None:
    pg.goto(f"{pg.base}/projects/llm/settings/")
    pg.add_script_tag(url=f"{pg.base}/static/vendor/uPlot.iife.min.js")
    pg.add_script_tag(url=f"{pg.base}/static/dashboard/charts.js")


def test_step_labels_are_exact(bare_page: Any, project: Any) -> None:  # noqa: F811
    # The ranks axis of the demo read "10k 10.3k 10.5k 10.8k 11k" for ticks every 250 steps, and
    # a rollback checkpoint at step 12,250 would have been labelled "step 12.3k".
    pg = bare_page
    _charts_js(pg)
    steps = [900, 9750, 10_000, 10_250, 10_750, 12_345, 250_000, 1_234_560]
    ticks = pg.evaluate("(s) => window.Runcast.fmtStep(null, s)", steps)
    assert ticks == ["900", "9750", "10k", "10.25k", "10.75k", "12,345", "250k", "1234.56k"]
    texts = pg.evaluate("(s) => s.map(window.Runcast.stepText)", steps)
    assert texts == ["900", "9750", "10k", "10.25k", "10.75k", "12,345", "250k", "1234.56k"]
