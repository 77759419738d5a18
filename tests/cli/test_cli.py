"""The `crr` CLI: one-line errors, exit codes, and the core commands against a real server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from crr.bus.connection import connect
from crr.bus.server import NatsServer
from crr.bus.streams import StreamSettings, provision
from crr.cli import main
from crr.commands import bench as bench_command
from tests.support.cli import ROOT
from tests.support.projector import FAST_CATALOG_YAML, running_projector


def test_unknown_argument_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown option fails with exit 2 and one line naming it."""
    with pytest.raises(SystemExit) as exc:
        main(["hosts", "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--bogus" in err
    assert len(err.splitlines()) == 1


@pytest.mark.slow  # several seconds of real waiting: `pytest -m slow`
def test_server_down_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A server that is down gives exit 1 and a line naming the URL, no traceback."""
    code = main(["hosts", "--server", "nats://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 1
    assert "cannot reach NATS at nats://127.0.0.1:1" in err
    assert "Traceback" not in err


def test_bench_runs_from_the_checkout() -> None:
    """`crr bench` finds the suite in the checkout this crr is installed from (editable)."""
    suite = bench_command.suite_module()
    assert Path(suite.__file__ or "").resolve() == ROOT / "tests" / "bench" / "suite.py"
    assert suite.add_arguments is bench_command.add_arguments


def test_bench_outside_a_checkout_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Where no checkout holds the benchmarks (a wheel install), one line says what to do."""
    monkeypatch.setattr(bench_command, "CHECKOUT", tmp_path)
    code = main(["bench", "--quick"])
    assert code == 1
    assert capsys.readouterr().err == f"crr bench: error: {bench_command.NOT_A_CHECKOUT}\n"


def test_bad_catalog_lists_every_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr catalog apply` on a bad file lists every problem with its path, exit 1."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nresources:\n  x: {kind: nope, reporter: r}\n"
                   "  y: {kind: numeric, reporter: missing, interval: 3q}\n"
                   "reporters:\n  r: {type: script}\n")
    code = main(["catalog", "apply", str(bad), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 1
    for needle in ("resources.x.kind", "resources.y.interval", "resources.y.reporter",
                   "reporters.r.command"):
        assert needle in err


def test_catalog_apply_report_hosts(
    nats_server: NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """apply → report → hosts --json round trip through a real projector."""
    cat = tmp_path / "resources.yaml"
    cat.write_text(FAST_CATALOG_YAML)
    url = nats_server.url
    assert main(["catalog", "apply", str(cat), "--server", url]) == 0

    async def project_until(seq: int) -> None:
        async with connect(url) as nc, running_projector(nc) as p:
            await p.wait_until(seq)

    assert main(["report", "--reporter", "scratch", "--host", "n1", "scratch_free=812.5",
                 "--no-wait", "--server", url]) == 0
    out = capsys.readouterr().out
    seq = int(out.rsplit("seq ", 1)[1].rstrip(")\n"))
    asyncio.run(project_until(seq))
    assert main(["hosts", "--json", "--server", url]) == 0
    hosts = json.loads(capsys.readouterr().out)
    assert [h["host"] for h in hosts] == ["n1"]
    assert hosts[0]["values"]["scratch_free"]["value"] == 812.5
    assert main(["catalog", "show", "--json", "--server", url]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert "scratch_free" in shown["resources"]


def test_catalog_apply_into_streams_set_up_otherwise(
    nats_server: NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`crr catalog apply` publishes into streams a projector created with other settings
    (here a 48 h retention; `--replicas 3` on a cluster is the same case) instead of
    failing on its own defaults, and leaves those settings as they were."""
    async def setup() -> None:
        async with connect(nats_server.url) as nc:
            await provision(nc, StreamSettings(events_max_age=48 * 3600.0))

    async def max_age() -> float:
        async with connect(nats_server.url) as nc:
            return float((await nc.jetstream().stream_info("CRR_EVENTS")).config.max_age or 0)

    asyncio.run(setup())
    cat = tmp_path / "resources.yaml"
    cat.write_text(FAST_CATALOG_YAML)
    assert main(["catalog", "apply", str(cat), "--server", nats_server.url]) == 0
    assert "published" in capsys.readouterr().out
    assert asyncio.run(max_age()) == 48 * 3600.0


def test_huge_report_is_a_clear_error(
    nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 10 MB report is refused with a one-line error naming max_payload."""
    big = "x" * (10 * 1024 * 1024)
    code = main(["report", "--reporter", "scratch", "--host", "n1", f"site_state={big}",
                 "--server", nats_server.url])
    err = capsys.readouterr().err
    assert code == 1
    assert "max_payload" in err
    assert len(err.strip().splitlines()) == 1


def test_projector_partition_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    """`--partition K` needs `--partitions N > K`, said in one line before connecting."""
    for argv in (["--partitions", "2"], ["--partitions", "2", "--partition", "2"],
                 ["--partitions", "1", "--partition", "1"]):
        code = main(["projector", "--server", "nats://127.0.0.1:1", *argv])
        err = capsys.readouterr().err
        assert code == 1, argv
        assert "--partition K (0 <= K < N) goes with --partitions N > 1" in err
        assert len(err.strip().splitlines()) == 1


def test_projector_refuses_a_stream_of_another_layout(
        nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """On a CRR_EVENTS stored for 2 partitions, an unpartitioned `crr projector` — also in the
    systemd template's form `--partitions 1 --partition 0` — exits 1 saying how to run it."""
    async def partition_stream() -> None:
        async with connect(nats_url, name="t") as nc:
            await provision(nc, StreamSettings(partitions=2), update=True)

    asyncio.run(partition_stream())
    for argv in ([], ["--partitions", "1", "--partition", "0"]):
        code = main(["projector", "--server", nats_url, *argv])
        err = capsys.readouterr().err
        assert code == 1, argv
        assert "stored for 2 projector partition(s), this projector for 1" in err
        assert "Traceback" not in err
