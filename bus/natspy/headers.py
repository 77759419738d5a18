"""A faster parser of NATS message headers for nats-py's receive path, same results.

Every JetStream message crr reads carries headers (`Nats-Msg-Id` at least),
and nats-py parses each block line by line with several Python-level steps
per character class check: ~5% of the projector's CPU at 5k reports/s.
`parse_headers` gives exactly what nats-py's `Client._process_headers`
gives for a plain header block (`NATS/1.0\\r\\nName: value\\r\\n...`): the
same names kept or skipped, the same values, the same None/{} cases — a
hypothesis property in `tests/bus/test_natspy_headers.py` compares the two on
arbitrary blocks.  It remembers the few header names it meets (a name's
checks are done once), and leaves status blocks (`NATS/1.0 100 Idle
Heartbeat`, `NATS/1.0 404 ...`: rare control messages) to nats-py's own code.

`install(nc)` puts it in place on one connection (`crr.bus.connection` does so
for every connection it opens); it installs nothing when `crr.bus.natspy` says the
path is not usable (another nats-py, `CRR_NATS_FAST=0`, or nats-py using the
optional `fast_mail_parser`, whose results differ).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import nats.aio.client as _client
from nats.aio.client import Client

from crr.bus import natspy

log = logging.getLogger("crr.bus.headers")

_HDR_LINE = b"NATS/1.0"
_PLAIN = _HDR_LINE + b"\r\n"
_SPACE = re.compile(rb"[\t-\r\x1c-\x1f ]")
"""The ASCII characters `str.isspace` accepts (nats-py skips a name holding one)."""
_NAMES: dict[bytes, str | None] = {}
"""Raw name (before `:`) -> the header name nats-py makes of it, or None (skipped)."""
_NAMES_MAX = 1024


def _name(raw: bytes) -> str | None:
    """What nats-py makes of the bytes before a line's `:` (None: it skips the line)."""
    key = _NAMES.get(raw, raw)  # `raw` itself: not seen yet (a str or None otherwise)
    if not isinstance(key, bytes):
        return key
    stripped = raw.strip()
    try:
        name: str | None = stripped.decode("ascii")
    except UnicodeDecodeError:
        name = None
    if name is not None and _SPACE.search(stripped):
        name = None
    if len(_NAMES) < _NAMES_MAX:
        _NAMES[raw] = name
    return name


def parse_lines(raw: bytes) -> dict[str, str]:
    """nats-py's `Client._parse_header_lines(raw)`, faster."""
    out: dict[str, str] = {}
    for line in raw.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if not sep:
            continue  # (an empty line has no `:` either)
        key = _name(name)
        if key is not None:
            out[key] = value.strip().decode("utf-8", "replace")
    return out


def parse_headers(headers: bytes) -> dict[str, str] | None:
    """What nats-py's `_process_headers` returns for a block without a status line.

    Only for blocks starting `NATS/1.0\\r\\n` (`plain(headers)`); nats-py's own
    code handles the others."""
    if len(headers) <= len(_PLAIN):
        return None
    return parse_lines(headers[len(_PLAIN):]) or None


def plain(headers: bytes | None) -> bool:
    """Whether `parse_headers` handles this block (no status line; not empty)."""
    return bool(headers) and headers.startswith(_PLAIN)  # type: ignore[union-attr]


ProcessHeaders = Callable[[Any], Awaitable[dict[str, str] | None]]


def _same_line(_: Any) -> str | None:
    """Whether this nats-py's header line is the one `parse_headers` expects."""
    if bytes(getattr(_client, "NATS_HDR_LINE", b"")) != _HDR_LINE:
        return "nats-py's header line differs"
    return None


def usable(nc: Client | None = None) -> bool:
    """Whether `parse_headers` gives what this nats-py's header parsing gives (on `nc`)."""
    return natspy.usable("headers", nc, _same_line)


def install(nc: Client) -> bool:
    """Make `nc` parse plain header blocks with `parse_headers`; whether it did."""
    if not usable(nc):
        return False
    original: ProcessHeaders = nc._process_headers

    async def process_headers(headers: Any) -> dict[str, str] | None:
        if headers and headers[8:10] == b"\r\n" and headers[:8] == _HDR_LINE:
            return parse_headers(headers)
        return await original(headers)

    nc._process_headers = process_headers  # type: ignore[method-assign]
    return True
