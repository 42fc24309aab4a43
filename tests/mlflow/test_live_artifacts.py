"""A stock MLflow training script that ends with artifacts and a logged model, run to its last
line against a live Runcast server (the real `mlflow` client, as a user runs it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracker import artifacts
from tracker.mlflow.models import LoggedModel
from tracker.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def artifact_root(settings: Any, tmp_path: Path) -> Path:
    settings.RUNCAST_ARTIFACT_ROOT = str(tmp_path / "artifacts")
    return tmp_path / "artifacts"


def test_a_stock_script_logs_files_and_a_model_to_its_last_line(
    mlflow_env: Any, artifact_root: Path, tmp_path: Path
) -> None:
    mlflow = mlflow_env
    sklearn_linear = pytest.importorskip("sklearn.linear_model")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    notes = tmp_path / "notes.txt"
    notes.write_text("trained on the small split\n")
    x = np.arange(40, dtype=float).reshape(-1, 2)
    y = x @ np.array([2.0, -1.0]) + 0.5

    mlflow.set_experiment("regression")
    with mlflow.start_run(run_name="linreg") as active:
        mlflow.log_params({"max_steps": 20, "alpha": 0.1})
        for step in range(20):
            mlflow.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        dataset = mlflow.data.from_numpy(x, targets=y, name="train-small")
        mlflow.log_input(dataset, context="training")
        mlflow.log_artifact(str(notes))
        mlflow.log_artifact(str(notes), artifact_path="docs")
        mlflow.log_text("epoch,loss\n1,0.5\n", "tables/loss.csv")
        mlflow.log_dict({"lr": 0.1, "layers": [64, 64]}, "config.json")
        figure, axes = plt.subplots()
        axes.plot([1, 2, 3])
        mlflow.log_figure(figure, "plots/loss.png")
        plt.close(figure)
        model = sklearn_linear.LinearRegression().fit(x, y)
        # pip_requirements: the inference of them starts a Python process (~30 s here).
        info = mlflow.sklearn.log_model(model, name="model", pip_requirements=["scikit-learn"])
        mlflow.log_metric("done", 1.0)  # the script's last line
    run_id = active.info.run_id
    client = mlflow.MlflowClient()

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert Run.objects.get(public_id=run_id).status == "finished"
    assert sorted(f.path for f in client.list_artifacts(run_id)) == [
        "config.json",
        "docs",
        "notes.txt",
        "plots",
        "tables",
    ]
    assert [f.path for f in client.list_artifacts(run_id, "docs")] == ["docs/notes.txt"]
    back = Path(client.download_artifacts(run_id, "tables/loss.csv", str(tmp_path)))
    assert back.read_text() == "epoch,loss\n1,0.5\n"
    assert mlflow.artifacts.load_dict(f"runs:/{run_id}/config.json") == {
        "lr": 0.1,
        "layers": [64, 64],
    }
    png = Path(client.download_artifacts(run_id, "plots/loss.png", str(tmp_path)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The logged model: created, its files uploaded, finalized, and loadable from Runcast.
    logged = client.get_logged_model(info.model_id)
    assert logged.status.to_proto() == 2  # LOGGED_MODEL_READY
    assert logged.source_run_id == run_id
    assert logged.params["alpha"] == "0.1"
    assert LoggedModel.objects.get(model_id=info.model_id).status == "LOGGED_MODEL_READY"
    assert [m.model_id for m in mlflow.search_logged_models(output_format="list")] == [
        info.model_id
    ]
    loaded = mlflow.sklearn.load_model(f"models:/{info.model_id}")
    np.testing.assert_allclose(loaded.predict(x[:3]), model.predict(x[:3]))
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [info.model_id]

    # The dataset input is kept and searchable.
    inputs = client.get_run(run_id).inputs.dataset_inputs
    assert [(d.dataset.name, d.tags[0].value) for d in inputs] == [("train-small", "training")]
    # Metrics stayed as logged: log_model's re-logging of step-0 points added none.
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == list(range(20))

    # The run page's list, through the selector the dashboard uses.
    db_run = Run.objects.get(public_id=run_id)
    files = artifacts.run_files(project_id=db_run.project_id, run_id=db_run.pk)
    assert {f.path: f.kind for f in files} == {
        "config.json": "text",
        "docs/notes.txt": "text",
        "notes.txt": "text",
        "plots/loss.png": "image",
        "tables/loss.csv": "text",
    }


def test_it_deletes_an_artifact_folder(mlflow_env: Any, artifact_root: Path) -> None:
    mlflow = mlflow_env
    with mlflow.start_run() as active:
        mlflow.log_text("a", "a.txt")
        mlflow.log_text("b", "sub/b.txt")
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    client = mlflow.MlflowClient()
    repo = get_artifact_repository(active.info.artifact_uri)
    repo.delete_artifacts("sub")
    assert [f.path for f in client.list_artifacts(active.info.run_id)] == ["a.txt"]
    assert client.list_artifacts(active.info.run_id, "sub") == []
