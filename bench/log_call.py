"""Cost of one `run.log({"loss": x, "lr": y}, step=i)` call, as seen by the training loop.

Measured over 200k calls in two setups where the background thread is busiest: a server
URL pointing at a closed port (sender retries, then spools to disk) and offline mode
(everything spooled). Per-call times include one perf_counter_ns() pair (printed
separately as `timer_overhead_us`). The last line is JSON with the worse of the two.

    .venv/bin/python bench/log_call.py [--calls 200000]
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import runcast
except ImportError:  # not pip-installed: use the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))
    import runcast

from runcast.settings import Settings


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again once the socket is gone


def measure(settings: Settings, calls: int) -> tuple[list[float], dict]:
    run = runcast.init(name="bench", settings=settings)
    timer = time.perf_counter_ns
    costs = [0] * calls
    x, y = 0.5, 3e-4
    for i in range(calls):
        started = timer()
        run.log({"loss": x, "lr": y}, step=i)
        costs[i] = timer() - started
    run.finish(timeout=60)
    return [c / 1000 for c in costs], run.stats()


def measure_timing(settings: Settings, calls: int) -> dict[str, tuple[float, float]]:
    """The per-rank step timing calls: timing(), step_timer() and log() in automatic mode."""
    timer = time.perf_counter_ns
    out: dict[str, tuple[float, float]] = {}
    run = runcast.init(name="bench", settings=settings, world_size=2, timings=True)
    # log_auto first: the first explicit timing() turns the automatic mode off in a process.
    for name in ("log_auto", "timing", "step_timer"):
        costs = [0] * calls
        for i in range(calls):
            step = i + calls * len(out)
            started = timer()
            if name == "timing":
                run.timing(step, compute_s=0.81, wait_s=0.02)
            elif name == "step_timer":
                with run.step_timer(step) as t:
                    t.wait()
            else:
                run.log({"loss": 0.5, "lr": 3e-4}, step=step)
            costs[i] = timer() - started
        us = [c / 1000 for c in costs]
        out[name] = (statistics.median(us), p99(us))
    run.finish(timeout=60)
    return out


def timer_overhead_us(samples: int = 100_000) -> float:
    timer = time.perf_counter_ns
    costs = []
    for _ in range(samples):
        started = timer()
        costs.append(timer() - started)
    return statistics.median(costs) / 1000


def p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the outage warnings are expected here
    results = {}
    with tempfile.TemporaryDirectory(prefix="runcast-bench-") as spool:
        setups = {
            "closed_port": Settings(url=closed_port_url(), token="rc_bench_x", dir=Path(spool)),  # noqa: S106 (fake)
            "offline": Settings(mode="offline", dir=Path(spool)),
        }
        for name, settings in setups.items():
            costs, stats = measure(settings, args.calls)
            results[name] = (statistics.median(costs), p99(costs))
            print(
                f"{name:12s} median {results[name][0]:.3f} us  p99 {results[name][1]:.3f} us  "
                f"max {max(costs):.1f} us  logged {stats['logged']} dropped {stats['dropped']}"
            )
        # log() in automatic mode records one timing per step.
        timing = measure_timing(Settings(mode="offline", dir=Path(spool)), args.calls // 4)
        for name, (median, high) in timing.items():
            print(f"{name:12s} median {median:.3f} us  p99 {high:.3f} us  (offline)")
    print(f"timer_overhead_us {timer_overhead_us():.3f}")
    summary = {
        "log_call_us_median": round(max(m for m, _ in results.values()), 3),
        "log_call_us_p99": round(max(p for _, p in results.values()), 3),
        "timing_call_us_median": round(timing["timing"][0], 3),
        "step_timer_us_median": round(timing["step_timer"][0], 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
