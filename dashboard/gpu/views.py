"""The host/GPU page: a GPU x time heat map with the run's events and the episodes on it."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from dashboard.presenters import HOST_TICK_STEPS, time_ticks
from forecasting.gpu import selectors as gpu_selectors
from tracker.access import membership_for
from tracker.gpu.selectors import host_for_token


@login_required
@require_GET
def host_page(request: HttpRequest, project: str, host: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project)
    target = host_for_token(project=membership.project, name=host)
    try:
        hours = min(24.0, max(0.05, float(request.GET.get("hours", "1"))))
    except ValueError:
        hours = 1.0
    t1 = timezone.now().timestamp()
    view = gpu_selectors.host_view(host=target, t0=t1 - hours * 3600, t1=t1)
    context = {
        "project": membership.project,
        "host": target,
        "hours": hours,
        "ticks": time_ticks(view["t0"], view["t1"], HOST_TICK_STEPS),
        "daily": gpu_selectors.unexplained_gpu_seconds_by_day(project_id=membership.project.pk),
        **view,
    }
    return render(request, "dashboard/host.html", context)
