"""`crr select`, `crr explain` and `crr sim scheduler` end to end (real server and projector)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from crr.bus.connection import connect
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.cli import main
from tests.support.projector import (
    publish_catalog,
    publish_report,
    running_projector,
)


async def _populate(url: str) -> None:
    """Catalog, 6 hosts (scratch i*10, datasets on even hosts), a cluster value; projected."""
    async with connect(url) as nc:
        await provision(nc)
        async with running_projector(nc) as p:
            seq = await publish_catalog(nc)
            for i in range(6):
                seq = await publish_report(nc, "scratch", f"n{i}", {"scratch_free": i * 10.0})
                if i % 2 == 0:
                    seq = await publish_report(nc, "datasets", f"n{i}",
                                               {"datasets": ["c4", f"d{i}"]})
            seq = await publish_report(nc, "flexlm", None, {"matlab_free": 4})
            await p.wait_until(seq)


@pytest.fixture
def url(nats_server: NatsServer) -> str:
    """A server whose CRR_SNAPSHOT holds the hosts `_populate` writes."""
    asyncio.run(_populate(nats_server.url))
    return nats_server.url


def test_select_json_sorted(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr select EXPR --json` prints the sorted matching host names; wrapper optional."""
    assert main(["select", 'scratch_free >= 20 && datasets has "c4"', "--json",
                 "--server", url]) == 0
    assert json.loads(capsys.readouterr().out) == ["n2", "n4"]
    assert main(["select", "select[scratch_free < 25 && matlab_free > 3]", "--json",
                 "--server", url]) == 0
    assert json.loads(capsys.readouterr().out) == ["n0", "n1", "n2"]
    assert main(["select", "scratch_free > 1000", "--json", "--server", url]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["select", "scratch_free > 35", "--server", url]) == 0
    assert capsys.readouterr().out.split() == ["n4", "n5"]


def test_select_bad_expression_caret(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A kind mismatch is exit 1 with the message, the expression and a caret under the token."""
    expr = 'scratch_free > 3 && datasets > 3'
    assert main(["select", expr, "--json", "--server", url]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines[0].startswith("crr select: error: ")
    assert lines[1] == f"  {expr}"
    caret = lines[2].index("^") - 2
    assert expr[caret:].startswith(("datasets", ">"))
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(("expr", "name", "message"), [
    ("scratch_free > 3 || bogus_res == 1", "bogus_res", "unknown resource 'bogus_res'"),
    ("select[scratch_free > 1] rusge[mem=1]", "rusge", "unknown section 'rusge'"),
])
def test_select_unknown_name_caret(url: str, capsys: pytest.CaptureFixture[str], expr: str,
                                   name: str, message: str) -> None:
    """An unknown resource or requirement section is exit 1 naming it, the caret under it."""
    assert main(["select", expr, "--server", url]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert message in lines[0]
    assert lines[2].index("^") - 2 == expr.index(name)


def test_select_whole_requirement_string_notes_other_sections(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bsub -R string: the select section decides, stderr notes the sections not evaluated."""
    expr = 'select [scratch_free >= 20 && datasets has "c4"] rusage[mem=100] span[hosts=1]'
    assert main(["select", expr, "--json", "--server", url]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == ["n2", "n4"]
    assert captured.err.startswith("crr select: note: crr evaluates the select section only; "
                                   "rusage[mem=100] span[hosts=1] are for the scheduler")
    assert main(["explain", "scratch_free > 15 order[ut]", "--host", "n4", "--json",
                 "--server", url]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["selected"] is True
    assert "crr explain: note:" in captured.err
    assert "order[ut]" in captured.err
    assert main(["select", "scratch_free > 15", "--server", url]) == 0
    assert capsys.readouterr().err == ""


def test_explain_text_and_json(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr explain` names each resource's value and freshness and gives the verdict."""
    expr = 'scratch_free > 15 && datasets has "c4"'
    assert main(["explain", expr, "--host", "n3", "--server", url]) == 0
    text = capsys.readouterr().out
    assert "not selected" in text
    assert "never reported" in text  # n3 has no datasets
    assert main(["explain", expr, "--host", "n4", "--json", "--server", url]) == 0
    why = json.loads(capsys.readouterr().out)
    assert why["selected"] is True
    assert why["truth"] == "true"
    assert {r["name"]: r["freshness"] for r in why["resources"]} == {
        "datasets": "fresh", "scratch_free": "fresh"}


def test_explain_bad_expression(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr explain` with a dangling operator fails like `crr select`: caret, exit 1."""
    assert main(["explain", "scratch_free >", "--host", "n1", "--server", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("crr explain: error: ")
    assert "^" in err


def test_sim_scheduler_generated(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr sim scheduler --generate N` makes N decisions and reports their distribution."""
    assert main(["sim", "scheduler", "--generate", "50", "--json", "--server", url]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["hosts"] == 6
    assert summary["decisions"] == 50
    assert summary["invalid_jobs"] == 0
    c = summary["candidates"]
    assert 0 <= c["min"] <= c["p50"] <= c["p90"] <= c["max"] <= 6
    assert summary["decisions_per_s"] > 0


def test_sim_scheduler_jobs_file(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A jobs file is read line by line; counts match the expressions; bad lines are reported."""
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("# placement requests\nscratch_free > 25\n\nselect[datasets has \"c4\"]\n"
                    "scratch_free > 1000\ndatasets > 1\n")
    assert main(["sim", "scheduler", "--jobs", str(jobs), "--server", url]) == 0
    out = capsys.readouterr().out
    assert "3 in" in out  # three valid decisions
    assert "(1 invalid)" in out
    assert "min 0  p50 3  p90 3  max 3" in out
    assert "zero-candidate     1 of 3" in out



def test_explain_of_an_unknown_host_is_an_error_like_hosts(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr explain … --host nosuchhost` fails as `crr hosts nosuchhost` does (one line,
    exit 1), not "not selected" with exit 0."""
    assert main(["explain", "scratch_free > 15", "--host", "nosuchhost", "--server", url]) == 1
    explain_err = capsys.readouterr().err.strip()
    assert main(["hosts", "nosuchhost", "--server", url]) == 1
    hosts_err = capsys.readouterr().err.strip()
    assert explain_err.endswith("no snapshot for host(s): nosuchhost"), explain_err
    assert hosts_err.endswith("no snapshot for host(s): nosuchhost"), hosts_err
    assert len(explain_err.splitlines()) == 1
