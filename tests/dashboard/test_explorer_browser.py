"""The runs explorer in Chromium: filter (and the error that marks its token), sort by a metric
and back, the view's state in the URL, the CSV download, select -> compare, bulk tag, delete
and restore, move to an experiment, and 800 px."""

from __future__ import annotations

import csv
import io
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.factories import listed_run as make
from tests.dashboard.test_browser import CHROMIUM, bare_page, browser  # noqa: F401
from tracker.mlflow import services as mlflow_services

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def explorer_runs(project: Any) -> None:
    for i, (loss, lr, team) in enumerate(
        [(2.0, "3e-4", "nlp"), (1.5, "1e-3", "nlp"), (3.0, "3e-4", "nlp"), (2.4, "3e-4", "cv")]
    ):
        make(
            project,
            f"run-{i}",
            day=i,
            tags=[f"team:{team}"],
            config={"lr": lr},
            metrics={"loss": loss},
        )


def _names(pg: Any) -> list[str]:
    return pg.locator("#runs-table tbody tr[data-run]").evaluate_all(
        "rows => rows.map(r => r.dataset.run)"
    )


def _query(pg: Any) -> dict[str, list[str]]:
    return urllib.parse.parse_qs(urllib.parse.urlparse(pg.url).query)


def test_a_filter_narrows_and_a_bad_one_marks_its_token(
    bare_page: Any,  # noqa: F811
    explorer_runs: None,
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/projects/llm/runs/")
    assert _names(pg) == ["run-3", "run-2", "run-1", "run-0"]
    pg.fill("input[name=q]", "metrics.loss < 2.5 and params.lr = '3e-4' and tags.team = 'nlp'")
    pg.click("#runs-filter button[type=submit]")
    pg.wait_for_url("**q=metrics.loss**")
    assert _names(pg) == ["run-0"]

    pg.fill("input[name=q]", "metrics.loss < 2.5 and colour = 'red'")
    pg.click("#runs-filter button[type=submit]")
    pg.wait_for_selector("#runs-error")
    assert pg.inner_text("#runs-error-token") == "colour = 'red'"
    assert "Invalid attribute key 'colour'" in pg.inner_text("#runs-error")


def test_sorting_on_a_metric_lives_in_the_url_and_back_undoes_it(
    bare_page: Any,  # noqa: F811
    explorer_runs: None,
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/projects/llm/runs/?p=lr")
    pg.click("th.metric a[data-sort='m:loss']")
    pg.wait_for_url("**sort=m%3Aloss**")
    assert _names(pg) == ["run-1", "run-0", "run-3", "run-2"]
    assert _query(pg)["dir"] == ["asc"] and _query(pg)["p"] == ["lr"]  # the columns stay
    pg.click("th.metric a[data-sort='m:loss']")
    pg.wait_for_url("**dir=desc**")
    assert _names(pg) == ["run-2", "run-3", "run-0", "run-1"]
    pg.go_back()
    pg.wait_for_url("**dir=asc**")
    assert _names(pg) == ["run-1", "run-0", "run-3", "run-2"]
    # The same URL in a fresh load is the same view (shareable).
    pg.goto(pg.url)
    assert _names(pg) == ["run-1", "run-0", "run-3", "run-2"]
    assert pg.locator("#runs-table th.param").inner_text().startswith("lr")


def test_the_csv_download_is_the_view(
    bare_page: Any,  # noqa: F811
    explorer_runs: None,
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/projects/llm/runs/?q=tags.team+%3D+%27nlp%27&sort=m:loss&dir=desc&p=lr")
    with pg.expect_download() as info:
        pg.click("#runs-csv")
    text = Path(info.value.path()).read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["run_id"] for r in rows] == _names(pg) == ["run-2", "run-0", "run-1"]
    assert [r["params.lr"] for r in rows] == ["3e-4", "3e-4", "1e-3"]


def test_selected_runs_open_in_compare(
    bare_page: Any,  # noqa: F811
    explorer_runs: None,
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/projects/llm/runs/")
    pg.check("input[name=run][value=run-0]")
    pg.check("input[name=run][value=run-2]")
    pg.click("#compare-selected")
    pg.wait_for_url("**/compare/**")
    assert sorted(_query(pg)["run"]) == ["run-0", "run-2"]
    pg.wait_for_selector("#chart-compare[data-ready='1']", timeout=15_000)
    assert pg.locator("#compare-table tbody tr").count() == 2


def test_a_member_tags_deletes_and_restores_selected_runs_in_the_same_view(
    bare_page: Any,  # noqa: F811
    explorer_runs: None,
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/projects/llm/runs/?sort=name&dir=asc")
    pg.check("input[name=run][value=run-1]")
    pg.fill("#runs-bulk input[name=tag]", "baseline")
    pg.click("#bulk-tag")
    pg.wait_for_selector("#runs-messages")
    assert "Tagged 1 run 'baseline'." in pg.inner_text("#runs-messages")
    assert _query(pg) == {"sort": ["name"], "dir": ["asc"]}  # the same view
    assert "baseline" in pg.inner_text("#runs-table tr[data-run=run-1]")

    pg.check("input[name=run][value=run-0]")
    pg.check("input[name=run][value=run-2]")
    pg.click("#bulk-delete")
    pg.wait_for_selector("#runs-messages")
    said = pg.inner_text("#runs-messages")
    assert "Deleted 2 runs" in said and "restorable until" in said
    assert _names(pg) == ["run-1", "run-3"]

    pg.check("#runs-filter input[name=deleted]")
    pg.click("#runs-filter button[type=submit]")
    pg.wait_for_url("**deleted=1**")
    assert _names(pg) == ["run-0", "run-2"]
    pg.check("input[name=run][value=run-2]")
    pg.click("#bulk-restore")
    pg.wait_for_selector("#runs-messages")
    assert "Restored 1 run." in pg.inner_text("#runs-messages")
    assert _names(pg) == ["run-0"]  # still the deleted runs' view


def test_a_member_moves_a_selected_mlflow_run_to_an_experiment(
    bare_page: Any,  # noqa: F811
    project: Any,
) -> None:
    default = mlflow_services.experiment_default(project=project)
    for name in ("m1", "m2"):
        mlflow_services.run_create(
            project=project,
            experiment=default,
            user_id="ada",
            start_time_ms=None,
            tags=[],
            run_name=name,
            run_id=name,
        )
    mlflow_services.experiment_create(project=project, name="vision", tags={})
    pg = bare_page
    pg.goto(f"{pg.base}/projects/llm/runs/?sort=name&dir=asc")
    pg.check("input[name=run][value=m2]")
    pg.select_option("#runs-bulk select[name=experiment_id]", label="vision")
    pg.click("#bulk-move")
    pg.wait_for_selector("#runs-messages")
    assert "Moved 1 run to another experiment." in pg.inner_text("#runs-messages")
    assert _query(pg) == {"sort": ["name"], "dir": ["asc"]}  # the same view
    assert "vision" in pg.inner_text("#runs-table tr[data-run=m2]")
    assert "vision" not in pg.inner_text("#runs-table tr[data-run=m1]")


def test_it_is_usable_at_800_px(
    bare_page: Any,  # noqa: F811
    explorer_runs: None,
) -> None:
    pg = bare_page
    pg.set_viewport_size({"width": 800, "height": 900})
    pg.goto(f"{pg.base}/projects/llm/runs/?p=lr")
    # The page itself never scrolls sideways: the wide table scrolls in its own box.
    assert pg.evaluate("() => document.documentElement.scrollWidth") <= 800
    for selector in ("input[name=q]", "#runs-filter button[type=submit]", "#runs-csv"):
        box = pg.locator(selector).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 800, selector
    pg.click("a:text-is('Run')")
    pg.wait_for_url("**sort=name**")
    assert _names(pg) == ["run-0", "run-1", "run-2", "run-3"]
