"""What arrives at the SMTP server and the HTTP sink, and what it says."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alerts import services
from alerts.models import Channel, Notification
from alerts.transports import TransportError
from alerts.transports.email import send_email
from alerts.transports.webhook import verify
from config import outbound as http
from forecasting.models import Forecast
from tests.alerts.fixtures import HttpSink, Mailbox, flag_raise
from tracker.models import Deadline, Run


def deliver_all() -> None:
    for n in Notification.objects.filter(status=Notification.Status.PENDING):
        services.notification_deliver(notification_id=n.pk)


def test_it_emails_plain_text_and_html_with_the_numbers(run: Run, mailbox: Mailbox) -> None:
    services.channel_create(
        project=run.project,
        kind=Channel.Kind.EMAIL,
        name="leads",
        target="lead@example.com\nsecond@example.com",
    )
    flag_raise(
        run,
        "regression",
        severity=1.3,
        data={
            "onset_step": 812_400.0,
            "rollback_step": 800_000.0,
            "wasted_s": 5.2 * 86400,
            "cost": 159_744.0,
            "regression_to_step": 400_000.0,
        },
        explanation="Loss is back at its level of 10 days ago (step 400,000).",
    )
    services.flags_dispatch()

    deliver_all()

    [message] = mailbox.messages
    text, html = mailbox.bodies(message)
    assert (
        message["Subject"]
        .strip()
        .startswith(
            "[Runcast CRITICAL] pretrain-3.0 diverging since step 812,400 (loss back at its level "
            "of step 400,000); last checkpoint before onset: step 800,000;"
        )
    )
    assert sorted(mailbox.handler.envelopes[0].rcpt_tos) == [
        "lead@example.com",
        "second@example.com",
    ]
    assert "since then 5.2 days, 512 GPUs, ≈ $159,744" in text
    assert "Loss is back at its level of 10 days ago" in text
    assert "http://testserver/runs/llm/pretrain-3.0/" in text
    assert '<a href="http://testserver/runs/llm/pretrain-3.0/">' in html
    assert "Last checkpoint before onset</td><td>step 800,000" in html


def test_it_says_a_deadline_risk_in_the_leads_language(
    project: Any, mailbox: Mailbox, no_default_slack: None
) -> None:
    # The clock rule: a message's times are in the project's zone, with the offset, whatever
    # zone the deadline was announced in (deadline emails said PST and JST beside CET pages).
    project.timezone = "Europe/Berlin"
    project.save(update_fields=["timezone"])
    shanghai = "Asia/Shanghai"
    deadline = Deadline.objects.create(
        project=project,
        slug="blind-eval",
        name="the conference blind eval",
        cutoff=datetime(2026, 6, 5, 10, 0, tzinfo=UTC),
        timezone=shanghai,
        buffer=timedelta(days=3),
    )
    run = Run.objects.create(project=project, public_id="post-train-1.0", deadline=deadline)
    at = datetime(2026, 5, 30, 12, 0, tzinfo=UTC)
    for hours_ago, finish in (
        (24, datetime(2026, 5, 28, 4, 0, tzinfo=UTC)),
        (0, datetime(2026, 6, 3, 3, 40, tzinfo=UTC)),
    ):
        Forecast.objects.create(
            run=run,
            kind=Forecast.Kind.ETA,
            computed_at=at - timedelta(hours=hours_ago),
            segment=0,
            input_last_step=100 - hours_ago,
            finish_p50=finish.timestamp(),
        )
    services.channel_create(
        project=project, kind=Channel.Kind.EMAIL, name="l", target="lead@example.com"
    )
    flag_raise(
        run,
        "deadline",
        severity=0.88,
        onset_step=None,
        created_at=at,
        data={
            "p_on_time": 0.12,
            "speedup_for_p90": 0.18,
            "steps_cut_for_p90": 12000.0,
            "deadline": "the conference blind eval",
            "explanation": "12% likely on time",
        },
    )
    services.flags_dispatch()

    deliver_all()

    text, _ = mailbox.bodies(mailbox.messages[0])
    assert text.splitlines()[0] == (
        "post-train-1.0 will likely miss the conference blind eval (cutoff 06-05 12:00 "
        "CEST (UTC+2), 3 days buffer): P50 finish moved from 05-28 06:00 CEST (UTC+2) to "
        "06-03 05:40 CEST (UTC+2) in 24 h; 12% chance "
        "to make it; for 90% it needs +18% speed or 12,000 fewer steps"
    )
    # The figure in the one wording of the board, the card and the flag (formatting.speedup).
    assert "For 90%: +18% speed" in text and "more throughput" not in text


@pytest.mark.parametrize(
    ("p_on_time", "words"), [(0.12, "will likely miss"), (0.76, "is at risk of missing")]
)
def test_a_deadline_headline_says_what_its_odds_say(run: Run, p_on_time: float, words: str) -> None:
    """ "will likely miss" beside "76% chance to make it" contradicted itself."""
    from alerts.messages import context_for, render

    flag = flag_raise(run, "deadline", data={"p_on_time": p_on_time, "deadline": "blind eval"})
    ctx = context_for(
        run=run, kind="deadline", event="raised", severity="warning", flag=flag, at=flag.created_at
    )
    headline = render(ctx, {}).headline
    assert f"{run} {words} blind eval" in headline
    assert f"{p_on_time:.0%} chance to make it" in headline


def test_a_close_call_on_a_short_run_is_written_to_the_second(run: Run) -> None:
    """Seen: "cutoff 12:49 JST: P50 finish 12:49 JST; 44% chance" for a finish 40 s past a
    3-minute run's cutoff: minutes hid the one thing the message was about."""
    from alerts.messages import context_for, render

    at = datetime(2026, 5, 30, 3, 47, 10, tzinfo=UTC)
    run.deadline = Deadline.objects.create(
        project=run.project, slug="tight", name="Tight", cutoff=at + timedelta(seconds=95)
    )
    run.save(update_fields=["deadline"])
    Forecast.objects.create(
        run=run,
        kind=Forecast.Kind.ETA,
        computed_at=at,
        segment=0,
        input_last_step=10,
        finish_p50=(at + timedelta(seconds=135)).timestamp(),
    )
    flag = flag_raise(run, "deadline", data={"p_on_time": 0.44}, created_at=at)
    ctx = context_for(
        run=run, kind="deadline", event="raised", severity="warning", flag=flag, at=at
    )
    headline = render(ctx, {}).headline
    assert "(cutoff 05-30 03:48:45 UTC): P50 finish 05-30 03:49:25 UTC; 44% chance" in headline


