"""Database bytes per run-day on PostgreSQL, before and after retention.

One run-day at the client's default cadences, written through the real services into a fresh
PostgreSQL database:

* ingest: one batch a second (the client's flush interval), one step a second with `--keys`
  keys (loss, lr, grad_norm, tokens_per_s, ...), a heartbeat every 15 s and a checkpoint event
  every 30 min, each batch through `tracker.services.batch_ingest` as the API calls it;
* forecasts: one computation per 15 s (the debounce). `forecast_compute` runs for real
  `--computations` times spread over the day (ETA, loss, deadline and CONDITIONS rows and
  their JSON, flags as they come); the other computations of the day are stored as copies of
  those rows (same payloads, their own times and input steps), as 5,760 real computations
  would take an hour here.

Then per table: `pg_total_relation_size` (heap, TOAST and indexes) after `VACUUM FULL`, row
counts, before retention, after it ran as it will once the day is older than every window
(`now` = the day's end + 8 days), and after compaction merged the chunks retention released
(tracker/compaction.py): the last is what each further day of a long run costs
(`runcast_mb_per_run_day`; `mb_per_run_day_after` is the same day uncompacted, in the same
process). Every point is read back before and after compaction and compared bit for bit.

The same points (read back from Runcast) are then logged to a real `mlflow server` of .venv on
PostgreSQL (1,000 per `log_batch`, MLflow's limit) and its metric tables measured the same way
(`mlflow_mb_per_run_day`; MLflow has no retention or compaction). `--no-mlflow` skips it.

    .venv/bin/python bench/growth.py                  # 1 day, 4 keys
    .venv/bin/python bench/growth.py --hours 6 --keys 8
    .venv/bin/python bench/growth.py --noisy --no-mlflow   # every value noisy, a jittery clock

Needs PostgreSQL (BENCH_PG_URL, default postgres://postgres@127.0.0.1:5432); the database is
BENCH_DB (default runcast_growth), dropped at the end. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import throwaway_secret_key

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402  (database helpers)

DB = os.environ.get("BENCH_DB", "runcast_growth")
MLFLOW_DB = os.environ.get("BENCH_MLFLOW_DB", "runcast_growth_mlflow")
# Where an MLflow server keeps metric points: every point, and each key's latest.
MLFLOW_TABLES = ("metrics", "latest_metrics")
KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "grad_norm/attn", "mfu", "step_ms", "ppl")
TABLES = (
    "tracker_ingestbatch",
    "tracker_metricchunk",
    "tracker_event",
    "forecasting_forecast",
    "forecasting_conditionreading",
    "forecasting_flag",
)
T0 = 1.7e9  # the simulated day starts here (long ago: retention sees it as old)
HEARTBEAT_S, CHECKPOINT_S, FORECAST_S = 15, 1800, 15


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

    # Nothing consumes the forecast tasks here: the bench computes forecasts itself.
    run_ingested.receivers.clear()
    run_finished.receivers.clear()


def points_read() -> dict[str, tuple[bytes, bytes, bytes]]:
    """Every stored point of the run, per key, as read (storage order, every attempt): what a
    forecast or MLflow's get_metric_history loads, timed before and after compaction."""
    from tracker import selectors
    from tracker.models import Run

    run = Run.objects.get(public_id="day")
    out = {}
    for key in selectors.series_keys(run=run):
        s = selectors.series_load(run=run, key=key, resolve=False)
        out[key] = (s.steps.tobytes(), s.values.tobytes(), s.times.tobytes())
    return out


def compact() -> dict[str, Any]:
    """Compaction until done, as the beat sweep does it; its wall time and rows merged."""
    from tracker import compaction

    began, merged, units = time.perf_counter(), 0, 0
    while True:
        result = compaction.chunks_compact(budget_s=600)
        merged, units = merged + result.merged, units + result.units
        if result.failed:
            raise SystemExit(f"compaction failed on {result.failed} series (see the log)")
        if result.done:
            break
    seconds = time.perf_counter() - began
    return {"compaction_s": seconds, "chunks_merged": merged, "compaction_units": units}


