"""Fill LatestMetric for the runs logged before it existed, as the write path now keeps it: per
key, the chunk with the highest max_step (the later chunk at an equal one), and in it the point
with the highest step, then the latest time. Reversible: the reverse empties the table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from django.db import migrations
from django.db.models import F, Window
from django.db.models.functions import RowNumber

_RUNS_PER_QUERY = 500


def _latest(steps: bytes, values: bytes, times: bytes) -> tuple[int, float, int]:
    s = np.frombuffer(steps, dtype="<i8")
    v = np.frombuffer(values, dtype="<f8")
    t = np.frombuffer(times, dtype="<f8")
    top = s == s.max()
    j = int(np.flatnonzero(top)[np.argmax(t[top])])
    return int(s[j]), float(v[j]), round(float(t[j]) * 1000)


def backfill(apps: Any, schema_editor: Any) -> None:
    chunks = apps.get_model("tracker", "MetricChunk")
    latest = apps.get_model("tracker", "LatestMetric")
    run_ids = list(chunks.objects.values_list("run_id", flat=True).distinct().order_by("run_id"))
    for i in range(0, len(run_ids), _RUNS_PER_QUERY):
        rows = (
            chunks.objects.filter(run_id__in=run_ids[i : i + _RUNS_PER_QUERY], n__gte=1)
            .annotate(
                newest=Window(
                    RowNumber(),
                    partition_by=[F("run_id"), F("key")],
                    order_by=[F("max_step").desc(), F("id").desc()],
                )
            )
            .filter(newest=1)
            .values_list("run_id", "key", "steps", "values", "times")
        )
        out = []
        for run_id, key, steps, values, times in rows:
            step, value, stamp = _latest(bytes(steps), bytes(values), bytes(times))
            nan = math.isnan(value)
            out.append(
                latest(
                    run_id=run_id,
                    key=key,
                    value=None if nan else value,
                    is_nan=nan,
                    step=step,
                    timestamp_ms=stamp,
                )
            )
        latest.objects.bulk_create(out, ignore_conflicts=True)


def empty(apps: Any, schema_editor: Any) -> None:
    apps.get_model("tracker", "LatestMetric").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("tracker", "0006_latest_metric_per_key")]

    operations = [migrations.RunPython(backfill, empty)]
