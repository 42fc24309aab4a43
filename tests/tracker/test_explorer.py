"""The runs explorer's selector (tracker.explorer): the MLflow filter language over Runcast runs
(tags as labels, statuses in either case, quick filters), errors that point at the token, and
keyset pages that add up to the whole sorted view."""

from __future__ import annotations

import math
from datetime import date

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.dashboard.factories import listed_run as make
from tracker import explorer, query
from tracker.explorer import RunFilter
from tracker.models import Project, Run


def names(
    project: Project, text: str = "", order: list[str] | None = None, **quick: object
) -> list[str]:
    where = RunFilter(text=text, order=order or [], **quick)  # type: ignore[arg-type]
    page = explorer.run_search(projects=[project], where=where, after=None, limit=100)
    return [r.name for r in page.runs]


@pytest.fixture
def runs(project: Project) -> None:
    make(
        project,
        "a",
        day=0,
        tags=["team:nlp", "baseline"],
        config={"lr": "3e-4"},
        metrics={"loss": 2.0},
    )
    make(project, "b", day=1, tags=["team=nlp"], config={"lr": "1e-3"}, metrics={"loss": 1.5})
    make(project, "c", day=2, tags=["my-team:nlp"], config={"lr": "3e-4"}, metrics={"loss": 3.0})
    make(project, "d", day=3, tags=["team:nlpx"], config={"lr": "3e-4"}, metrics={"loss": math.nan})
    make(project, "e", day=4, status=Run.Status.RUNNING, tags=["team:nlp"], config={"lr": "3e-4"})


@pytest.mark.django_db
def test_it_answers_the_issue_s_question_in_sql(project: Project, runs: None) -> None:
    text = "metrics.loss < 2.5 and params.lr = '3e-4' and tags.team = 'nlp' and status = 'FINISHED'"
    assert names(project, text) == ["a"]


@pytest.mark.django_db
def test_a_tag_label_is_a_key_and_value_matched_whole(project: Project, runs: None) -> None:
    assert names(project, "tags.team = 'nlp'") == ["e", "b", "a"]
    assert names(project, "tags.team != 'nlp'") == ["d"]
    assert names(project, "tags.baseline IS NOT NULL") == ["a"]
    assert names(project, "tags.baseline = ''") == ["a"]
    assert names(project, "tags.team IS NULL") == ["c"]
    assert names(project, "tags.team LIKE 'nl%'") == ["e", "d", "b", "a"]
    assert names(project, "tags.team ILIKE 'NLP_'") == ["d"]
    assert names(project, "tags.team IN ('nlpx', 'cv')") == ["d"]
    assert names(project, "tags.`my-team` = 'nlp'") == ["c"]


@pytest.mark.django_db
def test_a_tag_label_with_non_ascii_text_matches(project: Project) -> None:
    make(project, "fr", tags=['équipe:"vision"'])
    assert names(project, "tags.équipe = '\"vision\"'") == ["fr"]


@pytest.mark.django_db
def test_a_tag_compared_with_a_number_is_refused_at_its_position(project: Project) -> None:
    with pytest.raises(query.QueryError, match=r"tags are labels .*\(position 23\)") as e:
        names(project, "status = 'running' and tags.team > 3")
    assert e.value.position == 23


@pytest.mark.django_db
def test_an_unknown_attribute_names_itself_and_where_it_is(project: Project) -> None:
    with pytest.raises(
        query.QueryError, match=r"Invalid attribute key 'colour'.*\(position 21\)"
    ) as e:
        names(project, "metrics.loss < 1 and colour = 'red'")
    assert e.value.position == 21


@pytest.mark.django_db
def test_quick_filters_narrow_in_the_same_language(project: Project, runs: None) -> None:
    assert names(project, status="running") == ["e"]
    assert names(project, name="B") == ["b"]
    assert names(project, name="_") == ["e", "d", "c", "b", "a"]  # LIKE's wildcards work
    from_, to = date(2026, 11, 2), date(2026, 11, 3)
    assert names(project, started_from=from_, started_to=to) == ["c", "b"]


@pytest.mark.django_db
def test_other_projects_runs_are_never_found(project: Project, other_project: Project) -> None:
    make(project, "mine")
    make(other_project, "theirs")
    assert names(project) == ["mine"]


@pytest.mark.django_db
def test_sorting_on_a_metric_puts_nan_then_missing_last_both_ways(
    project: Project, runs: None
) -> None:
    assert names(project, order=["metrics.loss ASC"]) == ["b", "a", "c", "d", "e"]
    assert names(project, order=["metrics.loss DESC"]) == ["c", "a", "b", "d", "e"]
    assert names(project, order=["params.lr DESC"]) == ["e", "d", "c", "a", "b"]


def _all_pages(
    project: Project, order: list[str], limit: int, text: str = ""
) -> tuple[list[str], int]:
    seen, after, pages = [], None, 0
    while True:
        page = explorer.run_search(
            projects=[project], where=RunFilter(text=text, order=order), after=after, limit=limit
        )
        seen += [r.name for r in page.runs]
        pages += 1
        after = page.next_cursor
        if after is None:
            return seen, pages