def mlflow_sizes(points: dict[str, tuple[bytes, bytes, bytes]]) -> dict[str, dict[str, int]]:
    """Log the same points to a real `mlflow server` and measure its metric tables."""
    import numpy as np

    from bench.mlflow_throughput import mlflow_server_on

    for name in [k for k in os.environ if k.startswith("MLFLOW_")]:
        del os.environ[name]
    import mlflow
    from mlflow.entities import Metric

    rows = []
    for key, (steps, values, times) in points.items():
        stamps = np.rint(np.frombuffer(times) * 1000).astype(np.int64)
        for v, t, st in zip(
            np.frombuffer(values).tolist(),
            stamps.tolist(),
            np.frombuffer(steps, dtype=np.int64).tolist(),
            strict=True,
        ):
            rows.append(Metric(key, v, t, st))
    with mlflow_server_on(MLFLOW_DB) as (url, _):
        mlflow.set_tracking_uri(url)
        client = mlflow.MlflowClient()
        run = client.create_run(client.create_experiment("growth"))
        harness.log(f"mlflow: logging {len(rows):,} points to `mlflow server`")
        for i in range(0, len(rows), 1000):
            client.log_batch(run.info.run_id, metrics=rows[i : i + 1000])
        stored = sum(len(client.get_metric_history(run.info.run_id, k)) for k in points)
        if stored != len(rows):
            raise SystemExit(f"mlflow stored {stored} of {len(rows)} points")
        out = {}
        for table in MLFLOW_TABLES:
            harness.pg_admin_db(MLFLOW_DB, f"VACUUM FULL {table}")
            # Table names are this module's constants, never input.
            query = f"SELECT pg_total_relation_size('{table}'), count(*) FROM {table}"  # noqa: S608
            ((size, count),) = harness.pg_query(MLFLOW_DB, query)
            out[table] = {"bytes": int(size), "rows": int(count)}
    return out


def _wait_for_snapshots(cur: Any, timeout_s: float = 300.0) -> None:
    """Wait until no other session of this database holds a snapshot (autovacuum's ANALYZE of
    the tables just written, probably): VACUUM FULL keeps every row deleted after such a
    snapshot began, and one measurement counted 14 MB of deleted forecasts as kept."""
    began = time.monotonic()
    deadline = began + timeout_s
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL"
    )
    while time.monotonic() < deadline:
        cur.execute(query)
        if cur.fetchone()[0] == 0:
            if time.monotonic() - began > 1.0:
                waited = time.monotonic() - began
                harness.log(f"waited {waited:.0f} s for another session's snapshot to end")
            return
        time.sleep(1.0)
    harness.log("another session still holds a snapshot: deleted rows may be counted")


def sizes() -> dict[str, dict[str, int]]:
    from django.db import connection

    out = {}
    with connection.cursor() as cur:
        _wait_for_snapshots(cur)
        for table in TABLES:
            # Table names are this module's constants, never input.
            cur.execute(f"VACUUM FULL {table}")
            count = f"SELECT pg_total_relation_size(%s), count(*) FROM {table}"  # noqa: S608
            cur.execute(count, [table])
            size, rows = cur.fetchone()
            out[table] = {"bytes": int(size), "rows": int(rows)}
    return out


