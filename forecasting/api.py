"""/api/v1/runs/{id}/forecast: the current forecasts, open flags and loss episodes of a run (read
scope)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema

from forecasting import selectors
from forecasting.estimators import formatting as fmt
from forecasting.models import Flag
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
    explanation: str  # its times in UTC, as every time the API gives
    onset_step: int | None
    created_at: datetime
    data: dict[str, Any]

    @staticmethod
    def resolve_explanation(obj: Flag) -> str:
        # The stored text holds stamps each reader writes in its zone (docs/alerts.md).
        return fmt.render_stamps(obj.explanation)


class LossEpisodeOut(Schema):
    """One loss flag from its raise to its close (a NaN is one too, without state or ratio)."""

    kind: str
    open: bool
    state: str | None  # as last said while open: spiking, diverged, recovering
    outcome: str | None  # once closed: recovered, not recovered (the run ended), cleared
    onset_step: int | None
    rollback_step: float | None
    ratio: float | None  # the loss over its level before the onset, as last said
    reference_level: float | None  # the loss level before the onset
    opened_at: datetime
    closed_at: datetime | None
    explanation: str  # what it last said while open
    closing: str | None  # what the row that closed it said

    @classmethod
    def of(cls, span: selectors.FlagSpan) -> LossEpisodeOut:
        closed = span.closed
        return cls(
            kind=span.kind,
            open=span.is_open,
            state=span.state,
            outcome=span.outcome,
            onset_step=span.onset_step,
            rollback_step=span.rollback_step,
            ratio=span.ratio,
            reference_level=span.reference_level,
            opened_at=span.opened.created_at,
            closed_at=closed.created_at if closed is not None else None,
            explanation=span.said.explanation,
            closing=closed.explanation if closed is not None else None,
        )


class RunForecastOut(Schema):
    run: str
    forecasts: dict[str, ForecastOut]
    flags: list[FlagOut]
    eta_history: list[tuple[float, float | None, float | None, float | None]]
    loss_episodes: list[LossEpisodeOut]


@router.get(
    "/runs/{run_id}/forecast",
    response={200: RunForecastOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut},
    summary="Current forecasts, open flags and loss episodes",
)
def run_forecast(request: HttpRequest, run_id: str) -> RunForecastOut:
    """Finish-time percentiles are epoch seconds; `eta_history` is the newest 5,000 ETA
    forecasts as (computed at, P10, P50, P90): every one of the last week, one per hour
    before that (retention). `loss_episodes` is every loss flag of the run, open or closed,
    oldest first: it outlives the run's end and its resumes."""
    token = require_scope(request, ApiToken.Scope.READ)
    run = run_for_token(token=token, run_id=run_id)
    forecasts = selectors.forecasts_latest(run=run)
    return RunForecastOut(
        run=run.public_id,
        forecasts={k: ForecastOut.from_orm(f) for k, f in forecasts.items()},
        flags=[FlagOut.from_orm(f) for f in selectors.flags_open(run=run).values()],
        eta_history=selectors.eta_history(run=run),
        loss_episodes=[
            LossEpisodeOut.of(span)
            for span in selectors.flag_spans(run=run, kinds=Flag.DIVERGENCE_KINDS)
        ],
    )