@pytest.mark.django_db
@pytest.mark.parametrize(
    "order",
    [
        [],
        ["metrics.loss ASC"],
        ["metrics.loss DESC"],
        ["params.lr ASC"],
        ["steps DESC"],
        ["name ASC"],
    ],
)
def test_keyset_pages_add_up_to_the_whole_sorted_view(project: Project, order: list[str]) -> None:
    # Ties, NaNs, missing metrics and params, and equal start times: every boundary a keyset
    # cursor must continue across.
    for i in range(11):
        metrics = {} if i % 4 == 0 else {"loss": math.nan if i % 5 == 0 else float(i % 3)}
        config = {"lr": str(i % 2)} if i % 3 else {}
        make(project, f"r{i:02}", day=i // 3, metrics=metrics, config=config)
    whole = names(project, order=order)
    seen, pages = _all_pages(project, order, limit=3)
    assert seen == whole and len(whole) == 11 and pages == 4


@pytest.mark.django_db
def test_a_page_after_a_cursor_skips_nothing_added_before_it(project: Project) -> None:
    for i in range(4):
        make(project, f"r{i}", day=i)
    first = explorer.run_search(projects=[project], where=RunFilter(), after=None, limit=2)
    assert [r.name for r in first.runs] == ["r3", "r2"]
    make(project, "newest", day=9)  # an offset would now repeat r2
    rest = explorer.run_search(
        projects=[project], where=RunFilter(), after=first.next_cursor, limit=2
    )
    assert [r.name for r in rest.runs] == ["r1", "r0"] and rest.next_cursor is None


def test_a_cursor_not_from_this_server_or_this_order_is_refused() -> None:
    compiled_cols = [query.SortColumn("x", True), query.SortColumn("y", True)]
    from tracker.query.paging import _cursor_decode, _cursor_encode

    with pytest.raises(query.QueryError, match="not a page cursor this server gave"):
        _cursor_decode("%%%", compiled_cols)
    with pytest.raises(query.QueryError, match="not a page cursor of this order"):
        _cursor_decode(_cursor_encode([1]), compiled_cols)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "queries"),
    # The sort over narrow rows, then the page's runs whole with what they show; a filtered
    # page looks among its order's first rows first (the candidates, the matches among them).
    [("", 2), ("metrics.loss < 9 and tags.team = 'nlp'", 3)],
)
def test_a_page_is_a_few_queries_whatever_its_sort(
    project: Project, runs: None, text: str, queries: int
) -> None:
    where = RunFilter(text=text, order=["metrics.loss DESC"])
    with CaptureQueriesContext(connection) as ctx:
        page = explorer.run_search(projects=[project], where=where, after=None, limit=1)
        assert page.runs[0].project.slug == "llm" and page.runs[0].deadline is None
        assert explorer.run_user(page.runs[0]) == "" and explorer.run_experiment(page.runs[0]) == ""
    assert len(ctx.captured_queries) == queries


@pytest.mark.django_db
def test_metric_values_give_latest_and_best(project: Project) -> None:
    from tests.dashboard.factories import make_run

    run = make_run(project, "r", points=600)  # loss = 3 + exp(-step / 5000), falling
    values = explorer.metric_values(runs=[run], keys=["loss", "nope"])
    got = values[(run.pk, "loss")]
    assert got.step == 599 and got.best == pytest.approx(3 + math.exp(-599 / 5000))
    assert got.latest == pytest.approx(got.best) and (run.pk, "nope") not in values


@pytest.mark.django_db
def test_groups_count_every_matching_run_with_the_metric_s_mean_and_best(
    project: Project, runs: None
) -> None:
    def groups(by: str, text: str = "", metric: str | None = "loss") -> list[tuple[object, ...]]:
        found = explorer.run_groups(
            projects=[project], where=RunFilter(text=text), by=by, metric=metric
        )
        return [(g.value, g.count, g.mean, g.best) for g in found]

    # d's NaN and e's missing loss count as runs, not as values.
    assert groups("p:lr") == [("3e-4", 4, 2.5, 2.0), ("1e-3", 1, 1.5, 1.5)]
    assert groups("status", "tags.team = 'nlp'", None) == [
        ("finished", 2, None, None),
        ("running", 1, None, None),
    ]
    assert groups("experiment", metric=None) == [(None, 5, None, None)]
    with pytest.raises(query.QueryError, match=r"grouped by status, .* not 'colour'"):
        groups("colour")


@pytest.mark.django_db
def test_not_equal_on_a_metric_reads_only_that_key(project: Project) -> None:
    # The join is on (run, key): another key's value 2 must not exclude a run from loss != 2.
    make(project, "x", metrics={"loss": 1.0, "acc": 2.0})
    make(project, "y", metrics={"loss": 2.0, "acc": 1.0})
    make(project, "z", metrics={"acc": 3.0})
    assert names(project, "metrics.loss != 2") == ["x"]
    assert names(project, "metrics.loss != 2 and metrics.acc > 1") == ["x"]
    assert names(project, "metrics.loss < 3", ["metrics.acc DESC"]) == ["x", "y"]


@pytest.mark.django_db
@pytest.mark.parametrize("probe", [1, 4, 1000])
@pytest.mark.parametrize(
    "order", [[], ["metrics.loss ASC"], ["metrics.loss DESC"], ["params.lr DESC"]]
)
def test_a_filtered_view_pages_alike_whether_its_probe_finds_enough_or_not(
    project: Project, order: list[str], probe: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A filtered page first looks among the first `probe` rows of the unfiltered order: with 1
    # it never finds a page there, with 4 some pages, with 1000 every one.
    from tracker.query import paging

    monkeypatch.setattr(paging, "PROBE_ROWS", probe)
    for i in range(13):
        metrics = {} if i % 4 == 0 else {"loss": math.nan if i % 5 == 0 else float(i % 3)}
        config = {"lr": str(i % 2)} if i % 3 else {}
        make(
            project,
            f"r{i:02}",
            day=i // 3,
            metrics=metrics,
            config=config,
            tags=["team:nlp"] if i % 2 else ["team:cv"],
        )
    where = RunFilter(text="tags.team = 'nlp'", order=order)
    whole = [r.name for r in explorer.run_search_compiled(projects=[project], where=where).rows]
    seen, pages = _all_pages(project, order, limit=2, text="tags.team = 'nlp'")
    assert seen == whole and len(whole) == 6 and pages == 3
