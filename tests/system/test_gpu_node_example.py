"""ops/examples/gpu-node.yaml: `crr catalog apply` accepts it, and its mappings and scripts do
what docs/gpu-node.md says on real dcgm-exporter outputs and real directories."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crr.bus.server import NatsServer
from crr.cli import main
from crr.producers.exposition import ExpositionMap
from crr.producers.exposition_sources import TextfileDirectory
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.events import Attribute
from tests.support.cli import ROOT

EXAMPLE = ROOT / "ops" / "examples" / "gpu-node.yaml"
REPORTERS = ROOT / "ops" / "examples" / "reporters"
DCGM = ROOT / "tests" / "fixtures" / "dcgm"
NODE = ROOT / "tests" / "fixtures" / "node_exporter"


@pytest.fixture(scope="module")
def gpu_node() -> Catalog:
    """The example catalog, validated as `crr catalog apply` validates it."""
    return load_catalog(EXAMPLE)


def test_catalog_apply_accepts_it(
        nats_server: NatsServer, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr catalog apply` validates it (exports compiled too) and publishes it."""
    assert main(["catalog", "apply", str(EXAMPLE), "--server", nats_server.url]) == 0
    out = capsys.readouterr().out
    assert "21 resources" in out, out
    assert "4 reporters" in out, out


def test_its_shape(gpu_node: Catalog) -> None:
    """Four exposition reporters (two scrapes, a script, a textfile directory), ten drains."""
    assert {n: (r.type, r.format) for n, r in gpu_node.reporters.items()} == {
        "cache": ("textfile", "json"), "dcgm": ("scrape", "json"),
        "fs_probe": ("script", "prometheus"), "node": ("scrape", "json")}
    assert all(r.exposition() for r in gpu_node.reporters.values())
    assert len(gpu_node.exports_or_empty().drain) == 10


def test_dcgm_mapping_on_real_outputs(gpu_node: Catalog) -> None:
    """Healthy node: every health boolean true; XID 79 on GPU 3: only the XID one false, and
    the device says so; GPU 5 gone: 7 GPUs (the `gpu_count < 8` drain rule's input)."""
    dcgm = ExpositionMap(gpu_node.reporters["dcgm"])
    healthy = dcgm.from_text((DCGM / "a100x8.prom").read_bytes())
    assert healthy.problems == []
    assert healthy.values is not None
    assert {k: healthy.values[k] for k in (
        "gpu_count", "gpu_xid_clear", "gpu_ecc_dbe_clear", "gpu_retire_clear", "gpu_remap_ok",
        "gpu_nvlink_clear", "gpu_temp_max", "gpu_models")} == {
        "gpu_count": 8.0, "gpu_xid_clear": True, "gpu_ecc_dbe_clear": True,
        "gpu_retire_clear": True, "gpu_remap_ok": True, "gpu_nvlink_clear": True,
        "gpu_temp_max": 40.0, "gpu_models": ["NVIDIA A100 80GB PCIe"]}
    xid = dcgm.from_text((DCGM / "a100x8-xid79.prom").read_bytes())
    assert xid.values is not None
    assert xid.values["gpu_xid_clear"] is False
    assert xid.values["gpu_ecc_dbe_clear"] is True
    assert xid.inventory is not None
    gpu3 = next(d for d in xid.inventory.devices if d.name == "gpu3")
    assert gpu3.attributes["xid"] == Attribute(int=79)
    assert gpu3.attributes["healthy"] == Attribute(bool=False)
    missing = dcgm.from_text((DCGM / "a100x8-gpu5-missing.prom").read_bytes())
    assert missing.values is not None
    assert missing.values["gpu_count"] == 7.0
    assert missing.inventory is not None
    assert [d.name for d in missing.inventory.devices] == [
        "gpu0", "gpu1", "gpu2", "gpu3", "gpu4", "gpu6", "gpu7"]


def probe(*mounts: str, seconds: str = "5") -> bytes:
    """The example's fs_probe.py output for `mounts`."""
    return subprocess.run(
        [sys.executable, str(REPORTERS / "fs_probe.py"), *mounts], capture_output=True,
        check=True, timeout=30, env={**os.environ, "CRR_FS_PROBE_SECONDS": seconds}).stdout


def test_fs_probe(gpu_node: Catalog, tmp_path: Path) -> None:
    """A mount that answers is responsive; one that does not (here: gone) is not."""
    spec = gpu_node.reporters["fs_probe"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    text = probe(str(scratch), str(tmp_path / "shared")).replace(
        str(scratch).encode(), b"/scratch").replace(str(tmp_path / "shared").encode(), b"/shared")
    out = ExpositionMap(spec).from_text(text)
    assert out.values == {"scratch_responsive": True, "shared_responsive": False}


def test_fs_probe_that_does_not_answer_in_time(tmp_path: Path) -> None:
    """A probe that outlives its time counts as not responsive (the probe is not waited for)."""
    text = probe(str(tmp_path), seconds="0.001").decode()
    assert f'crr_fs_responsive{{mountpoint="{tmp_path}"}} 0' in text


def test_cache_inventory_textfile(gpu_node: Catalog, tmp_path: Path) -> None:
    """cache_inventory.sh writes complete entries only; the `cache` textfile reporter's
    mapping turns them into the datasets and models string sets."""
    for kind, name, complete in (("datasets", "imagenet", True), ("datasets", "c4", True),
                                 ("models", "llama-3-70b", True), ("models", "half", False)):
        entry = tmp_path / kind / name
        entry.mkdir(parents=True)
        if complete:
            (entry / ".complete").touch()
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    subprocess.run(["/bin/sh", str(REPORTERS / "cache_inventory.sh")], check=True,
                   timeout=30, env={**os.environ, "CRR_DATASET_DIR": str(tmp_path / "datasets"),
                                    "CRR_MODEL_DIR": str(tmp_path / "models"),
                                    "TEXTFILE_DIR": str(textfile)})
    assert [p.name for p in textfile.iterdir()] == ["crr_cache.prom"]
    read = TextfileDirectory(str(textfile), limit=1 << 16).read()
    out = ExpositionMap(gpu_node.reporters["cache"]).apply(read.expo, read.problems)
    assert out.values == {"datasets": ["c4", "imagenet"], "models": ["llama-3-70b"]}


def test_infiniband_mapping_on_node_exporter_output(gpu_node: Catalog) -> None:
    """node_exporter's own infiniband output (its e2e fixture): every port ACTIVE, the
    slowest port's rate, the devices; one port down turns `ib_ports_up` false.  The file
    system and memory metrics are not in that output: named missing, left out."""
    node = ExpositionMap(gpu_node.reporters["node"])
    up = node.from_text((NODE / "e2e-infiniband.prom").read_bytes())
    assert up.values == {"ib_devices": ["i40iw0", "mlx4_0"], "ib_ports_up": True,
                         "ib_rate_min_gbps": 10.0}
    assert sorted(p.split(":")[0] for p in up.problems) == [
        "mem_available_gib", "scratch_free_gib", "shared_free_gib"]
    down = node.from_text((NODE / "e2e-infiniband-port-down.prom").read_bytes())
    assert down.values is not None
    assert down.values["ib_ports_up"] is False
