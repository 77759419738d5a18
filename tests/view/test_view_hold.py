"""The scheduler view judges at the projector's watermark: a stopped projector freezes
the answers (holding) for `outage_hold`, then values expire again.

A real Projector writes the records and its status, then stops (its status frozen); the
view is asked at explicit `now`s past a value's `expires_at`, within and past the hold.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from crr.rest.app import Api
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.wire_time import parse_time
from crr.view.scheduler_view import SchedulerView
from tests.support.projector import publish_catalog, publish_report, running_projector

CATALOG = """
version: 1
outage_hold: {hold}
resources:
  scratch_free: {{kind: numeric, scope: host, reporter: scratch, interval: 60s, min: 0}}
reporters:
  scratch: {{type: script, command: [scratch.sh], interval: 60s}}
"""


@pytest.fixture
async def view(nc: Client) -> AsyncIterator[SchedulerView]:
    v = SchedulerView(nc, idle_heartbeat=0.5)
    yield v
    await v.stop()


async def _stopped_projector_view(nc: Client, view: SchedulerView, hold: str) -> float:
    """Records and status written by a projector that then stopped; the value's expires_at."""
    await publish_catalog(nc, load_catalog_text(CATALOG.format(hold=hold)))
    async with running_projector(nc) as p:
        await p.wait_until(await publish_report(nc, "scratch", "n1", {"scratch_free": 500.0}))
    await view.start()
    await view.wait_ready(10)
    snap = view.table.get("n1")
    assert snap is not None
    entry = snap.values["scratch_free"]
    assert entry.state == "fresh"
    return entry.expires_ts if entry.expires_ts is not None else parse_time(entry.expires_at)


async def test_select_holds_past_expires_at_within_the_hold(nc: Client,
                                                            view: SchedulerView) -> None:
    expires = await _stopped_projector_view(nc, view, "10m")
    judged = view.judgement(expires + 30)
    assert judged.holding
    assert not judged.expired
    assert judged.watermark is not None
    assert judged.judged_at == judged.watermark < expires
    assert judged.lag is not None
    assert judged.lag > 30
    assert "of outage_hold left" in judged.detail
    # Past its expires_at on the clock, but judged at the watermark: still selected.
    assert view.select("scratch_free > 100", expires + 30) == ["n1"]
    why = view.explain("scratch_free > 100", "n1", expires + 30)
    assert why.selected
    assert [r.freshness for r in why.resources] == ["fresh"]
    # Past outage_hold: judged at now - 600 s, which is past expires_at: stale.
    late = expires + 600 + 1
    assert view.judgement(late).expired
    assert view.select("scratch_free > 100", late) == []
    assert [r.freshness for r in view.explain("scratch_free > 100", "n1", late).resources] == [
        "stale"]


async def test_healthz_says_projector_lagging_while_holding(nc: Client,
                                                            view: SchedulerView) -> None:
    expires = await _stopped_projector_view(nc, view, "10m")
    api = Api(view, silent_after=3600)
    watermark = view.judgement().watermark
    assert watermark is not None
    caught_up = api.health(watermark + 0.5)
    assert caught_up.status == "ok"
    assert not caught_up.problems
    body = api.health(expires + 30)
    assert body.status == "unavailable"
    assert [p.code for p in body.problems] == ["projector_lagging"]
    assert body.judgement is not None
    assert body.judgement.holding


async def test_outage_hold_zero_judges_at_now(nc: Client, view: SchedulerView) -> None:
    """`outage_hold: 0s` is the old behaviour: past expires_at is stale at once."""
    expires = await _stopped_projector_view(nc, view, "0s")
    assert view.judgement(expires + 1).judged_at == expires + 1
    assert view.select("scratch_free > 100", expires + 1) == []
