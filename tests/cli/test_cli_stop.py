"""Every long-running command stops on SIGTERM/SIGINT within STOP_WITHIN seconds, in every
state, with exit status 0 and no child left (issue 30, item 1; `crr.runtime.shutdown`).

Each test runs the real `crr` console script of this venv in its own session, waits for
a line it logs (or a file its script writes) that says the state is reached, sends a
real signal and measures, on the monotonic clock, how long the process takes to end.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.runtime.shutdown import STOP_WITHIN
from crr.schemas.catalog import Catalog, ResourceSpec
from crr.schemas.codec import encode
from crr.schemas.subjects import SNAPSHOT_CATALOG, event_subject
from tests.support.agent import fast, live_in_groups, proc_stat, read_pids, write_script
from tests.support.cli import cli_env
from tests.support.faults import eventually
from tests.support.projector import publish_catalog

CRR = str(Path(sys.executable).parent / "crr")

HANGING = """#!/bin/sh
# Hangs for good and ignores SIGTERM, as does its child: only SIGKILL of the group ends it.
trap '' TERM
echo $$ >> {pids}
sleep 100000 &
echo $! >> {pids}
wait
"""


class Service:
    """`crr ARGS` in its own session; its output lines, kept as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._changed = asyncio.Condition()
        assert proc.stdout is not None
        self._reader = asyncio.ensure_future(self._read(proc.stdout))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            async with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()

    @property
    def output(self) -> str:
        """Everything it printed or logged so far."""
        return "\n".join(self.lines)

    async def wait_line(self, pattern: str, within: float = 30.0) -> str:
        """The first line matching `pattern`, once it has been written (bounded)."""
        found = re.compile(pattern)

        def match() -> str | None:
            return next((ln for ln in self.lines if found.search(ln)), None)

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(match), within)
            except TimeoutError:
                raise AssertionError(f"no line matching {pattern!r} within {within:g}s; "
                                     f"output:\n{self.output}") from None
        line = match()
        assert line is not None
        return line

    async def stop(self, sig: int = signal.SIGTERM) -> float:
        """Send `sig`; assert exit status 0 and no process left in its group; the seconds
        it took to end."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        code = await asyncio.wait_for(self.proc.wait(), 30)
        took = time.monotonic() - start
        await self._reader
        assert code == 0, f"exit status {code}; output:\n{self.output}"
        assert not live_in_groups({self.proc.pid}), "processes left in its group"
        assert "Task was destroyed" not in self.output, self.output
        assert "Traceback" not in self.output, self.output
        return took


@asynccontextmanager
async def service(*argv: str) -> AsyncIterator[Service]:
    """`crr ARGV…` (INFO logs), stdout and stderr merged; SIGKILLed if a test leaves it."""
    proc = await asyncio.create_subprocess_exec(
        CRR, *argv, "--log-level", "INFO", stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**cli_env(), "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    svc = Service(proc)
    try:
        yield svc
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def assert_quick(took: float) -> None:
    """The promise of `crr.runtime.shutdown`: ended within STOP_WITHIN seconds of the signal."""
    assert took < STOP_WITHIN, f"took {took:.2f}s to stop"


def closed_port_url() -> str:
    """A NATS URL nothing listens on (a port just bound and released)."""
    import socket  # noqa: PLC0415 - only here

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"nats://127.0.0.1:{port}"


async def assert_gone(pids: set[int]) -> None:
    """None of `pids` (script processes, reparented once crr exited) is left running."""
    assert pids

    def gone() -> bool:
        return all((st := proc_stat(p)) is None or st[0] == "Z" for p in pids)

    # A reparented zombie is reaped by init at its own pace: bounded retry on /proc.
    await eventually(gone, 5.0, f"script processes {sorted(pids)} gone")
    assert not live_in_groups(pids)


# -- NATS unreachable: the endless connect retry ------------------------------------------

UNREACHABLE: dict[str, list[str]] = {
    "agent": ["agent", "--host", "node1"],
    "projector": ["projector"],
    "api": ["api", "--listen", "127.0.0.1:0"],
    "external run": ["external", "run", "--reporter", "flexlm"],
    "bridge elim": ["bridge", "elim", "--host", "node1"],
    "bridge condor": ["bridge", "condor", "--host", "node1"],
    "bridge nfd": ["bridge", "nfd", "--host", "node1", "--dir", "/tmp"],
    "bridge slurm": ["bridge", "slurm"],
}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
@pytest.mark.parametrize("command", list(UNREACHABLE))
async def test_stops_while_nats_is_unreachable(command: str, sig: int) -> None:
    """The connect retry (forever, for a service) is cut short by the signal."""
    async with service(*UNREACHABLE[command], "--server", closed_port_url()) as svc:
        await svc.wait_line(r"cannot reach NATS at .*; retrying")
        assert_quick(await svc.stop(sig))
        assert re.search(r"stopped by SIG(TERM|INT)", svc.output)


# -- connected and serving -----------------------------------------------------------------

async def test_agent_stops_while_a_script_hangs(nc: Client, nats_url: str,
                                                tmp_path: Path) -> None:
    """A script that ignores SIGTERM and hangs: the agent kills its group and exits in time."""
    pids = tmp_path / "pids"
    write_script(tmp_path, "hang.sh", HANGING.format(pids=pids))
    catalog = Catalog(resources={"hang_v": ResourceSpec(kind="numeric", reporter="hang")},
                      reporters={"hang": fast(["hang.sh"], timeout=300.0, interval=600.0)})
    async with service("agent", "--server", nats_url, "--host", "node1",
                       "--reporters-dir", str(tmp_path)) as svc:
        await svc.wait_line(r"^crr agent: host node1")
        await nc.jetstream().publish(SNAPSHOT_CATALOG, encode(catalog))
        started = await eventually(lambda: len(read_pids(pids)) == 2 and read_pids(pids),
                                   20.0, "the hanging script and its child started")
        assert_quick(await svc.stop())
    await assert_gone(started)


async def test_external_run_stops_while_its_command_hangs(nats_url: str,
                                                          tmp_path: Path) -> None:
    """`crr external run`: the same for a central command that ignores SIGTERM."""
    pids = tmp_path / "pids"
    write_script(tmp_path, "hang.sh", HANGING.format(pids=pids))
    (tmp_path / "resources.yaml").write_text(
        "version: 1\n"
        "resources:\n"
        "  seats: {kind: numeric, scope: cluster, reporter: lic, interval: 60s}\n"
        "reporters:\n"
        "  lic: {type: external, command: [hang.sh], interval: 600s, timeout: 300s}\n")
    async with connect(nats_url) as nc:
        await provision(nc)
    async with service("external", "run", "--server", nats_url, "--reporter", "lic",
                       "--catalog", str(tmp_path / "resources.yaml")) as svc:
        started = await eventually(lambda: len(read_pids(pids)) == 2 and read_pids(pids),
                                   20.0, "the hanging command and its child started")
        assert_quick(await svc.stop())
    await assert_gone(started)


async def test_api_stops_with_an_event_stream_open(nc: Client, nats_url: str) -> None:
    """`crr api` serving, a client reading /v1/events: stopped in time, the stream ended."""
    import httpx  # noqa: PLC0415 - the api extra

    async with (service("api", "--server", nats_url, "--listen", "127.0.0.1:0") as svc,
                httpx.AsyncClient(base_url=await _api_base(svc), timeout=30) as client):
        await eventually(lambda: _ready(client), 30.0, "the view loaded")
        async with client.stream("GET", "/v1/events") as stream:
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("event: hello")
            assert_quick(await svc.stop())
    # Its log is crr's (one format, the level given), not Litestar's root-logger takeover
    # (`INFO - 2026-… - crr.bus - connection - nats: disconnected`).
    assert not re.search(r"^(DEBUG|INFO|WARNING|ERROR) - \d{4}-", svc.output, re.M), svc.output


async def test_api_event_stream_client_leaving_leaves_no_pending_task(
        nc: Client, nats_url: str) -> None:
    """A /v1/events client disconnects while the api runs: the api goes on serving, and
    neither then nor at its stop does asyncio say "Task was destroyed but it is pending"."""
    import httpx  # noqa: PLC0415 - the api extra

    async with service("api", "--server", nats_url, "--listen", "127.0.0.1:0") as svc:
        async with httpx.AsyncClient(base_url=await _api_base(svc), timeout=30) as client:
            await eventually(lambda: _ready(client), 30.0, "the view loaded")
            for _ in range(3):  # each one leaves after the first event
                async with client.stream("GET", "/v1/events") as stream:
                    assert (await anext(stream.aiter_lines())).startswith("event: hello")
            assert (await client.get("/v1/hosts")).status_code == 200
        assert_quick(await svc.stop())
        assert "Task was destroyed" not in svc.output
        assert "Traceback" not in svc.output


async def _api_base(svc: Service) -> str:
    """The `http://host:port` a started `crr api` says it serves on."""
    line = await svc.wait_line(r"^crr api: serving on http://")
    base = re.search(r"(http://[\d.:]+)/", line)
    assert base is not None, line
    return base.group(1)


async def _ready(client: object) -> bool:
    import httpx  # noqa: PLC0415 - the api extra

    assert isinstance(client, httpx.AsyncClient)
    return (await client.get("/v1/hosts")).status_code == 200


async def test_projector_stops_when_serving(nc: Client, nats_url: str) -> None:
    """Folding live, the projector's own loop ends (lease-free, clean) in time."""
    await publish_catalog(nc)
    async with service("projector", "--server", nats_url) as svc:
        await svc.wait_line(r"projector ready at seq")
        assert_quick(await svc.stop(signal.SIGINT))


