"""GPU telemetry storage: ingest of 128 hosts x 8 GPUs x 1 Hz, and the read of one host-day.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runcast_gpu .venv/bin/python -m bench.gpu_store

Drives tracker.gpu directly (the API's parsing is the same as for runs, measured by
bench/ingest.py). Each host sends what `runcast agent` sends: per GPU util (6 NVML samples a
second), mem_util, mem_used, power_w, sm_clock, temp, throttle, and two processes with sm, mem,
mem_used, in batches of `--batch-s` seconds (the agent's RUNCAST_FLUSH_INTERVAL). Baseline in the
same process: the same points stored one row per key per batch (the MetricChunk layout), to
show why a host batch is one row. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
import zlib

import numpy as np

FIELDS = ("mem_util", "mem_used", "power_w", "sm_clock", "temp", "throttle")


def setup(database_url: str | None) -> None:
    db = database_url or f"sqlite:///{tempfile.gettempdir()}/runcast-gpustore-{os.getpid()}.db"
    os.environ["DATABASE_URL"] = db
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.flagstream_settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def batch(t0: float, seconds: int, gpus: int, rng: np.random.Generator) -> dict:
    series = {}
    sub = t0 + np.arange(seconds * 6) / 6.0
    whole = t0 + np.arange(seconds, dtype=float)
    for g in range(gpus):
        series[f"gpu/{g}/util"] = (sub, rng.uniform(0, 100, sub.size))
        for field in FIELDS:
            series[f"gpu/{g}/{field}"] = (whole, rng.uniform(0, 1000, seconds))
        for pid in (4000 + g, 9000):
            for field in ("sm", "mem", "mem_used"):
                series[f"gpu/{g}/proc/{pid}/{field}"] = (whole, rng.uniform(0, 100, seconds))
    return series


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=128)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=60, help="simulated seconds of ingest")
    parser.add_argument("--batch-s", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    setup(os.environ.get("DATABASE_URL"))
    from tracker.gpu import selectors, services
    from tracker.models import Host, HostBatch, Project

    rng = np.random.default_rng(0)
    project = Project.objects.create(slug=f"bench-{uuid.uuid4().hex[:8]}", name="bench")
    hosts = [
        services.host_register(project=project, name=f"node-{i}", boot_id="b", gpus=[])[0]
        for i in range(args.hosts)
    ]
    start = 1_800_000_000.0
    batches = args.seconds // args.batch_s
    payloads = [batch(start + k * args.batch_s, args.batch_s, args.gpus, rng) for k in range(4)]
    points = sum(t.size for t, _ in payloads[0].values())
    began = time.perf_counter()
    for k in range(batches):
        for host in hosts:
            services.host_batch_ingest(
                host=host, session="s", seq=k, series=payloads[k % 4], processes=[]
            )
    ingest_s = time.perf_counter() - began
    realtime = args.seconds / ingest_s

    # Baseline: one row per key per batch, the same points, for one host's share.
    base_host = Host.objects.create(project=project, name="baseline")
    began = time.perf_counter()
    seq = 0
    for k in range(batches):
        for key, column in payloads[k % 4].items():
            services.host_batch_ingest(
                host=base_host, session="s", seq=seq, series={key: column}, processes=[]
            )
            seq += 1
    per_key_s = (time.perf_counter() - began) * args.hosts

    # One host-day: 86,400 s in agent batches, then read GPU 0's utilisation and everything.
    day = Host.objects.create(project=project, name="day")
    rows = []
    for k in range(86_400 // args.batch_s):
        series = payloads[k % 4]
        shift = k * args.batch_s - (k % 4) * args.batch_s
        shifted = {key: (t + shift, v) for key, (t, v) in series.items()}
        rows.append(
            HostBatch(
                host=day,
                session="s",
                seq=k,
                t0=start + k * args.batch_s,
                t1=start + (k + 1) * args.batch_s - 1,
                keys=sorted(shifted),
                data=services.pack(shifted),
                summary=services.util_summary(shifted),
            )
        )
    HostBatch.objects.bulk_create(rows, batch_size=500)
    # Where a raw read's time goes: the rows' bytes alone, then inflating and parsing them.
    began = time.perf_counter()
    blobs = list(HostBatch.objects.filter(host=day).values_list("data", flat=True))
    fetch_s = time.perf_counter() - began
    began = time.perf_counter()
    for blob in blobs:
        zlib.decompress(bytes(blob))
    inflate_s = time.perf_counter() - began
    del blobs
    began = time.perf_counter()
    one = selectors.host_series(host=day, t0=start, t1=start + 86_400, prefix="gpu/0/util")
    read_one_s = time.perf_counter() - began
    began = time.perf_counter()
    every = selectors.host_series(host=day, t0=start, t1=start + 86_400)
    read_all_s = time.perf_counter() - began
    began = time.perf_counter()
    heat = selectors.host_util_summary(host=day, t0=start, t1=start + 86_400)
    read_summary_s = time.perf_counter() - began
    size = sum(len(r.data) for r in rows)
    result = {
        "gpu_store_hosts": args.hosts,
        "gpu_store_points_per_host_s": points / args.batch_s,
        "gpu_store_ingest_x_realtime": round(realtime, 2),
        "gpu_store_batches_per_s": round(batches * args.hosts / ingest_s, 1),
        "gpu_store_per_key_rows_x_slower": round(per_key_s / ingest_s, 1),
        "gpu_store_host_day_rows": len(rows),
        "gpu_store_host_day_mb": round(size / 1e6, 1),
        "gpu_store_read_host_day_fetch_bytes_s": round(fetch_s, 3),
        "gpu_store_read_host_day_inflate_s": round(inflate_s, 3),
        "gpu_store_read_host_day_gpu0_util_s": round(read_one_s, 3),
        "gpu_store_read_host_day_all_s": round(read_all_s, 3),
        "gpu_store_read_host_day_summary_s": round(read_summary_s, 3),
        "gpu_store_read_points": int(one["gpu/0/util"][0].size),
        "gpu_store_summary_gpus": len(heat),
        "gpu_store_read_keys_all": len(every),
        "database": "postgresql" if "postgres" in os.environ["DATABASE_URL"] else "sqlite",
    }
    if not args.json:
        for key, value in result.items():
            print(f"{key:<40} {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
