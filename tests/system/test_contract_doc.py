"""The public contract is in the repo: docs/contract.md names every subject, stream and command.

A newcomer's clone has no other copy of the contract, so a subject the code defines,
a stream it provisions or a `crr` sub-command it registers without a line in
docs/contract.md is a contract change nobody wrote down.  This test makes adding
one without its doc line fail.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from crr.cli import build_parser
from crr.schemas import subjects

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = (ROOT / "docs" / "contract.md").read_text()


def _subject_constants() -> dict[str, str]:
    """Every `crr.v1…` string constant and stream name of schemas/subjects.py."""
    out = {}
    for name, value in vars(subjects).items():
        if name.isupper() and isinstance(value, str) and (
                value.startswith(subjects.PREFIX + ".") or name.endswith("_STREAM")):
            out[name] = value
    return out


def _builders() -> dict[str, str]:
    """What each subject builder makes, with its variable tokens written as the doc writes them."""
    kinds: tuple[subjects.EventType, ...] = ("report", "inventory", "health")
    out = {}
    for kind in kinds:
        out[f"event_subject({kind}, host)"] = subjects.event_subject(kind, "<reporter>", "<host>")
        out[f"event_subject({kind}, cluster)"] = subjects.event_subject(kind, "<reporter>", None)
    return out | {
        "forget_subject": subjects.forget_subject("<host>"),
        "host_snapshot_subject": subjects.host_snapshot_subject("<host>"),
        "status_subject(k)": subjects.status_subject(7).replace(".7", ".<k>"),
        "lease_subject(k)": subjects.lease_subject(7).replace(".7", "[.<k>]"),
    }


def _decoded(subject: str) -> str:
    # token() encodes `<` and `>`; the doc writes the placeholders plainly.
    return subject.replace("=3C", "<").replace("=3E", ">")


def _commands() -> list[str]:
    """Every registered `crr` sub-command path (`hosts`, `catalog apply`, …)."""
    out: list[str] = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out.append(prefix + name)
                    walk(sub, prefix + name + " ")

    walk(build_parser(), "")
    return out


def _cli_table() -> str:
    section = CONTRACT.split("\n## CLI\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("| `crr "))


def test_the_subject_constants_are_found() -> None:
    """The collection itself sees what it should (else the checks below check nothing)."""
    names = _subject_constants()
    assert {"EVENTS_STREAM", "SNAPSHOT_STREAM", "CATALOG", "DEADLETTER", "LEASE"} <= set(names)


@pytest.mark.parametrize(("name", "value"), sorted(_subject_constants().items()))
def test_every_subject_constant_is_in_the_contract(name: str, value: str) -> None:
    """A prefix constant (`crr.v1.snapshot.host.`) counts when a subject starting with it is."""
    needle = value.rstrip(".")
    assert needle in CONTRACT, f"{name} = {value!r} not in docs/contract.md"


@pytest.mark.parametrize(("name", "subject"), sorted(_builders().items()))
def test_every_built_subject_is_in_the_contract(name: str, subject: str) -> None:
    assert _decoded(subject) in CONTRACT, f"{name}: {_decoded(subject)!r} not in docs/contract.md"


def test_the_event_stream_captures_only_documented_subjects() -> None:
    for filt in subjects.EVENT_SUBJECTS + subjects.SNAPSHOT_SUBJECTS:
        stem = filt.removesuffix(".>")
        assert stem in CONTRACT, f"stream subject {filt!r} not in docs/contract.md"


@pytest.mark.parametrize("command", _commands())
def test_every_command_has_a_cli_table_line(command: str) -> None:
    table = _cli_table()
    assert table, "docs/contract.md has no CLI table under '## CLI'"
    assert re.search(rf"`crr {re.escape(command)}(\s|`)", table), \
        f"`crr {command}` has no line in the CLI table of docs/contract.md"


# The design document of record is not in the repository: nothing cites it ("D[E]SIGN": so
# that this pattern does not match itself when the tree is searched for the name).
_OUTSIDE = re.compile(r"\bD[E]SIGN\b")


def test_code_does_not_cite_a_document_outside_the_repo() -> None:
    """Comments and docstrings cite docs/contract.md (or docs/architecture.md), whose sections
    a reader can open, not the design document a clone does not have."""
    sources = [p for d in ("bus", "ops", "producers", "projections", "schemas", "tests")
               for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(sources) > 100
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sources
                 for n, line in enumerate(p.read_text().splitlines(), 1) if _OUTSIDE.search(line)]
    assert offenders == []


def test_user_docs_do_not_point_outside_the_repo() -> None:
    """A clone has no ../shared: the README and docs cite docs/contract.md instead."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        assert "../shared" not in text, path.name
        assert not _OUTSIDE.search(text), path.name
