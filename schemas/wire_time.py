"""RFC 3339 UTC timestamps on the wire; float seconds since the epoch inside.

This is the only module that formats or parses timestamp strings: everything
else holds time as float epoch seconds and converts at the wire edge (payload
fields, export lines, CLI/REST output).  Records carry numeric twins
(`*_ts`) of their times, so readers take the float and parse the string only
for a record from an older writer.

Formatting is deterministic (always millisecond precision, `Z` suffix) so the
same time always encodes to the same bytes, which keeps snapshots
byte-identical between live projection and replay.  `wire_rounded(t)` is the
float that `parse_time(format_time(t))` gives back, computed without the strings.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from crr.schemas.errors import PayloadError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

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


def from_millis(ms: int) -> float:
    """Epoch seconds of `ms` whole milliseconds, exactly as `parse_time` reads them back
    from `format_time`'s text (whole seconds + nanoseconds / 1e9, not `ms / 1000`)."""
    secs, millis = divmod(ms, 1000)
    return secs + millis * 1_000_000 / 1e9


def wire_rounded(t: float) -> float:
    """`parse_time(format_time(t))` without the strings: `t` at the wire's precision."""
    return from_millis(round(t * 1000))


def floor_millis(t: float) -> float:
    """`t` floored to the millisecond, as the wire carries it (`wire_rounded` of the floor)."""
    return from_millis(math.floor(t * 1000))


def format_time_whole(t: float) -> str:
    """RFC 3339 UTC in whole seconds, rounded down (`2026-12-02T14:00:00Z`): for readers
    that want no fraction (NFD's `# +expiry-time=`); never later than `t`."""
    return datetime.fromtimestamp(math.floor(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_time_precise(t: float) -> str:
    """RFC 3339 UTC with microseconds (`crr events export` lines, where `ts` is exact)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_fromisoformat: Final = datetime.fromisoformat


def expires_seconds(text: str) -> float:
    """Epoch seconds of an RFC 3339 timestamp; `-inf` (already expired) if it does not parse.

    For readers of a time that may be garbage (an older record without a `*_ts` twin):
    a deadline that cannot be read counts as passed.  The canonical form the
    projector writes (`2026-12-02T14:00:00.123Z`) is parsed by a fast path
    (`datetime.fromisoformat` is C code, ~10x faster than slicing digits);
    anything else goes through `parse_time`.  Both give the same float: whole
    seconds + milliseconds / 1000.
    """
    if len(text) == 24 and text[23] == "Z" and text[10] == "T" and text[19] == ".":
        try:
            dt = _fromisoformat(text)
        except ValueError:
            pass
        else:
            return int(dt.timestamp()) + dt.microsecond * 1000 / 1e9
    try:
        return parse_time(text)
    except PayloadError:
        return -math.inf


def seconds_of(ts: float | None, text: str) -> float:
    """A record's time in epoch seconds: its numeric `*_ts` twin (exact, as the projector
    holds it), else its RFC 3339 text read by `expires_seconds` (a record from an older
    writer, which has no twin)."""
    return ts if ts is not None else expires_seconds(text)


_DIGITS: Final = (0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 22)
_SEPARATORS: Final = ((4, "-"), (7, "-"), (10, "T"), (13, ":"), (16, ":"), (19, "."), (23, "Z"))
_MONTH_DAYS: Final = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def expires_many(texts: list[str]) -> FloatArray:
    """`expires_seconds` of every text, vectorised: the same floats, bit for bit.

    Canonical timestamps (`YYYY-MM-DDTHH:MM:SS.mmmZ`, years 1970–9999, a
    real calendar date) are parsed with numpy on their bytes; the rest
    (other forms, garbage) go through `expires_seconds` one by one.
    """
    import numpy as np  # noqa: PLC0415 - keeps numpy out of the agent's and publishers' imports

    n = len(texts)
    out: FloatArray = np.empty(n, dtype=np.float64)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=n)
    sel = np.flatnonzero(lengths == 24)
    ok = np.zeros(n, dtype=np.bool_)
    if len(sel):
        chosen = texts if len(sel) == n else [texts[i] for i in sel.tolist()]
        # Non-ASCII characters become "?" (one byte each), which fails the checks below.
        raw = np.frombuffer("".join(chosen).encode("ascii", "replace"), dtype=np.uint8)
        b = raw.reshape(len(sel), 24)
        good = np.ones(len(sel), dtype=np.bool_)
        for pos, ch in _SEPARATORS:
            good &= b[:, pos] == ord(ch)
        d = b[:, list(_DIGITS)].astype(np.int64) - ord("0")
        good &= ((d >= 0) & (d <= 9)).all(axis=1)
        year = d[:, 0] * 1000 + d[:, 1] * 100 + d[:, 2] * 10 + d[:, 3]
        month = d[:, 4] * 10 + d[:, 5]
        day = d[:, 6] * 10 + d[:, 7]
        hour = d[:, 8] * 10 + d[:, 9]
        minute = d[:, 10] * 10 + d[:, 11]
        second = d[:, 12] * 10 + d[:, 13]
        millis = d[:, 14] * 100 + d[:, 15] * 10 + d[:, 16]
        leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
        month_days = np.array(_MONTH_DAYS, dtype=np.int64)
        dim = month_days[np.clip(month, 0, 12)] + (leap & (month == 2))
        good &= ((year >= 1970) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= dim)
                 & (hour < 24) & (minute < 60) & (second < 60))
        # Days from civil (H. Hinnant's algorithm; March is month 0, years ≥ 1).
        y = year - (month <= 2)
        era = y // 400
        yoe = y - era * 400
        doy = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
        days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
        secs = days * 86400 + hour * 3600 + minute * 60 + second
        # The scalar fast path's arithmetic: int seconds + (ms * 10**6) / 1e9.
        out[sel] = secs.astype(np.float64) + (millis * 1_000_000).astype(np.float64) / 1e9
        ok[sel] = good
    for i in np.flatnonzero(~ok).tolist():
        out[i] = expires_seconds(texts[i])
    return out


def now() -> float:
    """The wall clock; only ever called at the IO edges, never in the fold."""
    return time.time()
