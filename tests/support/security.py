"""Test support for authorization: a real nats-server running `crr nats-config`'s output.

`secure_rig` generates credentials for a small catalog (a host script
reporter, an external cluster reporter `flexlm`, an external host-scope
reporter `dsindex`) and two hosts, starts nats-server with that config,
provisions the streams and applies the catalog as `admin`, and runs the
projector with its own `projector` credentials.  Tests then connect with
the identity they exercise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from crr.admin.nats_auth import SecureDemo, secure_demo_setup
from crr.bus.connection import connect
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.bus.streams import provision
from crr.projector.service import Projector
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.subjects import CATALOG, EVENTS_STREAM, SNAPSHOT_STREAM
from crr.view.snapshot_reader import SnapshotContents, read_snapshot
from tests.support import faults as fault_support

REPORTERS = Path(__file__).resolve().parents[2] / "ops" / "examples" / "reporters"

CATALOG_YAML = f"""
version: 1
resources:
  scratch_free: {{kind: numeric, scope: host, reporter: scratch, interval: 60s}}
  datasets:     {{kind: string_set, scope: host, reporter: dsindex, interval: 60s}}
  matlab_free:  {{kind: numeric, scope: cluster, reporter: flexlm, interval: 60s, min: 0}}
  simulink_free: {{kind: numeric, scope: cluster, reporter: flexlm, interval: 60s, min: 0}}
reporters:
  scratch: {{type: script, command: [scratch.sh], interval: 0.3, timeout: 2}}
  dsindex: {{type: external}}
  flexlm:  {{type: external, command: [{REPORTERS}/flexlm_poller.py, --lmutil, fake_lmutil,
             --server, 27000@licsrv], interval: 0.5, timeout: 10}}
"""

SCRATCH = """#!/bin/sh
printf '{"values": {"scratch_free": 42}}\\n'
"""

HOSTS = ("nodeA", "nodeB")


@dataclass
class Rig:
    """The secured server, the catalog, the projector, and where reporter scripts live."""

    demo: SecureDemo
    catalog: Catalog
    projector: Projector
    reporters_dir: Path

    @property
    def url(self) -> str:
        """The server URL."""
        return self.demo.url

    def creds(self, identity: str) -> str:
        """The credentials file of `identity`."""
        return self.demo.creds(identity)

    def secrets(self) -> list[str]:
        """Every secret the generated files hold (nkey seeds, passwords)."""
        out = []
        for path in self.demo.bundle.creds.values():
            for line in path.read_text().splitlines():
                if line.startswith("SU"):
                    out.append(line.strip())
                elif line.startswith("password:"):
                    out.append(line.partition(":")[2].strip())
        return out

    async def settle(self) -> SnapshotContents:
        """Wait until the projector has applied every stored event; read the snapshot as `view`."""
        async with connect(self.url, creds=self.creds("admin"), name="t-admin") as nc:
            info = await nc.jetstream().stream_info(EVENTS_STREAM)
        await self.projector.wait_until(info.state.last_seq, timeout=15)
        async with connect(self.url, creds=self.creds("view"), name="t-view") as nc:
            return await read_snapshot(nc)

    async def raw_snapshot(self) -> bytes:
        """Every record of CRR_SNAPSHOT, concatenated (read as `view`)."""
        chunks: list[bytes] = []

        def keep(m: StoredMessage) -> None:
            chunks.append(m.data)

        async with connect(self.url, creds=self.creds("view"), name="t-view") as nc:
            reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject="crr.v1.snapshot.>",
                                   handler=keep)
            await reader.start()
            try:
                await reader.wait_ready(10)
            finally:
                await reader.stop()
        return b"".join(chunks)


async def eventually(what: str, predicate: Callable[[], bool], within: float = 10.0) -> None:
    """A bounded retry: re-check `predicate` every 20 ms until it holds, or fail saying `what`."""
    await fault_support.eventually(predicate, within, what, every=0.02)


@contextlib.asynccontextmanager
async def secure_rig(
    tmp_path: Path, *, tls: bool = False, mode: str = "nkey"
) -> AsyncIterator[Rig]:
    """The secured server with streams, catalog and projector (see module doc)."""
    catalog = load_catalog_text(CATALOG_YAML)
    reporters_dir = tmp_path / "reporters"
    reporters_dir.mkdir()
    script = reporters_dir / "scratch.sh"
    script.write_text(SCRATCH)
    script.chmod(0o755)
    demo = await secure_demo_setup(tmp_path / "store", catalog=catalog, hosts=HOSTS, tls=tls,
                                   mode=mode)  # type: ignore[arg-type]
    ca = str(demo.tls_ca) if demo.tls_ca else None
    try:
        async with connect(demo.url, creds=demo.creds("admin"), tls_ca=ca, name="t-admin") as nc:
            await provision(nc)
            await nc.jetstream().publish(CATALOG, encode(catalog))
        async with connect(demo.url, creds=demo.creds("projector"), tls_ca=ca,
                           name="t-projector") as pnc:
            projector = Projector(pnc, status_interval=0.5)
            stop = asyncio.Event()
            task = asyncio.create_task(projector.run(stop))
            await asyncio.wait_for(projector.ready.wait(), 20)
            await eventually("the catalog in the projector", lambda: projector.state.catalog
                             is not None)
            try:
                yield Rig(demo, catalog, projector, reporters_dir)
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)
    finally:
        await asyncio.to_thread(demo.stop)
