"""The host agent's own cost: CPU % and memory at 8 GPUs x 1 Hz (NVML faked at its seam).

    .venv/bin/python -m bench.gpu_agent [--seconds 60] [--gpus 8] [--procs 2] [--json]

The agent runs in a child process (the real runcast.agent.Agent with its sender, batching and
HTTP) against a local HTTP sink in this process; its CPU time and peak RSS are read from
/proc/<pid>. Baseline in the same run: the same child with the agent never started (the
interpreter and imports alone), so the figures are the agent's own. The fake NVML answers from
memory, so real NVML calls (~0.1-1 ms each in the driver) come on top: on a real host run
bench/gpu_agent_check. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def sink() -> tuple[ThreadingHTTPServer, dict[str, int]]:
    counts = {"requests": 0, "bytes": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            counts["requests"] += 1
            counts["bytes"] += len(body)
            reply = b'{"accepted": 1, "duplicate": false, "host": "h", "project": "p", "gpus": 8}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, counts


def worker(url: str, seconds: float, gpus: int, procs: int, idle: bool) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "client")]
    from runcast.agent import Agent
    from runcast.settings import Settings

    from tests.client.fake_nvml import FakeGpu, FakeNvml, FakeProcess

    if idle:
        time.sleep(seconds)
        return
    me = os.getpid()
    fake = FakeNvml(
        [
            FakeGpu(
                util=lambda t: 70.0,
                processes=[FakeProcess(p, lambda t: 60.0) for p in (me, os.getppid())[:procs]],
            )
            for _ in range(gpus)
        ]
    )
    settings = Settings(url=url, token="rc_bench_x", dir=Path("/tmp/runcast-bench-agent"))  # noqa: S106
    settings.flush_interval = 10.0
    agent = Agent(settings, nvml=fake, host="bench-host")
    agent.start()
    agent.run(threading.Event(), duration=seconds)
    agent.close()


def measure(url: str, seconds: float, gpus: int, procs: int, idle: bool) -> dict[str, float]:
    cmd = [sys.executable, "-m", "bench.gpu_agent", "--worker", url, "--seconds", str(seconds)]
    cmd += ["--gpus", str(gpus), "--procs", str(procs)] + (["--idle"] if idle else [])
    child = subprocess.Popen(cmd, cwd=ROOT)
    peak = 0
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = 0.0
    started = time.monotonic()
    while child.poll() is None:
        try:
            status = Path(f"/proc/{child.pid}/status").read_text()
            stat = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(stat[11]) + int(stat[12])) / ticks
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    peak = max(peak, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            break
        time.sleep(0.2)
    wall = time.monotonic() - started
    return {"cpu_s": cpu, "wall_s": wall, "rss_mb": peak / 1024}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--procs", type=int, default=2, help="processes per GPU")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--idle", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.seconds, args.gpus, args.procs, args.idle)
        return 0
    server, counts = sink()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    base = measure(url, args.seconds, args.gpus, args.procs, idle=True)
    agent = measure(url, args.seconds, args.gpus, args.procs, idle=False)
    server.shutdown()
    cpu_pct = 100.0 * (agent["cpu_s"] - base["cpu_s"]) / args.seconds
    result = {
        "gpu_agent_gpus": args.gpus,
        "gpu_agent_procs_per_gpu": args.procs,
        "gpu_agent_cpu_pct_one_core": round(cpu_pct, 2),
        "gpu_agent_rss_mb": round(agent["rss_mb"], 1),
        "gpu_agent_rss_mb_interpreter_only": round(base["rss_mb"], 1),
        "gpu_agent_requests": counts["requests"],
        "gpu_agent_kb_per_s": round(counts["bytes"] / 1024 / args.seconds, 1),
        "seconds": args.seconds,
    }
    if not args.json:
        for key, value in result.items():
            print(f"{key:<36} {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
