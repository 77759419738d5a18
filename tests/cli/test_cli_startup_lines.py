"""Long-running processes say at start where they connect, as whom, and what they wait for."""

from __future__ import annotations

import asyncio
import signal
import sys

from nats.aio.client import Client

from tests.support.cli import cli_env


async def _start(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", *argv, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())


async def _stop(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_agent_says_what_it_waits_for(nc: Client, nats_url: str) -> None:
    """`crr agent`: one start-up line (host, URL), then at INFO that it waits for a catalog."""
    proc = await _start("agent", "--server", nats_url, "--host", "node9", "--log-level", "INFO")
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert first.startswith(f"crr agent: host node9 on {nats_url} ("), first
        assert "following the active catalog" in first
        async with asyncio.timeout(30):
            while True:
                line = (await proc.stderr.readline()).decode()
                assert line, "stderr ended"
                if "waiting for the active catalog" in line:
                    assert " INFO " in line
                    break
    finally:
        await _stop(proc)


async def test_projector_prints_one_startup_line(nats_url: str) -> None:
    """`crr projector`: one line with its id, the URL and what it does; nothing else at the
    default log level."""
    proc = await _start("projector", "--server", nats_url, "--id", "p-test")
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert first == (f"crr projector: p-test on {nats_url}; folding CRR_EVENTS into "
                         "CRR_SNAPSHOT (it creates both streams)\n")
    finally:
        await _stop(proc)
    assert proc.stderr is not None
    assert (await proc.stderr.read()) == b""
