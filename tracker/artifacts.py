"""Artifact storage: the one seam between Runcast and where a run's files live.

Files (MLflow's artifacts: plots, configs, checkpoints, logged models) are kept under keys
`p<project pk>/runs/<run pk>/<path>` and `p<project pk>/models/<model pk>/<path>`: a key names
its project, so one project's files can never be reached through another's prefix, and the
database ids (not names a client chose) make the keys safe and stable.

`artifact_store()` gives the configured store: `LocalArtifactStore` under
`RUNCAST_ARTIFACT_ROOT` (var/artifacts in the embedded mode, a volume in compose). A store writes
and reads in chunks (never a whole file in memory), refuses a file over `max_bytes` naming the
limit, and deletes a prefix whole (a run's files go with the run:
`tracker.mlflow.artifacts.artifacts_orphans_delete`).
"""

from __future__ import annotations

import mimetypes
import os
import posixpath
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from django.conf import settings
from django.http import FileResponse

from tracker.limits import echo

CHUNK_BYTES = 1024 * 1024


class ArtifactError(Exception):
    """A refused artifact path or file; `field` names what was wrong."""

    def __init__(self, message: str, *, field: str = "path") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class ArtifactTooLarge(ArtifactError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the artifact exceeds RUNCAST_ARTIFACT_MAX_BYTES ({limit:,} bytes); keep larger "
            "files in your own storage and log their path as a tag",
            field="body",
        )
        self.limit = limit


class ArtifactNotFound(ArtifactError):
    pass


@dataclass(frozen=True)
class Entry:
    """One child of a listed folder: its path relative to the folder listed."""

    path: str
    is_dir: bool
    size: int | None


class Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class ArtifactStore(Protocol):
    def write(self, key: str, body: Readable, *, max_bytes: int) -> int: ...
    def open(self, key: str) -> BinaryIO: ...
    def size(self, key: str) -> int: ...
    def is_file(self, key: str) -> bool: ...
    def children(self, key: str) -> list[Entry]: ...
    def walk(self, key: str) -> Iterator[Entry]: ...
    def delete(self, key: str) -> None: ...
    def prefixes(self, key: str) -> list[str]: ...


def safe_path(path: str, *, field: str = "path") -> str:
    """A relative artifact path, normalised, or ArtifactError: no `..`, no absolute path, no
    backslash or NUL (MLflow's `validate_path_is_safe` refuses the same)."""
    if "\x00" in path or "\\" in path:
        raise ArtifactError(
            f"Invalid path '{echo(path)}': NUL and backslash are refused", field=field
        )
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") and parts:
        raise ArtifactError(f"Invalid path '{echo(path)}': it must be relative", field=field)
    if ".." in parts:
        raise ArtifactError(f"Invalid path '{echo(path)}': '..' is refused", field=field)
    return "/".join(parts)


def run_prefix(*, project_id: int, run_id: int) -> str:
    return f"p{project_id}/runs/{run_id}"


def model_prefix(*, project_id: int, model_id: int) -> str:
    return f"p{project_id}/models/{model_id}"


def join(prefix: str, path: str) -> str:
    return posixpath.join(prefix, path) if path else prefix


class LocalArtifactStore:
    """Files under one root folder. A write lands in a temporary file beside its target and is
    renamed over it when complete, so a reader never sees half a file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        # Keys are built by run_prefix/model_prefix + safe_path; checked again here because a
        # store must never write outside its root whatever a caller passes.
        return self.root / safe_path(key, field="key")

    def write(self, key: str, body: Readable, *, max_bytes: int) -> int:
        target = self._path(key)
        if target.is_dir():
            raise ArtifactError(f"'{echo(key.split('/', 3)[-1])}' is a folder of artifacts")
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f".{target.name}.{secrets.token_hex(6)}.part")
        written = 0
        try:
            with open(part, "wb") as out:
                while chunk := body.read(CHUNK_BYTES):
                    written += len(chunk)
                    if written > max_bytes:
                        raise ArtifactTooLarge(max_bytes)
                    out.write(chunk)
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)
        return written

    def open(self, key: str) -> BinaryIO:
        path = self._path(key)
        if not path.is_file():
            raise ArtifactNotFound(f"No artifact at '{echo(key)}'")
        return open(path, "rb")

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def is_file(self, key: str) -> bool:
        return self._path(key).is_file()

    def children(self, key: str) -> list[Entry]:
        """The children of a folder (none for a file or a missing folder), by name."""
        folder = self._path(key)
        if not folder.is_dir():
            return []
        out = []
        for child in sorted(folder.iterdir(), key=lambda p: p.name):
            if child.name.endswith(".part") and child.name.startswith("."):
                continue  # a write in progress
            if child.is_dir():
                out.append(Entry(child.name, True, None))
            else:
                out.append(Entry(child.name, False, child.stat().st_size))
        return out

    def walk(self, key: str) -> Iterator[Entry]:
        """Every file below a folder, paths relative to it (the run page's list)."""
        folder = self._path(key)
        if not folder.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for name in sorted(filenames):
                if name.startswith(".") and name.endswith(".part"):
                    continue
                full = Path(dirpath) / name
                yield Entry(full.relative_to(folder).as_posix(), False, full.stat().st_size)

    def prefixes(self, key: str) -> list[str]:
        """The names of the folders directly under a key (the sweep of orphans walks them)."""
        folder = self._path(key)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_dir())

    def delete(self, key: str) -> None:
        """A file or a whole folder; deleting what is not there does nothing."""
        path = self._path(key)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink(missing_ok=True)


