"""The daily digest: every active run of a project against its deadline, in one email."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from django.template.loader import render_to_string

from alerts.messages import Message, run_url, span, when
from alerts.selectors import digest_runs
from tracker.models import Project

NONE = "\u2013"  # an en dash: "no value" in tables


def _verdict(p_on_time: float | None, p50: float | None, train_by: float | None) -> str:
    if p_on_time is not None:
        if p_on_time >= 0.9:
            return "on track"
        return "at risk" if p_on_time >= 0.5 else "likely late"
    if p50 is not None and train_by is not None:
        return "on track" if p50 <= train_by else "likely late"
    return ""


def digest_message(*, project: Project, now: datetime) -> Message | None:
    rows = []
    for row in digest_runs(project=project, now=now):
        run = row["run"]
        deadline = run.deadline
        tz = ZoneInfo(deadline.timezone) if deadline else project.tzinfo
        train_by = deadline.train_by.timestamp() if deadline else None
        p = row["p_on_time"]
        p_num = float(p) if isinstance(p, int | float) else None
        rows.append(
            {
                "name": str(run),
                "url": run_url(run),
                "status": run.status,
                "progress": f"{100 * run.progress:.0f}%" if run.progress is not None else NONE,
                "deadline": deadline.name if deadline else "",
                "train_by": when(train_by, tz, with_zone=True) if train_by else "",
                "p50": when(row["p50"], tz, with_zone=True) if row["p50"] else NONE,
                "p_on_time": f"{100 * p:.0f}%" if isinstance(p, int | float) else NONE,
                "verdict": _verdict(p_num, row["p50"], train_by),
                "flags": ", ".join(row["open_flags"]),
                "left": span(row["p50"] - now.timestamp()) if row["p50"] else "",
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
