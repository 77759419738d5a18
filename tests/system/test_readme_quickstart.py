"""The README's Quick start is two commands, parsed as ../shared/tools/check-quickstart does.

The full check (fresh clone, fresh venv, the demo and the suite) is slow and lives
outside the repo; this cheap test catches an edit that adds a third command or
drops the section before that check runs.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quickstart_commands(readme: str) -> list[str]:
    """The commands of the Quick start section's code blocks (comments, blanks and
    `$ ` prompts dropped, backslash continuations joined)."""
    lines = readme.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if re.match(r"#+\s*quick\s*-?\s*start", line, re.I))
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    cmds: list[str] = []
    in_code, cur = False, ""
    for line in lines[start + 1:]:
        if not in_code and re.match(rf"#{{1,{level}}}\s", line):
            break
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            s = re.sub(r"^\$\s+", "", s)
            if s.endswith("\\"):
                cur += s[:-1] + " "
                continue
            cmds.append(cur + s)
            cur = ""
    return cmds


def test_quick_start_is_two_commands_install_demo_then_tests() -> None:
    cmds = quickstart_commands((ROOT / "README.md").read_text())
    assert len(cmds) == 2, cmds
    assert "pip install" in cmds[0]
    assert "crr demo" in cmds[0]
    assert "pytest" in cmds[1]


def test_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 450
