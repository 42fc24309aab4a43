"""What a Slack channel receives when a run, a deadline or an explanation is named by a hostile
member: Slack reads <...> as a mention or a link in every mrkdwn field, the notification preview
included, so each user-controlled string arrives escaped, once."""

from __future__ import annotations

from typing import Any

from alerts import services
from alerts.models import Channel, Notification
from tests.alerts.fixtures import HttpSink, flag_raise
from tracker.models import Run

HOSTILE_RUN = "<!channel> <https://phish.example/login|Re-authenticate here> & co"
HOSTILE_DEADLINE = "<!here> eval <@U024BE7LH>"
HOSTILE_EXPLANATION = "Click <https://phish.example|here> & <!everyone>"

ESCAPED_RUN = "&lt;!channel&gt; &lt;https://phish.example/login|Re-authenticate here&gt; &amp; co"
ESCAPED_DEADLINE = "&lt;!here&gt; eval &lt;@U024BE7LH&gt;"
ESCAPED_EXPLANATION = "Click &lt;https://phish.example|here&gt; &amp; &lt;!everyone&gt;"


def _texts(node: Any, path: str = "") -> dict[str, str]:
    """Every string Slack renders as text in the payload, by its path."""
    found: dict[str, str] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "text" and isinstance(value, str):
                found[f"{path}.text"] = value
            else:
                found.update(_texts(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.update(_texts(value, f"{path}[{i}]"))
    return found


def test_it_escapes_every_text_field_once(
    project: Any, sink: HttpSink, no_default_slack: None
) -> None:
    run = Run.objects.create(project=project, public_id="hostile-1", name=HOSTILE_RUN)
    services.channel_create(
        project=project, kind=Channel.Kind.SLACK, name="s", target=sink.url("/slack")
    )
    flag_raise(
        run,
        "deadline",
        onset_step=None,
        explanation=HOSTILE_EXPLANATION,
        data={"p_on_time": 0.12, "deadline": HOSTILE_DEADLINE},
    )
    services.flags_dispatch()
    for n in Notification.objects.filter(status=Notification.Status.PENDING):
        services.notification_deliver(notification_id=n.pk)

    [request] = sink.to("/slack")
    body = request.json()
    texts = _texts(body)
    # The preview, the headline, the explanation and each fact: every one Slack shows.
    assert ESCAPED_RUN in body["text"]
    assert ESCAPED_DEADLINE in body["text"]
    assert ESCAPED_RUN in body["blocks"][0]["text"]["text"]
    assert body["blocks"][1]["text"]["text"] == ESCAPED_EXPLANATION
    facts = dict(f["text"].split("\n", 1) for f in body["blocks"][2]["fields"])
    assert facts["*Deadline*"] == ESCAPED_DEADLINE
    for where, text in texts.items():
        assert "<" not in text and ">" not in text, (where, text)
        assert "&amp;lt;" not in text and "&amp;gt;" not in text and "&amp;amp;" not in text, (
            where,
            text,
        )


def test_it_cuts_a_long_text_without_breaking_an_entity() -> None:
    """Slack refuses a section text over 3,000 characters; a cut inside "&lt;" would leave a
    stray "&l" that Slack shows as is."""
    from alerts.transports.slack import esc

    for n in range(1, 8):
        text = esc("x" * n + "<" * 2000, limit=40)
        assert len(text) <= 40 and text.endswith("…")
        whole = (len(text) - 1 - n) // 4
        assert text == "x" * n + "&lt;" * whole + "…", text
