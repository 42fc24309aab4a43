"""One rank of a torchrun-style job for the straggler end-to-end test: a process with RANK /
LOCAL_RANK / WORLD_SIZE in its environment, a compute part, then a barrier standing in for the
all-reduce (every rank waits there for the slowest, as in synchronous data parallelism)."""

from __future__ import annotations

import os
import time
from typing import Any


def train(env: dict[str, str], barrier: Any, release: Any, plan: dict[str, Any]) -> None:
    os.environ.update(env)  # before runcast reads it, as torchrun sets it before the script
    import runcast

    rank = int(env["RANK"])
    run = runcast.init(
        project=plan["project"],
        name="ddp-straggler",
        total_steps=plan["total_steps"],
        deadline=plan.get("deadline"),
    )
    for step in range(plan["steps"]):
        with run.step_timer(step) as t:
            slow = rank == plan["slow_rank"] and step >= plan["slow_from"]
            time.sleep(plan["compute_s"] * (plan["factor"] if slow else 1.0))
            t.wait()
            barrier.wait()  # the collective
        if rank == 0:
            run.log({"loss": 2.0 + 8.0 * (step + 10.0) ** -0.3}, step=step)
    # Rank 0 keeps the run open until the test has looked at it: a finished run closes flags.
    if rank == 0:
        release.wait(timeout=plan["hold_s"])
    run.finish()
