"""Web pages. Views parse, authorise (membership), call a selector and render."""

from __future__ import annotations

import math

import numpy as np
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from tracker import selectors
from tracker.models import Run

MAX_BUCKETS = 2_000


def _run_for_user(request: HttpRequest, project: str, run_id: str) -> Run:
    membership = selectors.membership_get(user=request.user, project_slug=project)
    if membership is None:
        # An outsider learns nothing, not even that the project exists.
        raise Http404("no such run")
    run = selectors.run_get(project=membership.project, public_id=run_id)
    if run is None:
        raise Http404("no such run")
    return run


@login_required
def home(request: HttpRequest) -> HttpResponse:
    runs = selectors.run_list_for_user(user=request.user)[:500]
    return render(request, "dashboard/home.html", {"runs": runs})


@login_required
def run_detail(request: HttpRequest, project: str, run_id: str) -> HttpResponse:
    run = _run_for_user(request, project, run_id)
    keys = selectors.series_keys(run=run)
    default = next(
        (k for k in ("loss", "train_loss", "val_loss") if k in keys), keys[0] if keys else ""
    )
    context = {"run": run, "keys": keys, "default_key": default}
    return render(request, "dashboard/run.html", context)


def _floats(a: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in a.tolist()]


def _float_param(request: HttpRequest, name: str) -> float | None:
    raw = request.GET.get(name)
    try:
        value = float(raw) if raw not in (None, "") else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


@login_required
def run_series(request: HttpRequest, project: str, run_id: str) -> JsonResponse:
    """Chart data for one key over the visible step range (zooming asks for finer data)."""
    run = _run_for_user(request, project, run_id)
    try:
        buckets = max(10, min(MAX_BUCKETS, int(request.GET.get("buckets", 1000))))
    except ValueError:
        buckets = 1000
    view = selectors.series_view(
        run=run,
        key=request.GET.get("key", ""),
        buckets=buckets,
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
