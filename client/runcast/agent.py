"""`runcast agent`: one per host, samples every GPU and its processes at 1 Hz and sends them.

    RUNCAST_URL=... RUNCAST_TOKEN=<write token> runcast agent [--interval 1] [--host NAME]

Needs NVIDIA's bindings (`pip install 'runcast[gpu]'`, i.e. nvidia-ml-py). What it sends per GPU
(keys `gpu/<i>/<field>`): util (NVML's own sub-second samples when the device offers them, so a
10-second burst is never missed between two reads), mem_util, mem_used, power_w, sm_clock,
temp, throttle (reasons bitmask); per process on it `gpu/<i>/proc/<pid>/sm|mem|mem_used`, and
once per process an event naming it (command line, user, cgroup/container, identity across PID
namespaces: runcast.procinfo).

Delivery is the training client's own (runcast.sender): batches of one second, retries with
backoff, a disk spool when the server is away, replayed in order; a spool left by an earlier
agent on this host is replayed at start. It never crashes on a missing NVML (it says so and
retries every minute), a GPU that fell off the bus (that GPU is skipped, the others go on) or a
process that exits between two reads.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from runcast import procinfo, transport
from runcast import spool as spool_mod
from runcast.batcher import Event
from runcast.delivery import Client, replay
from runcast.sender import Sender
from runcast.settings import Settings, from_env

logger = logging.getLogger("runcast")

NVML_RETRY_S = 60.0
# A process not seen for this long is forgotten (its metadata is re-sent if it comes back).
PROCESS_TTL_S = 300.0


class HostClient(Client):
    """The client's retries and classification, pointed at the host endpoints."""

    def __init__(self, settings: Settings, host: str) -> None:
        super().__init__(settings)
        self.host = host

    def url_for(self, kind: str, run_id: str) -> str:
        base = self.settings.url or ""
        if kind == "create":
            return f"{base}/api/v1/hosts"
        quoted = urllib.parse.quote(self.host, safe="")
        return f"{base}/api/v1/hosts/{quoted}/{'batches' if kind == 'batch' else 'finish'}"


def load_nvml() -> ModuleType | None:
    try:
        import pynvml  # nvidia-ml-py

        return pynvml
    except ImportError:
        return None


