"""`python -m runcast sync` mirrors the `runcast` console script."""

from __future__ import annotations

import sys

from runcast.cli import main

sys.exit(main())