def artifact_store() -> ArtifactStore:
    return LocalArtifactStore(Path(settings.RUNCAST_ARTIFACT_ROOT))


def max_bytes() -> int:
    return int(settings.RUNCAST_ARTIFACT_MAX_BYTES)


# --- downloads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Download:
    file: BinaryIO
    size: int
    name: str
    content_type: str


# Types a browser would run as a page or script are sent as text (MLflow's server does the same).
_AS_TEXT = ("text/html", "application/javascript", "text/javascript", "image/svg+xml")


def content_type(name: str) -> str:
    guessed = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if guessed in _AS_TEXT or preview_kind(name) == "text":
        return "text/plain"
    return guessed


def download_open(*, key: str) -> Download | None:
    """An open file to stream, or None where there is no file."""
    store = artifact_store()
    if not store.is_file(key):
        return None
    name = posixpath.basename(key)
    return Download(store.open(key), store.size(key), name, content_type(name))


def file_response(download: Download, *, inline: bool = False) -> FileResponse:
    """The file streamed in chunks (FileResponse reads it block by block), as an attachment
    unless previewed; never sniffed into a page the browser would run."""
    response = FileResponse(
        download.file,
        as_attachment=not inline,
        filename=download.name,
        content_type=download.content_type,
    )
    response["Content-Length"] = str(download.size)
    response["X-Content-Type-Options"] = "nosniff"
    return response


# --- reads for pages -------------------------------------------------------------------------

# Files the run page previews inline (their first PREVIEW_BYTES): text, and images a browser
# shows. Anything else is a download.
PREVIEW_BYTES = 64 * 1024
TEXT_SUFFIXES = frozenset(
    (".txt", ".log", ".json", ".yaml", ".yml", ".csv", ".md", ".py", ".toml", ".cfg", ".ini")
)
TEXT_NAMES = frozenset(("MLmodel", "requirements.txt", "conda.yaml", "python_env.yaml"))
IMAGE_SUFFIXES = frozenset((".png", ".jpg", ".jpeg", ".gif", ".webp"))


@dataclass(frozen=True)
class RunFile:
    path: str
    size: int
    kind: str  # "image", "text" or "file"


def preview_kind(path: str) -> str:
    name = posixpath.basename(path)
    suffix = posixpath.splitext(name)[1].lower()
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in TEXT_SUFFIXES or name in TEXT_NAMES:
        return "text"
    return "file"


def run_file_open(*, project_id: int, run_id: int, path: str) -> Download | None:
    """One of a run's files for its page's download and preview links, or None."""
    try:
        relative = safe_path(path)
    except ArtifactError:
        return None
    if not relative:
        return None
    return download_open(key=join(run_prefix(project_id=project_id, run_id=run_id), relative))


def run_files(*, project_id: int, run_id: int, limit: int = 500) -> list[RunFile]:
    """A run's files for its page, at most `limit` (a run logging thousands of checkpoints
    must not make its page slow)."""
    out = []
    for entry in artifact_store().walk(run_prefix(project_id=project_id, run_id=run_id)):
        out.append(RunFile(entry.path, entry.size or 0, preview_kind(entry.path)))
        if len(out) >= limit:
            break
    return out
