"""The Slurm door against a real slurmctld: features, drains, drift, batching, faults."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest

from crr.bridges.door import Door, Observed
from crr.bridges.engine import Engine
from crr.bridges.slurm import (
    SlurmCommands,
    SlurmDoor,
    SlurmNode,
    Update,
    plan_updates,
)
from crr.projections.exports import NodeWant
from crr.schemas.errors import SchedulerCommandError
from crr.schemas.target_names import slurm_feature_problem
from tests.support.slurm import SlurmCluster

OWNED = frozenset({"imagenet_cached", "big_scratch"})


def want(features: frozenset[str] = frozenset(), drain: str | None = None) -> NodeWant:
    """The planner's NodeWant of `features` and `drain`."""
    return NodeWant(features=features, drain=drain)


def door(slurm: SlurmCluster, *, batch: bool = True) -> SlurmDoor:
    """A door on the fixture's cluster, owning OWNED."""
    return SlurmDoor(SlurmCommands(env=slurm.env), owned=OWNED, batch=batch)


async def test_features_set_beside_the_admins_and_batched(slurm: SlurmCluster) -> None:
    """crr features join the admin's static one on 10 nodes in one call; a second
    reconcile has nothing to do."""
    d = door(slurm)
    wants = {f"node{i:03d}": want(frozenset({"imagenet_cached"})) for i in range(1, 11)}
    done = await d.reconcile(wants)
    assert (done.calls, done.failed) == (1, 0), done
    seen = slurm.features()
    assert all(seen[n][0] == {"admin_static", "imagenet_cached"} for n in wants)
    assert seen["node011"][0] == {"admin_static"}
    again = await d.reconcile(wants)
    assert again.updates == []
    assert again.calls == 0
    out = slurm.sbatch_test_only("-N", "10", "--constraint=imagenet_cached")
    assert "node[001-010]" in out.stderr, out.stderr
    assert slurm.sbatch_test_only("-N", "11", "--constraint=imagenet_cached").returncode != 0


async def test_unbatched_costs_a_call_per_node(slurm: SlurmCluster) -> None:
    """Without hostlists the same change is one call per node."""
    d = door(slurm, batch=False)
    wants = {f"node{i:03d}": want(frozenset({"big_scratch"})) for i in range(1, 6)}
    done = await d.reconcile(wants)
    assert done.calls == 5
    assert done.failed == 0


async def test_drain_and_resume_only_crrs_own(slurm: SlurmCluster) -> None:
    """crr drains with `crr: <reason>` and resumes what it drained; the admin's drain on
    another node stays, reason and all, whatever crr wants there."""
    slurm.scontrol("update", "NodeName=node005", "State=DRAIN", "Reason=admin: bad dimm")
    d = door(slurm)
    await d.reconcile({"node004": want(drain="scratch unhealthy"),
                       "node005": want(drain="scratch unhealthy")})
    seen = slurm.features()
    assert seen["node004"][1].startswith("drain")
    assert seen["node004"][2] == \
        "crr: scratch unhealthy"
    assert seen["node005"][2] == "admin: bad dimm"
    await d.reconcile({"node004": want(), "node005": want()})
    seen = slurm.features()
    assert seen["node004"][1] == "idle"
    assert seen["node004"][2] == ""
    assert seen["node005"][1].startswith("drain")
    assert seen["node005"][2] == "admin: bad dimm"


async def test_reapplied_after_reconfigure_and_restart(slurm: SlurmCluster) -> None:
    """`scontrol reconfigure` and a slurmctld restart wipe scontrol-set features; the
    next reconcile sees it and puts them back."""
    d = door(slurm)
    wants = {"node001": want(frozenset({"imagenet_cached"})), "node002": want(drain="x")}
    await d.reconcile(wants)
    slurm.scontrol("reconfigure")
    assert slurm.features()["node001"][0] == {"admin_static"}
    assert (await d.reconcile(wants)).calls == 1
    assert slurm.features()["node001"][0] == {"admin_static", "imagenet_cached"}
    slurm.restart_slurmctld()
    assert slurm.features()["node001"][0] == {"admin_static"}
    assert slurm.features()["node002"][2] == "crr: x"  # the drain survived the restart
    await d.reconcile(wants)
    assert slurm.features()["node001"][0] == {"admin_static", "imagenet_cached"}


async def test_slurmctld_down_counted_then_recovers(slurm: SlurmCluster) -> None:
    """slurmctld down: the reconcile raises a counted SchedulerCommandError (the loop backs
    off); once it is back the same door catches up."""
    d = SlurmDoor(SlurmCommands(env=slurm.env, timeout=20), owned=OWNED)
    slurm.stop_slurmctld()
    with pytest.raises(SchedulerCommandError, match="scontrol"):
        await d.reconcile({"node001": want(frozenset({"big_scratch"}))})
    assert d.status.failures == 1
    assert not d.status.healthy
    assert d.status.last_error is not None
    slurm.start_slurmctld()
    await d.reconcile({"node001": want(frozenset({"big_scratch"}))})
    assert d.status.healthy
    assert "big_scratch" in slurm.features()["node001"][0]


