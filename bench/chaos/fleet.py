"""The bench's side of its trainers (bench/chaos/trainer.py): start them, stop them, kill one,
and keep what each sent and when it was alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.profile import Profile
from bench.chaos.stack import INHERITED_OUT
from bench.chaos.trainer import PROTOCOL
from bench.harness import ROOT, BenchError, tail


@dataclass
class Trainer:
    run_id: str
    spec: dict[str, Any]
    log: Path
    proc: subprocess.Popen[str] | None = None
    started_at: float | None = None
    # The end of its life: when finish() returned (live) or when it was killed.
    ended_at: float | None = None
    killed: bool = False
    steps: int = 0  # steps logged (each `keys` points)
    stats: dict[str, Any] = field(default_factory=dict)
    _lines: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def keys(self) -> int:
        return int(self.spec["keys"])

    def start(self, env: dict[str, str]) -> None:
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.chaos.trainer", json.dumps(self.spec)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self.started_at = time.time()
        threading.Thread(target=self._read, name=f"trainer-{self.run_id}", daemon=True).start()

    def _read(self) -> None:
        # Its stdout, read all along so that a chatty library never fills the pipe.
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                kind, _, body = line[len(PROTOCOL) :].strip().partition(" ")
                with self._cond:
                    self._lines.append((kind, json.loads(body or "{}")))
                    self._cond.notify_all()
        with self._cond:
            self._lines.append(("EOF", {}))
            self._cond.notify_all()

    def expect(self, kind: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for seen, body in self._lines:
                    if seen == kind:
                        return body
                    if seen == "EOF":
                        raise BenchError(f"trainer {self.run_id} exited:\n{tail(self.log)}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"trainer {self.run_id}: no {kind} in {timeout:.0f} s")
                self._cond.wait(left)

    def stop(self) -> None:
        """Ask it to finish (it flushes and says RESULT)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()

    def collect(self, timeout: float) -> None:
        result = self.expect("RESULT", timeout)
        self.ended_at = time.time()
        self.steps = int(result["steps"])
        self.stats = result["stats"]

    def kill(self) -> None:
        """kill -9, as a scheduler or the OOM killer ends a job: no finish, no flush."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.ended_at = time.time()
        self.killed = True

    def alive_at(self, t: float) -> bool:
        return (
            self.started_at is not None
            and t >= self.started_at
            and (self.ended_at is None or t <= self.ended_at)
        )

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Fleet:
    """Every trainer of one bench run, each logging under a run id of its own."""

    def __init__(self, profile: Profile, work: Path, env: dict[str, str]) -> None:
        self.profile = profile
        self.work = work
        self.env = env
        self.trainers: list[Trainer] = []

    def _spec(self, run_id: str, mode: str) -> dict[str, Any]:
        p = self.profile
        steps_per_s = p.points_per_s / p.keys
        return {
            "mode": mode,
            "run_id": run_id,
            "project": "bench",
            "keys": p.keys,
            "steps_per_s": steps_per_s,
            # Far beyond the bench's end: the ETA is forecast, the run never completes.
            "total_steps": int(steps_per_s * 24 * 3600),
            "probe_max_s": p.liveness.probe_max_s,
            "burst": 20,
        }

    def add(self, name: str, mode: str) -> Trainer:
        run_id = f"chaos-{name}"
        trainer = Trainer(run_id, self._spec(run_id, mode), self.work / f"trainer-{name}.log")
        trainer.start(self.env)
        self.trainers.append(trainer)
        return trainer

    def start_live(self) -> list[Trainer]:
        live = [self.add(f"live-{i}", "live") for i in range(self.profile.trainers)]
        for trainer in live:
            trainer.expect("STARTED", timeout=60)
        return live

    @property
    def live(self) -> list[Trainer]:
        return [t for t in self.trainers if t.spec["mode"] == "live"]

    def stop_live(self, timeout: float) -> None:
        for trainer in self.live:
            trainer.stop()
        for trainer in self.live:
            trainer.collect(timeout)

    def close(self) -> None:
        for trainer in self.trainers:
            trainer.close()


def trainer_env(*, url: str, token: str, spool: Path, heartbeat_s: float) -> dict[str, str]:
    """The trainers' environment: this process's, less anything of Runcast's servers or of a
    client configured around the bench, plus the client's settings for this stack."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_OUT)}
    env.update(
        {
            "RUNCAST_URL": url,
            "RUNCAST_TOKEN": token,
            "RUNCAST_DIR": str(spool),
            "RUNCAST_HEARTBEAT_INTERVAL": str(heartbeat_s),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")]),
        }
    )
    return env
