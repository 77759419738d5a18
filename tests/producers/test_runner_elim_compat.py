"""LSF elims run unchanged: long-running by default, LSF's environment, buffering, bad lines.

Real agent, real nats-server, real elims in bash, perl and python written as
sites write them (`while true; do echo "N name value"; sleep N; done`);
events observed on the broker, waits on events only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crr.cli import main
from crr.producers.publisher import ReporterPublisher
from crr.producers.runner import BUFFERING_HINT, ReporterRunner, RunnerConfig
from crr.producers.spawn import script_environment
from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import decode
from crr.schemas.events import Report
from tests.support.agent import (
    SAFE_ENV,
    MemorySink,
    Received,
    fast,
    good_catalog,
    read_pids,
    running_agent,
    write_script,
)
from tests.support.faults import eventually

PERL = shutil.which("perl")
needs_perl = pytest.mark.skipif(PERL is None, reason="perl is not installed")


def _catalog(tmp_path: Path, command: str, *, resources: tuple[str, ...] = ("el_a", "el_b"),
             **kw: object) -> Catalog:
    """The `good` reporter plus an elim reporter `elim` owning numeric `resources`."""
    base = good_catalog(tmp_path)
    owned = {name: ResourceSpec(kind="numeric", reporter="elim") for name in resources}
    settings: dict[str, object] = {"format": "elim", "mode": "stream", "cwd": str(tmp_path),
                                   "interval": 0.4, "timeout": 0.5}
    settings.update(kw)
    spec = fast([command], **settings)
    return msgspec.structs.replace(base, resources={**base.resources, **owned},
                                   reporters={**base.reporters, "elim": spec})


def _values(reports: Sequence[Received]) -> list[dict[str, Any]]:
    """The values of each report, in order."""
    out = []
    for r in reports:
        assert isinstance(r.event, Report)
        out.append(dict(r.event.values))
    return out


# -- the default mode ---------------------------------------------------------------------

CATALOG_YAML = """
version: 1
resources:
  a: {kind: numeric, reporter: looping}
  b: {kind: numeric, reporter: oneshot}
  c: {kind: numeric, reporter: json}
reporters:
  looping: {command: [elim.a], format: elim}
  oneshot: {command: [elim.b], format: elim, mode: periodic}
  json:    {command: [c.py]}
