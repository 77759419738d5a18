"""RFC 3339 UTC timestamps on the wire; float seconds since the epoch inside.

Formatting is deterministic (always millisecond precision, `Z` suffix) so the
same time always encodes to the same bytes, which keeps snapshots
byte-identical between live projection and replay.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from schemas.errors import PayloadError

_SECONDS: dict[int, str] = {}
"""`%Y-%m-%dT%H:%M:%S` of whole epoch seconds recently formatted (the projector formats
several times per record, most of them within the same few seconds)."""
_SECONDS_KEPT = 4096


def format_time(t: float) -> str:
    """`2026-12-02T14:00:00.123Z` for `t` seconds since the epoch."""
    ms = round(t * 1000)
    secs, millis = divmod(ms, 1000)
    head = _SECONDS.get(secs)
    if head is None:
        if len(_SECONDS) >= _SECONDS_KEPT:
            _SECONDS.clear()
        head = _SECONDS[secs] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    return f"{head}.{millis:03d}Z"


def parse_time(text: str) -> float:
    """Seconds since the epoch for an RFC 3339 timestamp (any offset, up to ns precision)."""
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    # Python's fromisoformat takes at most 6 fractional digits; NATS sends 9.
    frac_ns = 0
    if "." in s:
        head, _, rest = s.partition(".")
        digits = ""
        for ch in rest:
            if not ch.isdigit():
                break
            digits += ch
        tz = rest[len(digits):]
        frac_ns = int((digits + "000000000")[:9]) if digits else 0
        s = head + tz
    try:
        dt = datetime.fromisoformat(s)
    except ValueError as exc:
        raise PayloadError(f"not an RFC 3339 timestamp: {text!r}") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp() + frac_ns / 1e9


def now() -> float:
    """The wall clock; only ever called at the IO edges, never in the fold."""
    return time.time()
