"""`crr nats-config`: what it writes, with which modes, and that re-running keeps deployed keys."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from crr.admin.nats_auth import identities, reporter_identity
from crr.schemas.catalog_loader import load_catalog, load_catalog_text
from tests.support.security import CATALOG_YAML

EXAMPLE = Path(__file__).resolve().parents[2] / "ops" / "examples" / "resources.yaml"


def _nats_config(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crr.cli", "nats-config", *args],
        capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
def test_files_are_private_and_rerunning_keeps_the_keys(tmp_path: Path) -> None:
    """Mode 0600 files in 0700 dirs; a second run with one more host keeps every existing key."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# compute\nnode1\nnode2  # the big one\n\n")
    out = tmp_path / "nats"
    run = _nats_config("--catalog", str(EXAMPLE), "--hosts-file", str(hosts), "--out", str(out))
    assert run.returncode == 0, run.stderr
    creds = sorted(p.name for p in (out / "creds").iterdir())
    assert creds == ["admin.nk", "host.node1.nk", "host.node2.nk", "projector.nk",
                     "reporter.flexlm.nk", "view.nk"]
    for p in [out / "auth.conf", *(out / "creds").iterdir()]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE((out / "creds").stat().st_mode) == 0o700
    seeds = {p.name: p.read_text() for p in (out / "creds").iterdir()}
    assert not any(seed.strip() in run.stdout + run.stderr for seed in seeds.values())
    config = (out / "auth.conf").read_text()
    assert not any(seed.strip() in config for seed in seeds.values())

    again = _nats_config("--catalog", str(EXAMPLE), "--hosts-file", str(hosts),
                         "--host", "node3", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert all((out / "creds" / n).read_text() == s for n, s in seeds.items())
    assert (out / "creds" / "host.node3.nk").exists()
    new_config = (out / "auth.conf").read_text()
    assert all(line in new_config for line in config.splitlines() if '"nkey"' in line)


def test_permissions_follow_the_catalog() -> None:
    """Hosts get their own subjects only; a host-scope external reporter gets host.* and a deny."""
    catalog = load_catalog_text(CATALOG_YAML)
    by_name = {i.name: i for i in identities(catalog, ["node.1"])}
    host = by_name["host.node=2E1"]  # host names are subject tokens
    assert "crr.v1.report.host.node=2E1.*" in host.publish
    assert host.publish_deny == ("crr.v1.*.host.node=2E1.dsindex",)
    assert not any(s.startswith("crr.v1.") and "node=2E1" not in s and "snapshot" not in s
                   for s in host.publish)
    assert "crr.v1.report.host.*.dsindex" in reporter_identity("dsindex", catalog).publish
    assert not any(".host." in s for s in reporter_identity("flexlm", catalog).publish)
    assert "$JS.API.>" not in by_name["view"].publish
    assert not any(s.startswith("crr.v1.") for s in by_name["view"].publish)
    assert "crr.v1.catalog" in by_name["admin"].publish


def test_missing_catalog_file_is_a_clear_error(tmp_path: Path) -> None:
    """A bad --catalog path fails with exit 1, naming the file, without a traceback."""
    run = _nats_config("--catalog", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o"))
    assert run.returncode == 1
    assert "nope.yaml" in run.stderr
    assert "cannot read" in run.stderr
    assert "Traceback" not in run.stderr


def test_example_catalog_loads() -> None:
    """The example catalog (with flexlm's command) is valid."""
    assert load_catalog(EXAMPLE).reporters["flexlm"].command