"""


def test_elim_without_mode_is_long_running_and_explicit_mode_wins() -> None:
    """`format: elim` alone means `stream` (LSF's way); `mode: periodic` stays periodic;
    a JSON reporter without mode stays periodic; the encoded catalog spells the mode out."""
    catalog = load_catalog_text(CATALOG_YAML)
    assert catalog.reporters["looping"].mode == "stream"
    assert catalog.reporters["oneshot"].mode == "periodic"
    assert catalog.reporters["json"].mode == "periodic"
    assert not catalog.reporters["looping"].tty
    encoded = msgspec.json.encode(catalog)
    assert b'"mode":"stream"' in encoded


def test_catalog_apply_notes_the_elim_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`crr catalog apply` says which elims get the long-running default (they were periodic
    before it changed); an elim with an explicit mode gets no note."""
    path = tmp_path / "resources.yaml"
    path.write_text(CATALOG_YAML)
    assert main(["catalog", "apply", str(path), "--dry-run"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["crr catalog: note: reporters.looping: format: elim without mode runs "
                   "long-running (mode: stream), as LSF runs elims; say `mode: periodic` for a "
                   "one-shot elim"]


# -- long-running elims -------------------------------------------------------------------

BASH_ZERO_FIRST = """#!/bin/bash
# No value yet on the first loop: LSF's elims often start with "0".
echo $$ >> pids
echo "0 "
sleep 0.2
n=0
while true; do
    n=$((n + 1))
    if [ $n -eq 1 ]; then
        echo "2 el_a $n el_b 100"
    else
        echo "1 el_a $n"
    fi
    sleep 0.1
done
"""


async def test_bash_elim_first_line_zero_then_values_every_line_a_report(
    nats_url: str, tmp_path: Path
) -> None:
    """A looping bash elim whose first line is `0 `: the later lines are reported as they
    come, from one process; a value the later lines do not repeat (`el_b`) is not re-sent
    with them (it keeps its own expiry)."""
    write_script(tmp_path, "elim.zero", BASH_ZERO_FIRST)
    catalog = _catalog(tmp_path, "elim.zero", mode="stream")
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait("four reports after the first values", lambda: sum(
            1 for r in rig.recorder.reports("elim")
            if isinstance(r.event, Report) and r.event.values) >= 4)
        assert rig.recorder.states("elim") == ["ok"]
    values = [v for v in _values(rig.recorder.reports("elim"))
              if v]
    assert values[0] == {"el_a": 1.0, "el_b": 100.0}
    later = [v["el_a"] for v in values[1:]]
    assert all(set(v) == {"el_a"} for v in values[1:])
    assert later == sorted(later)
    assert len(set(later)) == len(later)
    assert len(read_pids(tmp_path / "pids")) == 1


BURST = """#!/bin/sh
# Two lines naming different resources, written at once, every loop.
while :; do
    printf '1 el_a 1\\n1 el_b 2\\n'
    sleep 0.2
done
"""


async def test_elim_lines_arriving_together_are_one_report(
    nats_url: str, tmp_path: Path
) -> None:
    """Lines that arrive in one burst become one report, merged (as LSF's MELIM merges): two
    one-by-one reports could lose the first to the newer pending one in the outbox."""
    write_script(tmp_path, "elim.burst", BURST)
    catalog = _catalog(tmp_path, "elim.burst")
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("elim", 2)
    assert _values(rig.recorder.reports("elim"))[:2] == [
        {"el_a": 1.0, "el_b": 2.0}] * 2


PERL_LOOP = """#!{perl}
$| = 1;
open(my $fh, '>>', 'pids'); print $fh "$$\\n"; close($fh);
my $n = 0;
while (1) {{
    $n++;
    print "2 el_a $n el_b 7\\n";
    select(undef, undef, undef, 0.1);
}}
"""

PYTHON_LOOP = """#!{python}
# No -u, no flush: PYTHONUNBUFFERED=1 from the agent makes it line-buffered anyway.
import os, time
with open("pids", "a") as f:
    f.write(f"{{os.getpid()}}\\n")
n = 0
while True:
    n += 1
    print(f"1 el_a {{n}}")
    time.sleep(0.1)
"""


@needs_perl
async def test_perl_elim_loop_reports_each_line(nats_url: str, tmp_path: Path) -> None:
    """A perl elim with `$| = 1`, from the default (long-running) mode: a report per line."""
    write_script(tmp_path, "elim.perl", PERL_LOOP.format(perl=PERL))
    catalog = load_catalog_text(textwrap.dedent(f"""
        version: 1
        resources:
          el_a: {{kind: numeric, reporter: elim}}
          el_b: {{kind: numeric, reporter: elim}}
        reporters:
          elim: {{command: [elim.perl], format: elim, interval: 0.4, cwd: "{tmp_path}"}}
        """))
    assert catalog.reporters["elim"].mode == "stream"
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("elim", 3)
    values = _values(rig.recorder.reports("elim"))
    assert values[:3] == [{"el_a": float(n), "el_b": 7.0} for n in (1, 2, 3)]
    assert len(read_pids(tmp_path / "pids")) == 1


async def test_python_elim_without_flush_works_through_pythonunbuffered(
    nats_url: str, tmp_path: Path
) -> None:
    """A python elim that never flushes still reports every line: PYTHONUNBUFFERED=1 is set."""
    write_script(tmp_path, "elim.py", PYTHON_LOOP.format(python=sys.executable))
    catalog = _catalog(tmp_path, "elim.py")
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("elim", 3)
        assert "timeout" not in rig.recorder.states("elim")
    values = _values(rig.recorder.reports("elim"))
    assert values[:3] == [{"el_a": 1.0}, {"el_a": 2.0}, {"el_a": 3.0}]


ONESHOT = """#!/bin/sh
echo $$ >> pids
echo "1 el_a 5"
"""


async def test_one_shot_elim_in_the_default_mode_is_restarted_each_interval(
    nats_url: str, tmp_path: Path
) -> None:
    """An elim that prints and exits 0, left in the default mode, is restarted (as LSF does)
    once per interval, without counting a failure: its health stays `ok`."""
    write_script(tmp_path, "elim.once", ONESHOT)
    catalog = _catalog(tmp_path, "elim.once", interval=0.2)
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("elim", 3)
        assert rig.recorder.states("elim") == ["ok"]
    assert len(read_pids(tmp_path / "pids")) >= 3
    assert rig.recorder.max_gap("elim") < 2.0


async def _periodic_values(nats_url: str, tmp_path: Path, body: str,
                           **kw: Any) -> list[dict[str, Any]]:
    """Run `body` as periodic reporter `elim` until it reported 3 times, always `ok`."""
    write_script(tmp_path, "script", body)
    catalog = _catalog(tmp_path, "script", mode="periodic", interval=0.2, **kw)
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("elim", 3)
        assert rig.recorder.states("elim") == ["ok"]
    return _values(rig.recorder.reports("elim"))


async def test_one_shot_elim_as_explicit_periodic(nats_url: str, tmp_path: Path) -> None:
    """`mode: periodic` with `format: elim`: one run per interval, each exit a report."""
    values = await _periodic_values(nats_url, tmp_path, ONESHOT)
    assert all(v == {"el_a": 5.0} for v in values)


# -- LSF's environment --------------------------------------------------------------------

# LSF's documented checking header (with its test written correctly).
ABORT_HEADER = """#!/bin/sh
echo $$ >> pids
my_resource="{resource}"
if [ -n "$LSF_RESOURCES" ]; then
    res_ok=`echo " $LSF_RESOURCES " | grep " $my_resource "`
    if [ -z "$res_ok" ]; then
        exit $ELIM_ABORT_VALUE
    fi
fi
while true; do
    echo "1 $my_resource 1"
    sleep 0.1
done
"""


async def test_elim_abort_value_pattern_ends_not_applicable(
    nats_url: str, tmp_path: Path
) -> None:
    """The documented header: a resource missing from LSF_RESOURCES → `exit $ELIM_ABORT_VALUE`
    → `not_applicable`, never restarted; a listed one → the elim runs and reports."""
    write_script(tmp_path, "elim.absent", ABORT_HEADER.format(resource="gpfs_bw"))
    write_script(tmp_path, "elim.present", ABORT_HEADER.format(resource="el_b"))
    catalog = _catalog(tmp_path, "elim.absent", not_applicable_exit=42)
    present = fast(["elim.present"], format="elim", mode="stream", cwd=str(tmp_path),
                   interval=0.4)
    catalog = msgspec.structs.replace(
        catalog, reporters={**catalog.reporters, "present": present},
        resources={**catalog.resources,
                   "el_b": ResourceSpec(kind="numeric", reporter="present")})
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        health = await rig.recorder.wait_state("elim", "not_applicable")
        await rig.recorder.wait_reports("present", 2)
        await rig.recorder.wait_more_reports("good", 2)
        assert rig.recorder.states("elim") == ["not_applicable"]
    assert health.exit_code == 42
    assert len(read_pids(tmp_path / "pids")) == 2  # one run of each
    assert _values(rig.recorder.reports("present"))[0] == {
        "el_b": 1.0}


ENV_ELIM = """#!/bin/sh
env > env.out
printf '1 el_a 1\\n'
exec sleep 30
"""


async def test_elim_sees_lsf_environment(nats_url: str, tmp_path: Path) -> None:
    """An elim gets LSF_RESOURCES (space-separated), ELIM_ABORT_VALUE, LSF_MASTER=N on a
    host, PYTHONUNBUFFERED=1, and the agent's LSF_ENVDIR/LSF_SERVERDIR when it has them."""
    write_script(tmp_path, "elim.env", ENV_ELIM)
    catalog = _catalog(tmp_path, "elim.env")
    environ = {**SAFE_ENV, "LSF_ENVDIR": "/etc/lsf", "LSF_SERVERDIR": "/opt/lsf/etc",
               "NATS_CREDS": "/etc/crr/agent.creds"}
    async with running_agent(nats_url, catalog, tmp_path, environ=environ) as rig:
        await rig.recorder.wait_reports("elim", 1)
    seen = dict(line.split("=", 1) for line in (tmp_path / "env.out").read_text().splitlines()
                if "=" in line)
    assert seen["LSF_RESOURCES"] == "el_a el_b"
    assert seen["CRR_RESOURCES"] == "el_a,el_b"
    assert seen["ELIM_ABORT_VALUE"] == "97"
    assert seen["LSF_MASTER"] == "N"
    assert seen["PYTHONUNBUFFERED"] == "1"
    assert (seen["LSF_ENVDIR"], seen["LSF_SERVERDIR"]) == ("/etc/lsf", "/opt/lsf/etc")
    assert "NATS_CREDS" not in seen


# -- buffering ----------------------------------------------------------------------------

PERL_BUFFERED = """#!{perl}
# No $| = 1: through a pipe, perl block-buffers STDOUT (8 KiB) and this never shows.
my $n = 0;
while (1) {{
    $n++;
    print "1 el_a $n\\n";
    select(undef, undef, undef, 0.1);
}}
"""


@needs_perl
async def test_buffered_perl_elim_gets_the_buffering_hint(nats_url: str, tmp_path: Path) -> None:
    """A perl elim without `$|`: nothing arrives; Health `timeout` says it is probably buffered
    and how to fix it; the elim is left running (no restart)."""
    write_script(tmp_path, "elim.buffered", PERL_BUFFERED.format(perl=PERL))
    catalog = _catalog(tmp_path, "elim.buffered")
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        health = await rig.recorder.wait_state("elim", "timeout")
        await rig.recorder.wait_more_reports("good", 2)
        assert rig.recorder.reports("elim") == []
        assert rig.recorder.states("elim") == ["timeout"]
    assert health.detail is not None
    assert BUFFERING_HINT in health.detail
    assert "$| = 1" in health.detail
    assert "stdbuf -oL" in health.detail
    assert "tty: true" in health.detail


@needs_perl
async def test_buffered_perl_elim_works_unchanged_on_a_tty(nats_url: str, tmp_path: Path) -> None:
    """The same unmodified perl elim with `tty: true`: perl line-buffers a terminal, so every
    line arrives, without a carriage return, and the health is `ok`."""
    write_script(tmp_path, "elim.buffered", PERL_BUFFERED.format(perl=PERL))
    catalog = _catalog(tmp_path, "elim.buffered", tty=True)
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("elim", 3)
        assert rig.recorder.states("elim") == ["ok"]
    values = _values(rig.recorder.reports("elim"))
    assert values[:3] == [{"el_a": 1.0}, {"el_a": 2.0}, {"el_a": 3.0}]


TTY_JSON_ONESHOT = """#!/bin/sh
if [ -t 1 ]; then on=1; else on=0; fi
printf '{"values": {"el_a": %s}}\\n' "$on"
"""


async def test_tty_output_of_an_exiting_script_is_read_to_the_end(
    nats_url: str, tmp_path: Path
) -> None:
    """A periodic JSON script on a tty: stdout is a terminal, and its output is read whole
    although the master end reports EIO once the script has exited."""
    values = await _periodic_values(nats_url, tmp_path, TTY_JSON_ONESHOT, format="json",
                                    tty=True)
    assert all(v == {"el_a": 1} for v in values)


def _pty_fds() -> list[str]:
    """This process's descriptors on a pseudo-terminal (master or slave)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target == "/dev/ptmx" or target.startswith("/dev/pts/"):
                found.append(target)
    return found


async def test_tty_runs_leak_no_descriptor(nats_url: str, tmp_path: Path) -> None:
    """Many short runs on a tty: each run's master is closed (the slave never stays open in
    the agent), so no pseudo-terminal descriptor is left once the agent stopped."""
    before = _pty_fds()
    write_script(tmp_path, "tty.sh", TTY_JSON_ONESHOT)
    catalog = _catalog(tmp_path, "tty.sh", format="json", mode="periodic", tty=True,
                       interval=0.05)
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("elim", 10)
        assert len(_pty_fds()) <= len(before) + 1  # at most the run in progress
    assert _pty_fds() == before


# -- bad input ----------------------------------------------------------------------------

MALFORMED_BETWEEN = """#!/bin/bash
echo "1 el_a 1"
sleep 0.1
echo "3 el_a oops"
sleep 0.1
echo "1 el_b 2"
exec sleep 30
"""


async def test_malformed_line_between_good_ones(nats_url: str, tmp_path: Path) -> None:
    """A malformed line is `bad_output` in Health (named in the detail); the good lines on
    either side of it are reported, and the next good line makes the health `ok` again."""
    write_script(tmp_path, "elim.bad", MALFORMED_BETWEEN)
    catalog = _catalog(tmp_path, "elim.bad")
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait("health ok after bad_output",
                                lambda: rig.recorder.states("elim")[-2:] == ["bad_output", "ok"])
    reported: dict[str, object] = {}
    for v in _values(rig.recorder.reports("elim")):
        reported.update(v)
    assert reported == {"el_a": 1.0, "el_b": 2.0}
    bad = next(h for h in rig.recorder.health("elim") if h.state == "bad_output")
    assert bad.detail is not None
    assert "announces 3 pair(s) but has 2 token(s)" in bad.detail


def test_reporter_spec_tty_defaults_off() -> None:
    """`tty` is off unless asked for."""
    assert not ReporterSpec(command=["x"]).tty


def test_script_environment_central_and_overrides() -> None:
    """`crr external run` (an external reporter) is LSF's master host: LSF_MASTER=Y; LSF paths
    reach only elims; an allowlisted PYTHONUNBUFFERED overrides the default, protocol names
    cannot be overridden."""
    source = {"PATH": "/bin", "LSF_ENVDIR": "/etc/lsf", "PYTHONUNBUFFERED": "",
              "CRR_HOST": "spoofed"}
    central = script_environment(host="h", reporter="r", interval=5, resources=["x", "y"],
                                 allow=["PYTHONUNBUFFERED", "CRR_HOST"], source=source,
                                 not_applicable_exit=3, central=True)
    assert central["LSF_MASTER"] == "Y"
    assert central["ELIM_ABORT_VALUE"] == "3"
    assert central["LSF_RESOURCES"] == "x y"
    assert central["PYTHONUNBUFFERED"] == ""
    assert central["CRR_HOST"] == "h"
    assert "LSF_ENVDIR" not in central
    elim = script_environment(host="h", reporter="r", interval=5, resources=[], allow=[],
                              source=source, elim=True)
    assert elim["LSF_ENVDIR"] == "/etc/lsf"
    assert elim["LSF_MASTER"] == "N"
    assert elim["LSF_RESOURCES"] == ""


async def test_a_centrally_run_elim_is_on_lsfs_master(tmp_path: Path) -> None:
    """An external reporter's command (what `crr external run` runs) sees LSF_MASTER=Y, so an
    elim's `[ "$LSF_MASTER" = Y ]` check for cluster-wide resources holds there."""
    write_script(tmp_path, "elim.master", """#!/bin/sh
if [ "$LSF_MASTER" = Y ]; then echo "1 el_a 1"; else echo "1 el_a 0"; fi
exec sleep 30
""")
    spec = fast(["elim.master"], type="external", format="elim", mode="stream",
                cwd=str(tmp_path))
    catalog = Catalog(resources={"el_a": ResourceSpec(kind="numeric", reporter="central",
                                                      scope="cluster")},
                      reporters={"central": spec})
    sink = MemorySink()
    runner = ReporterRunner(RunnerConfig.from_catalog(catalog, "central"), host="admin1",
                            publisher=ReporterPublisher(sink, reporter="central", host=None,
                                                        boot="b"),
                            reporters_dir=tmp_path, agent_env=SAFE_ENV, kill_grace=0.3)
    runner.start()
    try:
        reports = await eventually(
            lambda: [p for s, p, _, _ in sink.puts if ".report." in s], 10.0, "a report")
    finally:
        await runner.stop()
    assert decode(reports[0], Report).values == {"el_a": 1.0}
