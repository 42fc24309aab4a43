"""What a live mirror of an MLflow server costs per tick (tracker.mlflow.mirror).

A real `mlflow server` (SQLite backend, one worker) on this machine holds a finished run and a
live run, STEPS steps x 2 keys each, logged with the stock client. The mirror (into a fresh
PostgreSQL database of its own, `runcast_mirror_bench`) then syncs, in this process as the
periodic task would:

  * first copy: syncs until everything is copied: seconds, points per second, history pages;
  * idle tick: nothing new on MLflow: seconds and pages (no history read is the point);
  * live tick: LIVE_STEPS new steps x 2 keys on the live run: seconds, pages, points;
  * end tick: the live run ended on MLflow: seconds, pages, and the run's status here;
  * idle again: both runs ended and copied.

Every point is counted where Runcast stored it, so a fast but lossy sync cannot pass.

    .venv/bin/python -m bench.mlflow_mirror            # 50,000 steps x 2 keys per run
    .venv/bin/python -m bench.mlflow_mirror --quick    # 5,000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from typing import Any

from bench import throwaway_secret_key
from bench.harness import (
    PG_URL,
    ROOT,
    VENV_PY,
    drop_db,
    free_port,
    log,
    recreate_db,
    start_group,
    stop_group,
    wait_http,
)

WORK = ROOT / "var" / "bench-mirror"
DB = "runcast_mirror_bench"
KEYS = ("loss", "lr")
LIVE_STEPS = 100


def _django() -> None:
    os.environ["DATABASE_URL"] = f"{PG_URL}/{DB}"
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ["SECRET_KEY"] = throwaway_secret_key()
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.flagstream_settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def _log(client: Any, run_id: str, steps: range, t0: int) -> None:
    from mlflow.entities import Metric

    batch: list[Any] = []
    for s in steps:
        batch += [Metric(k, 1.0 / (s + 1), t0 + s * 10, s) for k in KEYS]
        if len(batch) >= 1000:
            client.log_batch(run_id, metrics=batch)
            batch = []
    if batch:
        client.log_batch(run_id, metrics=batch)


def _tick(mirror_id: int) -> tuple[float, Any]:
    from tracker.mlflow.mirror import mirror_sync_one

    started = time.perf_counter()
    summary = mirror_sync_one(mirror_id=mirror_id)
    if summary is None:
        from tracker.mlflow.models import Mirror

        raise SystemExit(f"sync failed: {Mirror.objects.get(pk=mirror_id).last_error}")
    return time.perf_counter() - started, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    steps = 5_000 if args.quick else 50_000
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    server = start_group(
        [
            str(VENV_PY.parent / "mlflow"),
            *("server", "--backend-store-uri", f"sqlite:///{WORK / 'mlflow.db'}"),
            *("--default-artifact-root", str(WORK / "artifacts")),
            *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
        ],
        env,
        WORK / "mlflow.log",
    )
    url = f"http://127.0.0.1:{port}"
    recreate_db(DB)
    try:
        wait_http(f"{url}/health", server, WORK / "mlflow.log", 120)
        _django()
        from mlflow import MlflowClient

        from tracker import selectors
        from tracker.mlflow.mirror import mirror_configure
        from tracker.models import Project, Run

        source = MlflowClient(tracking_uri=url)
        exp = source.create_experiment("bench")
        t0 = int(time.time() * 1000) - steps * 10
        done = source.create_run(exp, run_name="done").info.run_id
        live = source.create_run(exp, run_name="live").info.run_id
        log(f"logging {steps:,} steps x {len(KEYS)} keys to two runs on MLflow")
        _log(source, done, range(steps), t0)
        source.set_terminated(done, "FINISHED")
        _log(source, live, range(steps), t0)

        project = Project.objects.create(slug="bench", name="Bench")
        mirror = mirror_configure(project=project, url=url, operator=True)
        figures: dict[str, Any] = {"steps_per_run": steps, "keys": len(KEYS)}

        first_s, ticks, pages, points = 0.0, 0, 0, 0
        while True:
            seconds, summary = _tick(mirror.pk)
            first_s += seconds
            ticks += 1
            pages += summary.pages
            points += summary.points_copied
            if summary.complete:
                break
        figures |= {
            "first_copy_s": round(first_s, 2),
            "first_copy_ticks": ticks,
            "first_copy_points": points,
            "first_copy_points_per_s": round(points / first_s),
            "first_copy_pages": pages,
        }
        seconds, summary = _tick(mirror.pk)
        figures |= {"idle_tick_s": round(seconds, 3), "idle_tick_pages": summary.pages}

        _log(source, live, range(steps, steps + LIVE_STEPS), t0)
        seconds, summary = _tick(mirror.pk)
        figures |= {
            "live_tick_s": round(seconds, 3),
            "live_tick_pages": summary.pages,
            "live_tick_points": summary.points_copied,
        }
        source.set_terminated(live, "FINISHED")
        seconds, summary = _tick(mirror.pk)
        figures |= {"end_tick_s": round(seconds, 3), "end_tick_pages": summary.pages}
        seconds, summary = _tick(mirror.pk)
        figures |= {"ended_idle_tick_s": round(seconds, 3), "ended_idle_pages": summary.pages}

        stored = {
            run_id: sum(
                int(selectors.series_load(run=run, key=k, resolve=False).steps.size) for k in KEYS
            )
            for run_id in (done, live)
            for run in [Run.objects.get(public_id=run_id)]
        }
        expected = {done: steps * len(KEYS), live: (steps + LIVE_STEPS) * len(KEYS)}
        figures["live_status_after_end"] = Run.objects.get(public_id=live).status
        figures["verified"] = stored == expected
        print(json.dumps(figures))
        return 0 if figures["verified"] else 1
    finally:
        stop_group(server)
        from django.db import connections

        connections.close_all()
        drop_db(DB)


if __name__ == "__main__":
    raise SystemExit(main())
