# The compaction sweep's work list (tracker/compaction.py): a partial index of the old small
# metric chunks. Built CONCURRENTLY on PostgreSQL: tracker_metricchunk is the largest table,
# and a plain CREATE INDEX would hold back every ingest for the whole build.

from collections.abc import Callable
from typing import Any

from django.db import migrations, models

INDEX = models.Index(
    condition=models.Q(("batch__isnull", True), ("n__lt", 2048)),
    fields=["run", "key", "segment"],
    name="chunk_compactable_idx",
)


def _index(method: str) -> Callable[[Any, Any], None]:
    """add_index or remove_index, CONCURRENTLY where the database can."""

    def run(apps: Any, schema_editor: Any) -> None:
        model = apps.get_model("tracker", "MetricChunk")
        online = schema_editor.connection.vendor == "postgresql"
        getattr(schema_editor, method)(model, INDEX, **({"concurrently": True} if online else {}))

    return run


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("tracker", "0011_saved_explorer_views"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="metricchunk", index=INDEX)],
            database_operations=[migrations.RunPython(_index("add_index"), _index("remove_index"))],
        ),
    ]
