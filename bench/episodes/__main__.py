"""`python -m bench.episodes DIR`: see bench/episodes/__init__.py."""

from __future__ import annotations

from bench.episodes.run import main

if __name__ == "__main__":
    raise SystemExit(main())
