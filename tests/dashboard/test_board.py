from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.pages import board_for_user
from tests.dashboard.factories import (
    ended_inside,
    episode,
    episode_recovered,
    flag,
    forecast_set,
    make_run,
)
from tracker.models import Run
from tracker.project_settings.services import deadline_create
from tracker.services import run_finish, run_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def deadline(project):
    return deadline_create(
        project=project,
        name="Blind eval",
        slug="blind-eval",
        cutoff=timezone.now() + timedelta(hours=8),
        timezone="Asia/Shanghai",
        buffer=timedelta(hours=1),
    )


def _board_runs(project, deadline, n: int) -> list[Run]:
    now = timezone.now()
    runs = []
    for i in range(n):
        run = make_run(project, f"r{i}", points=10, deadline=deadline if i % 2 else None)
        forecast_set(run, now, finish_in=3600 * (i + 1), p=(i % 10) / 10 if i % 2 else None)
        flag(run, "spike", onset=5, rollback_step=0)
        runs.append(run)
    return runs


def test_it_sorts_runs_by_risk_and_puts_runs_without_deadline_below(member, project, deadline):
    now = timezone.now()
    safe = make_run(project, "safe", points=10, deadline=deadline)
    late = make_run(project, "late", points=10, deadline=deadline)
    loose = make_run(project, "loose", points=10)
    forecast_set(safe, now, finish_in=3600, p=0.97)
    forecast_set(late, now, finish_in=12 * 3600, p=0.2)
    forecast_set(loose, now, finish_in=3600)
    board = board_for_user(user=member, now=now)
    assert [o.run.public_id for o in board.lanes[0].runs] == ["late", "safe"]
    assert [o.run.public_id for o in board.unscheduled] == ["loose"]
    late_o = board.lanes[0].runs[0]
    assert late_o.p_on_time == 0.2
    assert late_o.eta_moved_s == pytest.approx(3600)
    assert late_o.rate_change == pytest.approx(-0.1)


def test_it_prices_gpu_hours_so_far_and_to_finish(member, project):
    now = timezone.now()
    run = make_run(project, "r", points=10, world_size=8)
    Run.objects.filter(pk=run.pk).update(started_at=now - timedelta(hours=2))
    forecast_set(run, now, finish_in=3 * 3600)
    o = board_for_user(user=member, now=now).unscheduled[0]
    assert o.gpu_hours_so_far == pytest.approx(16)
    assert o.gpu_hours_to_finish == pytest.approx(24, rel=1e-3)
    assert o.cost_so_far == pytest.approx(40)  # 16 GPU-h x 2.5
    assert o.cost_to_finish == pytest.approx(60, rel=1e-3)


def test_a_run_that_reports_no_world_size_is_priced_as_one_process(member, project):
    now = timezone.now()
    run = make_run(project, "r", points=10, world_size=None)
    Run.objects.filter(pk=run.pk).update(started_at=now - timedelta(hours=2))
    forecast_set(run, now, finish_in=3 * 3600)
    o = board_for_user(user=member, now=now).unscheduled[0]
    assert o.gpu_count == 1 and o.gpu_count_assumed
    assert o.cost_so_far == pytest.approx(5)  # 2 h x 1 process x 2.5
    assert o.cost_to_finish == pytest.approx(7.5, rel=1e-3)


def test_the_board_says_when_it_assumed_one_process(client, member, project):
    make_run(project, "told", points=10, world_size=8)
    make_run(project, "untold", points=10, world_size=None)
    client.force_login(member)
    html = client.get("/").content.decode()
    rows = {r.split("</td>")[0]: r for r in html.split('<td class="run-cell">')[1:]}
    told = next(r for k, r in rows.items() if ">told<" in k)
    untold = next(r for k, r in rows.items() if ">untold<" in k)
    assert "1 process assumed" in untold and "\N{EN DASH}" not in untold.split("<td")[-1]
    assert "1 process assumed" not in told


