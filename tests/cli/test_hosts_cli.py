"""`crr hosts -R/-l/-w`: LSF-style listings against a real server and projector."""

from __future__ import annotations

import asyncio
import json

import pytest

from crr.bus.connection import connect
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.cli import main
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.events import Health
from crr.schemas.subjects import event_subject
from tests.support.projector import publish_catalog, publish_report, running_projector

CATALOG = load_catalog_text("""
version: 1
resources:
  scratch_free: {kind: numeric, scope: host, reporter: scratch, interval: 1h}
  ostype:       {kind: string, scope: host, reporter: facts, interval: 1h}
  model:        {kind: string, scope: host, reporter: facts, interval: 1h}
  note:         {kind: string, scope: host, reporter: facts, interval: 1h}
  matlab_free:  {kind: numeric, scope: cluster, reporter: flexlm, interval: 1h}
reporters:
  scratch: {type: external, interval: 1h}
  facts:   {type: external, interval: 1h}
  flexlm:  {type: external, interval: 1h}
""")
LONG_NOTE = "maintenance window announced for the whole rack next tuesday"


async def _populate(url: str) -> None:
    """n1: healthy RHEL4.6 Xeon; n2: a failing reporter; n3: scratch only, `facts` said null."""
    async with connect(url) as nc:
        await provision(nc)
        async with running_projector(nc) as p:
            await publish_catalog(nc, CATALOG)
            await publish_report(nc, "scratch", "n1", {"scratch_free": 812.0})
            await publish_report(nc, "facts", "n1", {"ostype": "RHEL4.6",
                                                     "model": "XeonE5-2650", "note": LONG_NOTE})
            await publish_report(nc, "scratch", "n2", {"scratch_free": 12.5})
            await publish_report(nc, "facts", "n2", {"ostype": "RHEL7.9", "model": "EPYC-7763"})
            health = Health(reporter="scratch", host="n2", boot="b1",
                            at="2026-12-02T14:00:01.000Z", state="failed", exit_code=3,
                            detail="exit 3: df: /scratch: No such file or directory")
            await nc.jetstream().publish(event_subject("health", "scratch", "n2"),
                                         encode(health))
            await publish_report(nc, "scratch", "n3", {"scratch_free": 300.0})
            await publish_report(nc, "facts", "n3", {"ostype": None})
            seq = await publish_report(nc, "flexlm", None, {"matlab_free": 4})
            await p.wait_until(seq)


@pytest.fixture
def url(nats_server: NatsServer) -> str:
    """A server whose CRR_SNAPSHOT holds the three hosts of `_populate`."""
    asyncio.run(_populate(nats_server.url))
    return nats_server.url


def _rows(out: str) -> dict[str, dict[str, str]]:
    """The host rows of a `crr hosts` table: host -> column name -> cell (by header offsets)."""
    lines = out.splitlines()
    header = lines[0]
    names = header.split()
    starts = [header.index(f" {n} ") + 1 if i else 0 for i, n in enumerate(names[:-1])]
    starts.append(header.rindex(names[-1]))
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return {line.split()[0]: {n: line[a:b].strip() for n, (a, b) in zip(names, bounds,
                                                                        strict=True)}
            for line in lines[1:] if line and line.split()[0] in ("n1", "n2", "n3")}


def test_table_status_column_and_whole_numbers(url: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """STATUS follows HOST; whole numbers print without `.0`; long values are cut."""
    assert main(["hosts", "--server", url]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["HOST", "STATUS"]
    rows = _rows(out)
    assert {h: r["STATUS"] for h, r in rows.items()} == {
        "n1": "ok", "n2": "failing", "n3": "unknown"}
    assert [rows[h]["scratch_free"] for h in ("n1", "n2", "n3")] == ["812", "12.5", "300"]
    assert rows["n1"]["model"] == "XeonE5-2650"
    assert rows["n3"]["ostype"] == "?"
    assert rows["n2"]["REPORTERS"] == "scratch:failed"
    assert "cluster: matlab_free=4" in out
    assert LONG_NOTE not in out
    assert LONG_NOTE[:21] + "..." in out
    assert "STATUS: ok (every value fresh" in out


def test_wide_does_not_cut(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`-w` shows long values whole."""
    assert main(["hosts", "-w", "--server", url]) == 0
    assert LONG_NOTE in capsys.readouterr().out


def test_requirement_filters_like_lsload(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`-R` takes a whole requirement string (bare LSF words too) and filters table and JSON."""
    assert main(["hosts", "-R", "select[ostype==RHEL4.6 || scratch_free > 100] rusage[mem=1]",
                 "--server", url]) == 0
    captured = capsys.readouterr()
    assert set(_rows(captured.out)) == {"n1", "n3"}
    assert "crr hosts: note: crr evaluates the select section only; rusage[mem=1]" \
        in captured.err
    assert main(["hosts", "-R", "model == XeonE5-2650", "--json", "--server", url]) == 0
    assert [h["host"] for h in json.loads(capsys.readouterr().out)] == ["n1"]
    assert main(["hosts", "n1", "n2", "-R", "scratch_free < 100", "--json",
                 "--server", url]) == 0
    assert [h["host"] for h in json.loads(capsys.readouterr().out)] == ["n2"]
    assert main(["hosts", "-R", "scratch_free > 10000", "--server", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "no host matches the requirement"
    assert lines[1].startswith("projector: ")  # live, or silent: the fixture's projector


def test_requirement_errors_have_a_caret(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad -R string fails like `crr select`: exit 1, message, caret under the section."""
    expr = "scratch_free > 1 rusge[mem=1]"
    assert main(["hosts", "-R", expr, "--server", url]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert "unknown section 'rusge'" in lines[0]
    assert lines[2].index("^") - 2 == expr.index("rusge")


def test_long_view(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`-l HOST`: status, every value with state, age, reporter, expiry; reporters' health."""
    assert main(["hosts", "-l", "n2", "--server", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("HOST n2   STATUS failing")
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines["scratch_free"][1:3] == ["12.5", "fresh"]
    assert lines["scratch_free"][4] == "scratch"
    assert lines["scratch_free"][-2] == "in"  # expires in ~1h
    assert lines["ostype"][1:3] == ["RHEL7.9", "fresh"]
    assert lines["note"][1:3] == ["-", "never_reported"]
    assert lines["REPORTER"][:2] == ["REPORTER", "STATE"]
    assert lines["scratch"][1:3] == ["failed", "(failing)"]
    assert "exit 3: df: /scratch: No such file or directory" in out
    assert main(["hosts", "-l", "n3", "--server", url]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
             if line.strip()}
    assert lines["ostype"][1:3] == ["?", "unknown"]
    assert lines["scratch_free"][1] == "300"


def test_long_view_of_every_host_cut_and_wide(url: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`-l` without HOST shows every host; `-w` keeps long values whole there too."""
    assert main(["hosts", "-l", "--server", url]) == 0
    out = capsys.readouterr().out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("HOST ")] == [
        "n1", "n2", "n3"]
    assert LONG_NOTE not in out
    assert main(["hosts", "-lw", "n1", "--server", url]) == 0
    assert LONG_NOTE in capsys.readouterr().out
