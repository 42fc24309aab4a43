"""Pages and chart data. Views parse, authorise (membership), call a selector and render."""

from __future__ import annotations

import math

import numpy as np
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from dashboard import pages
from dashboard.forms import RunPlanForm
from dashboard.presenters import board_view
from tracker import artifacts, selectors
from tracker.access import can_create_projects, membership_for, run_for
from tracker.mlflow import selectors as mlflow_selectors
from tracker.models import Run
from tracker.project_settings.services import run_plan_update

MAX_BUCKETS = 2_000
# Pages poll their partials at these intervals while a run is active (htmx `every`).
BOARD_POLL_S = 15
RUN_POLL_S = 10


def _floats(a: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in a.tolist()]


def _float_param(request: HttpRequest, name: str) -> float | None:
    raw = request.GET.get(name)
    try:
        value = float(raw) if raw not in (None, "") else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _buckets(request: HttpRequest) -> int:
    try:
        return max(10, min(MAX_BUCKETS, int(request.GET.get("buckets", 1000))))
    except ValueError:
        return 1000


# --- board -----------------------------------------------------------------------------------


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    board = pages.board_for_user(user=request.user, now=now)
    context = {
        "view": board_view(board, now),
        "poll_s": BOARD_POLL_S,
        "can_create_projects": can_create_projects(request.user),
        "hosts": pages.board_hosts(board=board),
    }
    return render(request, "dashboard/board.html", context)


