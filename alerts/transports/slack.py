"""Slack incoming webhooks: a Block Kit message through the one HTTP seam.

Slack answers errors with a status and a short code in the body (api.slack.com/messaging/webhooks
"Handling errors"): a removed webhook or channel will never start working again.
"""

from __future__ import annotations

from typing import Any

from alerts.messages import Message
from alerts.transports.base import Transport, TransportError
from config import outbound as http

PERMANENT_CODES = frozenset(
    {
        "no_service",
        "invalid_token",
        "no_team",
        "team_disabled",
        "channel_not_found",
        "channel_is_archived",
        "action_prohibited",
        "posting_to_general_channel_denied",
    }
)


def blocks(message: Message) -> dict[str, Any]:
    # Every string below may carry a member's words (a run, host or deadline name): each is
    # escaped here, once, where it becomes Slack text, and nowhere before.
    fields = [
        {"type": "mrkdwn", "text": f"*{esc(label, limit=200)}*\n{esc(value, limit=1700)}"}
        for label, value in message.facts[:10]
    ]
    body: list[dict[str, Any]] = [
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": f"{_mark(message)} *{esc(message.headline, limit=2900)}*",
            },
        }
    ]
    explanation = message.payload.get("explanation")
    if explanation:
        body.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": esc(explanation, limit=2900)}}
        )
    if fields:
        body.append({"type": "section", "fields": fields})
    body.append(
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": "Open run"},
                    "url": message.url,
                }
            ],
        }
    )
    # `text` is the notification preview and what clients without Block Kit show: Slack reads
    # mrkdwn there too, so a run named "<!channel>" would page the whole channel.
    return {"text": esc(message.headline, limit=3000), "blocks": body}


def _mark(message: Message) -> str:
    return {"critical": ":rotating_light:", "warning": ":warning:"}.get(
        message.severity, ":information_source:"
    )


def esc(text: str, *, limit: int) -> str:
    """Escape Slack's three control characters (api.slack.com/reference/surfaces/formatting
    "Escaping text") and cut to `limit` characters, never inside an entity: a stray "&l" is
    shown as is."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if len(escaped) <= limit:
        return escaped
    cut = escaped[: limit - 1]
    amp = cut.rfind("&", max(0, len(cut) - 4))
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + "…"


class SlackTransport(Transport):
    def notify(self, message: Message) -> None:
        response = http.post_json(self.channel.target, blocks(message), timeout=self.timeout)
        if 200 <= response.status < 300:
            return
        # Only a short error code of the answer is kept: the text is shown on the channel page,
        # and an arbitrary body there would let a member read pages the server fetched.
        code = http.error_code(response.text)
        redirect = " (redirects are not followed)" if 300 <= response.status < 400 else ""
        permanent = code in PERMANENT_CODES or response.status in (404, 410)
        raise TransportError(
            f"Slack answered {response.status}{f' {code}' if code else ''}{redirect}",
            permanent=permanent,
        )
