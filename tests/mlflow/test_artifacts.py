"""The artifact store seam (tracker/artifacts.py) and MLflow's artifact proxy over it: streamed,
size-limited, per project, gone with their run, authorised by the token's scope. Runs without
the mlflow package (Django's test client speaks the wire format)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tracker import artifacts
from tracker.artifacts import ArtifactError, ArtifactTooLarge, LocalArtifactStore
from tracker.mlflow import tasks
from tracker.mlflow.artifacts import artifacts_orphans_delete
from tracker.models import Project, Run

BASE = "/api/2.0/mlflow-artifacts/artifacts"


class CountingReader:
    """A body of `total` bytes that records how much each read asked for."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.asked: list[int] = []

    def read(self, size: int = -1) -> bytes:
        self.asked.append(size)
        n = self.left if size < 0 else min(size, self.left)
        self.left -= n
        return b"x" * n


# --- the seam --------------------------------------------------------------------------------


def test_it_writes_in_chunks_never_the_whole_body(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    body = CountingReader(5 * artifacts.CHUNK_BYTES + 7)
    written = store.write("p1/runs/1/weights.bin", body, max_bytes=10 * artifacts.CHUNK_BYTES)
    assert written == 5 * artifacts.CHUNK_BYTES + 7
    assert store.size("p1/runs/1/weights.bin") == written
    assert max(body.asked) == artifacts.CHUNK_BYTES  # never read(-1), never more than a chunk
    with store.open("p1/runs/1/weights.bin") as f:
        assert len(f.read()) == written


def test_it_refuses_a_file_over_the_limit_keeping_nothing(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    store.write("p1/runs/1/a.bin", io.BytesIO(b"old"), max_bytes=100)
    with pytest.raises(ArtifactTooLarge, match=r"RUNCAST_ARTIFACT_MAX_BYTES \(100 bytes\)"):
        store.write("p1/runs/1/a.bin", CountingReader(101), max_bytes=100)
    # The previous file is intact and no partial file is left.
    assert store.open("p1/runs/1/a.bin").read() == b"old"
    assert sorted(p.name for p in (tmp_path / "p1/runs/1").iterdir()) == ["a.bin"]


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "a\\b", "a\x00b"])
def test_it_refuses_a_path_outside_its_folder(path: str) -> None:
    with pytest.raises(ArtifactError):
        artifacts.safe_path(path)


