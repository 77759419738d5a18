"""Forgetting a host (`crr hosts forget`): the fold drops it, the projector writes a delete
marker, its events are purged (both layouts), views and listings drop it, a running or
restarted projector does not bring it back, later events do; admin role only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.streams import StreamSettings, events_config, provision
from crr.projections.envelope import Envelope
from crr.projections.fold import apply, expire, fold
from crr.projections.state import ProjectionState
from crr.schemas.codec import encode
from crr.schemas.events import Forget
from crr.schemas.subjects import (
    EVENTS_STREAM,
    SNAPSHOT_STREAM,
    event_subject,
    forget_subject,
    host_snapshot_subject,
)
from crr.view.scheduler_view import loaded_view
from crr.view.snapshot_reader import read_snapshot
from tests.history.test_replay import cli
from tests.projector.test_lease_ha import TAKEOVER_BOUND, pair
from tests.support.faults import eventually
from tests.support.projector import (
    FAST_CATALOG,
    publish_catalog,
    publish_report,
    running_partitions,
    running_projector,
)
from tests.support.security import secure_rig

T0 = 1_790_000_000.0


def _report(seq: int, host: str, value: float, t: float) -> Envelope:
    body = json.dumps({"reporter": "scratch", "host": host, "boot": "b", "seq": seq,
                       "observed_at": "2026-12-02T14:00:00.000Z",
                       "values": {"scratch_free": value}}).encode()
    return Envelope(seq=seq, subject=event_subject("report", "scratch", host),
                    received_at=t, data=body)


def _forget(seq: int, host: str, t: float, *, payload_host: str | None = None) -> Envelope:
    body = encode(Forget(host=payload_host or host, requested_at="2026-12-02T14:00:00.000Z"))
    return Envelope(seq=seq, subject=forget_subject(host), received_at=t, data=body)


def _catalog() -> Envelope:
    return Envelope(seq=1, subject="crr.v1.catalog", received_at=T0, data=encode(FAST_CATALOG))


def test_fold_forgets_a_host_and_later_events_bring_it_back() -> None:
    """Given two hosts, when one is forgotten, then the state drops it (Changes name it, so
    the projector writes its delete marker), its old deadlines do nothing, the other host is
    untouched, and a later report re-creates it from scratch."""
    state = fold([_catalog(), _report(2, "n1", 1.0, T0), _report(3, "n2", 2.0, T0)])
    other = state.hosts["n2"]
    ch = apply(state, _forget(4, "n1", T0 + 1))
    assert ch.hosts == frozenset({"n1"})
    assert ch.deadletter is None
    assert "n1" not in state.hosts
    assert state.hosts["n2"] is other
    later = expire(state, T0 + 3600)  # n1's deadlines come due: nothing about n1
    assert "n1" not in later.hosts
    assert "n1" not in state.hosts
    apply(state, _report(5, "n1", 7.0, T0 + 3601))
    assert set(state.hosts["n1"].reporters) == {"scratch"}
    # The same as a host that was never seen before: as if its old events never were.
    fresh = fold([_catalog(), _report(5, "n1", 7.0, T0 + 3601)])
    assert state.hosts["n1"].reporters["scratch"].first_seen == \
        fresh.hosts["n1"].reporters["scratch"].first_seen


def test_fold_forget_before_any_catalog_drops_held_events() -> None:
    """Events held for a catalog are dropped with the host; a bad forget is dead-lettered."""
    state = ProjectionState()
    apply(state, _report(1, "n1", 1.0, T0))
    apply(state, _report(2, "n2", 1.0, T0))
    apply(state, _forget(3, "n1", T0))
    apply(state, _catalog())
    assert set(state.hosts) == {"n2"}
    bad = apply(state, _forget(9, "n2", T0, payload_host="n3"))
    assert bad.deadletter is not None
    assert "n3" in bad.deadletter
    assert "n2" in state.hosts


async def _host_events(nc: Client, host: str) -> dict[str, int]:
    info = await nc.jetstream().stream_info(EVENTS_STREAM,
                                            subjects_filter=f"crr.v1.*.host.{host}.>")
    return dict(info.state.subjects or {})


async def test_forget_end_to_end(nc: Client, nats_url: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`crr hosts forget node1`: the record and the events go, the view drops the host at
    once, the running projector does not write it back, a restarted one neither,
    `crr replay --verify` agrees; an unknown host is exit 1; a new report brings it back."""
    server = ["--server", nats_url]
    await publish_catalog(nc)
    async with running_projector(nc) as projector, loaded_view(nc, 10) as view:
        for i in range(3):
            await publish_report(nc, "scratch", "node1", {"scratch_free": 10.0 + i}, seq=i + 1)
        last = await publish_report(nc, "scratch", "node2", {"scratch_free": 5.0})
        await view.wait_until(last, 10)
        assert view.select("scratch_free >= 0") == ["node1", "node2"]
        removed: list[str] = []
        view.subscribe(removed.append)
        code, out, err = await cli(["hosts", "forget", "node1", *server], capsys)
        assert code == 0, err
        assert out.startswith("forgot host node1: snapshot record removed; 3 event(s) purged")
        forget_seq = int(out.rsplit("seq ", 1)[1])
        await view.wait_until(forget_seq, 10)
        assert view.select("scratch_free >= 0") == ["node2"]
        assert host_snapshot_subject("node1") in removed
        assert "node1" not in projector.state.hosts
        assert list(await _host_events(nc, "node1")) == [forget_subject("node1")]
        # The running projector writes node2 (and its status) again: node1 stays gone.
        again = await publish_report(nc, "scratch", "node2", {"scratch_free": 6.0}, seq=2)
        await view.wait_until(again, 10)
        assert view.select("scratch_free >= 0") == ["node2"]
        code, out, err = await cli(["hosts", "--json", *server], capsys)
        assert [h["host"] for h in json.loads(out)] == ["node2"]
        code, out, err = await cli(["hosts", "forget", "nosuch", *server], capsys)
        assert code == 1
        assert "unknown host 'nosuch'" in err
        code, out, err = await cli(["replay", "--verify", *server], capsys)
        assert code == 0, out + err
    async with running_projector(nc) as restarted:  # rebuilds from CRR_EVENTS
        assert "node1" not in restarted.state.hosts
        assert set((await read_snapshot(nc)).hosts) == {"node2"}
        back = await publish_report(nc, "scratch", "node1", {"scratch_free": 1.0}, seq=9)
        await restarted.wait_until(back, 10)
        snap = await read_snapshot(nc)
        assert set(snap.hosts) == {"node1", "node2"}
        assert snap.hosts["node1"].values["scratch_free"].value == 1.0


