"""Reporters learn what became of their report: the SDK's `submit` returns or raises the
projector's verdict, the documented example runs under the example catalog, `crr external
run` prints a line per cycle, and a reporter the catalog does not declare is refused
before anything is stored (`crr report` and the SDK)."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr import ExternalReporter, ReportOutcome
from crr.admin.nats_auth import secure_demo_setup
from crr.bus.connection import connect
from crr.bus.streams import provision
from crr.projector.service import Projector
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.codec import encode
from crr.schemas.errors import ReportRejectedError, UnknownReporterError
from crr.schemas.subjects import CATALOG, EVENTS_STREAM
from crr.view.snapshot_reader import read_snapshot
from tests.support.cli import ROOT, cli_env, crr
from tests.support.faults import eventually
from tests.support.projector import publish_catalog, running_projector

DOC = ROOT / "docs" / "external-reporters.md"
EXAMPLE_CATALOG = ROOT / "ops" / "examples" / "resources.yaml"
UNDECLARED = ("active catalog: reporter 'nosuch' is not declared (reporters: blinker, "
              "datasets, flexlm, scratch); nothing published")


async def _last_seq(nc: Client) -> int:
    return int((await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq)


def _example() -> str:
    """The Python block after the `example: external-reporter` marker of the docs file."""
    text = DOC.read_text()
    m = re.search(r"<!-- example: external-reporter -->\n```python\n(.*?)```", text, re.DOTALL)
    assert m, f"no external-reporter example in {DOC}"
    return m.group(1)


async def test_report_refuses_an_undeclared_reporter(nc: Client, nats_url: str) -> None:
    """`crr report --reporter nosuch` (waiting or not): one line naming the declared
    reporters, exit 1, and nothing stored — so no `nosuch: rejecting` row."""
    await publish_catalog(nc)
    async with running_projector(nc) as projector:
        await projector.wait_until(await _last_seq(nc), 10)
        before = await _last_seq(nc)
        for extra in ([], ["--no-wait"]):
            ran = await crr("report", "--server", nats_url, "--reporter", "nosuch", "--host",
                            "n1", "x=1", *extra)
            assert ran.code == 1, ran
            assert ran.err_lines == [f"crr report: error: {UNDECLARED}"], ran.err
            assert ran.out == ""
        assert await _last_seq(nc) == before
        ok = await crr("report", "--server", nats_url, "--reporter", "scratch", "--host", "n1",
                       "scratch_free=3")
        assert ok.code == 0, ok
        assert set((await read_snapshot(nc)).hosts["n1"].reporters) == {"scratch"}


async def test_sdk_refuses_an_undeclared_reporter(nc: Client, nats_url: str) -> None:
    """`ExternalReporter.connect(reporter="nosuch")` raises UnknownReporterError once a
    catalog is active, before publishing anything; before any catalog it connects."""
    async with running_projector(nc):
        async with ExternalReporter.connect(reporter="nosuch", url=nats_url, attempts=1) as rep:
            assert rep.catalog is None  # nothing to check against yet
        await publish_catalog(nc)
        await eventually(lambda: _catalog_active(nc), 10, "the catalog active")
        before = await _last_seq(nc)
        with pytest.raises(UnknownReporterError, match=re.escape(UNDECLARED)):
            async with ExternalReporter.connect(reporter="nosuch", url=nats_url, attempts=1):
                pytest.fail("connected for an undeclared reporter")
        assert await _last_seq(nc) == before


async def _catalog_active(nc: Client) -> bool:
    return (await read_snapshot(nc)).catalog is not None


async def test_submit_returns_or_raises_the_outcome(nc: Client, nats_url: str) -> None:
    """`submit`: every value applied → the outcome; a value of a resource the catalog does
    not have → ReportRejectedError naming it and what was applied anyway; no catalog yet
    → `pending`; values queued with `report()` before it are not overtaken."""
    async with running_projector(nc), ExternalReporter.connect(
            reporter="flexlm", url=nats_url, attempts=1) as rep:
        with pytest.raises(ReportRejectedError) as pending:
            await rep.submit({"matlab_free": 1})
        assert pending.value.state == "pending"
        await publish_catalog(nc)
        await eventually(lambda: _catalog_active(nc), 10, "the catalog active")
        rep.report({"matlab_free": 5})
        verdict = await rep.submit({"matlab_free": 7})
        assert isinstance(verdict, ReportOutcome)
        assert (verdict.state, verdict.applied, verdict.lines()) == (
            "applied", ["matlab_free"], ["applied: matlab_free"])
        cluster = (await read_snapshot(nc)).cluster
        assert cluster is not None
        assert cluster.values["matlab_free"].value == 7
        with pytest.raises(ReportRejectedError) as bad:
            await rep.submit({"matlab_free": 8, "nope": 1})
        assert bad.value.state == "rejected"
        assert bad.value.applied == ["matlab_free"]
        assert bad.value.rejected == {"nope": "nope: not a resource in the catalog"}
        assert str(bad.value) == "applied: matlab_free; rejected: nope: not a resource in " \
                                 "the catalog"


async def test_the_documented_example_runs_under_the_example_catalog(tmp_path: Path) -> None:
    """The example of docs/external-reporters.md, run as written (in a child Python, with
    the flexlm credentials `crr nats-config` wrote, as `reporter.flexlm.nk` in its working
    directory) against an authorizing server with the example catalog and a projector:
    each `print` shows what its comment says."""
    catalog = load_catalog(EXAMPLE_CATALOG)
    demo = await secure_demo_setup(tmp_path / "store", catalog=catalog)
    try:
        async with connect(demo.url, creds=demo.creds("admin"), name="t-admin") as nc:
            await provision(nc)
            await nc.jetstream().publish(CATALOG, encode(catalog))
        async with connect(demo.url, creds=demo.creds("projector"), name="t-proj") as pnc:
            projector = Projector(pnc, status_interval=0.5)
            stop = asyncio.Event()
            task = asyncio.create_task(projector.run(stop))
            try:
                await asyncio.wait_for(projector.ready.wait(), 20)
                await eventually(lambda: projector.state.catalog is not None, 10, "catalog")
                shutil.copy(demo.bundle.for_reporter("flexlm"), tmp_path / "reporter.flexlm.nk")
                block = _example()
                script = ("import asyncio, sys\n\nasync def main(URL: str) -> None:\n"
                          + textwrap.indent(block, "    ") + "\nasyncio.run(main(sys.argv[1]))\n")
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", script, demo.url, cwd=tmp_path, env=cli_env(),
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
                out, err = await asyncio.wait_for(proc.communicate(), 45)
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)
    finally:
        await asyncio.to_thread(demo.stop)
    assert proc.returncode == 0, err.decode()
    expected = [line.split("# ", 1)[1] for line in block.splitlines() if "print(" in line]
    assert len(expected) == 2
    assert out.decode().splitlines() == expected, err.decode()


FLEXLM = """#!/bin/sh
printf '{"values": {"matlab_free": 3, "simulink_free": -1}}\\n'
"""


def _flexlm_catalog(tmp_path: Path) -> Path:
    script = tmp_path / "flexlm.sh"
    script.write_text(FLEXLM)
    script.chmod(0o755)
    catalog = tmp_path / "resources.yaml"
    catalog.write_text(textwrap.dedent(f"""\
        version: 1
        resources:
          matlab_free:   {{kind: numeric, scope: cluster, reporter: flexlm, min: 0}}
          simulink_free: {{kind: numeric, scope: cluster, reporter: flexlm, min: 0}}
        reporters:
          flexlm: {{type: external, command: [{script}], interval: 0.5, timeout: 5}}
        """))
    return catalog


async def _external_run(nats_url: str, catalog: Path, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", "external", "run", "--reporter", "flexlm",
        "--catalog", str(catalog), "--server", nats_url, *extra, env=cli_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def test_external_run_prints_a_line_per_cycle(nc: Client, nats_url: str,
                                                    tmp_path: Path) -> None:
    """`crr external run`: a line per published report with the verdict (what was applied,
    what rejected and why), a line per health change; `--quiet` prints nothing."""
    catalog_file = _flexlm_catalog(tmp_path)
    await nc.jetstream().publish(CATALOG, encode(load_catalog(catalog_file)))
    async with running_projector(nc):
        proc = await _external_run(nats_url, catalog_file)
        assert proc.stdout is not None
        lines: list[str] = []
        try:
            while sum("published" in line for line in lines) < 2:
                raw = await asyncio.wait_for(proc.stdout.readline(), 20)
                assert raw, "crr external run ended early"
                lines.append(raw.decode().rstrip("\n"))
        finally:
            proc.send_signal(signal.SIGTERM)
            rest, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0, err.decode()
        lines += rest.decode().splitlines()
        published = [line for line in lines if "published" in line]
        for line in published:
            assert re.fullmatch(
                r"flexlm: published matlab_free=3 simulink_free=-1 \(seq \d+\): applied: "
                r"matlab_free; rejected: simulink_free: -1 is below the minimum 0", line), line
        assert "flexlm: health ok" in lines
        assert lines[-1] == "flexlm: health stopped", lines

        quiet = await _external_run(nats_url, catalog_file, "--quiet")
        before = await _last_seq(nc)
        await eventually(lambda: _published_after(nc, before), 20, "a report of the quiet run")
        quiet.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(quiet.communicate(), 20)
        assert quiet.returncode == 0, err.decode()
        assert out == b""


async def _published_after(nc: Client, seq: int) -> bool:
    return await _last_seq(nc) > seq