def test_it_lists_and_deletes_folders(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    for key in ("p1/runs/1/a.txt", "p1/runs/1/sub/b.txt"):
        store.write(key, io.BytesIO(b"12"), max_bytes=10)
    entries = store.children("p1/runs/1")
    assert [(e.path, e.is_dir, e.size) for e in entries] == [
        ("a.txt", False, 2),
        ("sub", True, None),
    ]
    store.delete("p1/runs/1/sub")
    assert [e.path for e in store.walk("p1/runs/1")] == ["a.txt"]


# --- the API ---------------------------------------------------------------------------------


@pytest.fixture
def root(settings: Any, tmp_path: Path) -> Path:
    settings.RUNCAST_ARTIFACT_ROOT = str(tmp_path)
    return tmp_path


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _run(client: Client, token: str) -> dict[str, Any]:
    answer = client.post(
        "/api/2.0/mlflow/runs/create",
        data=json.dumps({"experiment_id": "0"}),
        content_type="application/json",
        headers=_auth(token),
    )
    info: dict[str, Any] = answer.json()["run"]["info"]
    return info


def _url(info: dict[str, Any], name: str) -> str:
    assert info["artifact_uri"] == f"mlflow-artifacts:/0/{info['run_id']}/artifacts"
    return f"{BASE}/0/{info['run_id']}/artifacts/{name}"


def _put(client: Client, url: str, body: bytes, token: str) -> Any:
    return client.put(url, data=body, content_type="text/plain", headers=_auth(token))


@pytest.mark.django_db
def test_it_uploads_lists_downloads_and_deletes(
    client: Client, write_token: str, root: Path
) -> None:
    info = _run(client, write_token)
    assert _put(client, _url(info, "logs/train.log"), b"step 1\n", write_token).json() == {}
    listed = client.get(BASE, {"path": f"0/{info['run_id']}/artifacts"}, headers=_auth(write_token))
    assert listed.json() == {"files": [{"path": "logs", "is_dir": True}]}
    listed = client.get(
        BASE, {"path": f"0/{info['run_id']}/artifacts/logs"}, headers=_auth(write_token)
    )
    assert listed.json() == {"files": [{"path": "train.log", "is_dir": False, "file_size": 7}]}
    download = client.get(_url(info, "logs/train.log"), headers=_auth(write_token))
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == b"step 1\n"  # type: ignore[attr-defined]
    assert download["Content-Disposition"].startswith("attachment")
    assert download["X-Content-Type-Options"] == "nosniff"
    html = _put(client, _url(info, "page.html"), b"<script>", write_token)
    assert html.status_code == 200
    assert client.get(_url(info, "page.html"), headers=_auth(write_token))["Content-Type"] == (
        "text/plain"
    )
    assert client.delete(_url(info, "logs"), headers=_auth(write_token)).status_code == 200
    missing = client.get(_url(info, "logs/train.log"), headers=_auth(write_token))
    assert (missing.status_code, missing.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")


@pytest.mark.django_db
def test_it_refuses_an_upload_over_the_limit_naming_it(
    client: Client, write_token: str, root: Path, settings: Any
) -> None:
    settings.RUNCAST_ARTIFACT_MAX_BYTES = 1000
    info = _run(client, write_token)
    answer = _put(client, _url(info, "big.bin"), b"x" * 1001, write_token)
    assert answer.status_code == 413
    assert "RUNCAST_ARTIFACT_MAX_BYTES (1,000 bytes)" in answer.json()["message"]
    # Beyond the 8 MiB JSON API limit, an artifact is still taken (it is streamed).
    settings.RUNCAST_ARTIFACT_MAX_BYTES = 20 * 1024 * 1024
    assert _put(client, _url(info, "big.bin"), b"x" * 9_000_000, write_token).status_code == 200
    assert not list(root.rglob("*.part"))
    chunked = client.put(
        _url(info, "chunked.bin"),
        data=b"x",
        content_type="text/plain",
        headers=_auth(write_token),
        CONTENT_LENGTH="",
        HTTP_TRANSFER_ENCODING="chunked",
    )
    assert chunked.status_code == 411 and "Content-Length" in chunked.json()["message"]
    # Behind gunicorn, which dechunks: read to the end, the limit applied as it streams.
    settings.RUNCAST_ARTIFACT_MAX_BYTES = 1000
    for body, name in ((b"", "empty.txt"), (b"x" * 2000, "over.bin"), (b"abc", "small.txt")):
        dechunked = client.put(
            _url(info, name),
            data=b"",
            content_type="text/plain",
            headers=_auth(write_token),
            CONTENT_LENGTH="",
            HTTP_TRANSFER_ENCODING="chunked",
            **{"wsgi.input": io.BytesIO(body), "wsgi.input_terminated": True},
        )
        assert dechunked.status_code == (413 if name == "over.bin" else 200), name
    listed = client.get(BASE, {"path": f"0/{info['run_id']}/artifacts"}, headers=_auth(write_token))
    sizes = {f["path"]: f.get("file_size") for f in listed.json()["files"]}
    assert (sizes["empty.txt"], sizes["small.txt"], "over.bin" in sizes) == (0, 3, False)


@pytest.mark.django_db
def test_another_projects_token_finds_nothing(
    client: Client, write_token: str, other_write_token: str, root: Path
) -> None:
    info = _run(client, write_token)
    _put(client, _url(info, "secret.txt"), b"ours", write_token)
    for answer in (
        client.get(_url(info, "secret.txt"), headers=_auth(other_write_token)),
        _put(client, _url(info, "secret.txt"), b"theirs", other_write_token),
        client.delete(_url(info, "secret.txt"), headers=_auth(other_write_token)),
        client.get(
            BASE, {"path": f"0/{info['run_id']}/artifacts"}, headers=_auth(other_write_token)
        ),
    ):
        assert (answer.status_code, answer.json()["error_code"]) == (
            404,
            "RESOURCE_DOES_NOT_EXIST",
        )
    ours = client.get(_url(info, "secret.txt"), headers=_auth(write_token))
    assert b"".join(ours.streaming_content) == b"ours"  # type: ignore[attr-defined]
    traversal = client.get(
        f"{BASE}/0/{info['run_id']}/artifacts/%2E%2E/%2E%2E/x", headers=_auth(write_token)
    )
    assert traversal.status_code in (400, 404)


@pytest.mark.django_db
def test_a_read_token_reads_but_does_not_write(
    client: Client, write_token: str, read_token: str, root: Path
) -> None:
    info = _run(client, write_token)
    _put(client, _url(info, "a.txt"), b"a", write_token)
    assert client.get(_url(info, "a.txt"), headers=_auth(read_token)).status_code == 200
    for answer in (
        _put(client, _url(info, "b.txt"), b"b", read_token),
        client.delete(_url(info, "a.txt"), headers=_auth(read_token)),
    ):
        assert (answer.status_code, answer.json()["error_code"]) == (403, "PERMISSION_DENIED")
    assert client.get(_url(info, "a.txt")).status_code == 401


@pytest.mark.django_db
def test_files_go_with_their_run_and_project(
    client: Client, write_token: str, other_write_token: str, root: Path, project: Project
) -> None:
    gone, kept = _run(client, write_token), _run(client, write_token)
    _put(client, _url(gone, "a.txt"), b"a", write_token)
    _put(client, _url(kept, "a.txt"), b"a", write_token)
    theirs = _run(client, other_write_token)
    _put(client, _url(theirs, "a.txt"), b"a", other_write_token)
    Run.objects.get(project=project, public_id=gone["run_id"]).delete()
    assert artifacts_orphans_delete() == 1
    assert client.get(_url(gone, "a.txt"), headers=_auth(write_token)).status_code == 404
    assert client.get(_url(kept, "a.txt"), headers=_auth(write_token)).status_code == 200
    project.delete()
    assert artifacts_orphans_delete() == 1
    assert [p.name for p in root.iterdir()] == [f"p{Project.objects.get(slug='other').pk}"]
    assert artifacts_orphans_delete() == 0
    for _ in range(2):  # the hourly task, run twice: nothing more goes
        tasks.artifacts_sweep()
    assert [p.name for p in root.iterdir()] == [f"p{Project.objects.get(slug='other').pk}"]


@pytest.mark.django_db
def test_multipart_upload_is_declined_so_the_client_sends_one_stream(
    client: Client, write_token: str, root: Path
) -> None:
    info = _run(client, write_token)
    answer = client.post(
        f"/api/2.0/mlflow-artifacts/mpu/create/0/{info['run_id']}/artifacts",
        data=json.dumps({"path": "big.bin", "num_parts": 3}),
        content_type="application/json",
        headers=_auth(write_token),
    )
    assert answer.status_code == 501
    assert answer.json()["message"].startswith(
        "Multipart upload is not supported for the current artifact repository"
    )


# --- the run page ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_run_page_lists_previews_and_downloads_files(
    client: Client, write_token: str, root: Path, owner: Any, outsider: Any, other_project: Any
) -> None:
    info = _run(client, write_token)
    _put(client, _url(info, "plots/loss.png"), b"\x89PNG\r\n\x1a\n", write_token)
    _put(client, _url(info, "notes.txt"), b"hello <b>", write_token)
    _put(client, _url(info, "weights.bin"), b"\x00\x01", write_token)
    page_url = f"/runs/llm/{info['run_id']}/"
    file_url = f"{page_url}files/"

    client.force_login(owner)
    page = client.get(page_url).content.decode()
    assert f'<img src="{file_url}plots/loss.png?preview=1"' in page
    assert f'href="{file_url}notes.txt?preview=1"' in page
    assert f'href="{file_url}weights.bin" download' in page
    assert "weights.bin?preview=1" not in page
    preview = client.get(f"{file_url}notes.txt?preview=1")
    assert preview["Content-Type"] == "text/plain"
    assert preview["Content-Disposition"].startswith("inline")
    assert b"".join(preview.streaming_content) == b"hello <b>"  # type: ignore[attr-defined]
    download = client.get(f"{file_url}weights.bin")
    assert download["Content-Disposition"].startswith("attachment")
    assert client.get(f"{file_url}../../x").status_code == 404
    assert client.get(f"{file_url}missing.txt").status_code == 404

    client.force_login(outsider)
    assert client.get(f"{file_url}notes.txt?preview=1").status_code == 404


@pytest.mark.django_db
def test_a_moved_runs_files_answer_at_the_uri_taken_before_the_move(
    client: Client, write_token: str, root: Path
) -> None:
    from tracker import bulk
    from tracker.mlflow.models import Experiment
    from tracker.models import Run

    info = _run(client, write_token)
    old_url = _url(info, "model.txt")
    assert _put(client, old_url, b"weights", write_token).status_code == 200
    run = Run.objects.get(public_id=info["run_id"])
    target = Experiment.objects.create(project=run.project, public_id="7", name="moved-here")
    assert bulk.runs_move(project=run.project, run_ids=[info["run_id"]], experiment_id="7") == 1
    got = client.get(
        "/api/2.0/mlflow/runs/get", {"run_id": info["run_id"]}, headers=_auth(write_token)
    )
    moved_uri = got.json()["run"]["info"]["artifact_uri"]
    assert moved_uri == f"mlflow-artifacts:/{target.public_id}/{info['run_id']}/artifacts"
    for url in (old_url, f"{BASE}/{target.public_id}/{info['run_id']}/artifacts/model.txt"):
        download = client.get(url, headers=_auth(write_token))
        assert download.status_code == 200, url
        assert b"".join(download.streaming_content) == b"weights"  # type: ignore[attr-defined]
