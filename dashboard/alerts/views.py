"""Alert pages: channels, rules and history. Parse, authorise (tracker.access), call a service
or a selector of alerts/."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from alerts import selectors, services
from alerts.messages import history_text
from alerts.models import Channel, Notification
from dashboard.alerts.forms import ChannelForm, RuleForm
from tracker.access import membership_for, run_for
from tracker.models import Membership, Project

# Changing channels and rules takes a member; viewers read.
EDIT = Membership.Role.MEMBER

HISTORY_LIMIT = 200


def _history(project: Project, rows: list[Notification]) -> list[Notification]:
    """Rows with what they said, as sent (alerts.messages.history_text): a flag's explanation,
    or for a run's end the headline its channels got ("... crashed at step 10,085 of 20,000
    after 5 min"), not the rule's name nor the run as it stands now."""
    for n in rows:
        n.run.project = project  # every row's run is in this project: no query per row
        # An attribute for the template only, not a field.
        n.message = history_text(n)  # type: ignore[attr-defined]
    return rows


@login_required
@require_GET
def project_alerts(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project)
    history = _history(
        membership.project,
        list(selectors.notification_list(project=membership.project)[:HISTORY_LIMIT]),
    )
    context = {"project": membership.project, "membership": membership, "history": history}
    return render(request, "alerts/history.html", context)


@login_required
@require_GET
def run_alerts(request: HttpRequest, project: str, run_id: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project)
    run = run_for(user=request.user, project_slug=project, run_id=run_id)
    history = _history(
        membership.project,
        list(selectors.notification_list(project=membership.project, run=run)[:HISTORY_LIMIT]),
    )
    context = {
        "project": membership.project,
        "membership": membership,
        "history": history,
        "run": run,
    }
    return render(request, "alerts/history.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def channel_list(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project)
    form = ChannelForm(request.POST or None) if request.method == "POST" else ChannelForm()
    if request.method == "POST":
        membership_for(user=request.user, project_slug=project, need=EDIT)
        if form.is_valid():
            d = form.cleaned_data
            services.channel_create(
                project=membership.project, kind=d["kind"], name=d["name"], target=d["target"]
            )
            messages.success(request, f"Channel {d['name']} added.")
            return redirect("alerts:channels", project=project)
    channels = selectors.channel_list(project=membership.project)
    context = {
        "project": membership.project,
        "membership": membership,
        "channels": channels,
        "form": form,
    }
    return render(request, "alerts/channels.html", context, status=400 if form.errors else 200)


def _channel(request: HttpRequest, project: str, channel_id: int) -> tuple[Membership, Channel]:
    membership = membership_for(user=request.user, project_slug=project, need=EDIT)
    channel = selectors.channel_get(project=membership.project, channel_id=channel_id)
    if channel is None:
        raise Http404("no such channel")
    return membership, channel


@login_required
@require_http_methods(["GET", "POST"])
def channel_edit(request: HttpRequest, project: str, channel_id: int) -> HttpResponse:
    membership, channel = _channel(request, project, channel_id)
    initial = {
        "kind": channel.kind,
        "name": channel.name,
        "target": channel.target,
        "enabled": channel.enabled,
    }
    form = ChannelForm(request.POST if request.method == "POST" else None, initial=initial)
    # Before validation: the target is checked against the channel's kind, not a posted one.
    form.fields["kind"].disabled = True
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        services.channel_update(
            channel=channel, name=d["name"], target=d["target"], enabled=d["enabled"]
        )
        messages.success(request, f"Channel {channel.name} saved.")
        return redirect("alerts:channels", project=project)
    context = {"project": membership.project, "channel": channel, "form": form}
    return render(request, "alerts/channel_edit.html", context)


@login_required
@require_POST
def channel_delete(request: HttpRequest, project: str, channel_id: int) -> HttpResponse:
    _, channel = _channel(request, project, channel_id)
    services.channel_delete(channel=channel)
    messages.success(request, f"Channel {channel.name} deleted.")
    return redirect("alerts:channels", project=project)


@login_required
@require_POST
def channel_test(request: HttpRequest, project: str, channel_id: int) -> HttpResponse:
    _, channel = _channel(request, project, channel_id)
    try:
        error = services.channel_test(channel=channel)
    except services.ChannelTestBusy:
        messages.warning(
            request,
            "Another test message is being sent from this server; try again in a few seconds.",
        )
        return redirect("alerts:channels", project=project)
    if error:
        messages.error(request, f"Test message to {channel.name} failed: {error}")
    else:
        messages.success(request, f"Test message sent to {channel.name}.")
    return redirect("alerts:channels", project=project)


@login_required
@require_GET
def rule_list(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project)
    rows = selectors.rule_rows(project=membership.project)
    # A rule without channels sends to every enabled one: with none enabled it sends nowhere,
    # which "all enabled" hid.
    enabled = membership.project.alert_channels.filter(enabled=True).exists()
    context = {
        "project": membership.project,
        "membership": membership,
        "rows": rows,
        "any_enabled": enabled,
    }
    return render(request, "alerts/rules.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def rule_edit(request: HttpRequest, project: str, kind: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need=EDIT)
    row = selectors.rule_row(project=membership.project, kind=kind)
    if row is None:
        raise Http404("no such rule")
    rule = row.rule
    initial = {
        "severity": rule.severity,
        "threshold": rule.threshold,
        "muted": rule.muted,
        "cooldown": rule.cooldown,
        "channels": row.channels,
    }
    data = request.POST if request.method == "POST" else None
    form = RuleForm(data, initial=initial, project=membership.project, rule=rule)
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        services.rule_update(
            project=membership.project,
            kind=kind,
            severity=d["severity"],
            threshold=d.get("threshold", rule.threshold),
            channels=list(d["channels"]),
            muted=d["muted"],
            cooldown=d["cooldown"],
        )
        messages.success(request, "Rule saved.")
        return redirect("alerts:rules", project=project)
    context = {"project": membership.project, "rule": rule, "kind": row.kind, "form": form}
    return render(request, "alerts/rule_edit.html", context)