def test_it_posts_a_block_kit_message_to_slack(run: Run, sink: HttpSink) -> None:
    services.channel_create(
        project=run.project, kind=Channel.Kind.SLACK, name="s", target=sink.url("/slack")
    )
    flag_raise(run, "nan")
    services.flags_dispatch()

    deliver_all()

    [request] = sink.to("/slack")
    body = request.json()
    assert request.headers["content-type"] == "application/json"
    assert body["text"].startswith("pretrain-3.0 loss became NaN/Inf at step 812,400")
    assert body["blocks"][0]["text"]["text"].startswith(":rotating_light: *pretrain-3.0")
    facts = {
        f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in body["blocks"][2]["fields"]
    }
    assert facts["*GPUs*"] == "512"
    assert facts["*Last checkpoint before onset*"] == "step 800,000"
    button = body["blocks"][-1]["elements"][0]
    assert button["url"] == "http://testserver/runs/llm/pretrain-3.0/"


def test_it_signs_webhooks_so_receivers_can_verify_them(run: Run, sink: HttpSink) -> None:
    channel = services.channel_create(
        project=run.project, kind=Channel.Kind.WEBHOOK, name="h", target=sink.url("/hook")
    )
    flag = flag_raise(run, "nan")
    services.flags_dispatch()

    deliver_all()

    [request] = sink.to("/hook")
    ts, signature = request.headers["x-runcast-timestamp"], request.headers["x-runcast-signature"]
    assert signature.startswith("sha256=")
    assert verify(channel.secret, ts, request.body, signature, now=time.time())
    assert not verify("wrong-secret", ts, request.body, signature, now=time.time())
    assert not verify(channel.secret, ts, request.body + b" ", signature, now=time.time())
    # A captured request replayed later is refused even with its valid signature.
    assert not verify(channel.secret, ts, request.body, signature, now=time.time() + 3600)
    body = request.json()
    n = Notification.objects.get()
    assert request.headers["x-runcast-delivery"] == str(n.public_id) == body["id"]
    assert body["kind"] == "nan" and body["event"] == "raised" and body["rule"] == "nan"
    assert body["run"]["url"] == "http://testserver/runs/llm/pretrain-3.0/"
    assert body["onset_step"] == flag.onset_step
    assert body["data"]["rollback_step"] == 800_000.0


