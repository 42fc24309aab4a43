"""A run's files on its page in headless Chromium: the image is shown (the page's CSP lets it
load), a text file opens as text, a binary downloads."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard import factories
from tests.dashboard.test_browser import _logged_in, browser  # noqa: F401 (the fixture)
from tracker import artifacts

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _png(width: int, height: int) -> bytes:
    """A valid RGB PNG of one colour, written by hand (no imaging package needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\x20\x80\xc0" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def test_the_run_page_shows_images_and_opens_text(
    browser: Any,  # noqa: F811
    live_server: Any,
    owner: Any,
    project: Any,
    settings: Any,
    tmp_path: Path,
) -> None:
    settings.RUNCAST_ARTIFACT_ROOT = str(tmp_path)
    run = factories.make_run(project, "with-files", points=200)
    prefix = artifacts.run_prefix(project_id=project.pk, run_id=run.pk)
    store = artifacts.artifact_store()
    for name, body in (
        ("plots/loss.png", _png(40, 30)),
        ("notes.txt", b"lr was 3e-4 <script>alert(1)</script>"),
        ("model.pkl", b"\x80\x04binary"),
    ):
        store.write(f"{prefix}/{name}", io.BytesIO(body), max_bytes=10_000)

    with _logged_in(browser, live_server) as pg:
        pg.goto(f"{live_server.url}/runs/{project.slug}/with-files/")
        files = pg.locator("#files")
        image = files.locator("img")
        image.wait_for()
        pg.wait_for_function("() => document.querySelector('#files img').complete")
        assert image.evaluate("img => img.naturalWidth") == 40
        assert files.locator("a", has_text="model.pkl").count() == 0  # no preview link
        with pg.expect_download() as download:
            files.locator("tr", has_text="model.pkl").locator("a", has_text="download").click()
        assert download.value.suggested_filename == "model.pkl"
        files.locator("a", has_text="notes.txt").click()
        # Shown as text: the script is characters on the page, never run.
        assert "<script>alert(1)</script>" in pg.locator("body").inner_text()
