"""The MLflow tracking REST API served by Runcast, and the import from an MLflow server.

A stock `mlflow` client pointed at Runcast (`MLFLOW_TRACKING_URI`, `MLFLOW_TRACKING_TOKEN`)
logs through `views` → `parsing` → `services`, which write through `tracker.services` (the same
batch ingestion, limits and exactly-once rules as /api/v1/). See docs/mlflow.md.
"""
