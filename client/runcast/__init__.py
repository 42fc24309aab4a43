"""Runcast trainer-side client (standard library only).

import runcast

run = runcast.init(project="llm", name="baseline", total_steps=10_000, config=cfg)
for step in range(10_000):
    run.log({"loss": loss, "lr": lr}, step=step)
run.finish()
"""

from __future__ import annotations

from runcast.run import NoOpRun, RankRun, Run, init
from runcast.settings import Settings
from runcast.version import __version__

__all__ = ["NoOpRun", "RankRun", "Run", "Settings", "__version__", "init"]