class Agent:
    def __init__(
        self,
        settings: Settings,
        *,
        nvml: Any = None,
        host: str | None = None,
        interval: float = 1.0,
        proc: Path = Path("/proc"),
    ) -> None:
        self.settings = settings
        self.nvml = nvml if nvml is not None else load_nvml()
        self.host = host or socket.gethostname()
        self.interval = interval
        self.proc = proc
        self.boot = procinfo.boot_id(proc)
        self.session = uuid.uuid4().hex
        self.stream_id = "host-" + spool_mod.safe_name(self.host)
        self.queue: collections.deque = collections.deque(maxlen=settings.max_queue)
        self._numbers = itertools.count()
        self._tick = itertools.count()
        self._handles: list[Any] = []
        self._ready = False
        self._next_init = 0.0
        self._last_ts: dict[tuple[str, int], int] = {}
        self._seen: dict[int, tuple[float, Any]] = {}
        self._warned: set[str] = set()
        self.samples_taken = 0
        self.sender = Sender(
            run_id=self.stream_id,
            session=self.session,
            settings=settings,
            queue=self.queue,
            on_created=lambda payload: None,
            client=HostClient(settings, self.host),
        )

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        self._init_nvml(time.time())
        self._replay_earlier_spools()
        body = {
            "host": self.host,
            "session": self.session,
            "boot_id": self.boot,
            "gpus": self._inventory(),
        }
        self.sender.open(transport.encode(body))
        self.sender.start()

    def close(self, timeout: float = 10.0) -> None:
        self.sender.request_close("finished", timeout)
        self.sender.join(timeout + 2.0)
        if self._ready and self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception as exc:
                logger.debug("runcast agent: nvmlShutdown failed: %s", exc)

    def run(self, stop: threading.Event, duration: float | None = None) -> None:
        """Sample every `interval` seconds until `stop` is set (or `duration` has passed)."""
        started = time.monotonic()
        next_at = started
        while not stop.is_set():
            self.sample(time.time())
            next_at += self.interval
            if duration is not None and time.monotonic() - started >= duration:
                return
            stop.wait(max(0.0, next_at - time.monotonic()))

    def _replay_earlier_spools(self) -> None:
        """Send what an earlier agent of this host left in the spool (it died in an outage)."""
        for folder in spool_mod.iter_sessions(self.settings.spool_root()):
            meta = folder.meta()
            if meta.get("run_id") != self.stream_id or folder.owned_by_live_process():
                continue
            client = HostClient(self.settings, self.host)
            result = replay(client, folder, self.stream_id, budget_s=30.0)
            logger.info("runcast agent: replayed earlier spool %s: %s", folder.path, result.value)
            if not folder.pending():
                folder.remove_if_empty()

    # -- NVML ---------------------------------------------------------------------

    def _init_nvml(self, now: float) -> bool:
        if self._ready:
            return True
        if now < self._next_init:
            return False
        self._next_init = now + NVML_RETRY_S
        if self.nvml is None:
            self._warn("nvml-missing", "NVML bindings missing (pip install 'runcast[gpu]')")
            return False
        try:
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
            self._handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            self._warn("nvml-init", f"NVML unavailable ({exc}); retrying every minute")
            return False
        self._ready = True
        logger.info("runcast agent: %d GPU(s) on %s", len(self._handles), self.host)
        return True

    def _inventory(self) -> list[dict[str, Any]]:
        gpus = []
        for index, handle in enumerate(self._handles):
            gpus.append(
                {
                    "index": index,
                    "name": _text(self._call("name", index, "nvmlDeviceGetName", handle)),
                    "uuid": _text(self._call("uuid", index, "nvmlDeviceGetUUID", handle)),
                }
            )
        return gpus

    def _call(self, what: str, index: int, name: str, *args: Any) -> Any:
        """One NVML call; None (said once per GPU and field) when it fails."""
        assert self.nvml is not None
        try:
            return getattr(self.nvml, name)(*args)
        except Exception as exc:
            self._warn(f"{index}:{what}:{type(exc).__name__}", f"GPU {index}: {what}: {exc}")
            return None

    # -- sampling -----------------------------------------------------------------

    def sample(self, now: float) -> None:
        """Read every GPU once and queue what was read. Never raises."""
        try:
            if not self._init_nvml(now):
                return
            step = next(self._tick)
            for index, handle in enumerate(self._handles):
                self._sample_gpu(index, handle, step, now)
            self._forget_old(now)
            self.samples_taken += 1
        except Exception:
            logger.exception("runcast agent: sampling failed; continuing")

    def _sample_gpu(self, index: int, handle: Any, step: int, now: float) -> None:
        nv = self.nvml
        assert nv is not None
        prefix = f"gpu/{index}/"
        values: dict[str, float] = {}
        rates = self._call("utilization", index, "nvmlDeviceGetUtilizationRates", handle)
        if rates is None and self._call("alive", index, "nvmlDeviceGetPowerUsage", handle) is None:
            return  # the GPU fell off the bus (said once); the others go on
        sub = self._sub_second(index, handle)
        if sub:
            for when, value in sub:
                self._put(step, when, {prefix + "util": value})
        elif rates is not None:
            values["util"] = float(rates.gpu)
        if rates is not None:
            values["mem_util"] = float(rates.memory)
        memory = self._call("memory", index, "nvmlDeviceGetMemoryInfo", handle)
        if memory is not None:
            values["mem_used"] = float(memory.used)
        for field, call, args in (
            ("power_w", "nvmlDeviceGetPowerUsage", ()),
            ("sm_clock", "nvmlDeviceGetClockInfo", (nv.NVML_CLOCK_SM,)),
            ("temp", "nvmlDeviceGetTemperature", (nv.NVML_TEMPERATURE_GPU,)),
            ("throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", ()),
        ):
            value = self._call(field, index, call, handle, *args)
            if value is not None:
                values[field] = float(value) / (1000.0 if field == "power_w" else 1.0)
        self._put(step, now, {prefix + k: v for k, v in values.items()})
        self._sample_processes(index, handle, step, now)

    def _sub_second(self, index: int, handle: Any) -> list[tuple[float, float]]:
        """NVML's own utilisation samples since the last read (µs timestamps)."""
        nv = self.nvml
        assert nv is not None
        last = self._last_ts.get(("util", index), 0)
        try:
            _, samples = nv.nvmlDeviceGetSamples(handle, nv.NVML_GPU_UTILIZATION_SAMPLES, last)
        except Exception:
            return []
        out = []
        for sample in samples:
            stamp = int(sample.timeStamp)
            if stamp <= last:
                continue
            value = sample.sampleValue
            out.append((stamp / 1e6, float(getattr(value, "uiVal", value))))
            self._last_ts[("util", index)] = max(self._last_ts.get(("util", index), 0), stamp)
        return out

    def _sample_processes(self, index: int, handle: Any, step: int, now: float) -> None:
        running = self._call("processes", index, "nvmlDeviceGetComputeRunningProcesses", handle)
        memory = {int(p.pid): float(p.usedGpuMemory or 0) for p in running or []}
        shares: dict[int, tuple[float, float]] = {}
        last = self._last_ts.get(("proc", index), 0)
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(handle, last)  # type: ignore[union-attr]
        except Exception:
            samples = []
        for sample in samples:
            pid = int(sample.pid)
            shares[pid] = (float(sample.smUtil), float(sample.memUtil))
            self._last_ts[("proc", index)] = max(
                self._last_ts.get(("proc", index), 0), int(sample.timeStamp)
            )
        for pid in set(memory) | set(shares):
            if not self._announce(pid, now):
                continue  # exited between the two reads: nothing to say about it
            sm, mem = shares.get(pid, (0.0, 0.0))
            base = f"gpu/{index}/proc/{pid}/"
            point = {base + "sm": sm, base + "mem": mem}
            if pid in memory:
                point[base + "mem_used"] = memory[pid]
            self._put(step, now, point)

    def _announce(self, pid: int, now: float) -> bool:
        known = self._seen.get(pid)
        ticks = procinfo.start_ticks(pid, self.proc)
        if ticks is None and known is None:
            return False
        if known is not None and (ticks is None or known[1] == ticks):
            self._seen[pid] = (now, known[1])
            return True
        info = procinfo.describe(pid, self.proc, self.boot)
        if info is None:
            return False
        self._seen[pid] = (now, ticks)
        self._put(None, now, Event("custom", {"name": "process", **info}))
        return True

    def _forget_old(self, now: float) -> None:
        for pid in [p for p, (seen, _) in self._seen.items() if now - seen > PROCESS_TTL_S]:
            del self._seen[pid]

    def _put(self, step: int | None, when: float, data: Any) -> None:
        self.queue.append((next(self._numbers), step, when, data))

    def _warn(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        logger.warning("runcast agent: %s", message)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runcast agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--host", help="host name to report (default: this machine's)")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    settings = from_env()
    if not os.environ.get("RUNCAST_FLUSH_INTERVAL"):
        # 1-Hz telemetry needs no 1-s latency: 10-s batches are 10x fewer requests and rows.
        settings.flush_interval = 10.0
    if not settings.url:
        logger.error("runcast agent: RUNCAST_URL is not set")
        return 2
    agent = Agent(settings, host=args.host, interval=args.interval)
    agent.start()
    stop = threading.Event()
    # systemd and Kubernetes stop with SIGTERM: flush (or spool) what was sampled, then exit.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        agent.run(stop, duration=args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
