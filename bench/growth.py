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
counts, before retention and after it ran as it will once the day is older than every window
(`now` = the day's end + 8 days), which is what each further day of a long run costs.

    .venv/bin/python bench/growth.py                  # 1 day, 4 keys
    .venv/bin/python bench/growth.py --hours 6 --keys 8

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


def sizes() -> dict[str, dict[str, int]]:
    from django.db import connection

    out = {}
    with connection.cursor() as cur:
        for table in TABLES:
            # Table names are this module's constants, never input.
            cur.execute(f"VACUUM FULL {table}")
            count = f"SELECT pg_total_relation_size(%s), count(*) FROM {table}"  # noqa: S608
            cur.execute(count, [table])
            size, rows = cur.fetchone()
            out[table] = {"bytes": int(size), "rows": int(rows)}
    return out


def simulate(hours: float, keys: int, computations: int) -> dict[str, Any]:
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
        series = [
            SeriesIn(name, step, np.array([loss if k == 0 else 1e-3 * (k + 1)]), when)
            for k, name in enumerate(names)
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


def report(before: dict[str, Any], after: dict[str, Any], hours: float) -> dict[str, Any]:
    per_day = 24.0 / hours
    print(f"\nDatabase bytes per run-day (simulated {hours:g} h, scaled x{per_day:g}), PostgreSQL")
    print(f"{'table':24s} {'rows':>10s} {'MB before':>10s} {'rows':>10s} {'MB after':>10s}")
    total_b = total_a = 0.0
    for table in TABLES:
        b, a = before[table], after[table]
        total_b += b["bytes"] * per_day
        total_a += a["bytes"] * per_day
        print(
            f"{table:24s} {b['rows'] * per_day:10,.0f} {b['bytes'] * per_day / 1e6:10.1f}"
            f" {a['rows'] * per_day:10,.0f} {a['bytes'] * per_day / 1e6:10.1f}"
        )
    print(f"{'total':24s} {'':10s} {total_b / 1e6:10.1f} {'':10s} {total_a / 1e6:10.1f}")
    print(
        f"  after retention: {total_a / total_b:.0%} of a fresh day"
        f" ({total_b / 1e6 * 30 / 1e3:.2f} GB vs {total_a / 1e6 * 30 / 1e3:.2f} GB per run-month)"
    )
    return {"mb_per_run_day_before": total_b / 1e6, "mb_per_run_day_after": total_a / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--computations", type=int, default=24, help="real forecast_compute calls")
    args = parser.parse_args(argv)
    harness.recreate_db(DB)
    try:
        from django.core.management import call_command

        setup_django()
        call_command("migrate", verbosity=0)
        harness.log(f"simulating {args.hours:g} h of a run with {args.keys} keys")
        sim = simulate(args.hours, args.keys, args.computations)
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
        after = sizes()
        summary = report(before, after, args.hours)
    finally:
        from django.db import connections

        connections.close_all()
        harness.drop_db(DB)
    print(json.dumps({**summary, **sim, "before": before, "after": after, "hours": args.hours}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
