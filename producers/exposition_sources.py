"""Where an exposition reporter's text comes from: a textfile directory or a local scrape.

`TextfileDirectory` reads node_exporter's textfile-collector convention: every
`*.prom` file of one directory (writers write a temporary name and rename it into
place, so a file ending in `.prom` is complete; nothing else is read).  A file
that vanishes between listing and reading is skipped.  Each file is parsed on
its own, so a syntax error names `file:line` and that file's last valid series
are kept (a file that stays bad keeps them until it is fixed or removed); an
unchanged file (same mtime and size) is not parsed again.  The oldest mtime of
the files read is the report's observation time.

`scrape` GETs an exporter's metrics URL (HTTP/1.0, so the body is never chunked)
within the reporter's timeout, reading at most `max_output_bytes`; its errors
(`ScrapeError`) name the URL without any credentials.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from crr.producers.exposition import Exposition, ExpositionError, parse_exposition
from crr.schemas.errors import ReporterError

_CHUNK = 64 * 1024


class ScrapeError(ReporterError):
    """A scrape failed: connection, HTTP status, timeout or size (the reporter is `failed`)."""


def shown_url(url: str) -> str:
    """`url` without user and password, for logs and Health details."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{host}{port}{parts.path}{query}"


async def scrape(url: str, *, timeout: float, limit: int) -> bytes:
    """The body of GET `url`; ScrapeError (credentials never named) if it fails."""
    where = shown_url(url)
    try:
        async with asyncio.timeout(timeout):
            return await _get(url, limit)
    except TimeoutError:
        raise ScrapeError(f"scrape of {where} timed out after {timeout:g}s") from None
    except OSError as exc:
        raise ScrapeError(f"scrape of {where} failed: {exc.strerror or exc}") from None


async def _get(url: str, limit: int) -> bytes:
    parts = urlsplit(url)
    where = shown_url(url)
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    reader, writer = await asyncio.open_connection(
        parts.hostname, port, ssl=ssl.create_default_context() if secure else None)
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [f"GET {path} HTTP/1.0", f"Host: {parts.netloc.rpartition('@')[2]}",
                "Accept: text/plain;version=0.0.4", "User-Agent: crr-agent"]
        if parts.username is not None:
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            head.append("Authorization: Basic " + base64.b64encode(token.encode()).decode())
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        status = (await reader.readline()).decode("latin-1").split(None, 2)
        if len(status) < 2 or not status[0].startswith("HTTP/"):
            raise ScrapeError(f"scrape of {where}: not an HTTP response")
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        if status[1] != "200":
            raise ScrapeError(f"scrape of {where}: HTTP {' '.join(status[1:]).strip()}")
        body = bytearray()
        while chunk := await reader.read(_CHUNK):
            body += chunk
            if len(body) > limit:
                raise ScrapeError(f"scrape of {where}: response exceeds max_output_bytes "
                                  f"({limit} bytes)")
        return bytes(body)
    finally:
        writer.close()


@dataclass
class _File:
    stamp: tuple[float, int]
    expo: Exposition


@dataclass
class TextfileRead:
    """One read of the directory: the merged series, the problems, the observation time."""

    expo: Exposition
    problems: list[str]
    observed_at: float | None


class TextfileDirectory:
    """The `*.prom` files of one directory, with each file's last valid parse."""

    def __init__(self, directory: str, *, limit: int) -> None:
        self.directory = Path(directory)
        self.limit = limit
        self.files: dict[str, _File] = {}
        self._busy = threading.Lock()

    def read(self) -> TextfileRead:
        """Read (blocking IO: the runner calls it in a thread, within its timeout).

        A read the runner stopped waiting for goes on in its thread (a hung file
        system); until it ends, later reads fail at once instead of piling up."""
        if not self._busy.acquire(blocking=False):
            raise ScrapeError(f"the previous read of {self.directory} has not finished "
                              "(a hung file system?)")
        try:
            return self._read()
        finally:
            self._busy.release()

    def _read(self) -> TextfileRead:
        try:
            names = sorted(e.name for e in os.scandir(self.directory)
                           if e.name.endswith(".prom") and e.is_file())
        except OSError as exc:
            raise ScrapeError(f"cannot list {self.directory}: {exc.strerror or exc}") from None
        problems: list[str] = []
        merged = Exposition()
        mtimes: list[float] = []
        for name in names:
            got = self._file(name, problems)
            if got is not None:
                merged.merge(got.expo)
                mtimes.append(got.stamp[0])
        for gone in set(self.files) - set(names):
            del self.files[gone]
        return TextfileRead(merged, problems, min(mtimes) if mtimes else None)

    def _file(self, name: str, problems: list[str]) -> _File | None:
        path = self.directory / name
        last = self.files.get(name)
        try:
            with path.open("rb") as handle:
                st = os.fstat(handle.fileno())
                stamp = (st.st_mtime, st.st_size)
                if last is not None and last.stamp == stamp:
                    return last
                data = handle.read(self.limit + 1)
        except FileNotFoundError:  # renamed away or removed since the listing
            return None
        except OSError as exc:
            problems.append(f"{name}: cannot read: {exc.strerror or exc}")
            return last
        if len(data) > self.limit:
            problems.append(f"{name}: larger than max_output_bytes ({self.limit} bytes); "
                            + ("its last valid series are kept" if last else "not read"))
            return last
        try:
            expo = parse_exposition(data.decode("utf-8", "replace"), source=name)
        except ExpositionError as exc:
            problems.append(exc.message + ("; its last valid series are kept" if last else ""))
            return last
        self.files[name] = got = _File(stamp, expo)
        return got
