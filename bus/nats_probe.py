"""Is it NATS?  The first bytes of each server address, read before nats-py connects.

A NATS server sends `INFO {…}` the moment it accepts a connection.  An HTTP server
(the REST API, the Prometheus metrics port, the monitoring port) says nothing until it
is asked, so nats-py would wait for the INFO for its whole connect timeout, attempt
after attempt (a one-shot command took about 35 s to fail with a bare `TimeoutError`).
Reading the first bytes ourselves, for `PROBE_TIMEOUT` at most, tells at once:

- `INFO` first: a NATS server (nats-py connects as usual);
- anything else, a close without a word, or silence: not a NATS server
  (`NotNatsServerError`, saying what it sent);
- the address refuses or does not answer: `NotConnectedError` with the reason, at once
  (a service logs its first "cannot reach" line within `PROBE_TIMEOUT`).

`ws://`/`wss://` servers are left to nats-py (a websocket server speaks HTTP first).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass
from typing import Final

from crr.schemas.errors import NotConnectedError, NotNatsServerError

PROBE_TIMEOUT: Final = 1.0
"""Seconds to wait for a TCP connection and then for the server's first bytes."""


@dataclass(frozen=True)
class Probe:
    """What one address did: `nats`, `not_nats` (with `said`) or `down` (with `said`)."""

    server: str
    verdict: str
    said: str = ""


def _address(server: str) -> tuple[str, int] | None:
    u = urllib.parse.urlsplit(server if "://" in server else f"nats://{server}")
    if u.scheme not in ("nats", "tls") or not u.hostname:
        return None
    try:
        return u.hostname, u.port or 4222
    except ValueError:  # a port that is not a number: nats-py says it
        return None


async def probe(server: str, shown: str, timeout: float = PROBE_TIMEOUT) -> Probe:
    """What the address of `server` (as `shown`, without secrets) answers first."""
    address = _address(server)
    if address is None:
        return Probe(shown, "nats")  # not ours to judge
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(*address)
    except TimeoutError:
        return Probe(shown, "down", f"no answer within {timeout:g} s")
    except OSError as exc:
        return Probe(shown, "down", str(exc) or type(exc).__name__)
    try:
        async with asyncio.timeout(timeout):
            first = await reader.read(256)
    except TimeoutError:
        return Probe(shown, "not_nats", f"got nothing within {timeout:g} s, where a NATS "
                                        "server sends INFO at once, unless it is frozen")
    except OSError as exc:
        return Probe(shown, "not_nats", f"the connection failed at once: "
                                        f"{exc.strerror or type(exc).__name__}")
    finally:
        writer.close()
    if first.startswith(b"INFO"):
        return Probe(shown, "nats")
    line = first.split(b"\n", 1)[0].strip().decode("utf-8", "replace")[:60]
    return Probe(shown, "not_nats",
                 f"got {line!r}" if first else "it closed the connection without a word")


async def check_nats(servers: list[str], shown: list[str],
                     timeout: float = PROBE_TIMEOUT) -> None:
    """Raise unless at least one of `servers` may be a NATS server (see the module doc)."""
    found = await asyncio.gather(*(probe(s, d, timeout) for s, d in zip(servers, shown,
                                                                       strict=True)))
    if any(p.verdict == "nats" for p in found):
        return
    wrong = [p for p in found if p.verdict == "not_nats"]
    if wrong:
        raise NotNatsServerError("; ".join(f"{p.server} is not a NATS server ({p.said})"
                                           for p in wrong) + "; check --server / NATS_URL")
    raise NotConnectedError(f"cannot reach NATS at {','.join(shown)}: "
                            + "; ".join(p.said for p in found))
