"""Move the hysteresis history out of the Forecast table: CONDITIONS rows kept their epoch second
in `input_last_step` (a column whose name it was not) and their findings in `data`."""

from typing import Any

from django.db import migrations

BATCH = 2_000


def forward(apps: Any, schema_editor: Any) -> None:
    Forecast = apps.get_model("forecasting", "Forecast")
    ConditionReading = apps.get_model("forecasting", "ConditionReading")
    rows = Forecast.objects.filter(kind="conditions").order_by("id")
    while True:
        batch = list(rows[:BATCH])
        if not batch:
            return
        ConditionReading.objects.bulk_create(
            [
                ConditionReading(
                    run_id=f.run_id,
                    segment=f.segment,
                    second=f.input_last_step,
                    computed_at=f.computed_at,
                    found=sorted((f.data or {}).get("found") or []),
                    deadline_p=(f.data or {}).get("deadline_p"),
                    input_step=(f.data or {}).get("input"),
                )
                for f in batch
            ],
            ignore_conflicts=True,
        )
        Forecast.objects.filter(id__in=[f.id for f in batch]).delete()


def backward(apps: Any, schema_editor: Any) -> None:
    Forecast = apps.get_model("forecasting", "Forecast")
    ConditionReading = apps.get_model("forecasting", "ConditionReading")
    rows = ConditionReading.objects.order_by("id")
    while True:
        batch = list(rows[:BATCH])
        if not batch:
            return
        Forecast.objects.bulk_create(
            [
                Forecast(
                    run_id=r.run_id,
                    kind="conditions",
                    segment=r.segment,
                    input_last_step=r.second,
                    computed_at=r.computed_at,
                    data={"found": r.found, "deadline_p": r.deadline_p, "input": r.input_step},
                )
                for r in batch
            ],
            ignore_conflicts=True,
        )
        ConditionReading.objects.filter(id__in=[r.id for r in batch]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("forecasting", "0007_condition_readings_table"),
    ]

    operations = [migrations.RunPython(forward, backward)]
