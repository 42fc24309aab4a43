"""What /proc says about a process: identity across PID namespaces, owner, command, container.

A process's identity that holds inside and outside containers is (boot id, the pid in its own
namespace, its start time in clock ticks since boot): the training client records it for itself,
the host agent for every GPU process, and the server matches the two (docs/gpu.md). Every reader
tolerates the process exiting between two reads: it returns what it got, or None.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_CONTAINER_RE = re.compile(r"([0-9a-f]{64})")
_POD_RE = re.compile(r"pod([0-9a-f_\-]{36})")
LAUNCHERS = ("torchrun", "torch.distributed.run", "deepspeed", "accelerate", "mpirun", "srun")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:  # gone, or not ours to read
        return None


def boot_id(proc: Path = Path("/proc")) -> str:
    return (_read(proc / "sys/kernel/random/boot_id") or "").strip()


def start_ticks(pid: int, proc: Path = Path("/proc")) -> int | None:
    stat = _read(proc / str(pid) / "stat")
    if not stat:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return None


def parent(pid: int, proc: Path = Path("/proc")) -> int | None:
    stat = _read(proc / str(pid) / "stat")
    if not stat:
        return None
    try:
        return int(stat.rsplit(")", 1)[-1].split()[1])
    except (IndexError, ValueError):
        return None


def namespace_pid(pid: int, proc: Path = Path("/proc")) -> int:
    """The pid as the process itself sees it (the last NSpid entry), else pid."""
    status = _read(proc / str(pid) / "status") or ""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            parts = line.split()[1:]
            if parts:
                return int(parts[-1])
    return pid


def uid(pid: int, proc: Path = Path("/proc")) -> int | None:
    status = _read(proc / str(pid) / "status") or ""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def user_name(uid_value: int | None) -> str:
    if uid_value is None:
        return ""
    try:
        import pwd

        return pwd.getpwuid(uid_value).pw_name
    except (KeyError, ImportError):
        return str(uid_value)


def cmdline(pid: int, proc: Path = Path("/proc")) -> str:
    raw = _read(proc / str(pid) / "cmdline") or ""
    return " ".join(part for part in raw.split("\x00") if part)[:500]


def cgroup(pid: int | str, proc: Path = Path("/proc")) -> str:
    text = _read(proc / str(pid) / "cgroup") or ""
    lines = [line.split(":", 2)[-1] for line in text.splitlines() if line]
    # cgroup v2 has one line "0::/path"; v1 many, the cpu/memory one names the container.
    return max(lines, key=len, default="")[:300]


def container_id(cgroup_path: str) -> str:
    """Docker/containerd/CRI-O container id (64 hex) or Kubernetes pod uid, when present."""
    match = _CONTAINER_RE.search(cgroup_path)
    if match:
        return match.group(1)[:12]
    pod = _POD_RE.search(cgroup_path)
    return "pod" + pod.group(1).replace("_", "-") if pod else ""


def env_run_id(pid: int, proc: Path = Path("/proc")) -> str | None:
    """RUNCAST_RUN_ID from the process's environment (readable by root or its owner)."""
    raw = _read(proc / str(pid) / "environ")
    if not raw:
        return None
    for item in raw.split("\x00"):
        if item.startswith("RUNCAST_RUN_ID="):
            return item.split("=", 1)[1][:64] or None
    return None


def key(pid: int, proc: Path = Path("/proc"), boot: str | None = None) -> list[Any] | None:
    ticks = start_ticks(pid, proc)
    if ticks is None:
        return None
    return [boot if boot is not None else boot_id(proc), namespace_pid(pid, proc), ticks]


def ancestors(pid: int, proc: Path = Path("/proc"), boot: str | None = None) -> list[list[Any]]:
    """Keys of the parent chain (up to 8, stopping at init): a worker belongs to its trainer."""
    out: list[list[Any]] = []
    current = parent(pid, proc)
    while current and current > 1 and len(out) < 8:
        k = key(current, proc, boot)
        if k is None:
            break
        out.append(k)
        current = parent(current, proc)
    return out


def describe(
    pid: int, proc: Path = Path("/proc"), boot: str | None = None
) -> dict[str, Any] | None:
    """Everything the server needs to tell whose process this is; None if it already exited."""
    k = key(pid, proc, boot)
    if k is None:
        return None
    group = cgroup(pid, proc)
    return {
        "pid": pid,
        "key": k,
        "ancestors": ancestors(pid, proc, boot),
        "cmdline": cmdline(pid, proc),
        "user": user_name(uid(pid, proc)),
        "cgroup": group,
        "container": container_id(group),
        "run_id": env_run_id(pid, proc),
    }


def self_registration() -> dict[str, Any]:
    """What the training client records at run start (its own identity and its launcher's)."""
    pid = os.getpid()
    info: dict[str, Any] = {
        "pid": pid,
        "key": key(pid),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "container": container_id(cgroup("self")),
        "launcher": None,
    }
    ppid = os.getppid()
    if any(name in cmdline(ppid) for name in LAUNCHERS):
        # torchrun's other ranks are siblings of this one: the launcher is their common parent.
        info["launcher"] = key(ppid)
    return info
