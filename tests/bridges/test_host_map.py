"""`crr bridge slurm --host-map`: crr's host names mapped to Slurm's NodeNames.

The rule (`short`) and the file form are unit-tested; one slurm-marked test runs a
mapped door against the real slurmctld fixture: crr's FQDN hosts reach Slurm's short
NodeNames, which the unmapped door cannot find.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crr.bridges.host_map import HostMap, MappedSlurmDoor
from crr.bridges.slurm import SlurmCommands, SlurmDoor
from crr.cli import build_parser
from crr.projections.exports import NodeWant
from crr.schemas.errors import CrrError
from tests.support.slurm import SlurmCluster

OWNED = frozenset({"imagenet_cached"})
WANT = NodeWant(features=frozenset({"imagenet_cached"}), drain=None)


def test_short_drops_the_domain() -> None:
    """`short`: node1.example.org is node1; a short name stays itself."""
    m = HostMap.parse("short")
    assert [m.slurm_name(h) for h in ("node1.example.org", "node2")] == ["node1", "node2"]


def test_a_file_maps_listed_hosts_and_keeps_the_rest(tmp_path: Path) -> None:
    """`crr_name slurm_name` lines, comments and blank lines ignored; others unchanged."""
    f = tmp_path / "hosts.map"
    f.write_text("# crr  slurm\ngpu-a.example.org  gpu001\n\nlogin  login01  # the login\n")
    m = HostMap.parse(str(f))
    assert m.slurm_name("gpu-a.example.org") == "gpu001"
    assert m.slurm_name("login") == "login01"
    assert m.slurm_name("node7") == "node7"


@pytest.mark.parametrize(("text", "problem"), [
    ("a b c\n", "line 1: expected `crr_name slurm_name`, got 'a b c'"),
    ("a x\na y\n", "line 2: 'a' is mapped twice"),
    ("a x\nb x\n", "line 2: 'x' is already the Slurm name of 'a'"),
])
def test_a_bad_file_is_refused_with_its_line(tmp_path: Path, text: str, problem: str) -> None:
    """A map that cannot be meant (three words, one host twice, two hosts on one node)."""
    f = tmp_path / "hosts.map"
    f.write_text(text)
    with pytest.raises(CrrError) as caught:
        HostMap.parse(str(f))
    assert caught.value.message == problem


def test_a_missing_file_says_what_host_map_takes() -> None:
    """Neither `short` nor a readable file: the two forms are named."""
    with pytest.raises(CrrError) as caught:
        HostMap.parse("shrot")
    assert "give `short` or a file" in str(caught.value)


def test_two_hosts_on_one_node_leave_the_second_out() -> None:
    """`short` on a.x and a.y: one Slurm node `a`, told by the first host only."""
    other = NodeWant(features=frozenset(), drain="down")
    assert HostMap(short=True).apply({"a.y": other, "a.x": WANT}) == {"a": WANT}


def test_the_option_is_offered_by_crr_bridge_slurm() -> None:
    """`--host-map` parses on `crr bridge slurm` (its default: the same names)."""
    args = build_parser().parse_args(["bridge", "slurm", "--host-map", "short"])
    assert args.host_map == "short"
    assert build_parser().parse_args(["bridge", "slurm"]).host_map is None


@pytest.mark.slurm
async def test_fqdn_hosts_reach_short_nodenames(slurm: SlurmCluster) -> None:
    """crr's `node001.example.org` is Slurm's `node001`: mapped, its feature is set there;
    unmapped, the door does not find the node and sets nothing."""
    node = slurm.first_node
    fqdn = f"{node}.example.org"
    plain = SlurmDoor(SlurmCommands(env=slurm.env), owned=OWNED)
    await plain.reconcile({fqdn: WANT})
    assert "imagenet_cached" not in slurm.features()[node][0]
    mapped = MappedSlurmDoor(SlurmCommands(env=slurm.env), HostMap.parse("short"))
    mapped.owned = OWNED
    done = await mapped.reconcile({fqdn: WANT})
    assert done.failed == 0, done
    assert "imagenet_cached" in slurm.features()[node][0]
