"""Run the real host agent on a machine with NVIDIA GPUs and print what it saw.

    pip install -e './client[gpu]' torch
    python -m bench.gpu_agent_check [--seconds 40] [--load-at 10] [--load-for 15] [--gpu 0]

A second process runs a real torch matmul loop on one GPU from `--load-at` to `--load-at +
--load-for` seconds; the agent (real NVML, its real sender) posts to a local HTTP sink in this
process. Printed: utilisation of that GPU per second, the load process's SM share per second as
NVML attributed it, the process description the agent sent (command, user, container, identity),
and a verdict: exit 0 when the load shows in the utilisation and is attributed to its pid, 1 when
not, 2 when this machine cannot run the check (no NVML bindings, no driver, no GPU, no torch).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOAD = """
import sys, time, torch
device = torch.device("cuda", int(sys.argv[1]))
a = torch.randn(8192, 8192, device=device)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    b = a @ a
    torch.cuda.synchronize(device)
"""


def fail(message: str) -> int:
    print(f"gpu_agent_check: cannot run here: {message}", file=sys.stderr)
    return 2


def preflight(gpu: int) -> str | None:
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed (pip install './client[gpu]')"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:
        return f"NVML did not start ({exc}); no NVIDIA driver or GPU on this machine"
    if gpu >= count:
        return f"GPU {gpu} asked for, {count} present"
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.stdout.strip() != "True":
        return "torch with CUDA is not available for the load process"
    return None


def sink() -> tuple[ThreadingHTTPServer, list[dict[str, Any]]]:
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            bodies.append(json.loads(raw))
            reply = b'{"accepted": 1, "duplicate": false, "host": "h", "project": "p", "gpus": 1}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, bodies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--load-at", type=float, default=10.0)
    parser.add_argument("--load-for", type=float, default=15.0)
    parser.add_argument("--gpu", type=int, default=0)
    args = parser.parse_args(argv)
    problem = preflight(args.gpu)
    if problem:
        return fail(problem)
    sys.path.insert(0, str(ROOT / "client"))
    from runcast.agent import Agent
    from runcast.settings import Settings

    server, bodies = sink()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    settings = Settings(url=url, token="rc_check_x", dir=Path("/tmp/runcast-gpu-agent-check"))  # noqa: S106
    agent = Agent(settings, host="gpu-agent-check")
    agent.start()
    stop = threading.Event()
    sampler = threading.Thread(target=agent.run, args=(stop, args.seconds), daemon=True)
    t0 = time.time()
    sampler.start()
    time.sleep(args.load_at)
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.gpu), str(args.load_for)])
    started = time.time() - t0
    load.wait()
    stopped = time.time() - t0
    sampler.join(args.seconds + 5)
    agent.close()
    server.shutdown()
    return report(bodies, t0, args.gpu, load.pid, started, stopped)


def report(
    bodies: list[dict[str, Any]], t0: float, gpu: int, pid: int, started: float, stopped: float
) -> int:
    util: dict[int, list[float]] = defaultdict(list)
    sm: dict[int, list[float]] = defaultdict(list)
    described = []
    for body in bodies:
        for key, column in body.get("metrics", {}).items():
            for when, value in zip(column["times"], column["values"], strict=True):
                second = int(when - t0)
                if key == f"gpu/{gpu}/util":
                    util[second].append(value)
                elif key == f"gpu/{gpu}/proc/{pid}/sm":
                    sm[second].append(value)
        described += [
            e["payload"] for e in body.get("events", []) if e["payload"].get("pid") == pid
        ]
    print(f"load pid {pid} on GPU {gpu}: from {started:.1f} s to {stopped:.1f} s")
    print(f"{'second':>6} {'util %':>8} {'samples':>8} {'load SM %':>10}")
    for second in sorted(util):
        mark = "*" if started <= second < stopped else " "
        load_sm = f"{max(sm[second]):.0f}" if sm.get(second) else "-"
        mean = sum(util[second]) / len(util[second])
        print(f"{second:>5}{mark} {mean:>8.1f} {len(util[second]):>8} {load_sm:>10}")
    print("process as the agent described it:", json.dumps(described[:1], indent=1))
    inside = [v for s, vs in util.items() if started + 2 <= s < stopped - 1 for v in vs]
    outside = [v for s, vs in util.items() if s < started - 1 or s > stopped + 2 for v in vs]
    busy = sum(inside) / len(inside) if inside else 0.0
    idle = sum(outside) / len(outside) if outside else 0.0
    attributed = any(sm.values()) and bool(described)
    print(f"utilisation during the load {busy:.0f}%, outside {idle:.0f}%; attributed: {attributed}")
    ok = busy > idle + 30 and attributed
    print("OK: the agent saw the load and named its process" if ok else "NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
