"""One trainer of the chaos bench: the real `runcast` client logging at a steady rate, a process
of its own so that the bench can kill it -9 like a job the scheduler kills.

Run by bench/chaos/fleet.py as `python -m bench.chaos.trainer SPEC` (SPEC: JSON) with RUNCAST_URL,
RUNCAST_TOKEN, RUNCAST_DIR and RUNCAST_HEARTBEAT_INTERVAL in its environment. It speaks on stdout
in lines starting with PROTOCOL:

* mode "live": logs `keys` values a step, `steps_per_s` steps a second, until "stop" arrives on
  stdin, then `finish()`es and prints `RESULT {...}` (steps logged, the client's counters).
* mode "one_batch": logs `burst` steps at once, waits until the server has acknowledged its first
  batch, prints `SENT {...}` and sleeps until it is killed.

The values are bench.trainers.values_at(step, keys): the bench recomputes exactly what was sent
and compares it with what the server stored, point by point.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from typing import Any

import runcast
from runcast.settings import from_env

from bench.trainers import key_names, values_at

PROTOCOL = "@@chaos "


def say(kind: str, body: dict[str, Any] | None = None) -> None:
    print(f"{PROTOCOL}{kind} {json.dumps(body or {})}", flush=True)


def open_run(spec: dict[str, Any]) -> Any:
    # The client's longest probe interval is no environment variable: the bench's short liveness
    # clocks need it short too (a client must be back within the server's reconnect grace).
    settings = dataclasses.replace(from_env(), probe_interval_max=float(spec["probe_max_s"]))
    return runcast.init(
        project=spec["project"],
        id=spec["run_id"],
        name=spec["run_id"],
        total_steps=int(spec["total_steps"]),
        settings=settings,
    )


def live(spec: dict[str, Any]) -> dict[str, Any]:
    stop = threading.Event()

    def wait_for_stop() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()  # "stop", or the bench went away (EOF)

    threading.Thread(target=wait_for_stop, daemon=True).start()
    keys = key_names(int(spec["keys"]))
    period = 1.0 / float(spec["steps_per_s"])
    run = open_run(spec)
    started = time.time()
    say("STARTED", {"at": started})
    step, due = 0, time.monotonic()
    while not stop.is_set():
        run.log(dict(zip(keys, values_at(step, len(keys)), strict=True)), step=step)
        step += 1
        due += period
        # A steady rate whatever the client does: log() never blocks, so a late step is ours.
        stop.wait(max(0.0, due - time.monotonic()))
    stopped = time.time()
    run.finish()
    return {"steps": step, "started": started, "stopped": stopped, "stats": run.stats()}


def one_batch(spec: dict[str, Any]) -> None:
    keys = key_names(int(spec["keys"]))
    run = open_run(spec)
    for step in range(int(spec["burst"])):
        run.log(dict(zip(keys, values_at(step, len(keys)), strict=True)), step=step)
    while run.stats().get("batches_sent", 0) < 1:
        time.sleep(0.005)
    say("SENT", {"steps": int(spec["burst"]), "at": time.time(), "stats": run.stats()})
    while True:  # until the bench kills this process (-9: no finish, no goodbye)
        time.sleep(60)


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    if spec["mode"] == "one_batch":
        one_batch(spec)
    else:
        say("RESULT", live(spec))


if __name__ == "__main__":
    main(sys.argv[1:])
