"""Slurm hostlist expressions: crr's compressor round-trips through Slurm's own reader."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crr.bridges.hostlist import compress, expand
from tests.support.slurm import missing_programs, slurm_conf

NAMES = st.builds(
    lambda prefix, number, width: f"{prefix}{number:0{width}d}" if width else prefix,
    st.sampled_from(["node", "gpu", "rack1-n", "a.b_c", "x"]),
    st.integers(0, 1200), st.sampled_from([0, 1, 2, 3, 4]))


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    """A `slurm.conf` for `scontrol show hostnames` (it reads one; no daemon needed)."""
    if "scontrol" in missing_programs():
        pytest.skip("scontrol not installed (apt-get install slurm-client)")
    with tempfile.TemporaryDirectory() as root:
        conf = Path(root) / "slurm.conf"
        conf.write_text(slurm_conf(Path(root), nodes="n[1-2]", cluster="crrhl", ctld_port=1,
                                   slurmd_port=2, munge_socket=Path(root) / "sock"))
        yield {**os.environ, "SLURM_CONF": str(conf)}


def slurm_expand(expr: str, env: dict[str, str]) -> list[str]:
    scontrol = shutil.which("scontrol") or "scontrol"
    ran = subprocess.run([scontrol, "show", "hostnames", expr], capture_output=True,
                         text=True, env=env, check=True, timeout=30)
    return ran.stdout.split()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sets(NAMES, min_size=1, max_size=60))
def test_round_trip_through_scontrol(slurm_env: dict[str, str], names: set[str]) -> None:
    """`scontrol show hostnames` of what `compress` writes names exactly the input, once
    each; crr's own `expand` agrees."""
    exprs = compress(names)
    assert len(exprs) == 1
    assert sorted(slurm_expand(exprs[0], slurm_env)) == sorted(names)
    assert sorted(expand(exprs[0])) == sorted(names)


def test_compresses_a_dense_range() -> None:
    """2,000 consecutive nodes are one short expression; widths are never mixed."""
    assert compress(f"node{i:04d}" for i in range(1, 2001)) == ["node[0001-2000]"]
    assert compress(["n9", "n10", "n11"]) == ["n9,n[10-11]"]


def test_sparse_set_split_over_arguments() -> None:
    """A set too sparse for one argument is split; together the parts name it exactly."""
    names = [f"node{i:05d}" for i in range(0, 20000, 2)]
    exprs = compress(names, max_chars=1000)
    assert len(exprs) > 1
    assert all(len(e) <= 1000 for e in exprs)
    assert sorted(n for e in exprs for n in expand(e)) == names


def test_expand_rejects_garbage() -> None:
    """A term crr cannot read is a ValueError naming it."""
    with pytest.raises(ValueError, match="bad range"):
        expand("node[a-b]")
