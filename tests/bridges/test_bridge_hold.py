"""The bridges' sources plan at the projector's watermark: a stopped projector changes
nothing on the target until `outage_hold` runs out (docs/contract.md, "Freshness at the
watermark").  A real Projector writes the records, then stops; the sources are asked at
explicit `now`s past a value's `expires_at`.
"""

from __future__ import annotations

from nats.aio.client import Client

from crr.bridges.host_source import HostSource
from crr.bridges.view_source import ViewSource
from crr.schemas.wire_time import parse_time
from crr.view.scheduler_view import SchedulerView
from tests.bridges.test_bridge_cli import CATALOG
from tests.support.projector import publish_catalog, publish_report, running_projector


async def test_sources_hold_the_wants_while_the_projector_is_stopped(nc: Client) -> None:
    async with running_projector(nc) as projector:
        await publish_catalog(nc, CATALOG)
        await publish_report(nc, "ext", "n1", {"scratch_free": 900.0, "fs_healthy": True})
        await projector.wait_until(await publish_report(nc, "blinker", "n3", {"blink": 1.0}))
    view = SchedulerView(nc)
    await view.start()
    await view.wait_ready()
    host = HostSource(nc, "n3")
    await host.start()
    source = ViewSource(view)
    try:
        snap = view.table.get("n3")
        assert snap is not None
        expires = parse_time(snap.values["blink"].expires_at)  # 1 s after the report
        cluster_wants = source.wants(expires + 30)
        host_wants = host.wants(expires + 30)
        for wants, judged in ((cluster_wants, source.judged), (host_wants, host.judged)):
            assert wants["n3"].features == {"blinking"}  # held: the projector is stopped
            assert judged is not None
            assert judged.holding
            # Its next change is put on the clock: not before now (no busy wake-ups).
            assert wants["n3"].expires_at is not None
            assert wants["n3"].expires_at > expires + 30
        late = expires + 600 + 1  # past the default outage_hold: the honest state
        assert "blinking" not in source.wants(late)["n3"].features
        assert "blinking" not in host.wants(late)["n3"].features
        assert source.judged is not None
        assert source.judged.expired
        assert source.wants(late)["n1"].features == {"big_scratch"}  # 60 s + 30 s: held still
    finally:
        source.close()
        await host.stop()
        await view.stop()
