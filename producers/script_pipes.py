"""Bounded readers for a script's stdout and stderr (asyncio protocols).

Nothing a script writes is buffered without bound: a periodic report is cut
off at `max_output_bytes` (the read end is closed so the writer gets
EPIPE/SIGPIPE, and the caller kills the group), a stream line longer than
that likewise, and stderr keeps only its last kilobyte.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("crr.agent.pipes")

STDERR_TAIL_BYTES = 1024


class _PipeProtocol(asyncio.Protocol):
    """Common part: `finished` resolves on EOF, a closed pipe, or when the subclass says."""

    def __init__(self) -> None:
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def _cut_off(self) -> None:
        """Stop reading for good: closing our end makes further writes fail at once."""
        self._finish()
        if self._transport is not None:
            self._transport.close()


class BoundedCapture(_PipeProtocol):
    """A periodic report: up to `limit` bytes; `overflow` if the script wrote more.

    `line_seen` resolves at the first newline (an LSF elim writes one line
    per interval and may never exit on its own); reading goes on.
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.buffer = bytearray()
        self.overflow = False
        self.line_seen: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self.finished.done():
            return
        room = self.limit - len(self.buffer)
        if len(data) > room:
            self.buffer += data[:room]
            self.overflow = True
            self._cut_off()
            return
        self.buffer += data
        if not self.line_seen.done() and b"\n" in data:
            self.line_seen.set_result(None)

    def complete_lines(self) -> bytes:
        """The output up to its last newline (a partial last line is left out)."""
        end = self.buffer.rfind(b"\n")
        return bytes(self.buffer[: end + 1]) if end >= 0 else b""


class LineReader(_PipeProtocol):
    """A stream: calls `on_line` for each complete line; `overflow` on a line over `limit`.

    `first_data` resolves at the first byte: a long-running script that wrote
    nothing at all for a long time is probably block-buffering its output.
    """

    def __init__(self, limit: int, on_line: Callable[[bytes], None]) -> None:
        super().__init__()
        self.limit = limit
        self.on_line = on_line
        self.overflow = False
        self.first_data: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._partial = bytearray()

    def data_received(self, data: bytes) -> None:
        if self.finished.done():
            return
        if data and not self.first_data.done():
            self.first_data.set_result(None)
        self._partial += data
        start = 0
        while True:
            nl = self._partial.find(b"\n", start)
            if nl < 0:
                break
            if nl - start > self.limit:
                break
            line = bytes(self._partial[start:nl])
            start = nl + 1
            if line.strip():
                try:
                    self.on_line(line)
                except Exception:  # a bug in a handler must not kill the reader
                    log.exception("error handling a stream line")
        del self._partial[:start]
        if len(self._partial) > self.limit:
            self.overflow = True
            self._partial.clear()
            self._cut_off()


class TailCapture(_PipeProtocol):
    """Drains a pipe, keeping only its last `size` bytes (stderr for Health details)."""

    def __init__(self, size: int = STDERR_TAIL_BYTES) -> None:
        super().__init__()
        self.size = size
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data[-self.size:]
        if len(self.buffer) > self.size:
            del self.buffer[: len(self.buffer) - self.size]

    def text(self) -> str:
        """The tail as text, trimmed (may start mid-line)."""
        return self.buffer.decode("utf-8", "replace").strip()
