"""How many active runs one Celery worker process keeps forecast at the default cadence.

A live run is forecast at most once per 15 s (the debounce) and liveness-checked once a minute
(the sweep). One worker process does one task at a time, so it keeps up with

    runs = 15 s / (forecast time + liveness time / 4)

runs of a given size. This measures both times on PostgreSQL, in this one process (what a
prefork child does, minus the broker round trip), for runs of `--sizes` points per key with
three keys (loss, lr, grad_norm): the loss values are real curves from `--data` (the shared
curve set's runs, interpolated onto the run's steps, a different curve for each run), logged
at one step a second in batches of 10,000 points. Each timed computation sees 15 s of new
points first, as a live run's would; the median of `--repeat` computations per run is taken.

    .venv/bin/python bench/capacity.py                       # 10k, 100k, 1M points per key
    .venv/bin/python bench/capacity.py --sizes 50000 --runs 5
    .venv/bin/python bench/capacity.py --sizes 10000 --runs 1 --watched-days 3   # watched 3 days

Needs PostgreSQL (BENCH_PG_URL); the database is BENCH_DB (default runcast_capacity), dropped
at the end. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import throwaway_secret_key

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402  (database helpers)

DB = os.environ.get("BENCH_DB", "runcast_capacity")
DATA = ROOT.parent / "shared" / "data" / "curves"
CADENCE_S = 15.0  # forecasting.tasks.FORECAST_DEBOUNCE_S
SWEEP_S = 60.0  # the sweep-active-runs beat entry
BATCH = 10_000
T0 = 1.7e9


def setup_django() -> None:
    os.environ.update(
        DATABASE_URL=f"{harness.PG_URL}/{DB}",
        DJANGO_SETTINGS_MODULE="config.settings.base",
        SECRET_KEY=throwaway_secret_key(),
        CELERY_BROKER_URL="memory://",
        CACHE_URL="locmemcache://",
        LOG_LEVEL="WARNING",
    )
    import django

    django.setup()
    from tracker.signals import run_finished, run_ingested

    run_ingested.receivers.clear()  # the bench calls the services itself
    run_finished.receivers.clear()


def real_curves(directory: Path) -> list[Any]:
    import numpy as np

    from curveset.load import load_runs

    curves = []
    for run in load_runs(directory):
        loss = run.column("train_loss")
        ok = np.isfinite(loss)
        if ok.sum() >= 50:
            curves.append(loss[ok])
    if not curves:
        raise SystemExit(f"no curves with train_loss in {directory}")
    return curves


def build_run(project: Any, name: str, points: int, curve: Any) -> Any:
    import numpy as np

    from tracker.services import SeriesIn, batch_ingest, from_epoch, run_start

    run = run_start(
        project=project,
        public_id=name,
        session="s1",
        started_at=from_epoch(T0),
        fields={"name": name, "total_steps": points * 2, "world_size": 64},
    ).run
    steps = np.arange(points, dtype=np.int64)
    loss = np.interp(np.linspace(0, len(curve) - 1, points), np.arange(len(curve)), curve)
    loss = loss + np.random.default_rng(points).normal(0, 0.002, points)
    lr = 3e-4 * np.minimum(1.0, (steps + 1) / 2000.0)
    grad = 1.0 + 0.1 * np.sin(steps / 500.0)
    for seq, lo in enumerate(range(0, points, BATCH), start=1):
        part = slice(lo, lo + BATCH)
        times = T0 + steps[part].astype(float)
        series = [
            SeriesIn(key, steps[part], values[part], times)
            for key, values in (("loss", loss), ("lr", lr), ("grad_norm", grad))
        ]
        batch_ingest(run=run, session="s1", seq=seq, series=series, events=[], heartbeat=None)
    run.refresh_from_db()
    return run, (loss, lr, grad)


def watched(run: Any, points: int, days: float) -> None:
    """The ETA forecasts a live run watched for `days` has stored by now, one per CADENCE_S
    (retention keeps a week in full): what a forecast that reads its own history pays for."""
    from datetime import UTC, datetime

    from forecasting.models import Forecast

    end = T0 + points  # the run's clock: a step a second
    n = int(days * 86400 / CADENCE_S)
    rows = (
        Forecast(
            run=run,
            kind=Forecast.Kind.ETA,
            computed_at=datetime.fromtimestamp(end - (n - i) * CADENCE_S, tz=UTC),
            segment=1,
            input_last_step=-(n - i),  # before the timed forecasts' own steps
            finish_p50=end + 2 * points + 0.01 * i,
            data={},
        )
        for i in range(n)
    )
    Forecast.objects.bulk_create(rows, batch_size=5000)


def db_backend_cpu() -> float:
    """CPU seconds the PostgreSQL backend serving this process has used (same machine)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Clock:
    """Wall time, this process's CPU and its database backend's CPU over a block."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu, self.db = time.perf_counter(), time.process_time(), db_backend_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu
        self.db = db_backend_cpu() - self.db


def time_run(run: Any, arrays: tuple[Any, ...], points: int, repeat: int) -> dict[str, float]:
    import numpy as np

    from forecasting import compute, liveness
    from tracker.services import SeriesIn, batch_ingest, from_epoch

    loss, lr, grad = arrays
    seq = points // BATCH + 2
    step = points
    forecasts: list[Clock] = []
    checks: list[Clock] = []
    for _ in range(repeat + 1):
        # 15 s of a live run: 15 new steps, then the computation the debounce schedules.
        new = np.arange(step, step + int(CADENCE_S), dtype=np.int64)
        times = T0 + new.astype(float)
        last = loss[-1]
        series = [
            SeriesIn("loss", new, np.full(new.size, last), times),
            SeriesIn("lr", new, np.full(new.size, lr[-1]), times),
            SeriesIn("grad_norm", new, np.full(new.size, grad[-1]), times),
        ]
        batch_ingest(run=run, session="s1", seq=seq, series=series, events=[], heartbeat=None)
        seq, step = seq + 1, step + new.size
        now = from_epoch(float(times[-1]) + 1.0)
        with Clock() as clock:
            compute.forecast_compute(run_id=run.pk, now=now)
        forecasts.append(clock)
        with Clock() as clock:
            liveness.run_check_liveness(run_id=run.pk, now=now)
        checks.append(clock)
    # The first computation of a process also pays one-time imports and caches: left out.
    f, lv = forecasts[1:], checks[1:]
    return {
        "forecast_s": statistics.median(c.wall for c in f),
        "forecast_cpu_s": statistics.median(c.cpu + c.db for c in f),
        "forecast_db_cpu_s": statistics.median(c.db for c in f),
        "liveness_s": statistics.median(c.wall for c in lv),
        "liveness_cpu_s": statistics.median(c.cpu + c.db for c in lv),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--runs", type=int, default=3, help="runs per size")
    parser.add_argument("--repeat", type=int, default=4, help="timed computations per run")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--watched-days",
        type=float,
        default=0.0,
        help="give each run the ETA forecasts of this many days of being watched (one per 15 s)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    curves = real_curves(args.data)
    harness.recreate_db(DB)
    rows = []
    try:
        from django.core.management import call_command

        setup_django()
        call_command("migrate", verbosity=0)
        from tracker.models import Project

        project = Project.objects.create(slug="capacity", name="Capacity", gpu_hour_price=2.0)
        pick = 0
        for points in sizes:
            timings = []
            for r in range(args.runs):
                curve = curves[(pick * 37) % len(curves)]  # spread over the set
                pick += 1
                harness.log(f"{points:,} points per key: run {r + 1}/{args.runs}")
                run, arrays = build_run(project, f"n{points}-{r}", points, curve)
                if args.watched_days > 0:
                    watched(run, points, args.watched_days)
                timings.append(time_run(run, arrays, points, args.repeat))

            def med(name: str, timings: list[dict[str, float]] = timings) -> float:
                return statistics.median(t[name] for t in timings)

            # Per run and 15 s: a forecast, and a quarter of a liveness check.
            wall = med("forecast_s") + med("liveness_s") * CADENCE_S / SWEEP_S
            cpu = med("forecast_cpu_s") + med("liveness_cpu_s") * CADENCE_S / SWEEP_S
            rows.append(
                {
                    "points_per_key": points,
                    "forecast_ms": med("forecast_s") * 1e3,
                    # CPU of this process plus its PostgreSQL backend: the work itself, which
                    # a machine whose cores are not shared with other jobs turns into time.
                    "forecast_cpu_ms": med("forecast_cpu_s") * 1e3,
                    "forecast_db_cpu_ms": med("forecast_db_cpu_s") * 1e3,
                    "liveness_ms": med("liveness_s") * 1e3,
                    "liveness_cpu_ms": med("liveness_cpu_s") * 1e3,
                    "runs_per_worker_wall": CADENCE_S / wall,
                    "runs_per_worker_cpu": CADENCE_S / cpu,
                }
            )
    finally:
        from django.db import connections

        connections.close_all()
        harness.drop_db(DB)
    print(f"\nOne worker process, one forecast per run per {CADENCE_S:g} s; {os.cpu_count()} CPUs")
    print(
        f"{'points/key':>11s} {'forecast wall':>14s} {'CPU (of it DB)':>16s} {'liveness wall':>14s}"
        f" {'CPU':>6s} {'runs/worker: wall':>18s} {'CPU':>6s}"
    )
    for row in rows:
        print(
            f"{row['points_per_key']:11,d} {row['forecast_ms']:11.0f} ms"
            f" {row['forecast_cpu_ms']:7.0f} ({row['forecast_db_cpu_ms']:3.0f}) ms"
            f" {row['liveness_ms']:11.0f} ms {row['liveness_cpu_ms']:6.0f}"
            f" {row['runs_per_worker_wall']:18.0f} {row['runs_per_worker_cpu']:6.0f}"
        )
    print(
        "  runs/worker: 15 s over the time one run takes per 15 s (a forecast and a quarter of a"
        " liveness check), from the wall clock here and from the CPU it used (a core of its own)"
    )
    print(f"  load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(
        json.dumps(
            {
                "rows": rows,
                "runs_per_size": args.runs,
                "curves": len(curves),
                "watched_days": args.watched_days,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
