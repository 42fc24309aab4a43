"""/api/v1/runs/{id}/forecast: the current forecasts and open flags of a run (read scope)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema

from forecasting import selectors
from tracker.access import run_for_token
from tracker.api.auth import TokenAuth, require_scope
from tracker.api.schemas import ErrorOut
from tracker.models import ApiToken

router = Router(auth=TokenAuth(), tags=["forecasts"])


class ForecastOut(Schema):
    kind: str
    computed_at: datetime
    input_last_step: int
    segment: int
    finish_p10: float | None
    finish_p50: float | None
    finish_p90: float | None
    data: dict[str, Any]


class FlagOut(Schema):
    kind: str
    state: str
    severity: float | None
    explanation: str
    onset_step: int | None
    created_at: datetime
    data: dict[str, Any]


class RunForecastOut(Schema):
    run: str
    forecasts: dict[str, ForecastOut]
    flags: list[FlagOut]
    eta_history: list[tuple[float, float | None, float | None, float | None]]


@router.get(
    "/runs/{run_id}/forecast",
    response={200: RunForecastOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut},
    summary="Current forecasts and open flags",
)
def run_forecast(request: HttpRequest, run_id: str) -> RunForecastOut:
    """Finish-time percentiles are epoch seconds; `eta_history` is the newest 5,000 ETA
    forecasts as (computed at, P10, P50, P90): every one of the last week, one per hour
    before that (retention)."""
    token = require_scope(request, ApiToken.Scope.READ)
    run = run_for_token(token=token, run_id=run_id)
    forecasts = selectors.forecasts_latest(run=run)
    return RunForecastOut(
        run=run.public_id,
        forecasts={k: ForecastOut.from_orm(f) for k, f in forecasts.items()},
        flags=[FlagOut.from_orm(f) for f in selectors.flags_open(run=run).values()],
        eta_history=selectors.eta_history(run=run),
    )