def test_board_page_shows_the_cutoff_in_its_zone_and_local_iso(client, member, project, deadline):
    run = make_run(project, "aimed", points=10, deadline=deadline)
    forecast_set(run, timezone.now(), finish_in=3600, p=0.95)
    client.force_login(member)
    html = client.get("/").content.decode()
    assert "Blind eval" in html and "Asia/Shanghai" in html
    assert deadline.cutoff.astimezone(deadline.cutoff.tzinfo).isoformat()[:16] in html
    assert "aimed" in html and "95%" in html
    assert 'hx-trigger="every' in html  # live while runs are active


@pytest.mark.parametrize("n", [4, 40])
def test_board_queries_do_not_grow_with_runs(
    client, member, project, deadline, n, django_assert_max_num_queries
):
    _board_runs(project, deadline, n)
    client.force_login(member)
    # session, user, memberships, runs (+ forecast ids), forecasts, open flags, deadlines,
    # past deadlines (listed under the lanes); the page (not its polled partial) also its
    # projects' GPU hosts
    with django_assert_max_num_queries(9):
        res = client.get("/")
    assert res.status_code == 200
    assert res.content.count(b'class="run-cell"') == n
    with django_assert_max_num_queries(8):
        assert client.get("/board/").status_code == 200


def test_the_board_shows_an_outsider_nothing(client, outsider, project, deadline):
    _board_runs(project, deadline, 2)
    client.force_login(outsider)
    html = client.get("/").content.decode()
    assert "r0" not in html and "Blind eval" not in html
    assert "r1" not in client.get("/board/").content.decode()


def test_the_board_asks_anonymous_users_to_log_in(client):
    assert client.get("/").status_code == 302
    assert client.get("/board/").status_code == 302


def test_resolved_flags_are_not_open(member, project):
    run = make_run(project, "r", points=10)
    flag(run, "spike")
    flag(run, "spike", state="resolved")
    flag(run, "nan")
    o = board_for_user(user=member, now=timezone.now()).unscheduled[0]
    assert [f.kind for f in o.flags] == ["nan"]


def test_it_keeps_a_far_cutoffs_axis_to_a_few_ticks(client, member, project):
    far = deadline_create(
        project=project,
        name="Far away",
        slug="far",
        cutoff=timezone.now() + timedelta(days=3 * 365),
        timezone="UTC",
    )
    run = make_run(project, "aimed", points=10, deadline=far)
    forecast_set(run, timezone.now(), finish_in=3600, p=0.95)
    client.force_login(member)
    html = client.get("/").content.decode()
    assert "Far away" in html
    assert 0 < html.count('class="tick"') <= 7


def test_a_crash_the_server_inferred_stays_on_the_board_at_the_top_in_red(
    client, member, project, deadline
):
    now = timezone.now()
    safe = make_run(project, "safe", points=10, deadline=deadline)
    forecast_set(safe, now, finish_in=3600, p=0.97)
    gone = make_run(project, "gone", points=10, deadline=deadline)
    forecast_set(gone, now, finish_in=3600, p=0.97)
    # The sweeper found it silent 3 h ago: crashed, with no end time (the client never said).
    Run.objects.filter(pk=gone.pk).update(
        status=Run.Status.CRASHED, last_seen_at=now - timedelta(hours=3)
    )
    board = board_for_user(user=member, now=now)
    assert [o.run.public_id for o in board.lanes[0].runs] == ["gone", "safe"]
    client.force_login(member)
    page = client.get("/").content.decode()
    assert "1 crashed, failed or stalled" in page and 'class="tone-bad"' in page


def test_finished_runs_show_their_outcome_and_running_ones_their_margin(member, project, deadline):
    now = timezone.now()
    type(deadline).objects.filter(pk=deadline.pk).update(cutoff=now - timedelta(hours=2))
    deadline.refresh_from_db()
    train_by = deadline.train_by  # 3 h ago: the cutoff less its 1 h buffer
    made = make_run(project, "made", points=10, deadline=deadline)
    missed = make_run(project, "missed", points=10, deadline=deadline)
    Run.objects.filter(pk=made.pk).update(
        status=Run.Status.FINISHED, ended_at=train_by - timedelta(seconds=29)
    )
    Run.objects.filter(pk=missed.pk).update(
        status=Run.Status.FINISHED, ended_at=now - timedelta(hours=1)
    )
    late = make_run(project, "late", points=10, deadline=deadline)
    forecast_set(late, now, finish_in=3600, p=0.01)
    board = board_for_user(user=member, now=now)
    by_id = {o.run.public_id: o for o in board.lanes[0].runs}
    assert by_id["made"].outcome == "made it, 29 s spare"
    assert by_id["missed"].outcome == "missed by 2 h"
    assert by_id["late"].margin_text == "P50 4 h after the train-by"


