"""The distribution name is ours (`crr-reporting`): pyproject says it, and every install
hint in the code uses it, never `crr[...]` (the index's `crr` is someone else's)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from crr.schemas.distribution import DISTRIBUTION, install_hint

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("bus", "docs", "ops", "producers", "projections", "schemas", "tests")

_FOREIGN_HINT = re.compile(r"""pip install ['"]?crr\[|['"`]crr\[\w+\]""")


def test_pyproject_names_the_distribution() -> None:
    """`[project] name` is the name the hints use; the command is still `crr`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "crr-reporting"
    assert project["scripts"] == {"crr": "crr.cli:main"}


def test_install_hint_names_the_distribution() -> None:
    """The hint is what a user pastes into a shell."""
    assert install_hint("api") == "pip install 'crr-reporting[api]'"


def test_no_source_file_hints_at_the_foreign_crr() -> None:
    """No module, test or deploy file tells anyone to `pip install 'crr[...]'`."""
    offenders = []
    files = [p for d in SOURCES for p in (ROOT / d).rglob("*") if p.suffix in (
        ".py", ".md", ".example", ".service", ".conf")]
    for path in files:
        if path == Path(__file__).resolve() or path.name == "distribution.py":
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _FOREIGN_HINT.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []
