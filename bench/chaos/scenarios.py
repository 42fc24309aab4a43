"""The scenarios of issue 24, each: break one thing, mend what the bench broke (never the worker
or beat), then wait with no hand on the keyboard until every live run is forecast again, and
say how long that took after the dependency was back.

A scenario is a `start` (break) and a `finish` (mend, wait, measure). Most run the two back to
back; `run_killed` waits for the liveness rules' own thresholds, so the runner starts it first and
finishes it while other scenarios run (bench/chaos/runner.py).
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2

from bench.chaos import measure
from bench.chaos.fleet import Fleet, Trainer
from bench.chaos.profile import Profile
from bench.chaos.stack import Stack
from bench.harness import BenchError, log
from forecasting.estimators import thresholds

FORECAST_TASK = "forecasting.tasks.forecast_run"


@dataclass
class Context:
    stack: Stack
    fleet: Fleet
    profile: Profile


@dataclass
class Outcome:
    scenario: str
    dependency: str  # what was broken
    started_at: float
    ended_at: float = 0.0
    down_s: float | None = None
    # Longest wait, over the live runs, from the dependency's return to the run's next forecast;
    # None: some live run had none by the end of the wait.
    forecast_resume_s: float | None = None
    resume_by_run: dict[str, float | None] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "dependency": self.dependency,
            "down_s": _round(self.down_s),
            "forecast_resume_s": _round(self.forecast_resume_s),
            "resume_by_run": {k: _round(v) for k, v in self.resume_by_run.items()},
            **self.details,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def await_forecasts(
    ctx: Context, outcome: Outcome, since: float, timeout: float | None = None
) -> None:
    """Wait until every live run has a forecast computed after `since`, the worker is dead (no
    forecast can come), or `timeout` (the profile's resume timeout) has passed since `since`;
    record the waits in `outcome`."""
    live = [t.run_id for t in ctx.fleet.live if t.ended_at is None]
    timeout = ctx.profile.resume_timeout_s if timeout is None else timeout
    deadline = since + timeout
    first: dict[str, float] = {}
    while True:
        try:
            first = measure.first_forecasts_since(ctx.stack.dsn, live, since)
        except psycopg2.OperationalError:
            first = {}
        if len(first) == len(live):
            break
        if ctx.stack.services["worker"].died:
            outcome.details["forecasts_stopped"] = "the worker exited"
            break
        if time.time() > deadline:
            outcome.details["forecasts_stopped"] = (
                f"no forecast of {len(live) - len(first)} live run(s) within {timeout:.0f} s"
            )
            break
        time.sleep(1.0)
    outcome.resume_by_run = {r: (first[r] - since if r in first else None) for r in live}
    waits = list(outcome.resume_by_run.values())
    outcome.forecast_resume_s = None if None in waits else max(w for w in waits if w is not None)
    outcome.ended_at = time.time()


class Scenario:
    name = ""
    dependency = ""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.outcome = Outcome(self.name, self.dependency, started_at=time.time())

    def start(self) -> None:
        self.outcome.started_at = time.time()

    def finish(self) -> Outcome:
        raise NotImplementedError

    def run(self) -> Outcome:
        log(f"scenario {self.name}")
        self.start()
        outcome = self.finish()
        log(f"scenario {self.name}: forecasts back after {_round(outcome.forecast_resume_s)} s "
            f"{json.dumps(outcome.details)}")  # fmt: skip
        return outcome


class Outage(Scenario):
    """A dependency down for a while, then started again by the bench."""

    def down_for(self) -> float:
        raise NotImplementedError

    def breaks(self) -> None:
        raise NotImplementedError

    def mends(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        super().start()
        self.breaks()

    def finish(self) -> Outcome:
        time.sleep(max(0.0, self.outcome.started_at + self.down_for() - time.time()))
        self.mends()
        back = time.time()
        self.outcome.down_s = back - self.outcome.started_at
        await_forecasts(self.ctx, self.outcome, since=back)
        return self.outcome


class WebDown(Outage):
    name, dependency = "web_down", "web"

    def down_for(self) -> float:
        return self.ctx.profile.web_down_s

    def breaks(self) -> None:
        self.ctx.stack.stop_web()

    def mends(self) -> None:
        self.ctx.stack.start_web()


class PostgresKilled(Outage):
    name, dependency = "postgres_killed", "postgres"

    def down_for(self) -> float:
        return self.ctx.profile.postgres_down_s

    def breaks(self) -> None:
        self.outcome.details["processes_killed"] = self.ctx.stack.kill_postgres()

    def mends(self) -> None:
        self.ctx.stack.start_postgres()


class RedisKilled(Outage):
    name, dependency = "redis_killed", "redis"

    def down_for(self) -> float:
        return self.ctx.profile.redis_down_s

    def breaks(self) -> None:
        self.ctx.stack.kill_redis()

    def mends(self) -> None:
        self.ctx.stack.start_redis()

    def finish(self) -> Outcome:
        outcome = super().finish()
        outcome.details["died"] = sorted(self.ctx.stack.deaths())
        return outcome


@dataclass(frozen=True)
class InFlight:
    """A forecast task running in a pool process, from its marker (bench/chaos/hooks.py)."""

    task_id: str
    pid: int
    run_pk: int
    at: float
    marker: Path


class WorkerKilled(Scenario):
    """kill -9 of the pool process that is computing a forecast, as soon as the computation has
    stored its ETA row (issue 24: only that row of the computation existed). Where no ETA row
    shows while a task runs (a computation that writes it only as it ends), after a few tries
    the next forecast task is killed as it starts. The worker's main process is left alone: it is
    what replaces a lost pool process (the bench restarts nothing)."""

    name, dependency = "worker_killed", "worker"
    WAIT_FOR_FORECAST_S = 120.0
    TRIES_FOR_ETA_ROW = 5

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.killed: InFlight | None = None
        self.killed_at = 0.0

    def start(self) -> None:
        super().start()
        stack = self.ctx.stack
        deadline = time.monotonic() + self.WAIT_FOR_FORECAST_S
        tries = 0
        with measure.cursor(stack.dsn) as cur:
            while time.monotonic() < deadline:
                task = self._forecast_in_flight()
                if task is not None:
                    tries += 1
                    if self._kill_mid_task(cur, task, wait_eta=tries <= self.TRIES_FOR_ETA_ROW):
                        return
                time.sleep(0.005)
        raise BenchError(f"no forecast killed mid-task in {self.WAIT_FOR_FORECAST_S:.0f} s")

    def _kill_mid_task(self, cur: Any, task: InFlight, *, wait_eta: bool) -> bool:
        """Kill `task`'s process as its ETA row appears (`wait_eta`), else at once; whether it
        was still running then (its end removes its marker)."""
        stored: set[str] = set()
        while wait_eta and task.marker.exists() and "eta" not in stored:
            stored = measure.kinds_stored_since(cur, run_pk=task.run_pk, since=task.at)
        _kill9(task.pid)
        self.killed_at = time.time()
        if not task.marker.exists():
            return False  # it had ended: try the next one
        self.killed = task
        # What the dead process left of its computation, before the task runs again (a rerun on
        # the same input fills the gap in: the row is keyed by input, not by computation).
        stored = measure.kinds_stored_since(cur, run_pk=task.run_pk, since=task.at)
        self.outcome.details.update(
            killed_pid=task.pid,
            killed_ms_into_task=round((self.killed_at - task.at) * 1000),
            rows_left_by_killed_task=sorted(stored),
            # Every computation of a run logging `loss` stores its ETA and its loss forecast.
            half_written=bool(stored) and not {"eta", "loss"} <= stored,
        )
        return True

    def _forecast_in_flight(self) -> InFlight | None:
        pool = set(self.ctx.stack.worker_pool())
        for path in self.ctx.stack.tasks_dir.glob("*.json"):
            try:
                body = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if body.get("task") == FORECAST_TASK and body.get("pid") in pool:
                task_id = path.name.split(".")[0]
                return InFlight(task_id, int(body["pid"]), int(body["args"][0]), body["at"], path)
        return None

    def finish(self) -> Outcome:
        await_forecasts(self.ctx, self.outcome, since=self.killed_at)
        stack = self.ctx.stack
        # acks_late with reject_on_worker_lost: the killed task's message goes back to the queue
        # and the worker runs it again (the worker log's "succeeded" line names its id).
        assert self.killed is not None
        worker_log = stack.services["worker"].logfile.read_text(errors="replace")
        self.outcome.details["killed_task_run_again"] = (
            f"{FORECAST_TASK}[{self.killed.task_id}] succeeded" in worker_log
        )
        return self.outcome


def _kill9(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class RunKilled(Scenario):
    """A trainer killed -9 right after its first batch was stored: its run must be closed as
    crashed once the liveness rules' own thresholds have passed."""

    name, dependency = "run_killed", "trainer"

    def start(self) -> None:
        super().start()
        self.trainer: Trainer = self.ctx.fleet.add("killed", "one_batch")
        sent = self.trainer.expect("SENT", timeout=60)
        self.trainer.kill()
        self.trainer.steps = int(sent["steps"])
        self.trainer.stats = sent["stats"]

    def judged_within(self) -> float:
        """The longest the rules may take: a silence of STALL_FACTOR client heartbeats and at
        least STALL_MIN_S, counted from the end of the grace after the sweep's first tick, then
        the sweep that sees it; three sweep periods (a tick that waited past its `expires` is
        dropped) and 20 s for a loaded machine."""
        live = self.ctx.profile.liveness
        silence = max(thresholds.STALL_FACTOR * live.heartbeat_s, live.stall_min_s)
        return live.reconnect_grace_s + silence + 3 * live.sweep_period_s + 20.0

    def finish(self) -> Outcome:
        assert self.trainer.ended_at is not None
        deadline = self.trainer.ended_at + self.judged_within()
        state: dict[str, Any] = {}
        while True:
            state = measure.run_states(self.ctx.stack.dsn).get(self.trainer.run_id, {})
            if state.get("status") == "crashed" or time.time() > deadline:
                break
            time.sleep(1.0)
        closed = state.get("status") == "crashed"
        self.outcome.ended_at = time.time()
        self.outcome.details.update(
            status=state.get("status"),
            batches_stored=state.get("batches"),
            closed_after_s=_round(self.outcome.ended_at - self.trainer.ended_at)
            if closed
            else None,
            waited_up_to_s=_round(self.judged_within()),
        )
        return self.outcome


SCENARIO_TYPES: dict[str, type[Scenario]] = {
    s.name: s for s in (RunKilled, WorkerKilled, WebDown, PostgresKilled, RedisKilled)
}
