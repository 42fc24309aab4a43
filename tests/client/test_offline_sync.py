"""Offline mode, the on-disk spool, and `runcast sync`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import runcast
from runcast import cli

from tests.client.conftest import MakeSettings
from tests.client.fakeserver import TOKEN, FakeServer
from tests.client.helpers import fast_env, spool_files, wait_until


def _offline_run(make_settings: MakeSettings, steps: int = 2_500) -> runcast.Run:
    settings = make_settings(None, mode="offline", batch_points=1_000)
    run = runcast.init(project="p", name="offline", settings=settings)
    assert isinstance(run, runcast.Run)
    for step in range(steps):
        run.log({"loss": float(step), "nan": float("nan")}, step=step)
    run.event("checkpoint", step=steps - 1, path="/ckpt")
    run.finish()
    return run


def test_offline_writes_only_to_spool(make_settings: MakeSettings, spool_dir: Path) -> None:
    run = _offline_run(make_settings)
    names = [p.name for p in spool_files(spool_dir)]
    assert "create.json" in names
    assert "finish.json" in names
    assert "lock" not in names, "lock released when the run finished"
    assert not any(name.startswith(".tmp-") for name in names)
    batches = sorted(n for n in names if n.startswith("batch-"))
    assert len(batches) >= 5
    first = json.loads(next(p for p in spool_files(spool_dir) if p.name == batches[0]).read_text())
    assert first["seq"] == 1
    assert first["session"] == run.session


def test_sync_uploads_offline_run_once(
    make_settings: MakeSettings,
    spool_dir: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _offline_run(make_settings)
    monkeypatch.setenv("RUNCAST_TOKEN", TOKEN)
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 0
    state = server.run(run.id)
    assert sorted(s for s, _ in state.points["loss"]) == list(range(2_500))
    assert len(state.points["nan"]) == 2_500
    assert state.events[0]["kind"] == "checkpoint"
    assert state.finishes[0]["status"] == "finished"
    assert state.body["name"] == "offline"
    assert not spool_files(spool_dir), "spool folder removed after a full sync"
    assert "ok" in capsys.readouterr().out
    # Running sync again is a no-op.
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 0
    assert server.state.count("batch") == len(state.seqs)


def test_sync_replay_is_idempotent(
    make_settings: MakeSettings,
    spool_dir: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sync interrupted after the server stored a batch (but before the file was deleted)
    re-sends it with the same session+seq, so the server ignores the copy."""
    _offline_run(make_settings, steps=1_500)
    monkeypatch.setenv("RUNCAST_TOKEN", TOKEN)
    copies = [(p, p.read_bytes()) for p in spool_files(spool_dir) if p.name.startswith("batch-")]
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 0
    for path, data in copies:  # resurrect the files as if deletion had never happened
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        (path.parent / "meta.json").write_text(json.dumps({"run_id": server.run().id}))
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 0
    assert server.state.duplicates == len(copies)
    assert server.state.total_points() == 3_000


