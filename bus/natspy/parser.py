"""Hot subscriptions' messages handled as they are read, without nats-py's Msg.

nats-py hands every message through a regex-driven protocol parser, a
`Msg` object, the subscription's queue and a task that awaits the
callback.  For the projector that is most of the cost of receiving: the
pipelined publishers' ack inbox (one ack per record written) and the
CRR_EVENTS consumer (one message per report).

`route(nc, sub, handler)` makes `nc` call `handler(subject, data)` (raw
bytes) at once for `sub`'s messages that carry no headers; a message with
headers (a status such as 503 "no responders") still takes nats-py's usual
path to the subscription's callback.  `route_full(nc, sid, handler)` offers
every message of subscription id `sid` to `handler(subject, reply, data,
headers)`, which handles it and returns True, or returns False to leave it
to nats-py's usual path (`crr.bus.natspy.ordered_consumer` uses it for an ordered
JetStream consumer: data messages directly, control messages and anything
unexpected the usual way).  Handlers must be quick and must not block: they
run inside the connection's read loop.

Both work through `Reader`, a protocol parser that replaces nats-py's on the
connection: it parses MSG/HMSG control lines without regular expressions
(a third of the receive cost), hands routed messages to their handler,
and every other message and operation to nats-py's own code, with the same
results (`tests/bus/test_natspy_parser.py` compares the two parsers on arbitrary
chunkings of a protocol stream).  Nothing is installed when `crr.bus.natspy`
says the path is not usable (another nats-py, `CRR_NATS_FAST=0`): then
`route` returns False and everything keeps nats-py's path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import nats.protocol.parser as _np
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.errors import ProtocolError

from crr.bus import natspy

log = logging.getLogger("crr.bus.direct")

Handler = Callable[[bytes, bytes], None]
"""(subject, data) of one message without headers, as read."""

FullHandler = Callable[[bytes, bytes, bytes, bytes | None], bool]
"""(subject, reply, data, header block or None) of one message, as read: whether it
handled it (False: nats-py's usual path takes it)."""

_Args = tuple[int, bytes, bytes, int, int]
"""A MSG/HMSG control line: (sid, subject, reply, header bytes, total bytes)."""



class Reader(_np.Parser):
    """nats-py's protocol parser (`nats.protocol.parser.Parser`), with routes, faster.

    The same calls into the client in the same order for any chunking of the input;
    only a routed message skips `Client._process_msg`.
    """

    def __init__(self, nc: Client, previous: Any) -> None:
        self._args: _Args | None = None
        self._resets = 0
        """Resets so far (a reset while a parse awaits ends that parse)."""
        super().__init__(nc)
        self._previous: Any = previous
        """The parser replaced: its buffered input is taken over at the next read."""
        self.plain: dict[int, Handler] = {}
        self.full: dict[int, FullHandler] = {}

    def reset(self) -> None:
        """A new connection: nothing buffered (nats-py calls it on reconnect)."""
        super().reset()
        self._args = None
        self._previous = None
        self._resets += 1

    def _take_over(self, previous: Any) -> None:
        """Continue where nats-py's parser stopped (installed between two reads)."""
        self.buf = previous.buf
        if previous.state == _np.AWAITING_MSG_PAYLOAD:
            a = previous.msg_arg
            self._args = (a["sid"], bytes(a["subject"]), bytes(a["reply"]),
                          previous.header_needed, previous.needed)
            self.state = _np.AWAITING_MSG_PAYLOAD

    async def parse(self, data: bytes = b"") -> None:
        """Parse what was read; dispatch every complete message and operation.

        Works on one `bytes` object (what was read, after what an earlier read
        left incomplete) and keeps only the incomplete rest in `buf`."""
        if self._previous is not None:
            self._take_over(self._previous)
            self._previous = None
        buf = self.buf
        if buf:
            src = b"".join((buf, data))  # (one copy of both)
            buf.clear()
        else:
            src = bytes(data)
        resets = self._resets
        pos = 0
        size = len(src)
        nc = self.nc
        stats = nc.stats
        plain, full = self.plain, self.full
        args = self._args  # a message whose payload an earlier read left incomplete
        self._args = None
        self.state = _np.AWAITING_CONTROL_LINE
        try:
            while pos < size:
                if args is None:
                    eol = src.find(b"\r\n", pos)
                    if eol < 0:
                        break
                    if src.startswith(b"MSG ", pos):  # (most: a stream's messages)
                        t = src[pos + 4:eol].split()
                        try:  # (`_msg` inline for a JetStream delivery's four tokens)
                            args = ((int(t[1]), t[0], t[2], 0, int(t[3])) if len(t) == 4
                                    else _msg(t))
                        except ValueError:
                            raise ProtocolError("nats: malformed MSG") from None
                        pos = eol + 2
                    elif src.startswith(b"HMSG ", pos):
                        args = _hmsg(src[pos + 5:eol].split())
                        pos = eol + 2
                    else:
                        rest = bytearray(src[pos:])
                        args = await self._operation(rest)  # (consumes what it takes)
                        if self._resets != resets:
                            return  # reset meanwhile (a reconnect)
                        pos = size - len(rest)
                        if args is None:
                            if self._stalled:
                                break
                            continue
                sid, subject, reply, hdr_len, total = args
                end = pos + total
                if size < end + 2:
                    break  # (the payload comes with a later read: kept below)
                args = None
                if hdr_len:
                    headers: bytes | None = src[pos:pos + hdr_len]
                    payload = src[pos + hdr_len:end]
                else:
                    headers = None
                    payload = src[pos:end]
                pos = end + 2
                handle = full.get(sid)
                if handle is not None:
                    try:
                        if handle(subject, reply, payload, headers):
                            stats["in_msgs"] += 1
                            stats["in_bytes"] += len(payload)
                            continue
                    except Exception:  # as a callback's would, it must not end the read loop
                        log.exception("handling a message on %r failed", subject)
                        continue
                elif headers is None:
                    quick = plain.get(sid)
                    if quick is not None:
                        stats["in_msgs"] += 1
                        stats["in_bytes"] += len(payload)
                        try:
                            quick(subject, payload)
                        except Exception:  # as above
                            log.exception("handling a message on %r failed", subject)
                        continue
                await nc._process_msg(sid, subject, reply, payload, headers)
                if self._resets != resets:
                    return
        finally:
            if self._resets == resets:
                if args is not None:
                    self._args = args
                    self.state = _np.AWAITING_MSG_PAYLOAD
                if pos < size:
                    self.buf.extend(memoryview(src)[pos:])  # (the rest, copied once)

    _stalled = False

    async def _operation(self, buf: bytearray) -> _Args | None:
        """The operation at the start of `buf` the way nats-py's parser takes it, consumed:
        a MSG/HMSG line written unusually (its arguments returned), or another operation
        (handled: None).  `_stalled`: it needs more input (nothing consumed)."""
        self._stalled = False
        m = _np.MSG_RE.match(buf)
        if m:
            subject, sid, _, reply, needed = m.groups()
            try:
                args = (int(sid), bytes(subject), bytes(reply or b""), 0, int(needed))
            except Exception:
                raise ProtocolError("nats: malformed MSG") from None
            del buf[:m.end()]
            return args
        m = _np.HMSG_RE.match(buf)
        if m:
            subject, sid, _, reply, hdr_len, needed = m.groups()
            try:
                args = (int(sid), bytes(subject), bytes(reply or b""), int(hdr_len),
                        int(needed))
            except Exception:
                raise ProtocolError("nats: malformed MSG") from None
            del buf[:m.end()]
            return args
        nc = self.nc
        m = _np.OK_RE.match(buf)
        if m:
            del buf[:m.end()]
            return None
        m = _np.ERR_RE.match(buf)
        if m:
            await nc._process_err(m.groups()[0].decode().lower())
            del buf[:m.end()]
            return None
        m = _np.PING_RE.match(buf)
        if m:
            del buf[:m.end()]
            await nc._process_ping()
            return None
        m = _np.PONG_RE.match(buf)
        if m:
            del buf[:m.end()]
            await nc._process_pong()
            return None
        m = _np.INFO_RE.match(buf)
        if m:
            await nc._process_info(json.loads(m.groups()[0].decode()))
            del buf[:m.end()]
            return None
        if len(buf) < _np.MAX_CONTROL_LINE_SIZE and b"\r\n" in buf:
            raise ProtocolError("nats: unknown protocol")
        self._stalled = True
        return None


def _msg(t: list[bytes]) -> _Args:
    """`MSG <subject> <sid> [reply] <size>` (the tokens after MSG)."""
    try:
        if len(t) == 4:
            return (int(t[1]), t[0], t[2], 0, int(t[3]))
        if len(t) == 3:
            return (int(t[1]), t[0], b"", 0, int(t[2]))
    except ValueError:
        pass
    raise ProtocolError("nats: malformed MSG")


def _hmsg(t: list[bytes]) -> _Args:
    """`HMSG <subject> <sid> [reply] <header size> <total size>` (the tokens after HMSG)."""
    try:
        if len(t) == 5:
            return (int(t[1]), t[0], t[2], int(t[3]), int(t[4]))
        if len(t) == 4:
            return (int(t[1]), t[0], b"", int(t[2]), int(t[3]))
    except ValueError:
        pass
    raise ProtocolError("nats: malformed MSG")


def _own_parser(nc: Any) -> str | None:
    """Whether `nc` reads with nats-py's own parser (the one `Reader` extends)."""
    if type(nc._ps) is not _np.Parser or not isinstance(nc.stats, dict):
        return f"the connection's parser is a {type(nc._ps).__name__}, not nats-py's Parser"
    return None


def reader(nc: Client) -> Reader | None:
    """`nc`'s `Reader`, installed now if need be (None: nats-py is not as expected)."""
    current = getattr(nc, "_ps", None)
    if isinstance(current, Reader):
        return current
    if not natspy.usable("parser", nc, _own_parser):
        return None
    installed = Reader(nc, current)
    nc._ps = installed
    return installed


def route(nc: Client, sub: Subscription, handler: Handler) -> bool:
    """Handle `sub`'s header-less messages with `handler` as they are read; whether it did."""
    sid = getattr(sub, "_id", None)
    r = reader(nc) if isinstance(sid, int) else None
    if r is None:
        return False
    r.plain[sid] = handler  # type: ignore[index]
    return True


def unroute(nc: Client, sub: Subscription) -> None:
    """Back to nats-py's usual path for `sub` (before unsubscribing it)."""
    unroute_sid(nc, getattr(sub, "_id", -1))


def route_full(nc: Client, sid: int, handler: FullHandler) -> bool:
    """Offer every message of subscription id `sid` to `handler` first; whether it could."""
    r = reader(nc)
    if r is None:
        return False
    r.full[sid] = handler
    return True


def unroute_sid(nc: Client, sid: int) -> None:
    """No route for subscription id `sid` any more."""
    r = getattr(nc, "_ps", None)
    if isinstance(r, Reader):
        r.plain.pop(sid, None)
        r.full.pop(sid, None)
