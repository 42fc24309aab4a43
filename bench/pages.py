"""Server time of the dashboard's pages on PostgreSQL: a 1M-point run and a 200-run board.

Creates a fresh database (runcast_bench_pages), migrates it with `manage.py migrate`, writes the
data (points through tracker.services.batch_ingest, the real write path; forecasts and flags as
rows), then times each page through Django's test client (middleware, ORM, templates, JSON: the
whole server side, no network). Prints a table and, last, one JSON line.

    .venv/bin/python bench/pages.py [--db postgres://postgres@127.0.0.1:5432] [--repeat 9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench import throwaway_secret_key

ROOT = Path(__file__).resolve().parents[1]
DB_NAME = "runcast_bench_pages"
POINTS_1M = 1_000_000
CHUNK = 1_000  # points per batch: what a trainer logging ~1k steps/s sends per flush
BOARD_RUNS = 200
ETA_HISTORY = 96  # forecasts per run over the last day


def _recreate(server: str) -> str:
    import psycopg2

    conn = psycopg2.connect(f"{server}/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {DB_NAME}")
    conn.close()
    url = f"{server}/{DB_NAME}"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings.base"}
    env.setdefault("SECRET_KEY", throwaway_secret_key())
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    return url


def _drop(server: str) -> None:
    import psycopg2

    conn = psycopg2.connect(f"{server}/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    conn.close()


def _setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.base"
    os.environ.setdefault("SECRET_KEY", throwaway_secret_key())
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.test.utils import setup_test_environment

    setup_test_environment()  # lets the test client's "testserver" host through


def _seed() -> dict[str, Any]:
    import numpy as np
    from django.contrib.auth.models import User
    from django.utils import timezone

    from forecasting import receivers
    from forecasting.models import Flag, Forecast
    from tracker.models import Event, Membership, Project, Run
    from tracker.project_settings.services import deadline_create
    from tracker.services import EventIn, SeriesIn, batch_ingest, from_epoch, run_start
    from tracker.signals import run_ingested

    # Forecasting would run per batch; the bench measures pages, so data is written directly.
    run_ingested.disconnect(receivers._on_ingested)
    now = timezone.now()
    user = User.objects.create_user("lead", "lead@example.com", "x")
    projects = []
    for i in range(2):
        p = Project.objects.create(slug=f"p{i}", name=f"Project {i}", gpu_hour_price=2.5)
        Membership.objects.create(project=p, user=user, role=Membership.Role.OWNER)
        projects.append(p)
    deadlines = [
        deadline_create(
            project=projects[i % 2],
            name=f"Cutoff {i}",
            slug=f"cutoff-{i}",
            cutoff=now + timedelta(hours=6 * (i + 1)),
            timezone="Asia/Shanghai",
            buffer=timedelta(hours=1),
        )
        for i in range(4)
    ]

    t0 = time.perf_counter()
    big = run_start(
        project=projects[0],
        public_id="big",
        session="s",
        started_at=now - timedelta(hours=10),
        fields={"total_steps": 2 * POINTS_1M, "world_size": 64},
        deadline_slug="cutoff-0",
    ).run
    steps = np.arange(POINTS_1M, dtype=np.int64)
    values = 2.5 + 8 * (1 + steps) ** -0.3 + np.random.default_rng(0).normal(0, 0.02, POINTS_1M)
    start = now.timestamp() - 10 * 3600
    times = start + steps * (10 * 3600 / POINTS_1M)
    for seq, lo in enumerate(range(0, POINTS_1M, CHUNK), start=1):
        sl = slice(lo, lo + CHUNK)
        events = []
        if lo % 50_000 == 0 and lo:
            events.append(EventIn(Event.Kind.CHECKPOINT, lo, from_epoch(times[lo]), {}))
        batch_ingest(
            run=big,
            session="s",
            seq=seq,
            series=[SeriesIn("loss", steps[sl], values[sl], times[sl])],
            events=events,
            heartbeat=None,
        )
    ingest_s = time.perf_counter() - t0

    runs = [big]
    for i in range(BOARD_RUNS - 1):
        r = run_start(
            project=projects[i % 2],
            public_id=f"r{i}",
            session="s",
            started_at=now - timedelta(hours=5),
            fields={"total_steps": 100_000, "world_size": 8},
            deadline_slug=deadlines[i % 4].slug if i % 5 else None,
        ).run
        batch_ingest(
            run=r,
            session="s",
            seq=1,
            series=[SeriesIn("loss", steps[:100], values[:100], times[:100])],
            events=[],
            heartbeat=None,
        )
        runs.append(r)
    Run.objects.update(last_seen_at=now)
    rows = []
    flags = []
    for n, r in enumerate(runs):
        r.refresh_from_db()
        end = now.timestamp() + 3600 * (1 + n % 30)
        for k in range(ETA_HISTORY):
            at = now - timedelta(minutes=15 * (ETA_HISTORY - k))
            rows.append(
                Forecast(
                    run=r,
                    kind="eta",
                    computed_at=at,
                    segment=r.current_segment,
                    input_last_step=k,
                    finish_p50=end + 60 * (k - ETA_HISTORY),
                    finish_p10=end - 1800,
                    finish_p90=end + 1800,
                    data={"rate_steps_per_s": 2.0 + k / 100},
                )
            )
        rows.append(
            Forecast(
                run=r,
                kind="loss",
                computed_at=now,
                segment=r.current_segment,
                input_last_step=0,
                data={"p10": 2.6, "p50": 2.7, "p90": 2.8, "smoothed_last": 2.9, "final_step": 2e6},
            )
        )
        rows.append(
            Forecast(
                run=r,
                kind="deadline",
                computed_at=now,
                segment=r.current_segment,
                input_last_step=0,
                data={
                    "p_on_time": (n % 10) / 10,
                    "speedup_for_p90": 0.1,
                    "steps_cut_for_p90": 100.0,
                },
            )
        )
        for kind in ("spike", "slip"):
            flags.append(Flag(run=r, kind=kind, state="raised", explanation="x", onset_step=50))
            flags.append(Flag(run=r, kind=kind, state="resolved", explanation="x"))
        flags.append(
            Flag(
                run=r,
                kind="spike",
                state="raised",
                explanation="again",
                onset_step=900,
                data={"rollback_step": 500},
            )
        )
    Forecast.objects.bulk_create(rows, batch_size=5000)
    Flag.objects.bulk_create(flags, batch_size=5000)
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    return {"user": user, "big": big, "ingest_s": ingest_s, "forecast_rows": len(rows)}


def _time(client: Any, url: str, repeat: int) -> tuple[float, int, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    res = client.get(url)  # warm: connection, template loading, numpy paths
    assert res.status_code == 200, (url, res.status_code)
    samples = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as q:
            t = time.perf_counter()
            res = client.get(url)
            samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples), len(q.captured_queries), len(res.content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    url = _recreate(args.db)
    try:
        _setup_django(url)
        from django.test import Client

        data = _seed()
        client = Client()
        client.force_login(data["user"])
        run = "/runs/p0/big/"
        pages = {
            "run page (HTML)": run,
            "run overview.json": f"{run}overview.json",
            "run series.json loss, 1500 buckets": f"{run}series.json?key=loss&buckets=1500",
            "run throughput.json, 400 buckets": f"{run}throughput.json?buckets=400",
            "run series.json zoomed to 10k steps": (
                f"{run}series.json?key=loss&buckets=1500&x0=500000&x1=510000"
            ),
            "run summary partial (poll)": f"{run}summary/",
            f"board, {BOARD_RUNS} active runs": "/",
            "board partial (poll)": "/board/",
        }
        results = {name: _time(client, u, args.repeat) for name, u in pages.items()}
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            _drop(args.db)
    print(
        f"data: 1M-point run ingested in {data['ingest_s']:.1f} s through batch_ingest "
        f"({POINTS_1M // CHUNK} batches); {data['forecast_rows']:,} forecast rows"
    )
    print(f"{'page':<42}{'median ms':>10}{'queries':>9}{'bytes':>10}")
    for name, (ms, queries, size) in results.items():
        print(f"{name:<42}{ms:>10.1f}{queries:>9}{size:>10,}")
    initial = [
        "run page (HTML)",
        "run overview.json",
        "run series.json loss, 1500 buckets",
        "run throughput.json, 400 buckets",
    ]
    run_total = sum(results[k][0] for k in initial)
    print(f"{'run page data: HTML + 3 chart JSONs (sum)':<42}{run_total:>10.1f}")
    print(
        json.dumps(
            {
                "run_page_data_ms_1m": round(run_total, 1),
                "run_page_html_ms_1m": round(results["run page (HTML)"][0], 1),
                "run_series_ms_1m": round(results["run series.json loss, 1500 buckets"][0], 1),
                "run_throughput_ms_1m": round(results["run throughput.json, 400 buckets"][0], 1),
                "run_overview_ms_1m": round(results["run overview.json"][0], 1),
                "run_zoom_ms_1m": round(results["run series.json zoomed to 10k steps"][0], 1),
                "board_ms_200_runs": round(results[f"board, {BOARD_RUNS} active runs"][0], 1),
                "board_queries_200_runs": results[f"board, {BOARD_RUNS} active runs"][1],
            }
        )
    )


if __name__ == "__main__":
    main()
