"""Which runs and processes are on a host: the inputs the GPU check and the host page share
(its GPUs' utilisation per second and processes' series: estimators.gpu_attribution)."""

from __future__ import annotations

from dataclasses import dataclass

from forecasting.estimators import gpu_attribution as gattr
from tracker.models import Host, HostProcess, Run, RunProcess


@dataclass
class HostRun:
    run: Run
    keys: set[tuple[str, int, int]]


def busiest_first(runs: list[HostRun], host: Host, sm_by_pid: dict[int, float]) -> list[HostRun]:
    """The runs on the host, the one whose processes used most of its GPUs first (the run the
    check holds the activity against; the newest run on the kernel need not be on the GPUs:
    every run started on a machine shares its boot id)."""
    if len(runs) < 2:
        return runs
    used: dict[str, float] = {}
    for owner, rid, proc in owners_of(host, runs).values():
        if owner in ("run", "other_run") and rid is not None:
            used[rid] = used.get(rid, 0.0) + sm_by_pid.get(proc.pid, 0.0)
    return sorted(runs, key=lambda r: -used.get(r.run.public_id, 0.0))


def runs_seen(
    runs: list[HostRun], owners: dict[int, tuple[str, str | None, HostProcess]], pids: set[int]
) -> list[Run]:
    """The runs with a process among `pids` (those sampled on the host's GPUs in a window)."""
    seen = {rid for pid, (owner, rid, _) in owners.items() if owner != "unknown" and pid in pids}
    return [r.run for r in runs if r.run.public_id in seen]


def runs_on(host: Host) -> list[HostRun]:
    """Runs whose registered process identity lives on this host's kernel, newest first."""
    rows = RunProcess.objects.filter(boot_id=host.boot_id, run__project=host.project)
    runs: dict[int, HostRun] = {}
    for rp in rows.select_related("run").order_by("-run__started_at"):
        entry = runs.setdefault(rp.run_id, HostRun(rp.run, set()))
        if rp.ns_pid is not None and rp.start_ticks is not None:
            entry.keys.add((rp.boot_id, rp.ns_pid, rp.start_ticks))
        launcher = rp.launcher
        if isinstance(launcher, list) and len(launcher) == 3:
            entry.keys.add((str(launcher[0]), int(launcher[1]), int(launcher[2])))
    return list(runs.values())


def owners_of(host: Host, runs: list[HostRun]) -> dict[int, tuple[str, str | None, HostProcess]]:
    """pid -> (owner, run id, process) for every process seen on the host."""
    own = runs[0]
    others = {k: r.run.public_id for r in runs[1:] for k in r.keys}
    out = {}
    for proc in HostProcess.objects.filter(host=host):
        sample = gattr.ProcessSample(
            time=0.0,
            gpu=0,
            pid=proc.pid,
            sm=0.0,
            key=(host.boot_id, proc.ns_pid, proc.start_ticks),
            ancestors=tuple(tuple(a) for a in proc.ancestors),  # type: ignore[misc]
            env_run=proc.env_run_id or None,
        )
        owner, rid = gattr.owner_of(sample, own.keys, others, own.run.public_id)
        out[proc.pid] = (owner, rid, proc)
    return out