async def test_unknown_node_noted_once(slurm: SlurmCluster,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """A node crr has but Slurm does not is left out of the calls and logged once."""
    caplog.set_level(logging.WARNING, "crr.bridge.slurm")
    d = door(slurm)
    big = want(frozenset({"big_scratch"}))
    wants = {"ghost7": big, "node003": big}
    for _ in range(3):
        done = await d.reconcile(wants)
        assert done.failed == 0
    assert d.status.unknown_nodes == {"ghost7"}
    said = [r for r in caplog.records if "unknown to Slurm" in r.getMessage()]
    assert len(said) == 1
    assert "ghost7" in said[0].getMessage()


def test_plan_groups_by_identical_change() -> None:
    """Nodes needing the same settings share one Update; a node already right is absent."""
    def node(name: str, feats: tuple[str, ...]) -> SlurmNode:
        return SlurmNode(name, feats, feats, "idle", frozenset(), "")

    observed = {"n1": node("n1", ("a",)), "n2": node("n2", ("a",)),
                "n3": node("n3", ("a", "imagenet_cached"))}
    cached = want(frozenset({"imagenet_cached"}))
    ups = plan_updates({"n1": cached, "n2": cached, "n3": cached}, observed, OWNED)
    assert ups == [Update(("n1", "n2"), ("AvailableFeatures=a,imagenet_cached",
                                         "ActiveFeatures=a,imagenet_cached"))]


async def test_permission_refused_counted(slurm: SlurmCluster, tmp_path: Path) -> None:
    """scontrol run as a user without Slurm operator rights: every update is refused,
    counted and kept in the status, the nodes untouched; the door keeps working."""
    scontrol = tmp_path / "scontrol-as-nobody"
    scontrol.write_text(f"#!/bin/sh\nexec {shutil.which('runuser', path='/usr/sbin:/sbin')} "
                        f"-u nobody -- {shutil.which('scontrol')} \"$@\"\n")
    scontrol.chmod(0o755)
    d = SlurmDoor(SlurmCommands(scontrol=str(scontrol), env=slurm.env), owned=OWNED)
    done = await d.reconcile({"node001": want(frozenset({"big_scratch"})),
                              "node002": want(drain="x")})
    assert done.failed == done.calls == 2
    # Slurm 22.05 refuses a non-operator's update as "Invalid user id" (others say
    # "Access/permission denied").
    assert re.search("Invalid user id|ermission denied", done.errors[0]), done.errors
    assert d.status.failed_calls == 2
    assert not d.status.healthy
    assert d.status.last_error is not None
    seen = slurm.features()
    assert seen["node001"][0] == {"admin_static"}
    assert seen["node002"][1] == "idle"


async def test_both_readers_agree(slurm: SlurmCluster) -> None:
    """`scontrol show node --oneliner` and `sinfo --json` read the same nodes — features,
    state, drain flag and a reason with spaces, `=` and brackets included."""
    slurm.scontrol("update", "NodeName=node003", "State=DRAIN", "Reason=admin: x=1 [see] y")
    slurm.scontrol("update", "NodeName=node004", "AvailableFeatures=admin_static,gpu_a")
    by_scontrol = await SlurmCommands(env=slurm.env).show_nodes()
    by_sinfo = await SlurmCommands(env=slurm.env, reader="sinfo-json").show_nodes()
    assert len(by_scontrol) == 20
    assert by_scontrol == by_sinfo
    assert by_scontrol["node003"].reason == "admin: x=1 [see] y"
    assert by_scontrol["node003"].drained
    assert by_scontrol["node003"].crr_drain is None
    assert by_scontrol["node004"].active == ("admin_static", "gpu_a")


async def test_door_protocol_observe_and_apply(slurm: SlurmCluster) -> None:
    """The `Door` calls: `observe` shows crr's part of each node (not the admin's
    feature, not the admin's drain) and leaves out a node Slurm lacks; `apply(changes)`
    changes the named nodes only, reports a node Slurm lacks as unknown."""
    d: Door = door(slurm)
    slurm.scontrol("update", "NodeName=node003", "State=DRAIN", "Reason=admin: fan")
    await d.apply({"node001": want(frozenset({"big_scratch"})),
                   "node002": want(frozenset({"big_scratch"}), drain="x")})
    seen_by_door = await d.observe(["node001", "node002", "node003", "ghost"])
    assert seen_by_door == {
        "node001": Observed(features=frozenset({"big_scratch"})),
        "node002": Observed(features=frozenset({"big_scratch"}), drain="x"),
        "node003": Observed()}
    done = await d.apply({"node002": want(), "ghost": want(frozenset({"big_scratch"}))})
    assert done.calls == 2  # features off, resume
    assert done.done == {"node002"}
    assert done.unknown == {"ghost"}
    seen = slurm.features()
    assert seen["node001"][0] == {"admin_static", "big_scratch"}
    assert seen["node002"][0] == {"admin_static"}


async def test_a_feature_slurm_cannot_ask_for_is_refused_by_sbatch(slurm: SlurmCluster) -> None:
    """`crr.schemas.target_names`' Slurm rule is Slurm's: a job cannot ask for a feature
    named with `|`, though scontrol stores it."""
    slurm.scontrol("update", "NodeName=node001", "AvailableFeatures=a|b", "ActiveFeatures=a|b")
    assert slurm.sbatch_test_only("--constraint=a|b").returncode != 0
    assert slurm_feature_problem("a|b") is not None
    assert slurm_feature_problem("imagenet_cached") is None


async def test_the_bridge_engine_drives_the_slurm_door(slurm: SlurmCluster) -> None:
    """The shared engine (`crr.bridges.engine.Engine`) reconciles through the Slurm door:
    it applies only what differs, and a second pass has nothing to do."""
    d = door(slurm)
    engine = Engine(d, rate=10_000)
    wants = {f"node{i:03d}": want(frozenset({"imagenet_cached"})) for i in range(1, 9)}
    wants["ghost"] = want(frozenset({"imagenet_cached"}))
    assert await engine.reconcile(wants)
    assert engine.stats.applied == 8
    assert engine.stats.calls == 1  # one hostlist call for the eight nodes
    assert engine.stats.unknown == {"ghost"}
    assert slurm.features()["node008"][0] == {"admin_static", "imagenet_cached"}
    assert await engine.reconcile(wants)
    assert engine.stats.applied == 8