@login_required
@require_GET
def board_partial(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    board = pages.board_for_user(user=request.user, now=now)
    context = {"view": board_view(board, now), "poll_s": BOARD_POLL_S}
    return render(request, "dashboard/_board.html", context)


# --- run page --------------------------------------------------------------------------------


def _run_context(request: HttpRequest, project: str, run_id: str) -> dict[str, object]:
    run = run_for(user=request.user, project_slug=project, run_id=run_id)
    page = pages.run_page(run=run, now=timezone.now())
    deadlines = selectors.deadline_choices(project=run.project)
    return {
        "run": page.outlook.run,
        "page": page,
        "o": page.outlook,
        "poll_s": RUN_POLL_S,
        "deadlines": deadlines,
    }


@login_required
@require_GET
def run_detail(request: HttpRequest, project: str, run_id: str) -> HttpResponse:
    context = _run_context(request, project, run_id)
    run = context["run"]
    assert isinstance(run, Run)
    # Here, not in _run_context: the summary partial that polls does not list files.
    context["files"] = artifacts.run_files(project_id=run.project_id, run_id=run.pk)
    context["datasets"] = mlflow_selectors.run_datasets(run=run)
    return render(request, "dashboard/run.html", context)


@login_required
@require_GET
def run_file(request: HttpRequest, project: str, run_id: str, path: str) -> HttpResponseBase:
    """One of a run's files (MLflow artifacts): a download, or with ?preview=1 shown in the
    browser (images, text; anything a browser would run is sent as text)."""
    run = run_for(user=request.user, project_slug=project, run_id=run_id)
    download = artifacts.run_file_open(project_id=run.project_id, run_id=run.pk, path=path)
    if download is None:
        raise Http404("No such file")
    return artifacts.file_response(download, inline=request.GET.get("preview") == "1")


@login_required
@require_POST
def run_plan(request: HttpRequest, project: str, run_id: str) -> HttpResponse:
    """Correct the plan forecasts use (total steps, deadline): members and owners."""
    run = run_for(user=request.user, project_slug=project, run_id=run_id, need="member")
    form = RunPlanForm(request.POST)
    if not form.is_valid():
        context = _run_context(request, project, run_id)
        return render(request, "dashboard/run.html", {**context, "plan_form": form}, status=400)
    run_plan_update(
        run=run,
        total_steps=form.cleaned_data["total_steps"],
        deadline_slug=form.cleaned_data["deadline"] or "",
    )
    return redirect("dashboard:run", project=project, run_id=run_id)


@login_required
@require_GET
def run_summary(request: HttpRequest, project: str, run_id: str) -> HttpResponse:
    return render(request, "dashboard/_run_summary.html", _run_context(request, project, run_id))


@login_required
@require_GET
def run_series(request: HttpRequest, project: str, run_id: str) -> JsonResponse:
    """Chart data for one key over the visible step range (zooming asks for finer data)."""
    run = run_for(user=request.user, project_slug=project, run_id=run_id)
    view = selectors.series_view(
        run=run,
        key=request.GET.get("key", ""),
        buckets=_buckets(request),
        x0=_float_param(request, "x0"),
        x1=_float_param(request, "x1"),
    )
    return JsonResponse(
        {
            "key": view.key,
            "points": view.points,
            "source": view.source,
            "x_min": view.x_min,
            "x_max": view.x_max,
            "x": _floats(view.x),
            "mean": _floats(view.mean),
            "min": _floats(view.lo),
            "max": _floats(view.hi),
            "nonfinite_steps": view.nonfinite_steps.tolist(),
        }
    )


@login_required
@require_GET
def run_throughput(request: HttpRequest, project: str, run_id: str) -> JsonResponse:
    run = run_for(user=request.user, project_slug=project, run_id=run_id)
    view = selectors.throughput_view(
        run=run,
        buckets=_buckets(request),
        x0=_float_param(request, "x0"),
        x1=_float_param(request, "x1"),
    )
    return JsonResponse(
        {
            "key": view.key,
            "source": view.source,
            "x": _floats(view.x),
            "rate": _floats(view.rate),
            "min": _floats(view.lo),
            "max": _floats(view.hi),
        }
    )


@login_required
@require_GET
def run_overview(request: HttpRequest, project: str, run_id: str) -> JsonResponse:
    """Everything the charts draw besides the series: ETA history, cutoff, loss forecast,
    target and markers."""
    run = run_for(user=request.user, project_slug=project, run_id=run_id)
    return JsonResponse(pages.run_overview(run=run))


# The heat map's window: the detector's (thresholds.STRAGGLER_WINDOW_STEPS) and a little more.
RANKS_WINDOW_STEPS = 5_000


@login_required
@require_GET
def run_ranks(request: HttpRequest, project: str, run_id: str) -> JsonResponse:
    """The ranks heat map (compute time relative to the median rank) and the slowest ranks,
    per host by default (`?host=` drills down to one host's ranks)."""
    run = run_for(user=request.user, project_slug=project, run_id=run_id)
    host = request.GET.get("host") or None
    view = pages.ranks_view(
        run=run,
        host=host,
        buckets=max(10, min(400, _buckets(request))),
        last_steps=RANKS_WINDOW_STEPS,
    )
    heat = view.heatmap
    return JsonResponse(
        {
            "mode": view.mode,
            "host": host,
            "hosts": view.hosts,
            "ranks": view.ranks,
            "window": view.window,
            "x": _floats(heat.x),
            "rows": heat.rows,
            "values": [_floats(row) for row in heat.values],
            "slowest": [
                {"rank": rank, "host": h, "ratio": ratio} for rank, h, ratio in heat.slowest
            ],
        }
    )


# --- compare ---------------------------------------------------------------------------------


@login_required
@require_GET
def compare(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project)
    chosen = request.GET.getlist("run")[:8]
    runs = list(selectors.run_list(project=membership.project)[:200])
    # Runs chosen on the explorer may be older than the picker's newest 200.
    listed = {r.public_id for r in runs}
    runs += selectors.run_list(project=membership.project).filter(
        public_id__in=[c for c in chosen if c not in listed]
    )
    slug = membership.project.slug
    picked = [
        {
            "id": r.public_id,
            "name": str(r),
            "series": reverse("dashboard:run-series", args=[slug, r.public_id]),
            "overview": reverse("dashboard:run-overview", args=[slug, r.public_id]),
        }
        for r in runs
        if r.public_id in chosen
    ]
    context = {
        "project": membership.project,
        "runs": runs,
        "chosen": picked,
        "chosen_ids": chosen,
        "key": request.GET.get("key") or "",
        "suggested_keys": selectors.LOSS_KEYS,
    }
    return render(request, "dashboard/compare.html", context)
