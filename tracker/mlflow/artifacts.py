"""MLflow's artifact proxy (`/api/2.0/mlflow-artifacts/artifacts/<path>`) over Runcast's store.

The stock client resolves a run's `artifact_uri` (`mlflow-artifacts:/<experiment>/<run>/artifacts`)
and a logged model's (`mlflow-artifacts:/<experiment>/models/<model>/artifacts`) against the
tracking URI, as `mlflow server --serve-artifacts` lays them out. Here such a path is read as
the run or model it names *in the token's project*: a path of another project, or of nothing,
is answered RESOURCE_DOES_NOT_EXIST, as missing runs are. The files then live under that run's
or model's prefix in `tracker.artifacts`, whatever the path said about the experiment.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from tracker import artifacts
from tracker.artifacts import ArtifactError, Entry, Readable
from tracker.limits import echo
from tracker.mlflow.errors import MlflowError, invalid, not_found
from tracker.mlflow.models import LoggedModel, RunLink
from tracker.models import Project, Run

ROOT = "artifacts"  # the last segment of every run's and model's artifact URI


@dataclass(frozen=True)
class Place:
    """An artifact path resolved: the owner's storage prefix and the path below it."""

    prefix: str
    path: str

    @property
    def key(self) -> str:
        return artifacts.join(self.prefix, self.path)


def run_artifact_uri(link: RunLink) -> str:
    return f"mlflow-artifacts:/{link.experiment.public_id}/{link.run.public_id}/{ROOT}"


def model_artifact_uri(model: LoggedModel) -> str:
    return f"mlflow-artifacts:/{model.experiment.public_id}/models/{model.model_id}/{ROOT}"


def _checked(path: str) -> str:
    try:
        return artifacts.safe_path(path)
    except ArtifactError as exc:
        raise invalid(exc.message) from exc


def place_of(*, project: Project, path: str) -> Place:
    """The run or logged model of this project that `path` is under, or RESOURCE_DOES_NOT_EXIST."""
    clean = _checked(path)
    parts = clean.split("/") if clean else []
    missing = not_found(f"No run or logged model has the artifact path '{echo(clean)}'")
    if len(parts) >= 4 and parts[1] == "models" and parts[3] == ROOT:
        model = (
            LoggedModel.objects.select_related("experiment")
            .filter(project=project, model_id=parts[2], experiment__public_id=parts[0])
            .first()
        )
        if model is None:
            raise missing
        prefix = artifacts.model_prefix(project_id=project.pk, model_id=model.pk)
        return Place(prefix, "/".join(parts[4:]))
    if len(parts) >= 3 and parts[2] == ROOT:
        # By the run alone: a run moved to another experiment (the runs explorer's bulk move)
        # keeps its files, and the artifact URI a script took before the move must still work.
        link = (
            RunLink.objects.select_related("run")
            .filter(run__project=project, run__public_id=parts[1])
            .first()
        )
        if link is None:
            raise missing
        prefix = artifacts.run_prefix(project_id=project.pk, run_id=link.run_id)
        return Place(prefix, "/".join(parts[3:]))
    raise missing


# --- writes ----------------------------------------------------------------------------------


def artifact_put(*, place: Place, body: Readable, length: int | None) -> int:
    """Store one file from a stream; a body over the limit is refused before it is read when
    its length is declared, else as soon as it passes the limit (nothing of it is kept)."""
    if not place.path:
        raise invalid("An artifact upload needs a file name after the artifact root")
    limit = artifacts.max_bytes()
    if length is not None and length > limit:
        raise too_large(artifacts.ArtifactTooLarge(limit))
    try:
        return artifacts.artifact_store().write(place.key, body, max_bytes=limit)
    except artifacts.ArtifactTooLarge as exc:
        raise too_large(exc) from exc
    except ArtifactError as exc:
        raise invalid(exc.message) from exc


def too_large(exc: artifacts.ArtifactTooLarge) -> MlflowError:
    # 413, which the client does not retry: sending the same file again cannot succeed.
    return MlflowError(exc.message, "INVALID_PARAMETER_VALUE", status=413)


def artifact_delete(*, place: Place) -> None:
    artifacts.artifact_store().delete(place.key)


# --- reads -----------------------------------------------------------------------------------


def artifact_list(*, place: Place) -> list[Entry]:
    """The children of a folder (MLflow lists a file, or nothing, as no entries)."""
    return artifacts.artifact_store().children(place.key)


def files_json(entries: list[Entry], *, under: str = "") -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for e in entries:
        item: dict[str, object] = {"path": posixpath.join(under, e.path) if under else e.path}
        item["is_dir"] = e.is_dir
        if not e.is_dir:
            item["file_size"] = e.size
        out.append(item)
    return out


def artifact_open(*, place: Place) -> artifacts.Download:
    download = artifacts.download_open(key=place.key) if place.path else None
    if download is None:
        raise not_found(f"No artifact file at '{echo(place.path or '/')}'")
    return download


# --- files go with their owner -----------------------------------------------------------------


def artifacts_orphans_delete() -> int:
    """Delete the files of every run, logged model and project that no longer exists; the
    number of prefixes deleted. The database is the truth: runs go by cascades no service
    sees (a project deleted in the admin, the demo's reset), so an hourly sweep
    (`tracker.mlflow.tasks.artifacts_sweep`) removes what they leave, rather than a model
    signal. A run or model created meanwhile has its row first, so it is never taken."""
    store = artifacts.artifact_store()
    deleted = 0
    for top in store.prefixes(""):
        if not (top.startswith("p") and top[1:].isdigit()):
            continue
        project_id = int(top[1:])
        if not Project.objects.filter(pk=project_id).exists():
            store.delete(top)
            deleted += 1
            continue
        for kind, model in (("runs", Run), ("models", LoggedModel)):
            names = store.prefixes(f"{top}/{kind}")
            ids = [int(n) for n in names if n.isdigit()]
            live = set(
                model.objects.filter(project_id=project_id, pk__in=ids).values_list("pk", flat=True)
            )
            for pk in ids:
                if pk not in live:
                    store.delete(f"{top}/{kind}/{pk}")
                    deleted += 1
    return deleted
