"""What a lead reads on the server-rendered pages: each number and sentence says what is so."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone

from alerts import selectors, services
from alerts.models import Channel, Notification
from forecasting.models import Flag, Forecast
from tests.alerts.fixtures import flag_raise
from tests.dashboard import factories
from tracker.models import Deadline, Project, Run
from tracker.project_settings.services import deadline_create


def _rules(client: Client, owner: User) -> str:
    client.force_login(owner)
    response = client.get("/projects/llm/alerts/rules/")
    assert response.status_code == 200
    return response.content.decode()


def test_rules_say_when_no_channel_would_receive_them(
    client: Client, owner: User, project: Project
) -> None:
    # The demo's rules page read "all enabled" on every rule with no channel at all: every alert
    # goes nowhere, and the page said the opposite.
    html = _rules(client, owner)
    assert "all enabled" not in html
    assert html.count("no channel enabled") == len(selectors.rule_rows(project=project))
    services.channel_create(
        project=project, kind=Channel.Kind.EMAIL, name="lead", target="lead@example.com"
    )
    html = _rules(client, owner)
    assert "no channel enabled" not in html and "all enabled" in html


def test_rules_give_the_cooldown_in_words(client: Client, owner: User, project: Project) -> None:
    # "1:00:00" (a Python timedelta) for the one-hour default.
    html = _rules(client, owner)
    assert "1:00:00" not in html
    assert "<td>1 h</td>" in html


def _blind_eval(project: Project, now: datetime) -> Deadline:
    return deadline_create(
        project=project,
        name="Blind eval",
        slug="blind-eval",
        cutoff=now + timedelta(hours=8),
        timezone="UTC",
        buffer=timedelta(hours=1),
    )


def test_a_small_required_speedup_is_rounded_up(
    client: Client, owner: User, project: Project
) -> None:
    # The demo board read "89% · needs +0% speed" (0.4% more throughput rounded to nothing).
    now = timezone.now()
    deadline = _blind_eval(project, now)
    run = factories.make_run(project, "close", points=10, deadline=deadline)
    factories.forecast_set(run, now, finish_in=3600)
    factories.forecast(
        run,
        "deadline",
        now,
        p_on_time=0.89,
        speedup_for_p90=0.004,
        steps_cut_for_p90=12.0,
        explanation="89% likely on time",
    )
    client.force_login(owner)
    board = client.get("/").content.decode()
    card = client.get(f"/runs/llm/{run.public_id}/").content.decode()
    assert "needs +1% speed" in board and "+0%" not in board
    assert "For 90%: +1% speed" in card


def test_one_figure_has_one_name_and_one_rounding_on_board_card_and_message(
    client: Client, owner: User, project: Project
) -> None:
    """Seen: one figure written "+141% speed" (board), "+141% throughput" (card) and "140% more
    throughput" (the flag and the message)."""
    from alerts.messages import context_for, render
    from forecasting.estimators import formatting as fmt

    now = timezone.now()
    deadline = _blind_eval(project, now)
    run = factories.make_run(project, "slow", points=10, deadline=deadline)
    factories.forecast_set(run, now, finish_in=12 * 3600)
    risk = {"p_on_time": 0.12, "speedup_for_p90": 1.4051, "steps_cut_for_p90": 2999.4}
    factories.forecast(run, "deadline", now, explanation="12% likely on time", **risk)
    words = "+141% speed or 3,000 fewer steps"
    # The flag's text (forecasting.compute._deadline_condition writes it with on_time).
    assert fmt.on_time(0.12, 1.4051, 2999.4) == f"12% likely on time; for 90% it needs {words}"
    flag = flag_raise(run, "deadline", explanation="", data={**risk, "deadline": "Blind eval"})
    ctx = context_for(
        run=run, kind="deadline", event="raised", severity="warning", flag=flag, at=now
    )
    message = render(ctx, {})
    client.force_login(owner)
    board = client.get("/").content.decode()
    card = client.get(f"/runs/llm/{run.public_id}/").content.decode()
    assert "needs +141% speed" in board and "% throughput" not in board
    assert f"For 90%: {words}" in card
    assert f"for 90% it needs {words}" in message.headline
    assert ("For 90%", "+141% speed") in message.facts
    for text in (board, card, message.text):
        assert "throughput or" not in text and "more throughput" not in text
        assert "140%" not in text


