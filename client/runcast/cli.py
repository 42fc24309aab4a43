"""`runcast sync [--dir DIR]`: upload spooled or offline runs.

The token comes only from RUNCAST_TOKEN (never a flag: argv is visible in `ps`).
Exit status: 0 everything uploaded, 1 something left in the spool, 2 usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from runcast import spool as spool_mod
from runcast.delivery import Client, ReplayResult, replay
from runcast.settings import Settings, from_env

logger = logging.getLogger("runcast")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["agent"]:
        from runcast import agent  # the host agent has its own options (runcast agent -h)

        return agent.main(argv[1:])
    args = _parser().parse_args(argv)
    _setup_logging(args.verbose)
    if args.command != "sync":
        _parser().print_help()
        return 2
    settings = from_env()
    if args.dir:
        settings = dataclasses.replace(settings, dir=Path(args.dir))
    if args.timeout:
        settings = dataclasses.replace(settings, timeout=args.timeout)
    return sync(settings, url=args.url, run_id=args.run, force=args.force)


def sync(
    settings: Settings, url: str | None = None, run_id: str | None = None, force: bool = False
) -> int:
    """Replay every session folder under the spool root, oldest first."""
    root = settings.spool_root()
    remaining = 0
    sessions = 0
    for folder in spool_mod.iter_sessions(root):
        meta = folder.meta()
        if run_id is not None and meta.get("run_id") != run_id:
            continue
        sessions += 1
        if not force and folder.owned_by_live_process():
            print(f"skip   {folder.path}: a running process still owns it (--force to override)")
            remaining += 1
            continue
        remaining += _sync_one(settings, folder, meta, url)
    if sessions == 0:
        print(f"nothing to sync under {root}")
    return 1 if remaining else 0


def _sync_one(
    settings: Settings, folder: spool_mod.SessionSpool, meta: dict, url: str | None
) -> int:
    """Returns 1 when files are left behind."""
    target = (url or settings.url or meta.get("url") or "").rstrip("/")
    if not target:
        print(f"error  {folder.path}: no server URL (set RUNCAST_URL or pass --url)")
        return 1
    client = Client(dataclasses.replace(settings, url=target))
    before = len(folder.pending())
    result = replay(client, folder, str(meta.get("run_id")), first_retries=settings.max_retries)
    left = len(folder.pending())
    if result is ReplayResult.DONE:
        # Also removes the lock of a process that was killed (it never released it); a folder
        # its process may still write to stays, with its lock.
        folder.remove_delivered()
    counters = client.counters
    print(
        f"{'ok' if not left else result.value:<6} run {meta.get('run_id')} session "
        f"{meta.get('session')}: {before - left} file(s) sent, "
        f"{counters.batches_dropped} dropped ({counters.points_dropped} points), {left} left"
    )
    return 1 if left else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runcast", description="Runcast client tools")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("agent", help="GPU host agent (runcast agent -h)")
    sync_cmd = commands.add_parser("sync", help="upload spooled / offline runs")
    sync_cmd.add_argument("--dir", help="spool root (default: RUNCAST_DIR or ~/.cache/runcast)")
    sync_cmd.add_argument("--url", help="server base URL (default: RUNCAST_URL, then the spool's)")
    sync_cmd.add_argument("--run", help="only this run id")
    sync_cmd.add_argument("--timeout", type=float, help="per-request timeout in seconds")
    sync_cmd.add_argument("--force", action="store_true", help="also sync folders of live runs")
    sync_cmd.add_argument("-v", "--verbose", action="store_true")
    parser.set_defaults(verbose=False)
    return parser


def _setup_logging(verbose: bool) -> None:
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    # main() may run several times in one process (tests); attach the handler once.
    if any(getattr(h, "_runcast_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler._runcast_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)


if __name__ == "__main__":
    sys.exit(main())