async def test_forget_with_no_projector_running(nc: Client, nats_url: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """No projector applies it in time: exit 1 saying so, the events are purged all the
    same; the next projector applies it (the record goes); forgetting again: unknown."""
    server = ["--server", nats_url]
    await publish_catalog(nc)
    async with running_projector(nc) as projector:
        seq = await publish_report(nc, "scratch", "node1", {"scratch_free": 1.0})
        await projector.wait_until(seq, 10)
    code, out, err = await cli(["hosts", "forget", "node1", "--wait", "0.5", *server], capsys)
    assert code == 1
    assert "snapshot record NOT removed yet; 1 event(s) purged" in out
    assert "goes when a projector runs" in err
    assert "node1" in (await read_snapshot(nc)).hosts
    async with running_projector(nc) as later:
        assert "node1" not in later.state.hosts
        assert "node1" not in (await read_snapshot(nc)).hosts
        code, out, err = await cli(["hosts", "forget", "node1", *server], capsys)
        assert code == 1
        assert "unknown host 'node1'" in err


async def test_forget_on_a_partitioned_stream(nats_url: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Partitioned layout: events stored with a partition token are purged, and the
    partition that owns the host writes the delete marker."""
    hosts = [f"node{i}" for i in range(6)]
    async with connect(nats_url, name="crr-test") as nc:
        await provision(nc, StreamSettings(partitions=2))
        async with running_partitions(nc, 2) as projectors, loaded_view(nc, 10) as view:
            await publish_catalog(nc)
            for i, host in enumerate(hosts):
                last = await publish_report(nc, "scratch", host, {"scratch_free": float(i)})
            await view.wait_until(last, 20)
            victim = sorted(projectors[1].state.hosts)[0]
            stored = await _host_events(nc, victim)
            assert all(s.endswith(".1") for s in stored)  # partition-token layout
            code, out, err = await cli(["hosts", "forget", victim, "--server", nats_url],
                                       capsys)
            assert code == 0, err
            assert "snapshot record removed; 1 event(s) purged" in out
            await view.wait_until(int(out.rsplit("seq ", 1)[1]), 10)
            assert victim not in view.select("scratch_free >= 0")
            assert len(view.select("scratch_free >= 0")) == len(hosts) - 1
            assert victim not in projectors[1].state.hosts
            assert list(await _host_events(nc, victim)) == [forget_subject(victim) + ".1"]
            msg = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM,
                                                    host_snapshot_subject(victim))
            assert not msg.data  # the delete marker


async def test_an_older_stream_gets_the_admin_subject(nats_url: str) -> None:
    """A CRR_EVENTS created before `crr.v1.admin.>` existed gets it added in place (nothing
    else changes): provisioning says "updated", and a forget can be stored."""
    async with connect(nats_url, name="crr-test") as nc:
        old = events_config(StreamSettings())
        old_subjects = [s for s in old.subjects or [] if s != "crr.v1.admin.>"]
        await nc.jetstream().add_stream(dataclasses.replace(old, subjects=old_subjects))
        result = await provision(nc)
        assert result[EVENTS_STREAM] == "updated"
        info = await nc.jetstream().stream_info(EVENTS_STREAM)
        assert sorted(info.config.subjects or []) == sorted(old.subjects or [])
        assert (await provision(nc))[EVENTS_STREAM] == "unchanged"


async def test_forget_needs_the_admin_role(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """With `admin` credentials the forget works; `view` may not publish it."""
    async with secure_rig(tmp_path) as rig:
        async with connect(rig.url, creds=rig.creds("host.nodeA"), name="t-host") as nc:
            await nc.jetstream().publish(
                event_subject("report", "scratch", "nodeA"),
                json.dumps({"reporter": "scratch", "host": "nodeA", "boot": "b", "seq": 1,
                            "observed_at": "2026-12-02T14:00:00.000Z",
                            "values": {"scratch_free": 3.0}}).encode())
        await eventually(lambda: "nodeA" in rig.projector.state.hosts, 10, "nodeA folded")
        async with connect(rig.url, creds=rig.creds("view"), name="t-view") as nc:
            with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
                await nc.jetstream(timeout=0.5).publish(
                    forget_subject("nodeA"), b"{}", timeout=0.5)
        code, out, err = await cli(["hosts", "forget", "nodeA", "--server", rig.url,
                                    "--creds", rig.creds("admin")], capsys)
        assert code == 0, err
        assert out.startswith("forgot host nodeA: snapshot record removed")
        assert "nodeA" not in (await rig.settle()).hosts


async def test_forget_while_the_writer_is_down_in_ha(nc: Client, nats_url: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """HA: the writer crashes, then a host is forgotten; the warm standby (which held the host
    in memory) folds the Forget, takes the lease and writes the delete marker."""
    await publish_catalog(nc)
    async with pair(nc) as (a, b):
        await publish_report(nc, "scratch", "node1", {"scratch_free": 1.0})
        seq = await publish_report(nc, "scratch", "node2", {"scratch_free": 2.0})
        await a.projector.wait_until(seq, 10)
        await eventually(lambda: "node1" in b.projector.state.hosts, 10, "standby warm")
        await a.crash()
        code, out, err = await cli(["hosts", "forget", "node1", "--wait",
                                    str(TAKEOVER_BOUND + 10), "--server", nats_url], capsys)
        assert code == 0, out + err
        assert out.startswith("forgot host node1: snapshot record removed; 1 event(s) purged")
        assert b.lease.held
        assert "node1" not in b.projector.state.hosts
        assert set((await read_snapshot(nc)).hosts) == {"node2"}