def test_times_on_pages_are_the_readers_and_flag_texts_are_rendered_for_them(
    client: Client, owner: User, project: Project
) -> None:
    """Seen: flag texts in the project's zone ("CST (UTC+8)") beside the viewer's (CET), and
    the alert history's Note "03:30 UTC" beside a When column in CET. A page writes every time
    as a <time> the browser puts in the viewer's zone, flag texts and notes included."""
    from forecasting.estimators import formatting as fmt

    project.timezone = "Asia/Shanghai"
    project.save(update_fields=["timezone"])
    run = factories.make_run(project, "slipping", points=10)
    finish = timezone.now().timestamp() + 7200
    text = f"ETA slipping: finish slipped from {fmt.stamp(finish - 3600)} to {fmt.stamp(finish)}"
    flag_raise(run, "slip", explanation=text, data={"amount_s": 3600.0})
    client.force_login(owner)
    page = client.get(f"/runs/llm/{run.public_id}/").content.decode()
    iso = re.escape(datetime.fromtimestamp(finish // 60 * 60, tz=UTC).isoformat())
    # In the open-flags card and the flag history, as a <time> of that instant.
    assert len(re.findall(rf'<time data-fmt="when" datetime="{iso}">', page)) == 2
    assert "CST" not in page and "\u27e6" not in page
    board = client.get("/").content.decode()
    assert 'data-stamped-title="ETA slipping: finish slipped from \u27e6' in board


def test_pages_name_an_icon_that_exists(client: Client) -> None:
    # Without one, browsers asked /favicon.ico on every visit: a 404 in the demo's web log and
    # a failed request in the console.
    html = client.get("/login/").content.decode()
    found = re.search(r'<link rel="icon" href="([^"]+)"', html)
    assert found, "no icon link"
    href = found.group(1)
    assert href.startswith(settings.STATIC_URL), (href, settings.STATIC_URL)
    assert finders.find(href.split(settings.STATIC_URL, 1)[1]) is not None


def test_a_resolve_with_no_channel_says_there_is_no_channel(
    client: Client, owner: User, run: Run
) -> None:
    # The demo's history (no channel configured) noted each resolve "its raise was not
    # delivered on this channel (cooldown or failure)", beside a raise noted "no channel".
    services.rules_ensure_defaults(project=run.project)
    flag_raise(run, "nan")
    services.flags_dispatch()
    flag_raise(run, "nan", state=Flag.State.RESOLVED, explanation="nan cleared")
    services.flags_dispatch()
    notes = list(Notification.objects.filter(run=run).values_list("event", "reason"))
    assert [event for event, _ in notes].count("resolved") == 1, notes
    assert all(reason == services.NO_CHANNEL for _, reason in notes), notes
    client.force_login(owner)
    html = client.get("/projects/llm/alerts/").content.decode()
    assert "cooldown or failure" not in html


def _eta(run: Run, at: datetime, finish: float, spread: float, **data: object) -> None:
    Forecast.objects.create(
        run=run,
        kind="eta",
        computed_at=at,
        segment=run.current_segment,
        input_last_step=int(at.timestamp()),
        finish_p10=finish - spread,
        finish_p50=finish,
        finish_p90=finish + spread,
        data={"rate_steps_per_s": 30.0, **data},
    )


def test_a_short_runs_finish_is_written_to_the_second(
    client: Client, owner: User, project: Project
) -> None:
    """Seen on a 3-minute run: "P10-P90 03:26 UTC - 03:26 UTC"."""
    run = factories.make_run(project, "tiny", points=10)
    now = timezone.now()
    finish = now.timestamp() + 100
    _eta(run, now, finish, 20.0)
    client.force_login(owner)
    card = client.get(f"/runs/llm/{run.public_id}/summary/").content.decode()
    low = datetime.fromtimestamp(finish - 20, tz=UTC).strftime("%H:%M:%S")
    high = datetime.fromtimestamp(finish + 20, tz=UTC).strftime("%H:%M:%S")
    assert re.search(
        rf'P10\u2013P90 <time data-fmt="short-s" [^>]*>\w+ \d+ \w+ {low} UTC</time>', card
    )
    assert re.search(rf'<time data-fmt="short-s" [^>]*>\w+ \d+ \w+ {high} UTC</time>', card)
    board = client.get("/").content.decode()
    assert '<time data-fmt="short-s"' in board
    # A day-long run keeps minutes.
    _eta(run, now + timedelta(seconds=1), now.timestamp() + 86400, 3600.0)
    card = client.get(f"/runs/llm/{run.public_id}/summary/").content.decode()
    assert 'data-fmt="short"' in card and "short-s" not in card


def test_an_early_forecast_says_it_is_early_instead_of_a_spread(
    client: Client, owner: User, project: Project
) -> None:
    """Seen on a 20-second-old run: "slipped 3 min ±17 min" and "-42% vs 1 s ago"."""
    run = factories.make_run(project, "young", points=10)
    now = timezone.now()
    _eta(run, now - timedelta(seconds=1), now.timestamp() + 400, 600.0, early=True)
    _eta(run, now, now.timestamp() + 580, 1020.0, early=True, rate_steps_per_s=17.4)
    client.force_login(owner)
    board = client.get("/").content.decode()
    card = client.get(f"/runs/llm/{run.public_id}/summary/").content.decode()
    assert "early estimate" in board and "early estimate" in card
    for page in (board, card):
        assert "slipped" not in page and "±" not in page and " ago</div>" not in page
        assert "vs 1 s ago" not in page and "P10\u2013P90 <time" not in page


def test_a_move_over_a_second_is_not_a_move(client: Client, owner: User, project: Project) -> None:
    """A settled forecast one second after the window's first: no "-42% vs 1 s ago"."""
    run = factories.make_run(project, "blip", points=10)
    now = timezone.now()
    _eta(run, now - timedelta(seconds=1), now.timestamp() + 4000, 600.0)
    _eta(run, now, now.timestamp() + 4180, 600.0, rate_steps_per_s=17.4)
    client.force_login(owner)
    board = client.get("/").content.decode()
    assert "vs 1 s ago" not in board and "slipped" not in board and "-42%" not in board
    later = now + timedelta(minutes=5, seconds=-1)
    _eta(run, later, now.timestamp() + 4480, 600.0, rate_steps_per_s=17.4)
    board = client.get("/").content.decode()
    assert "-42% vs 5 min ago" in board and "slipped 8 min" in board


def test_a_loss_forecast_during_a_spike_says_its_spread_means_nothing(
    client: Client, owner: User, project: Project
) -> None:
    """Seen: "0.3742 -> 4479 (P10-P90 0-6224)" during a spike."""
    run = factories.make_run(project, "spiking", points=10)
    now = timezone.now()
    loss: dict[str, Any] = {
        "smoothed_last": 0.37421,
        "final_step": 5000,
        "target": None,
        "model": "power_law",
    }
    factories.forecast(run, "loss", now, p10=-1200.0, p50=4479.2, p90=6224.0, **loss)
    client.force_login(owner)
    board = client.get("/").content.decode()
    card = client.get(f"/runs/llm/{run.public_id}/summary/").content.decode()
    for page in (board, card):
        assert "spread too wide to forecast" in page and "0.3742" in page
        assert "4479" not in page and "6224" not in page
    # A sane forecast reads the same on both, in four significant digits (the board had 3).
    factories.forecast(
        run, "loss", now + timedelta(seconds=1), p10=0.28114, p50=0.30123, p90=0.3254, **loss
    )
    board = client.get("/").content.decode()
    card = client.get(f"/runs/llm/{run.public_id}/summary/").content.decode()
    assert "0.3742 → <b>0.3012</b>" in board and "P10\u2013P90 0.2811\u20130.3254" in board
    assert "now 0.3742 → 0.3012 at step 5,000 (P10\u2013P90 0.2811\u20130.3254)" in card
