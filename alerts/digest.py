"""The daily digest: every active run of a project against its deadline, in one email."""

from __future__ import annotations

from datetime import datetime

from django.template.loader import render_to_string

from alerts.messages import Message
from alerts.selectors import digest_runs
from forecasting.estimators import formatting as fmt
from forecasting.estimators.deadline import TONE_WORDS, on_time_tone
from tracker.links import run_url
from tracker.models import Project


def _verdict(p_on_time: float | None, p50: float | None, train_by: float | None) -> str:
    if p_on_time is not None:
        return TONE_WORDS[on_time_tone(p_on_time)]
    if p50 is not None and train_by is not None:
        return TONE_WORDS["ok"] if p50 <= train_by else TONE_WORDS["bad"]
    return ""


def digest_message(*, project: Project, now: datetime) -> Message | None:
    rows = []
    for o in digest_runs(project=project, now=now):
        run = o.run
        deadline = run.deadline
        tz = project.tzinfo  # the clock rule: a message's times in the project's zone
        train_by = deadline.train_by.timestamp() if deadline else None
        p50 = o.finish[1] if o.finish else None
        p = o.p_on_time if isinstance(o.p_on_time, int | float) else None
        seconds = fmt.needs_seconds(None if p50 is None or train_by is None else p50 - train_by)
        rows.append(
            {
                "name": str(run),
                "url": run_url(run),
                "status": run.status,
                "progress": f"{100 * run.progress:.0f}%" if run.progress is not None else fmt.NONE,
                "deadline": deadline.name if deadline else "",
                "train_by": fmt.when(train_by, tz, seconds=seconds) if train_by else "",
                "p50": fmt.when(p50, tz, seconds=seconds),
                "p_on_time": f"{100 * p:.0f}%" if p is not None else fmt.NONE,
                "verdict": _verdict(p, p50, train_by),
                "flags": ", ".join(sorted(f.kind for f in o.flags)),
                "left": fmt.span(p50 - now.timestamp()) if p50 else "",
            }
        )
    if not rows:
        return None
    ctx = {
        "project": project.name,
        "day": now.astimezone(project.tzinfo).strftime("%Y-%m-%d"),
        "rows": rows,
        "late": sum(1 for r in rows if r["verdict"] == "likely late"),
        "flagged": sum(1 for r in rows if r["flags"]),
    }
    subject = " ".join(render_to_string("alerts/email/digest_subject.txt", ctx).split())
    return Message(
        subject=subject,
        text=render_to_string("alerts/email/digest.txt", ctx),
        html=render_to_string("alerts/email/digest.html", ctx),
        headline=subject,
        facts=[],
        url="",
        severity="info",
    )
