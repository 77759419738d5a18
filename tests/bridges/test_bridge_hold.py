"""The bridges plan at the projector's watermark: a stopped projector changes nothing on
the target until `outage_hold` runs out (docs/contract.md, "Freshness at the
watermark").  A real Projector writes the records, then stops; the per-host source and
the whole-cluster plan (`wants_from_view`, as `crr bridge slurm` runs it) are asked at
explicit `now`s past a value's `expires_at`.
"""

from __future__ import annotations

from nats.aio.client import Client

from crr.bridges.host_source import HostSource
from crr.bridges.slurm import SlurmCommands, SlurmDoor
from crr.bridges.slurm_bridge import SlurmBridge, wants_from_view
from crr.projections.exports import compile_exports
from crr.schemas.wire_time import parse_time
from crr.view.scheduler_view import SchedulerView, loaded_view
from tests.bridges.test_bridge_cli import CATALOG
from tests.support.projector import publish_catalog, publish_report, running_projector


async def test_bridges_hold_the_wants_while_the_projector_is_stopped(nc: Client) -> None:
    async with running_projector(nc) as projector:
        await publish_catalog(nc, CATALOG)
        await publish_report(nc, "ext", "n1", {"scratch_free": 900.0, "fs_healthy": True})
        await projector.wait_until(await publish_report(nc, "blinker", "n3", {"blink": 1.0}))
    view = SchedulerView(nc)
    await view.start()
    await view.wait_ready()
    host = HostSource(nc, "n3")
    await host.start()
    exports = compile_exports(CATALOG)
    try:
        snap = view.table.get("n3")
        assert snap is not None
        expires = parse_time(snap.values["blink"].expires_at)  # 1 s after the report
        held = host.wants(expires + 30)["n3"]
        assert held.features == {"blinking"}  # held: the projector is stopped
        assert host.judged is not None
        assert host.judged.holding
        # Its next change is put on the clock: not before now (no busy wake-ups).
        assert held.expires_at is not None
        assert held.expires_at > expires + 30
        assert wants_from_view(view, exports, expires + 30)["n3"].features == {"blinking"}
        late = expires + 600 + 1  # past the default outage_hold: the honest state
        assert "blinking" not in host.wants(late)["n3"].features
        assert host.judged.expired
        cluster = wants_from_view(view, exports, late)
        assert "blinking" not in cluster["n3"].features
        assert cluster["n1"].features == {"big_scratch"}  # 60 s + 30 s: held still
    finally:
        await host.stop()
        await view.stop()


async def test_the_slurm_bridge_says_holding(nc: Client) -> None:
    """`crr bridge slurm` sets `holding` (its Health says so) from the view's judgement:
    with the projector stopped, past a value's expires_at but within outage_hold."""
    async with running_projector(nc) as projector:
        await publish_catalog(nc, CATALOG)
        await projector.wait_until(await publish_report(nc, "blinker", "n3", {"blink": 1.0}))
    async with loaded_view(nc, 10) as view:
        bridge = SlurmBridge(view, SlurmDoor(SlurmCommands(env={}, timeout=1)))
        watermark = view.judgement().watermark
        assert watermark is not None
        bridge.note_judgement(watermark + 0.5)
        assert bridge.holding is None
        bridge.note_judgement(watermark + 30)
        assert bridge.holding is not None
        assert bridge.holding.startswith("holding: watermark ")
        bridge.note_judgement(watermark + 601)  # past outage_hold: the honest state
        assert bridge.holding is None
