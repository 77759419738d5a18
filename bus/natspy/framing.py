"""Publishing frames built by crr, not by `Client.publish` (a nats-py fast path).

`Framer.send` is `Client.publish(subject, payload, reply=reply, headers=headers)` with
the protocol frame built here: nats-py's per-message work (an f-string, a regular
expression per header name, a `str.translate` of every header value, two copies of the
payload) costs more than the rest of a send.  The frame is the one nats-py would send
(`tests/bus/test_pipeline_publish.py` compares them); anything unusual — not connected,
draining, an oversized message, a header nats-py would rewrite or refuse — and a nats-py
without the parts it writes to (`crr.bus.natspy.check`) go through `Client.publish` itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from nats.aio.client import Client

from crr.bus import natspy

_INVALID_SUBJECT = re.compile(r"[ \t\r\n]")
"""What nats-py refuses in a subject to publish to (its `_validate_subject`)."""
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""The header names nats-py sends as they are (its `_HEADER_KEY_RE`)."""
_NAMES: dict[str, bytes] = {}
"""Header names seen to match `_HEADER_NAME`, encoded (a few distinct ones)."""


def header_block(headers: Mapping[str, str]) -> bytes | None:
    """The header block nats-py sends for `headers`, or None when nats-py would reject or
    rewrite one of them (it refuses other names, strips values and turns CR and LF into
    spaces): then only nats-py's own `publish` may send it."""
    parts = [b"NATS/1.0\r\n"]
    for name, value in headers.items():
        raw = _NAMES.get(name)
        if raw is None:
            if not _HEADER_NAME.fullmatch(name):
                return None
            raw = name.encode()
            if len(_NAMES) < 64:
                _NAMES[name] = raw
        if ("\r" in value or "\n" in value
                or (value and (value[0].isspace() or value[-1].isspace()))):
            return None
        parts += (raw, b": ", value.encode(), b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


class Framer:
    """`Client.publish(subject, payload, reply=reply, headers=headers)` on the connection,
    with the protocol frame built here (see the module doc)."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._fast = natspy.usable("framer", nc)
        """Whether this nats-py has the parts `send` uses (else every message goes through
        `Client.publish`)."""

    async def send(self, subject: str, payload: bytes, reply: str,
                   headers: dict[str, str] | None) -> None:
        """Publish one message (the errors are `Client.publish`'s)."""
        nc: Any = self._nc
        if (not self._fast or not nc.is_connected or nc.is_draining_pubs or not subject
                or _INVALID_SUBJECT.search(subject) or _INVALID_SUBJECT.search(reply)):
            await nc.publish(subject, payload, reply=reply, headers=headers)
            return
        if headers is not None:
            block = header_block(headers)
            if block is None or len(payload) > nc._max_payload:
                await nc.publish(subject, payload, reply=reply, headers=headers)
                return
            frame = b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
                subject.encode(), reply.encode(), len(block), len(block) + len(payload),
                block, payload)
        else:
            if len(payload) > nc._max_payload:
                await nc.publish(subject, payload, reply=reply, headers=headers)
                return
            frame = b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(),
                                                    len(payload), payload)
        stats = nc.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(payload)
        await nc._send_command(frame)
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()
