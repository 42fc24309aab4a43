"""Single source of the client version (sent in the User-Agent)."""

from __future__ import annotations

__version__ = "0.1.0"