def test_it_survives_flag_data_with_missing_keys(run: Run, sink: HttpSink) -> None:
    services.channel_create(
        project=run.project, kind=Channel.Kind.SLACK, name="s", target=sink.url("/slack")
    )
    for kind in (
        "nan",
        "spike",
        "rise",
        "oscillation",
        "regression",
        "slip",
        "deadline",
        "stalled",
    ):
        flag_raise(run, kind, data={"cost": "not a number"}, onset_step=None, severity=None)
    services.flags_dispatch()

    deliver_all()

    # rise, oscillation and regression share the divergence rule: two of them are in its cooldown.
    assert len(sink.to("/slack")) == 6
    assert Notification.objects.filter(status=Notification.Status.SENT).count() == 6
    assert all("?" not in r.json()["text"] for r in sink.to("/slack"))


def test_it_times_out_a_slow_endpoint(sink: HttpSink) -> None:
    sink.script("/slow", (200, "ok", 1.0))
    started = time.monotonic()
    with pytest.raises(TransportError) as e:
        http.post_json(sink.url("/slow"), {"a": 1}, timeout=0.2)
    assert not e.value.permanent
    assert time.monotonic() - started < 0.9


def test_it_refuses_non_http_urls() -> None:
    with pytest.raises(TransportError) as e:
        http.post_json("file:///etc/passwd", {})
    assert e.value.permanent


def test_it_sends_a_test_message_on_each_channel(
    project: Any, sink: HttpSink, mailbox: Mailbox, no_default_slack: None
) -> None:
    results = {}
    for kind, target in (
        ("email", "lead@example.com"),
        ("slack", sink.url("/slack")),
        ("webhook", sink.url("/hook")),
    ):
        channel = services.channel_create(project=project, kind=kind, name=kind, target=target)
        results[kind] = services.channel_test(channel=channel)

    assert results == {"email": None, "slack": None, "webhook": None}
    assert "Test message" in mailbox.messages[0]["Subject"]
    assert json.loads(sink.to("/hook")[0].body)["type"] == "test"
    assert Notification.objects.count() == 0


def test_it_reports_a_failed_test_message_without_disabling(
    project: Any, sink: HttpSink, no_default_slack: None
) -> None:
    sink.script("/slack", (403, "invalid_token"))
    channel = services.channel_create(
        project=project, kind="slack", name="s", target=sink.url("/slack")
    )

    assert services.channel_test(channel=channel) == "Slack answered 403 invalid_token"
    channel.refresh_from_db()
    assert channel.enabled


def _smtp_trickler(stop: threading.Event) -> socket.socket:
    """A loopback SMTP server whose greeting never ends: "220-" continuation lines, one byte
    every 50 ms. Every read gets a byte well inside any per-operation timeout."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set():
                for byte in b"220-still greeting\r\n":
                    if stop.wait(0.05):
                        return
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:
                        return

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_an_email_has_one_deadline_however_slowly_the_server_answers(settings: Any) -> None:
    """Django's SMTP timeout is per socket operation: a server answering a byte at a time held
    the sending worker for ever. The whole email has RUNCAST_ALERTS_SMTP_TIMEOUT."""
    stop = threading.Event()
    listener = _smtp_trickler(stop)
    settings.EMAIL_BACKEND = "config.outbound.SMTPBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", listener.getsockname()[1]
    settings.EMAIL_USE_TLS = False
    settings.RUNCAST_ALERTS_SMTP_TIMEOUT = 0.5
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            send_email(to=["lead@example.com"], subject="s", text="t", html="<p>t</p>")
            outcome.append(None)
        except BaseException as e:  # the test reads what it was
            outcome.append(e)

    sender = threading.Thread(target=send, daemon=True)
    try:
        sender.start()
        sender.join(30)  # a bound on a hang, not a timing: the deadline is 0.5 s
        assert not sender.is_alive(), "the send was still waiting on the server after 30 s"
    finally:
        stop.set()
        listener.close()
    assert isinstance(outcome[0], TransportError) and not outcome[0].permanent
