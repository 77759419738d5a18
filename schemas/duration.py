"""Durations as written by operators: `250ms`, `30s`, `5m`, `1h`, `1d`, or a number of seconds."""

from __future__ import annotations

import re

from crr.schemas.errors import DurationError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str | float) -> float:
    """Seconds in `text`; compound forms like `1h30m` are accepted."""
    if isinstance(text, bool):
        raise DurationError(f"expected a duration like '30s', got {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise DurationError(f"duration must not be negative, got {text!r}")
        return float(text)
    s = text.strip()
    if not s:
        raise DurationError("empty duration")
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        try:
            return parse_duration(float(s))
        except ValueError:
            pass
        raise DurationError(f"expected a duration like '30s', '5m', '1h' or '250ms', got {text!r}")
    return total
