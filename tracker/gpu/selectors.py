"""The GPU telemetry reads: a host by name, its series, and the per-batch summaries."""

from __future__ import annotations

import json
import struct
import zlib
from collections import defaultdict

import numpy as np

from tracker.gpu.models import Host, HostBatch
from tracker.models import Project
from tracker.services import NotFound

# key -> (epoch times, values): what the agent sends, what a batch packs, what reads return.
Series = dict[str, tuple[np.ndarray, np.ndarray]]


def host_for_token(*, project: Project, name: str) -> Host:
    host = Host.objects.filter(project=project, name=name).first()
    if host is None:
        raise NotFound(f"no host {name!r} in this project (start the agent to register it)")
    return host


def host_series(*, host: Host, t0: float, t1: float, prefix: str = "") -> Series:
    """Every key's points in [t0, t1] (concatenated over batches, time-ordered).

    A host-day is ~8,640 batches of ~100 keys each. Unpacking them one key at a time cost
    seconds of Python per read; an agent's batches mostly share one layout (the same keys
    and counts), so the batches of each distinct layout are stacked into one matrix and each
    key is cut out of it once.
    """
    # Per distinct layout: the wanted keys' (key, n) and the float positions that hold them.
    layouts: dict[bytes, tuple[list[tuple[str, int]], np.ndarray]] = {}
    picked: dict[bytes, list[np.ndarray]] = {}
    rows = HostBatch.objects.filter(host=host, t0__lte=t1, t1__gte=t0).values_list(
        "data", flat=True
    )
    for blob in rows.iterator(chunk_size=500):
        raw = zlib.decompress(bytes(blob))
        (length,) = struct.unpack_from("<I", raw)
        layout = raw[4 : 4 + length]
        if layout not in layouts:
            keys, where, offset = [], [], 0
            for key, n in json.loads(layout):
                if n and key.startswith(prefix):
                    keys.append((key, n))
                    where.append(np.arange(offset, offset + 2 * n))
                offset += 2 * n
            layouts[layout] = (keys, np.concatenate(where) if where else np.arange(0))
            picked[layout] = []
        body = np.frombuffer(raw, "<f8", offset=4 + length)
        picked[layout].append(body[layouts[layout][1]])
    columns: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for layout, same in picked.items():
        keys, _ = layouts[layout]
        matrix = np.vstack(same)  # one row per batch: each wanted key's times, then its values
        offset = 0
        for key, n in keys:
            ts, vs = columns.setdefault(key, ([], []))
            ts.append(matrix[:, offset : offset + n].ravel())
            vs.append(matrix[:, offset + n : offset + 2 * n].ravel())
            offset += 2 * n
    out: Series = {}
    for key, (ts, vs) in columns.items():
        t = np.concatenate(ts)
        v = np.concatenate(vs)
        order = np.argsort(t, kind="stable")
        keep = (t[order] >= t0) & (t[order] <= t1)
        out[key] = (t[order][keep], v[order][keep])
    return out


def host_util_summary(
    *, host: Host, t0: float, t1: float
) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per GPU: batch mid-times, mean and max utilisation, from the batches' summaries."""
    rows = HostBatch.objects.filter(host=host, t0__lte=t1, t1__gte=t0).order_by("t0")
    acc: dict[int, tuple[list[float], list[float], list[float]]] = {}
    for b0, b1, summary in rows.values_list("t0", "t1", "summary").iterator(chunk_size=2000):
        for gpu, (mean, peak) in summary.get("util", {}).items():
            times, means, peaks = acc.setdefault(int(gpu), ([], [], []))
            times.append((b0 + b1) / 2)
            means.append(mean)
            peaks.append(peak)
    return {g: (np.array(a), np.array(b), np.array(c)) for g, (a, b, c) in acc.items()}


def host_sm_by_pid(*, host: Host, t0: float, t1: float) -> dict[int, float]:
    """SM-percent-seconds per pid on the host's GPUs in [t0, t1], from the batch summaries."""
    totals: dict[int, float] = defaultdict(float)
    rows = HostBatch.objects.filter(host=host, t0__lte=t1, t1__gte=t0)
    for summary in rows.values_list("summary", flat=True).iterator(chunk_size=2000):
        for pid, amount in summary.get("sm", {}).items():
            totals[int(pid)] += amount
    return dict(totals)
