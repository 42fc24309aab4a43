"""Replay real training logs through the real `runcast` client, so the demo shows real runs.

Each run's history up to a chosen fraction is sent at once with its original pacing mapped onto
the recent past; the rest is logged live at the run's own pace. Usage:
    RUNCAST_URL=... RUNCAST_TOKEN=... python demo/replay.py demo/data
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import runcast

from curveset import CurveRow, curve_rows

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
log = logging.getLogger("demo.replay")


@dataclass(frozen=True)
class Plan:
    file_prefix: str
    run_id: str
    name: str
    now_fraction: float  # how much of the run has happened "now"; 1.0 = already finished
    deadline: str | None
    world_size: int | None  # only where the source documents it
    tags: tuple[str, ...]


PLANS = (
    Plan(
        "modded-nanogpt__track_1_short-2024-10-20_ScaleUp1B",
        "nanogpt-1b-scaleup",
        "GPT-2 1.5B speedrun (8x H100)",
        0.55,
        "blind-eval",
        8,
        ("nanogpt", "1.5b"),
    ),
    Plan(
        "megatron-lm__deepseekv3_proxy",
        "dsv3-proxy-h100",
        "DeepSeek-V3 proxy convergence (Megatron, H100)",
        0.40,
        "release",
        None,
        ("megatron",),
    ),
    Plan(
        "megatron-lm__bert_release",
        "bert-release-h100",
        "BERT release convergence (Megatron, H100)",
        1.0,
        None,
        None,
        ("megatron", "bert"),
    ),
    Plan(
        "parameter-golf__track_10min_16mb-2026-03-17_NaiveBaseline",
        "param-golf-baseline",
        "Parameter golf naive baseline (10 min cap)",
        1.0,
        None,
        8,
        ("parameter-golf",),
    ),
)


def _metrics(row: CurveRow) -> dict[str, float]:
    out = {}
    if row.train_loss is not None:
        out["loss"] = row.train_loss
    if row.val_loss is not None:
        out["val_loss"] = row.val_loss
    return out


def replay(plan: Plan, path: Path) -> None:
    rows, total = curve_rows(path)
    split = next(
        (i for i, r in enumerate(rows) if r.step >= plan.now_fraction * rows[-1].step), len(rows)
    )
    if plan.now_fraction >= 1.0:
        split = len(rows)
    t_now = rows[min(split, len(rows)) - 1].t
    base = time.time() - t_now
    run = runcast.init(
        started_at=base + rows[0].t,  # the original start, so a finished run shows its duration
        name=plan.name,
        id=plan.run_id,
        total_steps=total,
        deadline=plan.deadline,
        tags=plan.tags,
        world_size=plan.world_size,
        config={"source": path.name},
    )
    for row in rows[:split]:
        if m := _metrics(row):
            run.log(m, step=row.step, time=base + row.t)
    log.info("%s: history sent up to step %s", plan.run_id, rows[split - 1].step)
    for row in rows[split:]:
        time.sleep(max(0.0, base + row.t - time.time()))
        if m := _metrics(row):
            run.log(m, step=row.step)
    run.finish()
    log.info("%s: finished", plan.run_id)


# The drill: a real curve with an INJECTED failure, so a fresh install shows the alert path end
# to end (it is labelled as a drill everywhere it appears). The job logs checkpoints, its loss
# goes NaN, the job dies; two minutes later it is resumed from the last checkpoint before the
# NaN, as teams do, and the NaN flag resolves.
DRILL = Plan(
    "megatron-lm__bert_release",
    "bert-divergence-drill",
    "BERT divergence drill (real curve, injected NaN)",
    0.30,
    None,
    8,
    ("drill",),
)
DRILL_NAN_AT = 0.50  # fraction of the steps where the injected NaN starts
DRILL_RESUME_AFTER_S = 120.0
DRILL_CHECKPOINT_EVERY = 2000
# BERT's real pace (~0.29 s/step) would put the NaN 19 minutes after start: play it 10x faster.
DRILL_SPEED = 10.0


def drill(path: Path) -> None:
    rows, total = curve_rows(path)
    rows = [replace(r, t=r.t / DRILL_SPEED) for r in rows]
    split = next(i for i, r in enumerate(rows) if r.step >= DRILL.now_fraction * rows[-1].step)
    nan_at = DRILL_NAN_AT * rows[-1].step
    config = {
        "source": path.name,
        "drill": f"NaN injected from step {nan_at:.0f}; replayed at {DRILL_SPEED:.0f}x its pace",
    }
    args = {
        "name": DRILL.name,
        "id": DRILL.run_id,
        "total_steps": total,
        "tags": DRILL.tags,
        "world_size": DRILL.world_size,
    }
    base = time.time() - rows[split - 1].t
    run = runcast.init(config=config, started_at=base + rows[0].t, **args)
    for i, row in enumerate(rows):
        if i >= split:
            time.sleep(max(0.0, base + row.t - time.time()))
        when = base + row.t if i < split else None
        if row.step >= nan_at:
            run.log({"loss": float("nan")}, step=row.step, time=when)
            if row.step >= nan_at + 200:
                break
            continue
        if m := _metrics(row):
            run.log(m, step=row.step, time=when)
        if row.step and row.step % DRILL_CHECKPOINT_EVERY == 0:
            run.event("checkpoint", step=row.step, path=f"ckpt/{row.step}")
    run.finish(status="crashed")
    log.info("drill: crashed with NaN loss; resuming in %.0f s", DRILL_RESUME_AFTER_S)
    time.sleep(DRILL_RESUME_AFTER_S)
    # The last checkpoint before the NaN: what the alert names as the rollback target.
    resume_step = int((nan_at - 1) // DRILL_CHECKPOINT_EVERY * DRILL_CHECKPOINT_EVERY)
    run = runcast.init(config=config, **args)
    run.event("resume", step=resume_step, checkpoint=f"ckpt/{resume_step}")
    start = next(i for i, r in enumerate(rows) if r.step > resume_step)
    base = time.time() - rows[start].t
    for row in rows[start:]:
        time.sleep(max(0.0, base + row.t - time.time()))
        if m := _metrics(row):
            run.log(m, step=row.step)
    run.finish()
    log.info("drill: finished after the resume")


def main(directory: str) -> None:
    files = sorted(Path(directory).glob("*.csv"))
    threads = []
    for plan in PLANS:
        path = next((f for f in files if f.name.startswith(plan.file_prefix)), None)
        if path is None:
            log.warning("no file for %s", plan.run_id)
            continue
        thread = threading.Thread(target=replay, args=(plan, path), name=plan.run_id)
        thread.start()
        threads.append(thread)
    drill_file = next((f for f in files if f.name.startswith(DRILL.file_prefix)), None)
    if drill_file is not None:
        thread = threading.Thread(target=drill, args=(drill_file,), name="drill")
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo/data")
