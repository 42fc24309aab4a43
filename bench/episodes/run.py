"""The replays behind `python -m bench.episodes` (importable, so spawned workers find its jobs)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import flagstream as fs
from bench.episodes.data import (
    SHAPES,
    Episode,
    Extras,
    documented_episodes,
    inject_episode,
    load_extras,
    restore_non_finite,
    sending_extras,
)
from bench.episodes.score import (
    FlagRow,
    Scored,
    score_episode,
    score_healthy,
    summarise,
    table,
    visible_before_checkpoint,
)


@dataclass(frozen=True)
class Job:
    index: int
    path: Path
    events: pd.DataFrame  # this run's EVENTS.csv rows
    healthy: bool  # no documented fault: replayed as is, and with injected episodes
    shapes: tuple[str, ...]
    seed: int


def _flag_rows(name: str) -> tuple[list[FlagRow], list[str]]:
    """The replayed run's flag rows on its own clock, with what their notifications became."""
    from alerts.models import Notification
    from forecasting.estimators import episode_states
    from forecasting.models import Flag
    from tracker.models import Run

    run = Run.objects.filter(public_id=name[:64]).order_by("-id").first()
    assert run is not None, name
    start = run.started_at.timestamp()
    status: dict[int, list[str]] = {}
    for flag_id, st in Notification.objects.filter(run=run, flag__isnull=False).values_list(
        "flag_id", "status"
    ):
        status.setdefault(flag_id, []).append(st)
    rows, texts = [], []
    said: dict[str, dict] = {}  # the last row of each kind: is this one worse news?
    for f in Flag.objects.filter(run=run).order_by("created_at", "id"):
        sts = status.get(f.pk, [])
        worse = f.state == "updated" and episode_states.escalates(f.data, said.get(f.kind))
        said[f.kind] = f.data
        row = FlagRow(
            t=f.created_at.timestamp() - start,
            kind=f.kind,
            state=f.state,
            onset_step=f.onset_step,
            rollback_step=f.data.get("rollback_step"),
            closed_by_end=bool(f.data.get("closed_by_run_end")),
            back_at_end=episode_states.state_of(f.data) in ("recovered", "recovering"),
            sent=sts.count("sent"),
            held=sts.count("suppressed"),
            escalation=worse,
        )
        rows.append(row)
        texts.append(f.explanation)
    return rows, texts


def _trace(flags: list[FlagRow], texts: list[str], onset_t: float) -> list[str]:
    return [
        f"    {f.t - onset_t:+7.0f}s {f.kind:<11} {f.state:<8} onset {f.onset_step} "
        f"rollback {f.rollback_step} sent {f.sent} held {f.held}: {text[:150]}"
        for f, text in zip(flags, texts, strict=True)
        if f.kind in fs.DETECTED_BY["divergence"] | {"nan", "spike"}
    ]


def _replay(
    job: Job, rows: list[fs.Row], total: int | None, extras: Extras, variant: int
) -> tuple[fs.Replay, list[FlagRow], list[str]]:
    with sending_extras(extras):
        # One seed per replay of the file: it names the run, so each replay is its own run.
        rep = fs.replay(job.path, rows, total, None, job.seed * 100 + variant)
    flags, texts = _flag_rows(rep.name)
    return rep, flags, texts


def _scored(
    job: Job,
    rows: list[fs.Row],
    total: int | None,
    extras: Extras,
    episodes: list[Episode],
    variant: int,
) -> tuple[list[Scored], list[str]]:
    _, flags, texts = _replay(job, rows, total, extras, variant)
    clock = (np.array([r.t for r in rows]), np.array([r.step for r in rows], dtype=float))
    out, trace = [], []
    for ep in episodes:
        out.append(score_episode(job.path.name, ep, flags, clock, extras.checkpoints))
        trace.append(f"  {job.path.name} {ep.scenario} onset {ep.onset_step:.0f}:")
        trace += _trace(flags, texts, ep.onset_t)
    return out, trace


def _visible(
    rows: list[fs.Row], bad_rows: list[fs.Row], episode: Episode, extras: Extras
) -> bool | None:
    """score.visible_before_checkpoint on the loss the server reads (the train loss if any)."""
    attr = fs.read_loss(rows)
    keep = [i for i, r in enumerate(rows) if getattr(r, attr) is not None]
    steps = np.array([rows[i].step for i in keep], dtype=float)
    clean = np.array([getattr(rows[i], attr) for i in keep], dtype=float)
    faulty = np.array([getattr(bad_rows[i], attr) for i in keep], dtype=float)
    return visible_before_checkpoint((steps, clean), faulty, episode.onset_step, extras.checkpoints)


