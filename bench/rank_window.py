"""The straggler forecast's read of a 1,024-rank window: from the rollup against the raw chunks.

A fresh PostgreSQL database holds 2,000 steps of 1,024 ranks as the client sends them (20-step
batches: 102,400 chunk rows; rank 17 20% slower from step 1,500), inserted directly. Then, in
one process, each measured as CPU time of this process and, apart, of its PostgreSQL backend
(from /proc; wall time on a shared machine measures the neighbours):

* the raw read the forecast made before (`rank_timings_window(last_steps=2000).complete()`:
  60,000 chunk rows, ~1,180 steps) and the detector on it,
* the rollup's first build (one-off: every chunk of the window),
* the steady state, `--rounds` times: one more 20-step batch of every rank arrives (20 s of
  the job; the forecast runs every ~15 s), then the forecast's read (`rank_timings_recent`: fold
  the new chunks, cut the window from the blocks) and the detector on it (~1,950 steps),
* one more detection on the rollup's window with np.argsort and np.partition timed (the sorting
  the method needs, which no reordering of the code removes),
* that the rollup's window equals the raw read's without its row bound, cell for cell,
* ingest (`rank_timings_ingest`, process and backend CPU) with the chunk table's lock trigger
  and with it disabled, `--ingests` calls each, interleaved.

With `--baseline REV`, the detector as git revision REV had it also runs on the raw window (the
path before, whole). The last line printed is one JSON object with the ratios.

    .venv/bin/python -m bench.rank_window --baseline d2884cd
    .venv/bin/python -m bench.rank_window --ranks 256 --rounds 3
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import throwaway_secret_key
from bench.harness import PG_URL, ROOT, VENV_PY, BenchError, Cleanup, log, manage, recreate_db

DB = "runcast_rank_window_bench"
WINDOW = 2_000
BATCH = 20


def django_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"{PG_URL}/{DB}",
        DJANGO_SETTINGS_MODULE="config.settings.base",
        SECRET_KEY=throwaway_secret_key(),
        LOG_LEVEL="WARNING",
        PYTHONPATH=f"{ROOT}:{ROOT / 'client'}",
    )
    env.setdefault("CACHE_URL", os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/8"))
    env.setdefault("CELERY_BROKER_URL", env["CACHE_URL"])
    return env


def backend_cpu(pid: int) -> float:
    """CPU seconds of one PostgreSQL backend (this process's connection)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _detector_at(ref: str) -> Callable[..., Any]:
    """detect_stragglers as the git revision `ref` had it, loaded beside the current one."""
    import types

    source = subprocess.run(
        ["git", "show", f"{ref}:forecasting/estimators/straggler_detect.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("straggler_detect_baseline")
    sys.modules[module.__name__] = module  # its dataclasses look their module up there
    exec(compile(source, f"{ref}:straggler_detect.py", "exec"), module.__dict__)  # noqa: S102
    return module.detect_stragglers  # type: ignore[no-any-return]


def measure(ranks: int, rounds: int, ingests: int, baseline: str | None) -> dict[str, Any]:
    import django

    django.setup()
    import numpy as np
    from django.db import connection

    from forecasting.estimators.straggler_detect import detect_stragglers
    from tracker import rank_timings, services
    from tracker.models import Project, RankTimingChunk
    from tracker.series import pack_steps, pack_timings

    project = Project.objects.create(slug="bench", name="Bench")
    run = services.run_start(
        project=project,
        public_id="window-bench",
        session="rank0",
        started_at=services.from_epoch(1.7e9),
        fields={"world_size": ranks, "total_steps": 10**6},
    ).run
    rng = np.random.default_rng(0)

    def batch(first: int, seq: int) -> list[RankTimingChunk]:
        steps = np.arange(first, first + BATCH)
        rows = []
        for rank in range(ranks):
            slow = 1.2 if rank == 17 and first >= 1500 else 1.0
            c = 0.8 * (1 + rng.normal(0, 0.01, BATCH)) * slow
            rows.append(
                RankTimingChunk(
                    run=run, session=f"pre-{rank}", seq=seq, rank=rank, local_rank=rank % 8,
                    host=f"node-{rank // 8}", n=BATCH, min_step=first, max_step=first + BATCH - 1,
                    steps=pack_steps(steps), compute=pack_timings(c), wait=pack_timings(1 - c),
                    total=pack_timings(np.full(BATCH, np.nan)),
                )
            )  # fmt: skip
        return rows

    log(f"prefill: {WINDOW:,} steps of {ranks:,} ranks in {BATCH}-step chunks")
    for first in range(0, WINDOW, BATCH):
        RankTimingChunk.objects.bulk_create(batch(first, first // BATCH + 1), batch_size=2_000)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE tracker_ranktimingchunk")
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]

    def cpu(fn: Callable[[], Any]) -> tuple[float, float, Any]:
        """(this process's CPU s, the backend's CPU s, fn's value)."""
        t, b = time.process_time(), backend_cpu(pid)
        value = fn()
        return time.process_time() - t, backend_cpu(pid) - b, value

    def detect(w: rank_timings.RankTimings, fn: Callable[..., Any] = detect_stragglers) -> Any:
        # As forecasting.stragglers calls it.
        return fn(
            w.steps,
            w.signal(),
            hosts=w.hosts if any(w.hosts) else None,
            wait_s=w.wait if np.isfinite(w.wait).any() else None,
            total_s=w.total if np.isfinite(w.total).any() else None,
        )

    out: dict[str, Any] = {"ranks": ranks, "chunk_rows": RankTimingChunk.objects.count()}
    log("raw read (the path before), 3 times")
    raw = [cpu(lambda: rank_timings.rank_timings_window(run=run, last_steps=WINDOW).complete())]
    raw += [cpu(lambda: rank_timings.rank_timings_window(run=run, last_steps=WINDOW).complete())]
    raw += [cpu(lambda: rank_timings.rank_timings_window(run=run, last_steps=WINDOW).complete())]
    old_window = raw[0][2]
    out["raw_read_cpu_s"] = min(r[0] for r in raw)
    out["raw_read_db_cpu_s"] = min(r[1] for r in raw)
    out["raw_window_shape"] = list(old_window.compute.shape)
    d_cpu, _, old_report = cpu(lambda: detect(old_window))
    out["raw_detect_cpu_s"] = d_cpu
    if baseline is not None:
        # The detector as it was at `baseline`, on the same window in the same process.
        before = _detector_at(baseline)
        out["baseline"] = baseline
        b_cpu, _, b_report = cpu(lambda: detect(old_window, before))
        out["baseline_detect_cpu_s"] = b_cpu
        out["baseline_same_report"] = b_report.to_dict() == old_report.to_dict()

    log("rollup: first build")
    built = cpu(lambda: rank_timings.rank_rollup_fold(run=run))
    out["rollup_build_cpu_s"], out["rollup_build_db_cpu_s"] = built[0], built[1]

    log(f"rollup: {rounds} rounds of one more batch of every rank, then the forecast's read")
    reads, dbs, detects = [], [], []
    top = WINDOW
    window = None
    for _ in range(rounds):
        RankTimingChunk.objects.bulk_create(batch(top, top // BATCH + 1), batch_size=2_000)
        top += BATCH
        r_cpu, r_db, window = cpu(
            lambda: rank_timings.rank_timings_recent(run=run, last_steps=WINDOW).complete()
        )
        d_cpu, _, report = cpu(functools.partial(detect, window))
        reads.append(r_cpu)
        dbs.append(r_db)
        detects.append(d_cpu)
    assert window is not None
    out["rollup_window_shape"] = list(window.compute.shape)
    out["rollup_read_cpu_s"] = statistics.median(reads)
    out["rollup_read_db_cpu_s"] = statistics.median(dbs)
    out["rollup_detect_cpu_s"] = statistics.median(detects)
    out |= _sorting_share(functools.partial(detect, window))
    out["stragglers_raw"] = [(s.kind, list(s.ranks), s.onset_step) for s in old_report.stragglers]
    out["stragglers_rollup"] = [(s.kind, list(s.ranks), s.onset_step) for s in report.stragglers]

    log("exactness: the raw read without its row bound")
    bound = rank_timings.MAX_WINDOW_ROWS
    rank_timings.MAX_WINDOW_ROWS = 10**9
    try:
        unbounded = rank_timings.rank_timings_window(run=run, last_steps=WINDOW).complete()
    finally:
        rank_timings.MAX_WINDOW_ROWS = bound
    out["exact"] = bool(
        np.array_equal(unbounded.steps, window.steps)
        and np.array_equal(unbounded.ranks, window.ranks)
        and unbounded.hosts == window.hosts
        and all(
            np.array_equal(getattr(unbounded, p), getattr(window, p), equal_nan=True)
            for p in ("compute", "wait", "total")
        )
    )

    out |= _ingest_cost(run, pid, ingests)
    return _ratios(out, baseline)


def _sorting_share(call: Callable[[], Any]) -> dict[str, float]:
    """One detection with np.argsort and np.partition timed: the sorting its method needs
    (the weighted levels' argsorts, the medians' partitions), which no reordering removes."""
    import numpy as np

    spent = {"argsort": [0.0, 0.0], "partition": [0.0, 0.0]}
    originals = {name: getattr(np, name) for name in spent}

    def timed(name: str) -> Callable[..., Any]:
        def inner(a: Any, *args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            value = originals[name](a, *args, **kwargs)
            spent[name][0] += time.process_time() - t
            spent[name][1] += np.size(a)
            return value

        return inner

    for name in spent:
        setattr(np, name, timed(name))
    try:
        t = time.process_time()
        call()
        whole = time.process_time() - t
    finally:
        for name, fn in originals.items():
            setattr(np, name, fn)
    out = {"sorting_detect_cpu_s": whole}
    for name, (cpu, values) in spent.items():
        out[f"sorting_{name}_cpu_s"] = cpu
        out[f"sorting_{name}_million_values"] = values / 1e6
    return out


def _ingest_cost(run: Any, pid: int, ingests: int) -> dict[str, float]:
    """CPU per rank_timings_ingest call with the chunk table's lock trigger and without it."""
    import numpy as np
    from django.db import connection

    from tracker import services

    out: dict[str, float] = {}
    log(f"ingest: {ingests} calls with the chunk table's lock trigger, {ingests} without")
    steps = np.arange(10**7, 10**7 + BATCH)
    timings = services.RankTimingsIn(
        rank=0, local_rank=0, host="node-0", steps=steps, compute=np.full(BATCH, 0.8),
        wait=np.full(BATCH, 0.2), total=np.full(BATCH, np.nan),
    )  # fmt: skip
    spent: dict[str, list[float]] = {"with": [0.0, 0.0], "without": [0.0, 0.0]}
    seq = 0
    for block in range(10):
        for mode in ("with", "without") if block % 2 == 0 else ("without", "with"):
            switch = "ENABLE" if mode == "with" else "DISABLE"
            with connection.cursor() as cursor:
                cursor.execute(
                    f"ALTER TABLE tracker_ranktimingchunk {switch} TRIGGER tracker_rank_chunk_id"
                )
            t, b = time.process_time(), backend_cpu(pid)
            for _ in range(ingests // 10):
                seq += 1
                services.rank_timings_ingest(run=run, session="ingest", seq=seq, timings=timings)
            spent[mode][0] += time.process_time() - t
            spent[mode][1] += backend_cpu(pid) - b
    for mode, (proc, db) in spent.items():
        out[f"ingest_{mode}_lock_us"] = 1e6 * proc / ingests
        out[f"ingest_{mode}_lock_db_us"] = 1e6 * db / ingests
    out["ingest_lock_ratio"] = (out["ingest_with_lock_us"] + out["ingest_with_lock_db_us"]) / (
        out["ingest_without_lock_us"] + out["ingest_without_lock_db_us"]
    )
    return out


def _ratios(out: dict[str, Any], baseline: str | None) -> dict[str, Any]:
    out["raw_total_cpu_s"] = out["raw_read_cpu_s"] + out["raw_detect_cpu_s"]
    if baseline is not None:
        out["before_total_cpu_s"] = out["raw_read_cpu_s"] + out["baseline_detect_cpu_s"]
    out["rollup_total_cpu_s"] = out["rollup_read_cpu_s"] + out["rollup_detect_cpu_s"]
    out["read_ratio"] = out["rollup_read_cpu_s"] / out["raw_read_cpu_s"]
    out["read_with_db_ratio"] = (out["rollup_read_cpu_s"] + out["rollup_read_db_cpu_s"]) / (
        out["raw_read_cpu_s"] + out["raw_read_db_cpu_s"]
    )
    out["total_ratio"] = out["rollup_total_cpu_s"] / out["raw_total_cpu_s"]
    if baseline is not None:
        out["detect_ratio_vs_baseline"] = out["raw_detect_cpu_s"] / out["baseline_detect_cpu_s"]
        out["total_ratio_vs_before"] = out["rollup_total_cpu_s"] / out["before_total_cpu_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ingests", type=int, default=2000, help="ingest calls per mode")
    parser.add_argument(
        "--baseline", help="also time detect_stragglers as this git revision had it (e.g. main)"
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.ranks, args.rounds, args.ingests, args.baseline)))
        return 0
    cleanup = Cleanup()
    try:
        env = django_env()
        cleanup.databases.append(DB)
        recreate_db(DB)
        log("migrating a fresh database")
        manage(env, "migrate", "--noinput")
        cmd = [str(VENV_PY), "-m", "bench.rank_window", "--measure", *(argv or sys.argv[1:])]
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise BenchError(f"the measurement failed (exit {done.returncode})")
        result = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        cleanup.run()
    print(
        f"{result['ranks']:,} ranks, {result['chunk_rows']:,} chunk rows\n"
        f"raw read     {1000 * result['raw_read_cpu_s']:7.0f} ms CPU"
        f" (+{1000 * result['raw_read_db_cpu_s']:.0f} ms PostgreSQL)"
        f" {result['raw_window_shape']}, detect {1000 * result['raw_detect_cpu_s']:.0f} ms\n"
        f"rollup read  {1000 * result['rollup_read_cpu_s']:7.0f} ms CPU"
        f" (+{1000 * result['rollup_read_db_cpu_s']:.0f} ms PostgreSQL)"
        f" {result['rollup_window_shape']}, detect {1000 * result['rollup_detect_cpu_s']:.0f} ms\n"
        f"first build  {1000 * result['rollup_build_cpu_s']:7.0f} ms CPU,"
        f" exact: {result['exact']}\n"
        f"ingest per call (process + PostgreSQL): with the lock trigger"
        f" {result['ingest_with_lock_us']:.0f} + {result['ingest_with_lock_db_us']:.0f} µs,"
        f" without {result['ingest_without_lock_us']:.0f}"
        f" + {result['ingest_without_lock_db_us']:.0f} µs"
    )
    print(
        f"sorting in one detection: argsort {result['sorting_argsort_million_values']:.1f} M values"
        f" {1000 * result['sorting_argsort_cpu_s']:.0f} ms, partition"
        f" {result['sorting_partition_million_values']:.1f} M values"
        f" {1000 * result['sorting_partition_cpu_s']:.0f} ms, of"
        f" {1000 * result['sorting_detect_cpu_s']:.0f} ms"
    )
    if "baseline" in result:
        print(
            f"detector at {result['baseline']} on the raw window:"
            f" {1000 * result['baseline_detect_cpu_s']:.0f} ms (same report:"
            f" {result['baseline_same_report']}); before (raw read + that detector)"
            f" {result['before_total_cpu_s']:.2f} s, now {result['rollup_total_cpu_s']:.2f} s"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
