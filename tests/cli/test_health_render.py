"""`crr health`'s table: DETAIL fits the terminal's width (not ~80 characters), never cut
when piped; the DEAD column shows recent dead letters."""

from __future__ import annotations

from crr.admin.reporter_health import ReporterHealth
from crr.commands.health import render

_DETAIL = "exit 3: " + "df: /scratch: No such file or directory; " * 6


def _rows() -> list[ReporterHealth]:
    return [ReporterHealth(reporter="scratch", host="node1", state="failed", failing=True,
                           detail=_DETAIL, exit_code=3),
            ReporterHealth(reporter="flexlm", host=None, state="ok", failing=False,
                           deadletters=2, last_deadletter="scope")]


def test_detail_uses_the_terminal_width() -> None:
    """Each line fits the width given; a wider terminal shows more of the detail."""
    narrow = render(_rows(), color=False, width=100).splitlines()
    wide = render(_rows(), color=False, width=250).splitlines()
    assert all(len(line) <= 100 for line in narrow)
    assert all(len(line) <= 250 for line in wide)
    assert narrow[1].endswith("…")
    assert len(wide[1]) > len(narrow[1]) + 100


def test_piped_output_is_never_cut() -> None:
    """width=None (stdout is not a terminal): the whole detail, whitespace folded."""
    table = render(_rows(), color=False, width=None)
    assert " ".join(_DETAIL.split()) in table


def test_dead_column() -> None:
    """DEAD shows the count, or `-`."""
    lines = render(_rows(), color=False, width=None).splitlines()
    header = lines[0].split()
    assert header[6] == "DEAD"
    assert lines[1].split()[6] == "-"
    assert lines[2].split()[6] == "2"
