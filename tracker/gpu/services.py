"""The GPU telemetry write path: host registration, agent batches, run identities."""

from __future__ import annotations

import json
import struct
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db import IntegrityError, transaction
from django.utils import timezone

from tracker.gpu.models import Host, HostBatch, HostProcess, RunProcess
from tracker.gpu.selectors import Series
from tracker.models import Project, Run
from tracker.services import ServiceError


def pack(series: Series) -> bytes:
    """zlib(header length, JSON [(key, n)...], then each key's times and values as float64).

    selectors.host_series reads this layout back."""
    header = json.dumps([[k, int(t.size)] for k, (t, _) in series.items()]).encode()
    parts = [struct.pack("<I", len(header)), header]
    for t, v in series.values():
        parts += [np.asarray(t, "<f8").tobytes(), np.asarray(v, "<f8").tobytes()]
    return zlib.compress(b"".join(parts), 1)


def util_summary(series: Series) -> dict[str, dict[str, Any]]:
    """Per GPU [mean, max] utilisation and per pid SM-percent-seconds over the batch, for
    coarse views and costs (a host-day reads these 8,640 small rows, not every point)."""
    util: dict[str, list[float]] = {}
    sm: dict[str, float] = defaultdict(float)
    for key, (_t, v) in series.items():
        parts = key.split("/")
        if not v.size or parts[0] != "gpu":
            continue
        if len(parts) == 3 and parts[2] == "util":
            util[parts[1]] = [round(float(v.mean()), 2), round(float(v.max()), 2)]
        elif len(parts) == 5 and parts[2] == "proc" and parts[4] == "sm":
            # One sample per second: the sum is SM-percent-seconds.
            sm[parts[3]] += round(float(np.clip(v, 0, 100).sum()), 1)
    return {"util": util, "sm": dict(sm)}


def host_register(
    *, project: Project, name: str, boot_id: str, gpus: list[dict[str, Any]]
) -> tuple[Host, bool]:
    host, created = Host.objects.get_or_create(
        project=project, name=name, defaults={"boot_id": boot_id, "gpus": gpus}
    )
    if not created:
        # A reboot (new boot id) or a GPU swapped: the latest agent start is the truth.
        Host.objects.filter(pk=host.pk).update(
            boot_id=boot_id, gpus=gpus or host.gpus, last_seen_at=timezone.now()
        )
        host.boot_id, host.gpus = boot_id, gpus or host.gpus
    return host, created


@dataclass
class HostIngest:
    accepted: int
    duplicate: bool


def host_batch_ingest(
    *,
    host: Host,
    session: str,
    seq: int,
    series: Series,
    processes: list[dict[str, Any]],
) -> HostIngest:
    """Store one agent batch; a retried or replayed (session, seq) changes nothing."""
    points = sum(int(t.size) for t, _ in series.values())
    times = [t for t, _ in series.values() if t.size]
    t0 = float(min(t.min() for t in times)) if times else 0.0
    t1 = float(max(t.max() for t in times)) if times else 0.0
    try:
        with transaction.atomic():
            HostBatch.objects.create(
                host=host,
                session=session,
                seq=seq,
                t0=t0,
                t1=t1,
                keys=sorted(series),
                data=pack(series),
                summary=util_summary(series),
            )
            for info in processes:
                _process_upsert(host, info)
            Host.objects.filter(pk=host.pk).update(last_seen_at=timezone.now())
    except IntegrityError:
        if HostBatch.objects.filter(host=host, session=session, seq=seq).exists():
            return HostIngest(accepted=0, duplicate=True)
        raise
    return HostIngest(accepted=points, duplicate=False)


def _process_upsert(host: Host, info: dict[str, Any]) -> None:
    key = info["key"]
    HostProcess.objects.get_or_create(
        host=host,
        pid=info["pid"],
        start_ticks=key[2],
        defaults={
            "ns_pid": key[1],
            "ancestors": info.get("ancestors") or [],
            "cmdline": info.get("cmdline") or "",
            "user": info.get("user") or "",
            "cgroup": info.get("cgroup") or "",
            "container": info.get("container") or "",
            "env_run_id": info.get("run_id") or "",
            "first_seen": info["time"],
        },
    )


def run_process_record(*, run: Run, session: str, host: str, info: dict[str, Any]) -> None:
    """The run's own identity (client's `process` field at create): idempotent per session."""
    key = info.get("key")
    if not (isinstance(key, list) and len(key) == 3):
        # Never refuse a run for it: an unreadable /proc only means its GPUs are not mapped.
        key = [None, None, None]
    RunProcess.objects.get_or_create(
        run=run,
        session=session,
        defaults={
            "host": host,
            "boot_id": str(key[0] or ""),
            "ns_pid": key[1],
            "start_ticks": key[2],
            "launcher": info.get("launcher"),
            "cuda_visible_devices": str(info.get("cuda_visible_devices") or "")[:200],
            "container": str(info.get("container") or "")[:80],
        },
    )


def check_series(series: dict[str, Any], field: str = "metrics") -> Series:
    """Agent series from the parsed batch: equal lengths, finite epoch times."""
    out: Series = {}
    for key, payload in series.items():
        t = np.asarray(payload.times if payload.times is not None else [], float)
        v = np.asarray(payload.values, float)
        if t.size != v.size:
            raise ServiceError(
                f"times has {t.size} items but values has {v.size}", field=f"{field}.{key}.times"
            )
        if t.size and (not np.isfinite(t).all() or t.min() < 0 or t.max() > 2**32):
            raise ServiceError("times must be epoch seconds", field=f"{field}.{key}.times")
        out[key] = (t, v)
    return out
