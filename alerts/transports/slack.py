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
    fields = [
        {"type": "mrkdwn", "text": f"*{label}*\n{value}"} for label, value in message.facts[:10]
    ]
    body: list[dict[str, Any]] = [
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": f"{_mark(message)} *{_esc(message.headline)}*"},
        }
    ]
    explanation = message.payload.get("explanation")
    if explanation:
        body.append({"type": "section", "text": {"type": "mrkdwn", "text": _esc(explanation)}})
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
    # `text` is the notification preview and what clients without Block Kit show.
    return {"text": message.headline[:3000], "blocks": body}


def _mark(message: Message) -> str:
    return {"critical": ":rotating_light:", "warning": ":warning:"}.get(
        message.severity, ":information_source:"
    )


def _esc(text: str) -> str:
    # Slack mrkdwn treats these three as control characters.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")[:2900]


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
