from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.pages import board_for_user
from tests.dashboard.factories import flag, forecast_set, make_run
from tracker.models import Run
from tracker.project_settings.services import deadline_create

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
    # session, user, memberships, runs (+ forecast ids), forecasts, open flags, deadlines
    with django_assert_max_num_queries(7):
        res = client.get("/")
    assert res.status_code == 200
    assert res.content.count(b'class="run-cell"') == n
    with django_assert_max_num_queries(7):
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
