"""The status page in headless Chromium: live value change and stale transition, no reload.

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
NUL-separated JSON on fds 3 and 4), so no WebSocket client is needed.  The
test waits inside the page (a promise over `window.crrStatus`), never on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from crr.schemas.catalog_loader import load_catalog_text
from tests.support.projector import publish_catalog, publish_report, running_projector
from tests.support.rest import running_api, served_api
from tests.system.test_liveness import SHORT_YAML, SILENT_AFTER

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")


class ProtocolError(Exception):
    """The browser answered a DevTools command with an error."""


class DevTools:
    """A minimal Chrome DevTools protocol client over the debugging pipe."""

    def __init__(self, reader: asyncio.StreamReader, write_fd: int) -> None:
        self._reader = reader
        self._write_fd = write_fd
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            raw = await self._reader.readuntil(b"\0")
            msg = json.loads(raw[:-1])
            fut = self._waiting.pop(msg.get("id", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def call(self, method: str, session: str | None = None,
                   **params: Any) -> dict[str, Any]:
        """Send one command and return its result (ProtocolError on a protocol error)."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session is not None:
            msg["sessionId"] = session
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = fut
        os.write(self._write_fd, json.dumps(msg).encode() + b"\0")
        reply = await fut
        if "error" in reply:
            raise ProtocolError(str(reply["error"]))
        result: dict[str, Any] = reply["result"]
        return result

    async def close(self) -> None:
        """Stop reading."""
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, asyncio.IncompleteReadError):
            await self._pump


@contextlib.asynccontextmanager
async def chromium(url: str, profile: Path) -> AsyncIterator[tuple[DevTools, str]]:
    """Headless Chromium showing `url`; yields the DevTools client and the page's session."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}",
            "--remote-debugging-pipe", url]
    actions = [(os.POSIX_SPAWN_DUP2, to_child_r, 3), (os.POSIX_SPAWN_DUP2, from_child_w, 4),
               (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
               (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)]
    pid = os.posix_spawn(argv[0], argv, dict(os.environ),  # noqa: ASYNC221 - returns at once
                         file_actions=actions, setpgroup=0)
    os.close(to_child_r)
    os.close(from_child_w)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=16 * 1024 * 1024)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_child_r, "rb", 0))
    devtools = DevTools(reader, to_child_w)
    try:
        async with asyncio.timeout(20):
            while True:
                targets = (await devtools.call("Target.getTargets"))["targetInfos"]
                pages = [t for t in targets if t["type"] == "page" and t["url"].startswith(url)]
                if pages:
                    break
                await devtools.call("Target.setDiscoverTargets", discover=True)
        session = (await devtools.call("Target.attachToTarget", targetId=pages[0]["targetId"],
                                       flatten=True))["sessionId"]
        yield devtools, session
    finally:
        await devtools.close()
        transport.close()
        os.close(to_child_w)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        await asyncio.to_thread(os.waitpid, pid, 0)


async def until(devtools: DevTools, session: str, predicate: str, within_ms: int = 15000) -> Any:
    """Wait in the page until the JS expression `predicate` is truthy; returns its value."""
    expression = f"""new Promise((resolve, reject) => {{
        const deadline = Date.now() + {within_ms};
        const check = () => {{
            let v; try {{ v = ({predicate}); }} catch (e) {{ v = null; }}
            if (v) resolve(v);
            else if (Date.now() > deadline) reject(new Error({json.dumps(predicate)}));
            else setTimeout(check, 25);
        }};
        check();
    }})"""
    for _ in range(20):  # the first evaluations may race the page's initial navigation
        try:
            result = await devtools.call("Runtime.evaluate", session, expression=expression,
                                         awaitPromise=True, returnByValue=True)
            break
        except ProtocolError as exc:
            if "context" not in str(exc):
                raise
    else:
        raise AssertionError("the page never got an execution context")
    assert "exceptionDetails" not in result, result["exceptionDetails"]
    return result["result"].get("value")


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_status_page_updates_live_without_reload(nc: Client, tmp_path: Path) -> None:
    """A value change and a stale transition reach the open page over SSE; it never reloads."""
    async with running_api(nc) as rig:
        await publish_catalog(nc)
        seq = await publish_report(nc, "scratch", "node1", {"scratch_free": 500.0})
        await rig.settle(seq)
        async with chromium(f"{rig.url}/", tmp_path / "profile") as (cdp, page):
            load_id = await until(cdp, page, "crrStatus.connected && crrStatus.loaded && "
                                             "crrStatus.loadId")
            first = await until(cdp, page, "crrStatus.cell('node1', 'scratch_free')")
            assert first == {"text": "500", "state": "fresh"}
            # A value change, pushed to the open page.
            await publish_report(nc, "scratch", "node1", {"scratch_free": 812.5}, seq=2)
            changed = await until(
                cdp, page, "(c => c && c.text === '812.5' && c)"
                           "(crrStatus.cell('node1', 'scratch_free'))")
            assert changed["state"] == "fresh"
            # blink (interval 200ms) goes stale: the projector's expiry reaches the page.
            await publish_report(nc, "blinker", "node1", {"blink": 3.0})
            stale = await until(
                cdp, page, "(c => c && c.state === 'stale' && c)"
                           "(crrStatus.cell('node1', 'blink'))")
            assert stale["text"] == "~3"
            log = await until(cdp, page, "document.querySelector('#log').textContent")
            assert "scratch_free: 500 → 812.5 (fresh)" in log
            assert "blink: 3 → ~3 (stale)" in log or "blink: - → ~3 (stale)" in log
            assert await until(cdp, page, "crrStatus.loadId") == load_id
        assert rig.api.page_loads == 1


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_status_page_shows_a_stopped_projector_and_stale_values(
        nc: Client, tmp_path: Path) -> None:
    """The projector stops: the page says it is silent (last status age, lag) and shows the
    value that expired meanwhile as stale, as every other surface does."""
    await publish_catalog(nc, load_catalog_text(SHORT_YAML))
    async with running_projector(nc, status_interval=0.2) as projector:
        seq = await publish_report(nc, "scratch", "node1", {"scratch_free": 500.0})
        await projector.wait_until(seq, 10)
    async with served_api(nc, silent_after=SILENT_AFTER) as rig, \
            chromium(f"{rig.url}/", tmp_path / "profile") as (cdp, page):
        await until(cdp, page, "crrStatus.connected && crrStatus.loaded")
        silent = await until(cdp, page, "(l => l && l.state === 'silent' && l)"
                                        "(crrStatus.liveness)")
        assert silent["last_status_age"] > SILENT_AFTER
        assert silent["lag"] == 0
        text = await until(cdp, page, "document.querySelector('#liveness').textContent")
        assert text.startswith("projector silent: last status")
        stale = await until(cdp, page, "(c => c && c.state === 'stale' && c)"
                                       "(crrStatus.cell('node1', 'scratch_free'))")
        assert stale["text"] == "~500"
        banner = await until(cdp, page, "(b => !b.hidden && b.textContent)"
                                        "(document.querySelector('#banner'))")
        assert "past outage_hold (1 s)" in banner