def simulate(hours: float, keys: int, computations: int, noisy: bool = False) -> dict[str, Any]:
    import numpy as np
    from django.db import connection

    from forecasting import compute
    from forecasting.models import Forecast
    from tracker.models import Deadline, Project
    from tracker.services import EventIn, SeriesIn, batch_ingest, from_epoch, run_start

    project = Project.objects.create(slug="growth", name="Growth", gpu_hour_price=2.0)
    deadline = Deadline.objects.create(
        project=project, slug="d", name="Release", cutoff=from_epoch(T0 + 40 * 86400)
    )
    seconds = int(hours * 3600)
    run = run_start(
        project=project,
        public_id="day",
        session="s1",
        started_at=from_epoch(T0),
        fields={"name": "day", "total_steps": 30 * 86400, "world_size": 64},
        deadline_slug=deadline.slug,
    ).run
    names = KEYS[:keys] if keys <= len(KEYS) else [*KEYS, *(f"k{i}" for i in range(keys))][:keys]
    rng = np.random.default_rng(0)
    real_at = set(np.linspace(FORECAST_S, seconds, computations).astype(int) // FORECAST_S)
    samples: list[list[Forecast]] = []
    began = time.time()
    for t in range(seconds):
        step = np.array([t], dtype=np.int64)
        when = np.array([T0 + t + 0.5])
        loss = 2.0 + 8.0 * (t + 10.0) ** -0.3 + rng.normal(0, 0.01)
        values = [loss] + [1e-3 * (k + 1) for k in range(1, len(names))]
        if noisy:
            # Every key noisy and the clock jittered: what compresses least.
            when = when + rng.uniform(0, 0.05)
            values = [loss] + [v * (1 + rng.normal(0, 0.01)) for v in values[1:]]
        series = [
            SeriesIn(name, step, np.array([v]), when) for name, v in zip(names, values, strict=True)
        ]
        events = []
        if t and t % CHECKPOINT_S == 0:
            events = [EventIn("checkpoint", t, from_epoch(T0 + t), {"path": f"ckpt/{t}"})]
        heartbeat = from_epoch(T0 + t) if t % HEARTBEAT_S == 0 else None
        batch_ingest(
            run=run, session="s1", seq=t + 1, series=series, events=events, heartbeat=heartbeat
        )
        if t and t % FORECAST_S == 0 and t // FORECAST_S in real_at:
            compute.forecast_compute(run_id=run.pk, now=from_epoch(T0 + t + 1))
            samples.append(
                list(Forecast.objects.filter(run=run, computed_at=from_epoch(T0 + t + 1)))
            )
        if t and t % 3600 == 0:
            harness.log(f"  {t // 3600} h simulated ({(time.time() - began) / t * 1e3:.1f} ms/s)")
    # The run's batches arrived over the day, not during this script's minutes.
    with connection.cursor() as cur:
        cur.execute("UPDATE tracker_ingestbatch SET received_at = to_timestamp(%s + seq - 1)", [T0])
    real = sum(1 for _ in samples)
    copies = _copy_forecasts(run, samples, seconds)
    return {"run_id": run.pk, "real_computations": real, "copied_rows": copies}


def _copy_forecasts(run: Any, samples: list[list[Any]], seconds: int) -> int:
    """Fill every 15 s of the day with a computation's rows, copied from the nearest real one."""
    from forecasting.models import Forecast
    from tracker.services import from_epoch

    if not samples:
        return 0
    taken = {f.computed_at for rows in samples for f in rows}
    rows = []
    for i, t in enumerate(range(FORECAST_S, seconds, FORECAST_S)):
        at = from_epoch(T0 + t + 1)
        if at in taken:
            continue
        template = samples[min(len(samples) - 1, i * len(samples) // (seconds // FORECAST_S))]
        for f in template:
            rows.append(
                Forecast(
                    run=run,
                    kind=f.kind,
                    computed_at=at,
                    segment=f.segment,
                    # Unique per computation, as the real key (the input step) is.
                    input_last_step=-t,
                    finish_p10=f.finish_p10,
                    finish_p50=f.finish_p50,
                    finish_p90=f.finish_p90,
                    data=f.data,
                )
            )
    Forecast.objects.bulk_create(rows, batch_size=2000)
    return len(rows) + _copy_readings(run, seconds)


def _copy_readings(run: Any, seconds: int) -> int:
    """The hysteresis' reading of every 15 s of the day, copied from the newest real one."""
    from forecasting.models import ConditionReading
    from tracker.services import from_epoch

    real = list(ConditionReading.objects.filter(run=run).order_by("second"))
    if not real:
        return 0
    taken = {r.second for r in real}
    rows = [
        ConditionReading(
            run=run,
            segment=real[-1].segment,
            second=int(T0 + t + 1),
            computed_at=from_epoch(T0 + t + 1),
            found=real[-1].found,
            deadline_p=real[-1].deadline_p,
            input_step=t,
        )
        for t in range(FORECAST_S, seconds, FORECAST_S)
        if int(T0 + t + 1) not in taken
    ]
    ConditionReading.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


def report(
    before: dict[str, Any], retained: dict[str, Any], after: dict[str, Any], hours: float
) -> dict[str, Any]:
    per_day = 24.0 / hours
    print(f"\nDatabase bytes per run-day (simulated {hours:g} h, scaled x{per_day:g}), PostgreSQL")
    print(f"{'':28s} {'fresh':>18s} | {'after retention':>18s} | {'and compaction':>18s}")
    head = f"{'rows':>10s} {'MB':>7s}"
    print(f"{'table':28s} {head} | {head} | {head}")
    totals = [0.0, 0.0, 0.0]
    for table in TABLES:
        cells = []
        for i, state in enumerate((before, retained, after)):
            totals[i] += state[table]["bytes"] * per_day
            rows, mb = state[table]["rows"] * per_day, state[table]["bytes"] * per_day / 1e6
            cells.append(f"{rows:10,.0f} {mb:7.1f}")
        print(f"{table:28s} {' | '.join(cells)}")
    mb = [t / 1e6 for t in totals]
    print(f"{'total MB':28s} {mb[0]:18.1f} | {mb[1]:18.1f} | {mb[2]:18.1f}")
    print(
        f"  per run-month: {mb[0] * 30 / 1e3:.2f} GB fresh, {mb[1] * 30 / 1e3:.2f} GB after"
        f" retention, {mb[2] * 30 / 1e3:.2f} GB after compaction"
    )
    return {
        "mb_per_run_day_before": mb[0],
        "mb_per_run_day_after": mb[1],
        "runcast_mb_per_run_day": mb[2],
        "compacted_vs_uncompacted": mb[2] / mb[1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--computations", type=int, default=24, help="real forecast_compute calls")
    parser.add_argument("--no-mlflow", action="store_true", help="skip the MLflow server's figure")
    parser.add_argument(
        "--noisy",
        action="store_true",
        help="every key noisy and times jittered by up to 50 ms (the default: only the loss is"
        " noisy and times fall on the half second)",
    )
    args = parser.parse_args(argv)
    harness.recreate_db(DB)
    try:
        from django.core.management import call_command

        setup_django()
        call_command("migrate", verbosity=0)
        harness.log(f"simulating {args.hours:g} h of a run with {args.keys} keys")
        sim = simulate(args.hours, args.keys, args.computations, noisy=args.noisy)
        before = sizes()
        from datetime import timedelta

        from forecasting import retention as forecast_retention
        from tracker import retention as batch_retention
        from tracker.services import from_epoch

        later = from_epoch(T0 + args.hours * 3600) + timedelta(days=8)
        while not batch_retention.batches_thin(now=later, budget_s=600).done:
            pass
        while not forecast_retention.forecasts_thin(now=later, budget_s=600).done:
            pass
        retained = sizes()
        began = time.perf_counter()
        points = points_read()
        read_s = {"read_all_s_uncompacted": time.perf_counter() - began}
        harness.log("compacting the metric chunks retention released")
        compacted = compact()
        began = time.perf_counter()
        exact = points_read() == points
        read_s["read_all_s_compacted"] = time.perf_counter() - began
        after = sizes()
        summary = report(before, retained, after, args.hours)
        if not exact:
            raise SystemExit("compaction changed the points read back")
        if not args.no_mlflow:
            ml = mlflow_sizes(points)
            ml_mb = sum(t["bytes"] for t in ml.values()) * 24.0 / args.hours / 1e6
            print(f"  an MLflow server storing the same points: {ml_mb:.1f} MB per run-day")
            summary.update(mlflow_mb_per_run_day=ml_mb, mlflow=ml)
    finally:
        from django.db import connections

        connections.close_all()
        harness.drop_db(DB)
    print(
        json.dumps(
            {
                **summary,
                **sim,
                **compacted,
                **read_s,
                "points_exact_after_compaction": exact,
                "before": before,
                "retained": retained,
                "after": after,
                "hours": args.hours,
                "noisy": args.noisy,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
