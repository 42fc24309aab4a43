"""One chaos run: the stack up, the live trainers logging, the scenarios in order, the trainers
finished, then every figure read back from the database into one result."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.chaos import measure
from bench.chaos.fleet import Fleet, Trainer, trainer_env
from bench.chaos.profile import FORECAST_RESUME_GOAL_S, Profile
from bench.chaos.scenarios import SCENARIO_TYPES, Context, Outcome, RunKilled, await_forecasts
from bench.chaos.stack import Stack
from bench.harness import BenchError, log

# Scenarios that take the server's listening away: the killed run is judged before them.
OUTAGES = ("web_down", "postgres_killed", "redis_killed")
# What finish() may take: the client's own budget (RUNCAST_FINISH_TIMEOUT, 30 s) and its start.
FINISH_TIMEOUT_S = 90.0


def run(profile: Profile, *, keep: bool = False) -> dict[str, Any]:
    began = time.time()
    work = Path(tempfile.mkdtemp(prefix="runcast-chaos-"))
    stack = Stack(profile, work)
    fleet: Fleet | None = None
    try:
        stack.start()
        env = trainer_env(
            url=stack.web_url,
            token=stack.token,
            spool=work / "spool",
            heartbeat_s=profile.liveness.heartbeat_s,
        )
        fleet = Fleet(profile, work, env)
        outcomes = _scenarios(Context(stack, fleet, profile))
        log("stopping the trainers (each finishes and flushes)")
        fleet.stop_live(FINISH_TIMEOUT_S)
        result = _result(stack, fleet, profile, outcomes)
    except BaseException:
        keep = True
        raise
    finally:
        if fleet is not None:
            fleet.close()
        stack.close()
        if keep:
            log(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    result["wall_s"] = round(time.time() - began, 1)
    return result


def _scenarios(ctx: Context) -> list[Outcome]:
    selected = ctx.profile.scenarios
    ctx.fleet.start_live()
    # The killed run first: it waits out the liveness thresholds while the others run.
    killed = RunKilled(ctx) if "run_killed" in selected else None
    if killed is not None:
        log("scenario run_killed: a trainer killed -9 after its first batch")
        killed.start()
    started = min(t.started_at or 0.0 for t in ctx.fleet.live)
    warmup = Outcome("warmup", "none", started_at=started)
    await_forecasts(ctx, warmup, since=started, timeout=ctx.profile.warmup_timeout_s)
    if warmup.forecast_resume_s is None:
        raise BenchError(f"the stack forecasts nothing: {warmup.details}")
    log(f"every live run is forecast {warmup.forecast_resume_s:.0f} s after it started")
    outcomes = []
    for name in selected:
        if name == "run_killed":
            continue
        if killed is not None and name in OUTAGES:
            outcomes.append(killed.finish())
            killed = None
        outcomes.append(SCENARIO_TYPES[name](ctx).run())
    if killed is not None:
        outcomes.append(killed.finish())
    return sorted(outcomes, key=lambda o: selected.index(o.scenario))


def _result(
    stack: Stack, fleet: Fleet, profile: Profile, outcomes: list[Outcome]
) -> dict[str, Any]:
    points = _points(stack, fleet.trainers)
    false_marks = _false_crash_marks(stack, fleet.trainers)
    states = measure.run_states(stack.dsn)
    # A live run must end as its trainer ended it: finished.
    false_ends = [t.run_id for t in fleet.live if states[t.run_id]["status"] != "finished"]
    left_open = [
        t.run_id for t in fleet.trainers if t.killed and states[t.run_id]["status"] != "crashed"
    ]
    resumes = {o.scenario: o.forecast_resume_s for o in outcomes if o.dependency != "trainer"}
    waits = [w for w in resumes.values() if w is not None]
    worst = max(waits, default=0.0) if len(waits) == len(resumes) else None
    result: dict[str, Any] = {
        "bench": "chaos",
        "profile": profile.name,
        "points_sent": points["sent"],
        "points_lost": points["lost"],
        "points_duplicated": points["duplicated"],
        "false_crash_alerts": len(false_marks) + len(false_ends),
        "forecast_resume_s": None if worst is None else round(worst, 1),
        "forecast_resume_by_scenario": {k: _round(v) for k, v in resumes.items()},
        "runs_left_open": len(left_open),
        "forecasts_half_written": _half_written(outcomes),
        "processes_died": {name: death["exit_code"] for name, death in stack.deaths().items()},
    }
    result["goals_met"] = _goals_met(result)
    result["details"] = {
        "scenarios": [o.as_json() for o in outcomes],
        "points_by_run": points["by_run"],
        "false_crash_marks": [m.__dict__ for m in false_marks],
        "live_runs_not_finished": false_ends,
        "runs_left_open": left_open,
        "deaths": stack.deaths(),
        "trainers": {t.run_id: _client_stats(t) for t in fleet.trainers},
        "liveness": profile.liveness.__dict__,
        "profile": {
            "trainers": profile.trainers,
            "points_per_s_each": profile.points_per_s,
            "web_down_s": profile.web_down_s,
            "postgres_down_s": profile.postgres_down_s,
            "redis_down_s": profile.redis_down_s,
            "web_server": stack.web_server,
        },
    }
    return result


def _points(stack: Stack, trainers: list[Trainer]) -> dict[str, Any]:
    totals = {"sent": 0, "lost": 0, "duplicated": 0}
    by_run = {}
    for trainer in trainers:
        sent = measure.sent_points(keys=trainer.keys, steps=trainer.steps)
        stored = measure.stored_points(stack.dsn, trainer.run_id)
        lost, duplicated = measure.lost_and_duplicated(sent, stored)
        row = {"sent": sum(sent.values()), "lost": lost, "duplicated": duplicated}
        by_run[trainer.run_id] = row
        for key in totals:
            totals[key] += row[key]
    return {**totals, "by_run": by_run}


def _false_crash_marks(stack: Stack, trainers: list[Trainer]) -> list[measure.CrashMark]:
    """Stalled/crashed flags and crash notifications of a run while its trainer was alive."""
    by_id = {t.run_id: t for t in trainers}
    return [
        mark
        for mark in measure.crash_marks(stack.dsn)
        if mark.run_id in by_id and by_id[mark.run_id].alive_at(mark.at)
    ]


def _half_written(outcomes: list[Outcome]) -> int | None:
    """Forecast computations the worker kill left with some of their rows only (None: the
    scenario did not run)."""
    for o in outcomes:
        if o.scenario == "worker_killed":
            return int(o.details["half_written"])
    return None


def _client_stats(trainer: Trainer) -> dict[str, Any]:
    wanted = ("points_sent", "batches_sent", "batches_duplicate", "batches_spooled",
              "files_replayed", "points_dropped", "dropped")  # fmt: skip
    return {"steps": trainer.steps, "killed": trainer.killed,
            **{k: trainer.stats.get(k) for k in wanted}}  # fmt: skip


def _goals_met(result: dict[str, Any]) -> bool:
    resume = result["forecast_resume_s"]
    return (
        result["points_lost"] == 0
        and result["points_duplicated"] == 0
        and result["false_crash_alerts"] == 0
        and resume is not None
        and resume <= FORECAST_RESUME_GOAL_S
        and result["runs_left_open"] == 0
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
