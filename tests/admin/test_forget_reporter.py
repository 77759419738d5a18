"""Forgetting one reporter's row on a host (`crr hosts forget HOST --reporter R`): the fold
drops that row, its values and inventory and nothing else; a fold of the whole history
gives the same; the projector rewrites the record; the CLI says what it did and refuses
a row that is not there."""

from __future__ import annotations

import json

import msgspec
import pytest
from nats.aio.client import Client

from crr.projections.envelope import Envelope
from crr.projections.fold import apply, expire, fold
from crr.projections.state import ProjectionState
from crr.schemas.codec import encode
from crr.schemas.events import Forget
from crr.schemas.subjects import forget_subject
from crr.view.snapshot_reader import read_snapshot
from tests.history.test_replay import cli
from tests.support.fold import (
    T0,
    catalog_env,
    encoded_hosts,
    inventory_env,
    report_env,
    snap,
)
from tests.support.projector import publish_catalog, publish_report, running_projector

GPU = [{"name": "gpu0", "attributes": {"model": {"string": "H100"}}}]


def _forget(seq: int, host: str, t: float, reporter: str | None) -> Envelope:
    event = Forget(host=host, requested_at="2027-01-15T08:00:00.000Z",
                   reporter=msgspec.UNSET if reporter is None else reporter)
    return Envelope(seq=seq, subject=forget_subject(host), received_at=t, data=encode(event))


def _history() -> list[Envelope]:
    """n1: scratch and datasets values, a gpus inventory, an undeclared `nosuch` (rejecting);
    n2: scratch."""
    return [
        catalog_env(1, T0),
        report_env(2, T0, "scratch", "n1", {"scratch_free": 5.0, "scratch_total": 9.0}),
        report_env(3, T0, "datasets", "n1", {"datasets": ["c4"]}),
        inventory_env(4, T0, "gpus", "n1", GPU),
        report_env(5, T0, "nosuch", "n1", {"x": 1}),
        report_env(6, T0, "scratch", "n2", {"scratch_free": 1.0}),
    ]


def test_fold_forgets_only_that_reporters_row() -> None:
    """Given a host with four reporters, when the undeclared one is forgotten, then its
    `rejecting` row goes, the change names the host, and every other row, value and the
    inventory are as they were; forgetting scratch takes its values, gpus its inventory."""
    state = fold(_history())
    assert snap(state, "n1").reporters["nosuch"].state == "rejecting"
    before = snap(state, "n1")
    ch = apply(state, _forget(7, "n1", T0 + 1, "nosuch"))
    assert ch.hosts == frozenset({"n1"})
    assert ch.deadletter is None
    after = snap(state, "n1")
    assert set(after.reporters) == {"scratch", "datasets", "gpus"}
    assert after.values == before.values
    assert after.inventory == before.inventory
    assert after.as_of.seq == 7
    apply(state, _forget(8, "n1", T0 + 1, "scratch"))
    after = snap(state, "n1")
    assert set(after.values) == {"datasets"}
    assert "scratch" not in after.reporters
    apply(state, _forget(9, "n1", T0 + 1, "gpus"))
    assert snap(state, "n1").inventory == {}
    assert set(snap(state, "n2").values) == {"scratch_free"}  # another host: untouched


def test_fold_forgetting_the_last_reporter_drops_the_host() -> None:
    """When nothing is left of a host, it goes as a whole-host Forget would take it (the
    projector then writes a delete marker); a Forget of a row that is not there changes
    nothing; expiry later does not bring the row back, a new report of it does."""
    state = fold(_history()[:3])
    assert apply(state, _forget(4, "n1", T0, "nosuch")).hosts == frozenset()
    apply(state, _forget(5, "n1", T0, "scratch"))
    ch = apply(state, _forget(6, "n1", T0, "datasets"))
    assert ch.hosts == frozenset({"n1"})
    assert "n1" not in state.hosts
    assert "n1" not in expire(state, T0 + 3600).hosts
    assert "n1" not in state.hosts
    apply(state, report_env(7, T0 + 3601, "scratch", "n1", {"scratch_free": 2.0}))
    assert set(snap(state, "n1").reporters) == {"scratch"}


def test_fold_forget_before_any_catalog_drops_that_reporters_held_events() -> None:
    """Events held for want of a catalog: the forgotten reporter's go, the others stay."""
    state = ProjectionState()
    for env in _history()[1:]:
        apply(state, env)
    apply(state, _forget(7, "n1", T0, "nosuch"))
    apply(state, catalog_env(8, T0 + 1))
    assert set(state.hosts["n1"].reporters) == {"scratch", "datasets", "gpus"}


def test_fold_of_the_whole_history_equals_folding_in_steps() -> None:
    """Replay is the same fold: the history with a reporter Forget, folded at once or in
    two parts with expiry between, gives byte-identical records."""
    events = [*_history(), _forget(7, "n1", T0 + 2, "nosuch"),
              report_env(8, T0 + 3, "nosuch", "n2", {"x": 2}),
              _forget(9, "n2", T0 + 4, "nosuch")]
    whole = fold(events, now=T0 + 100)
    steps = fold(events[:5], now=T0 + 1)
    fold(events[5:], now=T0 + 100, state=steps)
    assert encoded_hosts(whole) == encoded_hosts(steps)
    assert all("nosuch" not in snap(whole, h).reporters for h in ("n1", "n2"))


async def test_forget_reporter_end_to_end(nc: Client, nats_url: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`crr hosts forget node1 --reporter nosuch`: the running projector rewrites node1
    without the row, scratch stays, a restarted (rebuilding) projector agrees and
    `crr replay --verify` holds; a row that is not there is exit 1 naming the rows."""
    server = ["--server", nats_url]
    await publish_catalog(nc)
    async with running_projector(nc) as projector:
        await publish_report(nc, "scratch", "node1", {"scratch_free": 10.0})
        last = await publish_report(nc, "nosuch", "node1", {"x": 1.0})
        await projector.wait_until(last, 10)
        assert (await read_snapshot(nc)).hosts["node1"].reporters["nosuch"].state == "rejecting"
        code, out, err = await cli(["hosts", "forget", "node1", "--reporter", "nosuch",
                                    *server], capsys)
        assert code == 0, err
        assert out.startswith("forgot reporter nosuch on host node1: row removed"), out
        record = (await read_snapshot(nc)).hosts["node1"]
        assert set(record.reporters) == {"scratch"}
        assert record.values["scratch_free"].value == 10.0
        code, out, err = await cli(["hosts", "forget", "node1", "--reporter", "nosuch",
                                    *server], capsys)
        assert code == 1
        assert "host 'node1' has no reporter 'nosuch' (its reporters: scratch)" in err
        code, out, err = await cli(["hosts", "--reporter", "nosuch", *server], capsys)
        assert code == 1
        assert "--reporter goes with `crr hosts forget" in err
        code, out, err = await cli(["replay", "--verify", *server], capsys)
        assert code == 0, out + err
    async with running_projector(nc) as restarted:  # restores; node1 written again
        again = await publish_report(nc, "scratch", "node1", {"scratch_free": 11.0}, seq=2)
        await restarted.wait_until(again, 10)
    code, out, err = await cli(["hosts", "--json", *server], capsys)
    assert [sorted(h["reporters"]) for h in json.loads(out)] == [["scratch"]]