def visibility(jobs: list[Job]) -> dict[str, Any]:
    """Per shape, how many injected faults stood outside one point's noise before the checkpoint
    a rollback must not pass (score.visible_before_checkpoint): the rest no loss-only method
    can place before it. The same injections as the replays (one random stream per shape)."""
    counts: dict[str, Counter[str]] = {shape: Counter() for shape in SHAPES}
    for job in jobs:
        loaded = fs.load_rows(job.path) if job.healthy else None
        if loaded is None:
            continue
        rows = loaded[0]
        extras = load_extras(job.path, job.events, rows)
        for shape in SHAPES:
            rng = random.Random(f"{job.seed}:{job.path.name}:{shape}")
            bad_rows, episode = inject_episode(rows, shape, rng)
            seen = _visible(rows, bad_rows, episode, extras)
            counts[shape]["unknown" if seen is None else "visible" if seen else "not_visible"] += 1
    return {"bench": "episodes-visibility", "seed": jobs[0].seed if jobs else None} | {
        shape: dict(sorted(c.items())) for shape, c in counts.items()
    }


def _run_job(job: Job) -> tuple[int, list[Scored], list[str], bool]:
    loaded = fs.load_rows(job.path)
    if loaded is None:
        return job.index, [], [], False
    rows, total = loaded
    restore_non_finite(job.path, rows)
    extras = load_extras(job.path, job.events, rows)
    documented = documented_episodes(job.events, rows)
    if documented:
        found, lines = _scored(job, rows, total, extras, documented, 1)
        return job.index, found, lines, True
    if not job.healthy:
        return job.index, [], [], True
    rep, flags, _ = _replay(job, rows, total, extras, 0)
    scored = [score_healthy(job.path.name, flags, rep.run_hours, rep.messages)]
    trace = []
    for k, shape in enumerate(job.shapes):
        rng = random.Random(f"{job.seed}:{job.path.name}:{shape}")
        bad_rows, episode = inject_episode(rows, shape, rng)
        more, lines = _scored(job, bad_rows, total, extras, [episode], 2 + k)
        more[0].visible_before_checkpoint = _visible(rows, bad_rows, episode, extras)
        scored += more
        trace += lines
    return job.index, scored, trace, True


def _jobs(root: Path, seed: int, per_run: int, limit: int | None) -> list[Job]:
    events_path = root / "EVENTS.csv"
    events = (
        pd.read_csv(events_path, dtype=str).fillna("")
        if events_path.exists()
        else pd.DataFrame(
            columns=["file", "step", "elapsed_s", "event_type", "description", "origin"]
        )
    )
    by_name = {
        name: frame for name, frame in events.groupby(events["file"].map(lambda f: Path(f).name))
    }
    faulty = fs.documented_faults(root)
    jobs = []
    for i, path in enumerate(fs.run_files(root)[:limit]):
        own = by_name.get(path.name, events.iloc[0:0])
        shapes = tuple(SHAPES[(i + k) % len(SHAPES)] for k in range(per_run))
        jobs.append(Job(i, path, own, path.name not in faulty, shapes, seed))
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="loss divergences scored as episodes")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N runs")
    parser.add_argument(
        "--per-run", type=int, default=len(SHAPES), help="injected shapes per healthy run (1-4)"
    )
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--trace", action="store_true", help="print each episode's flag stream")
    parser.add_argument("--database-url", default=None, help="default: a SQLite file per process")
    parser.add_argument(
        "--visibility",
        action="store_true",
        help="no replay: for every shape injected into every healthy run, whether the loss "
        "showed it before the first checkpoint after its onset (seconds, not minutes)",
    )
    args = parser.parse_args(argv)
    jobs = _jobs(args.directory, args.seed, min(max(args.per_run, 0), len(SHAPES)), args.limit)
    if args.visibility:
        print(json.dumps(visibility(jobs)))
        return 0
    jobs.sort(key=lambda j: -j.path.stat().st_size)  # longest first
    scored: list[tuple[int, list[Scored], list[str]]] = []
    skipped = 0
    began = time.monotonic()
    import multiprocessing

    fs._repo_root_on_path()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.processes, fs._worker_init, (args.database_url,)) as pool:
        for done, (index, out, trace, ok) in enumerate(pool.imap_unordered(_run_job, jobs), 1):
            skipped += not ok
            scored.append((index, out, trace))
            print(f"[{done}/{len(jobs)}] {time.monotonic() - began:.0f}s", file=sys.stderr)
    scored.sort(key=lambda x: x[0])
    flat = [s for _, out, _ in scored for s in out]
    summary: dict[str, Any] = summarise(flat, skipped)
    summary["seed"], summary["per_run"] = args.seed, args.per_run
    summary["wall_s"] = round(time.monotonic() - began, 1)
    if args.trace:
        print("\n".join(line for _, _, trace in scored for line in trace))
    print(table(flat, summary))
    if args.json:
        print(json.dumps(summary))
    return 0