def test_sync_keeps_files_on_bad_token(
    make_settings: MakeSettings,
    spool_dir: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _offline_run(make_settings, steps=10)
    monkeypatch.setenv("RUNCAST_TOKEN", "rc_wrong_token")
    before = spool_files(spool_dir)
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 1
    assert spool_files(spool_dir) == before
    assert server.state.count("create") == 1, "a 401 stops the sync instead of spinning"


def test_sync_retries_transient_errors(
    make_settings: MakeSettings,
    spool_dir: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _offline_run(make_settings, steps=10)
    monkeypatch.setenv("RUNCAST_TOKEN", TOKEN)
    monkeypatch.setenv("RUNCAST_BACKOFF_BASE", "0.01")
    monkeypatch.setenv("RUNCAST_BACKOFF_MAX", "0.02")
    server.script("batch", (502, {"error": "bad gateway"}, {}))
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 0
    assert server.state.total_points() == 20


# A trainer that spools its points (offline) and then stays alive until it is killed.
TRAINER = textwrap.dedent(
    """
    import time
    import runcast

    run = runcast.init(project="p", name="killed", id="killed", mode="offline")
    for step in range(500):
        run.log({"loss": float(step)}, step=step)
    print("logged", flush=True)
    time.sleep(120)
    """
)


@pytest.fixture
def trainer(tmp_path: Path, spool_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """A live trainer process whose spool holds its 500 points; killed at the end."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, **fast_env(None, spool_dir)}
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "logged"
        on_disk = lambda: sum(  # noqa: E731
            len(json.loads(p.read_bytes())["metrics"]["loss"]["steps"])
            for p in spool_files(spool_dir)
            if p.name.startswith("batch-")
        )
        assert wait_until(lambda: on_disk() == 500), "the trainer spooled its points"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_sync_removes_the_folder_of_a_killed_process_with_its_stale_lock(
    trainer: subprocess.Popen[str],
    spool_dir: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer.send_signal(signal.SIGKILL)  # no atexit, no release: the lock stays behind
    trainer.wait()
    [lock] = [p for p in spool_files(spool_dir) if p.name == "lock"]
    assert lock.read_text().endswith(f":{trainer.pid}")
    monkeypatch.setenv("RUNCAST_TOKEN", TOKEN)
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 0
    assert sorted(s for s, _ in server.run("killed").points["loss"]) == list(range(500))
    assert list(spool_dir.iterdir()) == [], "the delivered folder is gone, lock and all"


def test_sync_leaves_the_folder_and_lock_of_a_live_process(
    trainer: subprocess.Popen[str],
    spool_dir: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNCAST_TOKEN", TOKEN)
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 1, "skipped"
    assert server.state.requests == []
    # --force delivers what is there, but the process may still write: its folder stays
    # findable (meta.json) and owned (lock).
    assert cli.main(["sync", "--force", "--dir", str(spool_dir), "--url", server.url]) == 0
    assert len(server.run("killed").points["loss"]) == 500
    assert sorted(p.name for p in spool_files(spool_dir)) == ["lock", "meta.json"]
    assert trainer.poll() is None, "still running"


def test_sync_counts_the_points_of_a_spooled_batch_the_server_refuses(
    make_settings: MakeSettings,
    spool_dir: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _offline_run(make_settings, steps=1_500)
    first = min(p for p in spool_files(spool_dir) if p.name.startswith("batch-"))
    metrics = json.loads(first.read_bytes())["metrics"]
    refused = sum(len(m["steps"]) for m in metrics.values())
    server.script("batch", (400, {"error": "bad metric", "field": "metrics"}, {}))
    monkeypatch.setenv("RUNCAST_TOKEN", TOKEN)
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 0
    assert server.state.total_points() == 3_000 - refused
    assert f"1 dropped ({refused} points), 0 left" in capsys.readouterr().out


def test_sync_without_url_is_an_error(make_settings: MakeSettings, spool_dir: Path) -> None:
    _offline_run(make_settings, steps=5)
    assert cli.main(["sync", "--dir", str(spool_dir)]) == 1
    assert spool_files(spool_dir)


def test_console_script_sync(
    make_settings: MakeSettings, spool_dir: Path, server: FakeServer
) -> None:
    """The installed `runcast` entry point (or `python -m runcast`) runs the same sync."""
    run = _offline_run(make_settings, steps=100)
    env = {**os.environ, "RUNCAST_TOKEN": TOKEN, "RUNCAST_URL": server.url}
    script = Path(sys.executable).with_name("runcast")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "runcast"]
    done = subprocess.run(
        [*command, "sync", "--dir", str(spool_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    assert len(server.run(run.id).points["loss"]) == 100


def test_env_mode_offline(
    make_settings: MakeSettings, spool_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCAST_MODE", "offline")
    monkeypatch.setenv("RUNCAST_DIR", str(spool_dir))
    monkeypatch.setenv("RUNCAST_URL", "http://127.0.0.1:9")  # never contacted
    run = runcast.init(name="env-offline")
    run.log({"loss": 1.0}, step=0)
    run.finish()
    assert run.url is None
    assert any(p.name == "finish.json" for p in spool_files(spool_dir))


def _capped_run(make_settings: MakeSettings, cap: int, steps: int = 5_000) -> runcast.Run:
    settings = make_settings(None, mode="offline", batch_points=100, max_spool_bytes=cap)
    run = runcast.init(project="p", name="capped", settings=settings)
    assert isinstance(run, runcast.Run)
    for step in range(steps):
        run.log({"loss": float(step)}, step=step)
    run.finish()
    return run


def test_a_full_spool_drops_its_oldest_batches_counted_and_warned_once(
    make_settings: MakeSettings,
    spool_dir: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cap = 20_000
    with caplog.at_level("WARNING", logger="runcast"):
        run = _capped_run(make_settings, cap)
    files = spool_files(spool_dir)
    batches = sorted(p for p in files if p.name.startswith("batch-"))
    assert sum(p.stat().st_size for p in batches) <= cap
    seqs = [json.loads(p.read_text())["seq"] for p in batches]
    stats = run.stats()
    written = stats["batches_spooled"]
    assert written == 50  # 5,000 points in batches of 100
    # The newest survive, the oldest went, and every one that went is counted.
    assert seqs == list(range(written - len(seqs) + 1, written + 1))
    assert stats["batches_spool_dropped"] == written - len(seqs) > 0
    assert stats["points_dropped"] == 100 * stats["batches_spool_dropped"]
    assert stats["bytes_spool_dropped"] > 0
    assert {"create.json", "finish.json"} <= {p.name for p in files}
    warnings = [r for r in caplog.records if "max_spool_bytes" in r.getMessage()]
    assert len(warnings) == 1
    # What is left still replays: the newest steps, and the finish.
    monkeypatch.setenv("RUNCAST_TOKEN", TOKEN)
    assert cli.main(["sync", "--dir", str(spool_dir), "--url", server.url]) == 0
    state = server.run(run.id)
    kept_from = (seqs[0] - 1) * 100
    assert sorted(s for s, _ in state.points["loss"]) == list(range(kept_from, 5_000))
    assert state.finishes[0]["status"] == "finished"


def test_no_cap_keeps_everything_and_a_tiny_cap_never_raises(
    make_settings: MakeSettings, spool_dir: Path
) -> None:
    run = _capped_run(make_settings, 0, steps=1_000)
    assert run.stats()["batches_spool_dropped"] == 0
    assert len([p for p in spool_files(spool_dir) if p.name.startswith("batch-")]) == 10
    # A cap below one batch: every batch is dropped (counted), training goes on, no exception.
    tiny = _capped_run(make_settings, 100, steps=1_000)
    stats = tiny.stats()
    assert stats["batches_dropped"] == 10 and stats["batches_spooled"] == 0
    assert stats["points_dropped"] == 1_000


def test_the_cap_comes_from_the_environment() -> None:
    from runcast.settings import DEFAULT_MAX_SPOOL_BYTES, from_env

    assert from_env(environ={}).max_spool_bytes == DEFAULT_MAX_SPOOL_BYTES
    assert from_env(environ={"RUNCAST_MAX_SPOOL_BYTES": "5000"}).max_spool_bytes == 5000