# -- reconnecting: the server went away after the start -----------------------------------

RECONNECTING: dict[str, list[str]] = {
    "agent": ["agent", "--host", "node1"],
    "projector": ["projector"],
    "api": ["api", "--listen", "127.0.0.1:0"],
}


@pytest.mark.parametrize("command", list(RECONNECTING))
async def test_stops_while_reconnecting(command: str, tmp_path: Path) -> None:
    """Connected, then the server is gone: the reconnect loop does not hold the stop up."""
    with NatsServer(tmp_path / "store") as server:
        async with connect(server.url) as nc:
            await provision(nc)
            await publish_catalog(nc)
        async with service(*RECONNECTING[command], "--server", server.url) as svc:
            await svc.wait_line(rf"^crr {command}: ")
            if command == "projector":
                await svc.wait_line(r"projector ready at seq")
            server.stop()
            await svc.wait_line(r"nats: disconnected")
            assert_quick(await svc.stop())


# -- mid-rebuild and mid-restore: a long initial load --------------------------------------

LOAD_HOSTS = 40_000


async def _publish_hosts(nc: Client, count: int) -> None:
    """`count` hosts' reports (one subject each)."""
    js = nc.jetstream()
    for i in range(count):
        body = json.dumps({"reporter": "scratch", "host": f"h{i}", "boot": "b1", "seq": 1,
                           "observed_at": "2026-12-02T14:00:00.000Z",
                           "values": {"scratch_free": i}}).encode()
        await js.publish_async(event_subject("report", "scratch", f"h{i}"), body,
                               headers={"Nats-Msg-Id": f"scratch/h{i}/b1/1"})
    await asyncio.wait_for(js.publish_async_completed(), 60)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_projector_stops_mid_rebuild_and_mid_restore(nc: Client, nats_url: str) -> None:
    """A first start rebuilds from CRR_EVENTS (signalled once it says it is rebuilding;
    its start-up to "ready" takes ~1.7 s for 40k hosts here); a later start restores
    from CRR_SNAPSHOT (signalled once the checkpoint is read, while the restore decodes
    it, never having reached "ready"): both end in time."""
    await publish_catalog(nc)
    await _publish_hosts(nc, LOAD_HOSTS)
    async with service("projector", "--server", nats_url) as svc:
        # Signalled as it starts to fold (40k events fold in ~0.4 s, then ~1.3 s of first
        # writes before "ready"): it stops in time wherever in that start-up it is.
        await svc.wait_line(r"rebuilding from CRR_EVENTS")
        assert_quick(await svc.stop())
    # Let one projector write the snapshot, so that the next start restores from it.
    async with service("projector", "--server", nats_url) as svc:
        await svc.wait_line(r"projector ready at seq", within=50)
        assert_quick(await svc.stop())
    async with service("projector", "--server", nats_url) as svc:
        await svc.wait_line(r"checkpoint read, [1-9]\d* record")
        assert_quick(await svc.stop())
        assert "projector ready" not in svc.output
        assert "restored from" not in svc.output
