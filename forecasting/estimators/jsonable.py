"""Estimator results become JSON: numpy scalars turn into Python ones, NaN/Inf into None.

Forecast rows store these dicts in JSON columns, and PostgreSQL's jsonb refuses NaN.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any


def plain(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, list | tuple | dict):
        value = value.item()  # numpy scalar -> int / float / bool
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def as_json(result: Any) -> dict[str, Any]:
    """A result dataclass as a JSON-ready dict."""
    return {k: plain(v) for k, v in asdict(result).items()}
