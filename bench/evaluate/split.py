"""The family split every fitted figure of bench/evaluate uses: half A fits, half B is held out."""

from __future__ import annotations

import zlib


def half_of(family: str) -> str:
    """'A' (crc32 of the family even: fits) or 'B' (odd: held out)."""
    return "A" if zlib.crc32(family.encode()) % 2 == 0 else "B"
