# The compaction sweep's work list (tracker/compaction.py): a partial index of the old small
# metric chunks. Built CONCURRENTLY on PostgreSQL: tracker_metricchunk is the largest table,
# and a plain CREATE INDEX would hold back every ingest for the whole build.

from typing import Any

from django.db import migrations, models

INDEX = models.Index(
    condition=models.Q(("batch__isnull", True), ("n__lt", 2048)),
    fields=["run", "key", "segment"],
    name="chunk_compactable_idx",
)


def _add(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("tracker", "MetricChunk")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.add_index(model, INDEX, concurrently=True)
    else:
        schema_editor.add_index(model, INDEX)


def _remove(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("tracker", "MetricChunk")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.remove_index(model, INDEX, concurrently=True)
    else:
        schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("tracker", "0008_segment_declared_heartbeat"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="metricchunk", index=INDEX)],
            database_operations=[migrations.RunPython(_add, _remove)],
        ),
    ]
