"""The projector's live fold (`crr.projector.live_fold.LiveFold`) on its own.

Given a live fold (its position and metrics real objects over a real server's
connection, nothing written), when stored messages are folded, then the state, the dirty
records, the dead letters and the position follow; restored records waiting (`Lazy`,
`Deferred`) are placed before the fold needs them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec
from nats.aio.client import Client

from crr.bus.jetstream import jetstream
from crr.bus.ordered import StoredMessage
from crr.projections.checkpoint import Deferred, Lazy, decode_record
from crr.projections.envelope import Envelope
from crr.projections.fold import fold
from crr.projections.record.snapshot import host_snapshot
from crr.projector.live_fold import LiveFold
from crr.projector.metrics import ProjectorMetrics
from crr.projector.position import Position
from crr.projector.status import Origin
from crr.schemas.codec import encode
from tests.support.fold import T0, catalog_env, report_env

SCRATCH = {"scratch_free": 1, "scratch_total": 2}


class _Idle:
    """What the metrics read of a projector: one that did nothing (a real class, no mock)."""

    lag = 0
    position = 0
    applied = 0
    deadletter_count = 0
    writes = 0

    def written_records(self) -> list[tuple[str, bytes]]:
        return []


def _live(nc: Client, owns: Callable[[str], bool] | None = None,
          wake: asyncio.Event | None = None) -> tuple[LiveFold, Position]:
    pos = Position(jetstream(nc), None)
    live = LiveFold(pos=pos, metrics=ProjectorMetrics(_Idle()),
                    origin=Origin(), wake=wake or asyncio.Event(), owns=owns)
    return live, pos


def _stored(env: Envelope) -> StoredMessage:
    return StoredMessage(seq=env.seq, time=env.received_at, subject=env.subject,
                         data=env.data, headers=None, pending=0)


async def test_folded_events_mark_their_records_dirty_and_move_the_position(
        nc: Client) -> None:
    """Given a catalog and a report, when folded, then the host is in the state and dirty,
    the position is at the report's seq, and the loop is woken to write."""
    wake = asyncio.Event()
    live, pos = _live(nc, wake=wake)
    for env in (catalog_env(1, T0), report_env(2, T0 + 1, "scratch", "n1", SCRATCH)):
        live.fold(_stored(env), None)
    assert "n1" in live.state.hosts
    assert live.dirty.hosts == {"n1"}
    assert live.dirty.catalog
    assert (live.applied, pos.applied, pos.handled) == (2, 2, 2)
    assert live.last_event is not None
    assert live.last_event.seq == 2
    assert wake.is_set()
    assert live.unwritten()
    assert not live.deadletters


async def test_an_event_the_fold_refuses_becomes_a_dead_letter(nc: Client) -> None:
    """A report whose payload names another host than its subject: dead-lettered with its
    seq, subject and reason; nothing of it is stored."""
    live, _ = _live(nc)
    live.fold(_stored(catalog_env(1, T0)), None)
    bad = report_env(2, T0 + 1, "scratch", "n1", SCRATCH, payload={"host": "n2"})
    live.fold(_stored(bad), None)
    assert live.deadletter_count == 1
    (letter,) = live.deadletters
    assert (letter.seq, letter.subject) == (2, bad.subject)
    assert "subject says reporter 'scratch' host 'n1'" in letter.reason
    assert live.state.hosts == {}


async def test_a_partition_drops_what_is_not_its_own(nc: Client) -> None:
    """A partition reads every subject at its first load: another partition's event moves
    only its handled position; nothing is applied."""
    live, pos = _live(nc, owns=lambda subject: not subject.endswith(".n2.scratch"))
    live.fold(_stored(catalog_env(1, T0)), None)
    live.fold(_stored(report_env(2, T0 + 1, "scratch", "n2", SCRATCH)), None)
    assert (live.applied, pos.applied, pos.handled) == (1, 1, 2)
    assert "n2" not in live.state.hosts


async def test_a_waiting_record_is_placed_before_an_event_of_its_host(nc: Client) -> None:
    """Given n1's restored record waiting (`Lazy`), when an event of n1 is folded, then the
    record is placed first: the values it held and the new one are both there, as in a
    fold that never stopped."""
    history = [catalog_env(1, T0), report_env(2, T0 + 1, "scratch", "n1", {"scratch_total": 9})]
    before = fold(history)
    live, _ = _live(nc)
    live.fold(_stored(history[0]), None)
    live.state.seq = 2
    lazy = live.lazy = Lazy(upto=2)
    lazy.add("n1", encode(host_snapshot(before, "n1")), T0 + 100)
    nxt = report_env(3, T0 + 2, "scratch", "n1", {"scratch_free": 4})
    live.fold(_stored(nxt), None)
    assert len(lazy) == 0
    reference = fold([*history, nxt])
    assert host_snapshot(live.state, "n1") == host_snapshot(reference, "n1")


async def test_a_deferred_record_is_placed_once_the_fold_passed_its_event(
        nc: Client) -> None:
    """Given n1's record as of seq 3 deferred (written after the status at seq 1), when
    the fold reaches seq 4, then the record is in place (its values, not refolded)."""
    history = [catalog_env(1, T0), report_env(2, T0 + 1, "scratch", "n1", SCRATCH),
               report_env(3, T0 + 2, "scratch", "n1", {"scratch_free": 7})]
    later = fold(history)
    snap = decode_record(encode(host_snapshot(later, "n1")))
    live, _ = _live(nc)
    live.fold(_stored(history[0]), None)
    deferred = live.deferred = Deferred([("n1", snap)])
    live.fold(_stored(history[1]), None)
    # (another value at seq 3 than the record holds: what is in place after seq 4 says
    # whether the record was placed or the events refolded)
    live.fold(_stored(report_env(3, T0 + 2, "scratch", "n1", {"scratch_free": 5})), None)
    assert deferred.next_seq == 3  # not passed yet: seq 3 was just folded
    live.fold(_stored(report_env(4, T0 + 3, "site", "n2", {"site_ok": True})), None)
    assert len(deferred) == 0
    assert msgspec.json.decode(encode(host_snapshot(live.state, "n1")))["values"][
        "scratch_free"]["value"] == 7
