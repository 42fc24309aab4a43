"""The one NVML seam: a small fake of the NVML functions runcast.agent calls.

Scripted by the test: GPUs with a utilisation as a function of time, processes (real pids of
real processes, so /proc is read for real) with an SM share as a function of time. A GPU can be
made to fall off the bus; NVML can be made missing. Names, signatures, errors and result shapes
follow nvidia-ml-py (pynvml).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
NVML_GPU_UTILIZATION_SAMPLES = 1


class NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


class NVMLError_GpuIsLost(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


@dataclass
class FakeProcess:
    pid: int
    sm: Callable[[float], float]
    memory: int = 2 << 30


@dataclass
class FakeGpu:
    util: Callable[[float], float] = lambda t: 0.0
    processes: list[FakeProcess] = field(default_factory=list)
    lost: bool = False
    sub_second: bool = True


class FakeNvml:
    """Module-like: the agent calls attributes of it exactly as it would on pynvml."""

    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_GPU_UTILIZATION_SAMPLES = NVML_GPU_UTILIZATION_SAMPLES
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], clock: Callable[[], float] = time.time) -> None:
        self.gpus = gpus
        self.clock = clock
        self.missing = False
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _gpu(self, handle: int) -> FakeGpu:
        gpu = self.gpus[handle]
        if gpu.lost:
            raise NVMLError_GpuIsLost(15, "GPU is lost")
        return gpu

    def nvmlInit(self) -> None:
        self._count("init")
        if self.missing:
            raise NVMLError(12, "NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self._count("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._gpu(handle)
        return "NVIDIA H100 80GB HBM3 (fake)"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._gpu(handle)
        return f"GPU-fake-{handle:04d}"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        gpu = self._gpu(handle)
        util = gpu.util(self.clock())
        return SimpleNamespace(gpu=int(util), memory=int(util / 2))

    def nvmlDeviceGetSamples(self, handle: int, kind: int, last: int) -> Any:
        gpu = self._gpu(handle)
        if not gpu.sub_second:
            raise NVMLError(3, "Not Supported")
        now = self.clock()
        # Six samples a second, like an H100's 1/6 s utilisation sampling.
        stamps = [int((now - k / 6) * 1e6) for k in range(6)][::-1]
        samples = [
            SimpleNamespace(timeStamp=s, sampleValue=SimpleNamespace(uiVal=int(gpu.util(s / 1e6))))
            for s in stamps
            if s > last
        ]
        return 0, samples

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        gpu = self._gpu(handle)
        return SimpleNamespace(used=sum(p.memory for p in gpu.processes), total=80 << 30)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        gpu = self._gpu(handle)
        return int(70_000 + 6_300 * gpu.util(self.clock()))

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
        self._gpu(handle)
        return 1980

    def nvmlDeviceGetTemperature(self, handle: int, kind: int) -> int:
        gpu = self._gpu(handle)
        return int(35 + 0.3 * gpu.util(self.clock()))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        self._gpu(handle)
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        gpu = self._gpu(handle)
        now = self.clock()
        return [
            SimpleNamespace(pid=p.pid, usedGpuMemory=p.memory)
            for p in gpu.processes
            if p.sm(now) >= 0
        ]

    def nvmlDeviceGetProcessUtilization(self, handle: int, last: int) -> list[Any]:
        gpu = self._gpu(handle)
        now = self.clock()
        stamp = int(now * 1e6)
        active = [p for p in gpu.processes if p.sm(now) >= 0]
        if not active or stamp <= last:
            raise NVMLError_NotFound(6, "Not Found")
        return [
            SimpleNamespace(
                pid=p.pid, timeStamp=stamp, smUtil=int(p.sm(now)), memUtil=int(p.sm(now) / 3)
            )
            for p in active
        ]
