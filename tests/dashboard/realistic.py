"""A project of real training curves (demo/data), ingested through tracker.services and
forecast with forecasting.compute, for browser tests, screenshots and the page benchmark.

Each curve's own pacing is stretched to a chosen duration and placed so that a chosen share of
it has happened by `now`; the history is ingested in batches with a forecast after each, so the
ETA history and "moved in 24 h" are real forecasts, not made-up rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from curveset import CurveRow, curve_rows
from forecasting import receivers
from forecasting.compute import forecast_compute
from tracker.models import Deadline, Event, Project, Run
from tracker.project_settings.services import deadline_create
from tracker.services import EventIn, SeriesIn, batch_ingest, from_epoch, run_finish, run_start
from tracker.signals import run_finished, run_ingested

DATA = Path(__file__).resolve().parents[2] / "demo" / "data"


@dataclass(frozen=True)
class Plan:
    prefix: str
    run_id: str
    name: str
    hours: float  # the whole run's wall time once stretched
    done: float  # share of it that has happened by now
    deadline: str | None
    world_size: int
    crash_at: float | None = None  # share of the run where a crash + resume happens


PLANS = (
    Plan(
        "modded-nanogpt__track_1_short-2024-10-20_ScaleUp1B",
        "nanogpt-1b-scaleup",
        "GPT-2 1.5B speedrun",
        12,
        0.55,
        "blind-eval",
        8,
    ),
    Plan(
        "megatron-lm__deepseekv3_proxy",
        "dsv3-proxy",
        "DeepSeek-V3 proxy",
        14,
        0.42,
        "blind-eval",
        32,
        crash_at=0.25,
    ),
    Plan(
        "megatron-lm__bert_release",
        "bert-release",
        "BERT release convergence",
        15,
        0.55,
        "blind-eval",
        8,
    ),
    Plan(
        "parameter-golf__track_10min_16mb-2026-03-17_NaiveBaseline",
        "golf-baseline",
        "Parameter golf baseline",
        3,
        0.6,
        None,
        8,
    ),
)


# Reports (each with its forecast) the last batch of a run's replay is split into.
LIVE_REPORTS = 8


@contextmanager
def forecasts_by_hand() -> Iterator[None]:
    # Forecasts are computed here at chosen clocks; the receivers would compute at the real one.
    run_ingested.disconnect(receivers._on_ingested)
    run_finished.disconnect(receivers._on_finished)
    try:
        yield
    finally:
        run_ingested.connect(receivers._on_ingested)
        run_finished.connect(receivers._on_finished)


def seed(project: Project, *, now: datetime, batches: int = 10) -> dict[str, Run]:
    """Four real runs in `project`, three aimed at a cutoff announced in Asia/Shanghai."""
    project.timezone = "Asia/Shanghai"
    project.targets = {"loss": 3.3}
    project.save()
    cutoff = (now + timedelta(hours=8)).replace(minute=0, second=0, microsecond=0)
    deadline_create(
        project=project,
        name="Blind eval submission",
        slug="blind-eval",
        cutoff=cutoff,
        timezone="Asia/Shanghai",
        buffer=timedelta(hours=1),
        notes="Upload by the organisers' cutoff",
    )
    runs = {}
    with forecasts_by_hand():
        for plan in PLANS:
            path = next(DATA.glob(plan.prefix + "*.csv"))
            runs[plan.run_id] = _replay(project, plan, path, now=now, batches=batches)
    return runs


def _replay(project: Project, plan: Plan, path: Path, *, now: datetime, batches: int) -> Run:
    rows, total = curve_rows(path)
    full_t = rows[-1].t
    scale = plan.hours * 3600 / full_t
    t_now = plan.done * full_t
    base = now.timestamp() - t_now * scale
    rows = [r for r in rows if r.t <= t_now]
    started = run_start(
        project=project,
        public_id=plan.run_id,
        session="s1",
        started_at=from_epoch(base),
        fields={
            "name": plan.name,
            "total_steps": total,
            "world_size": plan.world_size,
            "config": {"source": path.name, "precision": "bf16", "gpus": plan.world_size},
            "tags": [plan.prefix.split("__")[0]],
        },
        deadline_slug=plan.deadline,
    )
    run = started.run
    segments = _segments(rows, plan, total or rows[-1].step, full_t=full_t, scale=scale)
    seq = 0
    for number, (seg_rows, shift) in enumerate(segments, start=1):
        session = f"s{number}"
        if number > 1:
            run_start(
                project=project,
                public_id=plan.run_id,
                session=session,
                started_at=from_epoch(base + seg_rows[0].t * scale + shift),
                fields={},
            )
        parts = np.array_split(np.arange(len(seg_rows)), batches)
        # The last part arrives as a live run's would, a report every few minutes, each
        # forecast: a flag needs a finding sustained over several reports (forecasting
        # services._sustained), and one forecast per batch never raised one, so the board
        # showed a run at 0% on time with "none" in its Flags column.
        parts = parts[:-1] + np.array_split(parts[-1], LIVE_REPORTS)
        for part in parts:
            if part.size == 0:
                continue
            chunk = [seg_rows[i] for i in part]
            seq += 1
            clock = [base + r.t * scale + shift for r in chunk]
            batch_ingest(
                run=Run.objects.get(pk=run.pk),
                session=session,
                seq=seq,
                series=_series(chunk, clock),
                events=_events(chunk, clock, total or rows[-1].step),
                heartbeat=from_epoch(clock[-1]),
            )
            forecast_compute(run_id=run.pk, now=from_epoch(clock[-1] + 30))
    if plan.done >= 1.0:
        run_finish(run=run, status=Run.Status.FINISHED, ended_at=now)
    return Run.objects.get(pk=run.pk)


def _segments(
    rows: list[CurveRow], plan: Plan, total: int, *, full_t: float, scale: float
) -> list[tuple[list[CurveRow], float]]:
    """The rows as one segment, or two when the run crashes and resumes from a checkpoint."""
    if plan.crash_at is None:
        return [(rows, 0.0)]
    crash = next(i for i, r in enumerate(rows) if r.t >= plan.crash_at * full_t)
    every = max(1, total // 10)
    ckpt_step = (rows[crash].step // every) * every
    resume = next(i for i, r in enumerate(rows) if r.step >= ckpt_step)
    downtime = 40 * 60.0
    redo = (rows[crash].t - rows[resume].t) * scale
    return [(rows[:crash], 0.0), (rows[resume:], downtime + redo)]


def _series(rows: list[CurveRow], clock: list[float]) -> list[SeriesIn]:
    out = []
    for key, attr in (("loss", "train_loss"), ("val_loss", "val_loss")):
        pts = [
            (r.step, getattr(r, attr), t)
            for r, t in zip(rows, clock, strict=True)
            if getattr(r, attr) is not None
        ]
        if pts:
            s, v, t = (np.array(a) for a in zip(*pts, strict=True))
            out.append(SeriesIn(key, s.astype(np.int64), v.astype(float), t.astype(float)))
    return out


def _events(rows: list[CurveRow], clock: list[float], total: int) -> list[EventIn]:
    ckpt_every, eval_every = max(1, total // 10), max(1, total // 20)
    out = []
    prev = rows[0].step
    for r, t in zip(rows[1:], clock[1:], strict=True):
        # Logged steps need not hit exact multiples: an event fires when a multiple is crossed.
        if r.step // ckpt_every > prev // ckpt_every:
            step = (r.step // ckpt_every) * ckpt_every
            out.append(
                EventIn(Event.Kind.CHECKPOINT, step, from_epoch(t), {"path": f"ckpt/step_{step}"})
            )
        if r.step // eval_every > prev // eval_every:
            out.append(EventIn(Event.Kind.EVAL, r.step, from_epoch(t), {}))
        prev = r.step
    return out


def deadline_of(project: Project) -> Deadline:
    return Deadline.objects.get(project=project, slug="blind-eval")
