"""Small builders for dashboard tests: runs with points, forecasts and flags at chosen clocks."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from forecasting.conditions import Condition, Ending
from forecasting.flags import flags_close, flags_sync
from forecasting.models import Flag, Forecast
from tracker.models import Deadline, LatestMetric, Project, Run
from tracker.services import SeriesIn, batch_ingest, from_epoch, run_finish, run_start

T0 = 1.7e9


def make_run(
    project: Project,
    public_id: str,
    *,
    points: int = 1000,
    chunk: int = 500,
    total: int | None = 100_000,
    deadline: Deadline | None = None,
    world_size: int | None = 8,
    rate: float = 2.0,
) -> Run:
    """A running run whose `loss` is logged at `rate` steps/s, in batches of `chunk` points."""
    started = run_start(
        project=project,
        public_id=public_id,
        session="s",
        started_at=from_epoch(T0),
        fields={"name": public_id, "total_steps": total, "world_size": world_size},
        deadline_slug=deadline.slug if deadline else None,
    )
    steps = np.arange(points, dtype=np.int64)
    values = 3.0 + np.exp(-steps / 5000.0)
    times = T0 + steps / rate
    for seq, lo in enumerate(range(0, points, chunk), start=1):
        sl = slice(lo, lo + chunk)
        batch_ingest(
            run=started.run,
            session="s",
            seq=seq,
            series=[SeriesIn("loss", steps[sl], values[sl], times[sl])],
            events=[],
            heartbeat=None,
        )
    return Run.objects.get(pk=started.run.pk)


def forecast(
    run: Run, kind: str, at: datetime, *, finish: float | None = None, **data: Any
) -> Forecast:
    spread = 1800.0
    return Forecast.objects.create(
        run=run,
        kind=kind,
        computed_at=at,
        segment=run.current_segment,
        input_last_step=int(at.timestamp()),
        finish_p10=None if finish is None else finish - spread,
        finish_p50=finish,
        finish_p90=None if finish is None else finish + spread,
        data=data,
    )


def forecast_set(run: Run, now: datetime, *, finish_in: float, p: float | None = None) -> None:
    """An ETA 20 h ago, the latest ETA (moved by +1 h), a loss forecast and a deadline risk."""
    end = now.timestamp() + finish_in
    forecast(run, "eta", now - timedelta(hours=20), finish=end - 3600, rate_steps_per_s=2.0)
    forecast(run, "eta", now - timedelta(minutes=1), finish=end, rate_steps_per_s=1.8)
    forecast(
        run,
        "loss",
        now,
        p10=2.9,
        p50=3.0,
        p90=3.1,
        smoothed_last=3.2,
        final_step=100_000,
        target=None,
        target_step=None,
        target_reachable=None,
        model="power_law",
        explanation="",
    )
    if p is not None:
        forecast(
            run,
            "deadline",
            now,
            p_on_time=p,
            speedup_for_p90=0.2 if p < 0.9 else 0.0,
            steps_cut_for_p90=1000.0,
            explanation=f"{p:.0%} likely on time",
        )


def flag(
    run: Run, kind: str, *, state: str = "raised", onset: int | None = None, **data: Any
) -> Flag:
    return Flag.objects.create(
        run=run,
        kind=kind,
        state=state,
        explanation=f"{kind} explained",
        onset_step=onset,
        data=data,
    )


# Loss kinds an episode flag holds (forecasting.episodes.EPISODE_KINDS).
EPISODE_KINDS = tuple(k for k in Flag.DIVERGENCE_KINDS if k != Flag.Kind.NAN)


def episode(
    run: Run,
    at: datetime,
    *,
    kind: str = "regression",
    onset: int = 2500,
    rollback: float | None = 2400.0,
    state: str = "diverged",
    ratio: float = 8.9,
    level: float = 0.37,
) -> list[Flag]:
    """A loss episode's flag raised or updated as forecasting.episodes words it, written by the
    one Flag writer (the rows it wrote: none when it is no news)."""
    data = {
        "onset_step": onset,
        "rollback_step": rollback,
        "episode": {
            "reference": {
                "onset_step": onset,
                "level": float(np.log(level)),
                "noise": 0.02,
                "value": level,
                "points": 200,
            },
            "state": state,
            "ratio": ratio,
            "level": ratio * level,
            "since_step": None,
        },
    }
    text = f"Loss diverged at step {onset:,} and has not come back: {ratio:.1f}x its level."
    cond = Condition(kind, text, 1.0, onset, data)
    return flags_sync(run=run, conditions=[cond], kinds=EPISODE_KINDS, now=at)


def episode_recovered(run: Run, at: datetime, *, kind: str, onset: int) -> list[Flag]:
    """The loss came back: the episode's flag closes saying so (forecasting.episodes)."""
    text = f"Loss recovered from the blow-up at step {onset:,}: back at its level before it."
    ending = Ending(text, {"episode": {"state": "recovered"}})
    return flags_sync(
        run=run, conditions=[], kinds=EPISODE_KINDS, now=at, resolutions={kind: ending}
    )


def ended_inside(
    run: Run,
    at: datetime,
    *,
    status: str = "finished",
    kind: str = "regression",
    onset: int = 2500,
    back: bool = False,
) -> Run:
    """The run ends while its episode flag is open: its end closes the flag, "never recovered"
    (or, `back`: the loss had come back just before the end, and the flag says so)."""
    run = run_finish(run=run, status=status, ended_at=at)
    text = (
        f"The run {status} with its loss 8.9x its level before it (~0.37): diverged at step"
        f" {onset:,} and never recovered."
    )
    ending = Ending(text, {"episode": {"state": "diverged"}})
    if back:
        text = f"Loss recovered from the blow-up at step {onset:,}: back at its level before it."
        ending = Ending(text, {"episode": {"state": "recovered"}})
    flags_close(run=run, reason=f"the run {status}", now=at, resolutions={kind: ending})
    return run


# When the explorer's runs start (day 0); days count from it.
EXPLORER_T0 = datetime(2026, 11, 1, 12, tzinfo=UTC)


def listed_run(
    project: Project,
    name: str,
    *,
    day: int = 0,
    status: str = Run.Status.FINISHED,
    tags: list[str] | None = None,
    config: dict[str, object] | None = None,
    metrics: dict[str, float] | None = None,
) -> Run:
    """A run as the explorer lists it, written directly: its tags, config and the latest value
    of each metric (a NaN as the write path stores one), no points."""
    run = Run.objects.create(
        project=project,
        public_id=name,
        name=name,
        status=status,
        started_at=EXPLORER_T0 + timedelta(days=day),
        tags=tags or [],
        config=config or {},
    )
    for key, value in (metrics or {}).items():
        nan = math.isnan(value)
        LatestMetric.objects.create(
            run=run, key=key, value=None if nan else value, is_nan=nan, step=1, timestamp_ms=0
        )
    return run
