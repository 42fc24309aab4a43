"""Server time of the runs explorer's first page on PostgreSQL, at a lab's scale.

Creates a fresh database (runcast_bench_runs_page), migrates it, and bulk-loads (COPY) one
project of `--runs` runs (100,000 by default), each with 20 params, 2 tag labels and the latest
value of 10 metrics; 2% of them are running, aimed at a deadline, with ETA and deadline
forecasts. Then times the page `/projects/bench/runs/` through Django's test client
(middleware, ORM, template: the whole server side, no network) for four query shapes:

    plain             the default order (newest start first)
    filtered          metrics.loss < 2.5 and params.lr = '3e-4' and tags.team = 'nlp'
                      and status = 'finished'
    sorted_metric     by metrics.loss, ascending
    filtered_sorted   the filter above, by metrics.loss

Each shape is timed twice in the same process: without the explorer's indexes (the baseline,
run_project_started_idx and latest_metric_value_idx dropped) and with them. Prints a table
and, last, one JSON line: `runs_page_ms` (median of --repeat) and the queries per page for each
shape, the SQL part of that time (`sql_ms`), and the ratio baseline / indexed. On a shared
machine the page time moves with the load; `sql_ms` less so.

    .venv/bin/python -m bench.runs_page [--runs 100000] [--repeat 7] [--keep]

(PostgreSQL at BENCH_PG_URL, postgres://postgres@127.0.0.1:5432 unless set: bench.harness.)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import harness, throwaway_secret_key
from bench.pages import _setup_django

DB_NAME = "runcast_bench_runs_page"
PARAMS = 20
METRICS = 10
LIVE_SHARE = 0.02
FILTER = "metrics.loss < 2.5 and params.lr = '3e-4' and tags.team = 'nlp' and status = 'finished'"
SHAPES: dict[str, dict[str, str]] = {
    "plain": {},
    "filtered": {"q": FILTER},
    "sorted_metric": {"sort": "m:loss", "dir": "asc"},
    "filtered_sorted": {"q": FILTER, "sort": "m:loss", "dir": "asc"},
}
INDEXES = {
    "run_project_started_idx": (
        "CREATE INDEX run_project_started_idx ON tracker_run (project_id, started_at DESC, id)"
    ),
    "latest_metric_value_idx": (
        "CREATE INDEX latest_metric_value_idx ON tracker_latestmetric (key, value) "
        "INCLUDE (run_id, is_nan)"
    ),
}


def _recreate() -> str:
    harness.recreate_db(DB_NAME)
    url = f"{harness.PG_URL}/{DB_NAME}"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings.base"}
    env.setdefault("SECRET_KEY", throwaway_secret_key())
    harness.manage(env, "migrate", "-v0")
    return url


def _copy(cur: Any, table: str, columns: list[str], rows: list[list[Any]]) -> None:
    buf = io.StringIO()
    for row in rows:
        buf.write("\t".join("\\N" if v is None else str(v) for v in row) + "\n")
    buf.seek(0)
    cur.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN", buf)


def _seed(n: int) -> dict[str, Any]:
    """One project of n runs, COPYed in (the write path would take hours at this size and is
    not what is measured)."""
    from django.contrib.auth.models import User
    from django.db import connection

    from forecasting.models import Forecast
    from tracker.models import Deadline, Membership, Project, Run

    rng = random.Random(0)
    now = datetime.now(UTC)
    user = User.objects.create_user("lead", "lead@example.com", "x")
    project = Project.objects.create(slug="bench", name="Bench", gpu_hour_price=2.5)
    Membership.objects.create(project=project, user=user, role=Membership.Role.OWNER)
    deadline = Deadline.objects.create(
        project=project, slug="neurips", name="NeurIPS", cutoff=now + timedelta(days=3)
    )
    t0 = time.perf_counter()
    runs, metrics = [], []
    lrs = ["1e-4", "3e-4", "1e-3", "3e-3"]
    teams = ["nlp", "vision", "speech", "rl"]
    for i in range(n):
        live = i < n * LIVE_SHARE
        started = now - timedelta(minutes=5 * (n - i))
        config = {f"p{k:02}": rng.choice(["a", "b", "c"]) for k in range(PARAMS - 1)}
        config["lr"] = rng.choice(lrs)
        tags = [f"team:{rng.choice(teams)}", f"size:{rng.choice(['s', 'm', 'l'])}"]
        runs.append(
            [
                project.pk,
                f"run-{i:06}",
                f"run {i}",
                "running" if live else rng.choice(["finished"] * 8 + ["failed", "crashed"]),
                started.isoformat(),
                None if live else (started + timedelta(hours=2)).isoformat(),
                (now if live else started + timedelta(hours=2)).isoformat(),
                1000,
                "steps",
                json.dumps(config),
                json.dumps(tags),
                "[]",
                deadline.pk if live else None,
                rng.randint(1, 1000),
                0,
                1000,
                started.isoformat(),
                8,
            ]
        )
    columns = [
        "project_id", "public_id", "name", "status", "started_at", "ended_at", "last_seen_at",
        "total_steps", "progress_unit", "config", "tags", "hosts", "deadline_id", "last_step",
        "current_segment", "points_count", "created_at", "world_size",
    ]  # fmt: skip
    with connection.cursor() as cur:
        _copy(cur.cursor, "tracker_run", columns, runs)
        cur.execute("SELECT id FROM tracker_run WHERE project_id = %s ORDER BY id", [project.pk])
        ids = [row[0] for row in cur.fetchall()]
        for run_id in ids:
            for k in range(METRICS):
                key = "loss" if k == 0 else f"m{k}"
                metrics.append([run_id, key, round(rng.uniform(1.5, 4.0), 4), "f", 1000, 0])
        _copy(
            cur.cursor,
            "tracker_latestmetric",
            ["run_id", "key", "value", "is_nan", "step", "timestamp_ms"],
            metrics,
        )
    live_ids = list(Run.objects.filter(status="running").values_list("pk", flat=True))
    Forecast.objects.bulk_create(
        [
            Forecast(
                run_id=pk,
                kind=kind,
                computed_at=now,
                segment=0,
                input_last_step=0,
                finish_p50=now.timestamp() + 3600,
                finish_p10=now.timestamp() + 1800,
                finish_p90=now.timestamp() + 7200,
                data={"p_on_time": 0.8, "rate_steps_per_s": 2.0},
            )
            for pk in live_ids
            for kind in ("eta", "deadline")
        ]
    )
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
    return {"seed_s": round(time.perf_counter() - t0, 1), "user": user}


def _time_shapes(client: Any, repeat: int) -> dict[str, dict[str, Any]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    out = {}
    for shape, params in SHAPES.items():
        client.get("/projects/bench/runs/", params)  # warm: plans, caches
        times, sql = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            with CaptureQueriesContext(connection) as ctx:
                res = client.get("/projects/bench/runs/", params)
            times.append((time.perf_counter() - t) * 1000)
            sql.append(sum(float(q["time"]) for q in ctx.captured_queries) * 1000)
            assert res.status_code == 200, res.content[:500]
        rows = res.content.count(b"<tr data-run=")
        out[shape] = {
            "ms": round(statistics.median(times), 1),
            "sql_ms": round(statistics.median(sql), 1),
            "queries": len(ctx.captured_queries),
            "rows": rows,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    url = _recreate()
    try:
        _setup_django(url)
        from django.db import connection
        from django.test import Client

        seeded = _seed(args.runs)
        client = Client()
        client.force_login(seeded["user"])
        with connection.cursor() as cur:
            for name in INDEXES:
                cur.execute(f"DROP INDEX {name}")
            cur.execute("ANALYZE")
        baseline = _time_shapes(client, args.repeat)
        with connection.cursor() as cur:
            for sql in INDEXES.values():
                cur.execute(sql)
            cur.execute("ANALYZE")
        indexed = _time_shapes(client, args.repeat)
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            harness.drop_db(DB_NAME)

    print(f"{'shape':<18}{'no index ms':>12}{'indexed ms':>12}{'of it SQL':>10}{'queries':>9}")
    for shape in SHAPES:
        b, i = baseline[shape], indexed[shape]
        print(f"{shape:<18}{b['ms']:>12}{i['ms']:>12}{i['sql_ms']:>10}{i['queries']:>9}")
    print(
        json.dumps(
            {
                "runs": args.runs,
                "params": PARAMS,
                "metrics": METRICS,
                "seed_s": seeded["seed_s"],
                "runs_page_ms": {s: indexed[s]["ms"] for s in SHAPES},
                "sql_ms": {s: indexed[s]["sql_ms"] for s in SHAPES},
                "queries": {s: indexed[s]["queries"] for s in SHAPES},
                "baseline_no_index_ms": {s: baseline[s]["ms"] for s in SHAPES},
                "speedup_vs_no_index": {
                    s: round(baseline[s]["ms"] / indexed[s]["ms"], 2) for s in SHAPES
                },
            }
        )
    )


if __name__ == "__main__":
    main()