def test_a_cut_run_name_reads_in_full_on_hover(client, member, project):
    # The run column cuts long names ("DeepSeek-V3 proxy con…", "BERT divergence drill (r…"
    # at 1400 px in the demo): the link carries the whole name and the project line the rest.
    run = make_run(project, "long", points=10)
    run.name = "BERT divergence drill (real curve, injected NaN)"
    run.save(update_fields=["name"])
    client.force_login(member)
    html = client.get("/").content.decode()
    assert 'title="BERT divergence drill (real curve, injected NaN)"' in html


def _flags_cell(html: str, run_id: str) -> str:
    row = html[html.index(f'href="/runs/llm/{run_id}/"') :]
    cell = row[row.index('<td class="flags">') :]
    return cell[: cell.index("</td>")]


@pytest.mark.parametrize("n", [1, 6])
def test_a_run_that_ended_inside_a_loss_episode_says_so_in_its_flags_column(
    client, member, project, n, django_assert_max_num_queries
):
    # Issue 22: a finished run that ended diverged read "none" in the Flags column: its end
    # closed the episode's flag, and the column showed open flags only.
    now = timezone.now()
    for i in range(n):
        run = make_run(project, f"diverged-{i}", points=10)
        episode(run, now - timedelta(hours=1))
        ended_inside(run, now - timedelta(minutes=50), status="finished" if i else "failed")
    back = make_run(project, "back", points=10)  # its loss came back, then it finished
    episode(back, now - timedelta(hours=1), kind="spike", onset=300, state="spiking")
    episode_recovered(back, now - timedelta(minutes=55), kind="spike", onset=300)
    run_finish(run=back, status="finished", ended_at=now - timedelta(minutes=50))
    # Ended diverged, was resumed from the checkpoint before the onset, and finished: that
    # attempt's end is how the run ended, not the one before it.
    rolled = make_run(project, "rolled-back", points=10)
    episode(rolled, now - timedelta(hours=2))
    ended_inside(rolled, now - timedelta(minutes=100), status="crashed")
    run_start(project=project, public_id="rolled-back", session="s2", started_at=now, fields={})
    run_finish(run=rolled, status="finished", ended_at=now - timedelta(minutes=10), session="s2")
    # Its loss came back just before its end, which closed the flag saying so: not diverged.
    late = make_run(project, "back-at-the-end", points=10)
    episode(late, now - timedelta(hours=1), kind="spike", onset=300, state="spiking")
    ended_inside(late, now - timedelta(minutes=50), kind="spike", onset=300, back=True)
    client.force_login(member)
    # The board's 7, past deadlines, the page's GPU hosts, and one for the episodes the ended
    # runs' ends closed, whatever their number.
    with django_assert_max_num_queries(10):
        html = client.get("/").content.decode()
    for i in range(n):
        cell = _flags_cell(html, f"diverged-{i}")
        assert ">diverged at step 2,500, not recovered</span>" in cell
        assert 'title="The run ' in cell and "never recovered." in cell  # what its flag said
    assert _flags_cell(html, "back").endswith('<span class="muted">none</span>')
    assert _flags_cell(html, "rolled-back").endswith('<span class="muted">none</span>')
    assert _flags_cell(html, "back-at-the-end").endswith('<span class="muted">none</span>')
    # The run page says as much as the board.
    card = client.get("/runs/llm/rolled-back/summary/").content.decode()
    assert "never recovered" not in card and '<div class="big">healthy</div>' in card
    card = client.get("/runs/llm/diverged-0/summary/").content.decode()
    assert '<div class="big">diverged</div>' in card
