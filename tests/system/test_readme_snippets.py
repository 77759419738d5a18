"""The README's Python snippets are whole programs that run (issue 40: they used top-level
`await` and an undefined `URL`): each ```python block is run as written, in order, against
a real nats-server with a projector and the example catalog, with `NATS_URL` set as the
demo tells a second terminal to; a `print(…)  # shown` line must print what it shows."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

from crr.cli import main
from tests.support.cli import ROOT
from tests.system.test_doc_examples import projector_thread

README = ROOT / "README.md"


def snippets() -> list[tuple[int, str]]:
    """(line, code) of every ```python block of the README."""
    out = []
    lines = README.read_text().splitlines()
    start = None
    for i, line in enumerate(lines):
        if start is None and line.strip() == "```python":
            start = i + 1
        elif start is not None and line.strip() == "```":
            out.append((start + 1, "\n".join(lines[start:i]) + "\n"))
            start = None
    return out


def shown(code: str) -> list[str]:
    """What the snippet's `print(…)  # X` lines say they print, in order."""
    return [m.group(1) for m in re.finditer(r"print\(.*\)\s+#\s+(.+)$", code, re.MULTILINE)]


def test_the_snippets_are_whole_programs() -> None:
    """Each parses as a module (no top-level await) and names nothing it does not define
    or import, reading the server from `NATS_URL`."""
    found = snippets()
    assert len(found) >= 2
    for line, code in found:
        tree = ast.parse(code, f"README.md:{line}")
        assert "asyncio.run(main())" in code, line
        assert 'os.environ["NATS_URL"]' in code, line
        assert not any(isinstance(n, ast.Await) for n in tree.body), line
        assert "URL," not in code.replace("NATS_URL", ""), line


def test_the_snippets_run(nats_url: str, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    """Run in README order after `crr catalog apply` and one `crr report`: each exits
    normally and prints what its comments show."""
    monkeypatch.setenv("NATS_URL", nats_url)
    monkeypatch.delenv("NATS_CREDS", raising=False)
    with projector_thread(nats_url):
        assert main(["catalog", "apply", str(ROOT / "ops/examples/resources.yaml")]) == 0
        assert main(["report", "--reporter", "scratch", "--host", "demo-node",
                     "scratch_free=812.5", "scratch_total=900"]) == 0
        capsys.readouterr()
        for line, code in snippets():
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__main__"})  # noqa: S102 - the README's own code
            printed = out.getvalue().splitlines()
            expected = shown(code)
            assert printed[:len(expected)] == expected, (line, printed)
            if "explain" in code:
                assert any("scratch_free" in p for p in printed), printed


def test_readme_stays_short() -> None:
    """The README stays at most 450 lines (the rest belongs in docs/)."""
    assert len(Path(README).read_text().splitlines()) <= 450


def paragraphs(text: str) -> list[str]:
    """The paragraphs of a Markdown text outside fenced code blocks."""
    out: list[str] = []
    current: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.strip():
            current.append(line)
        elif current:
            out.append("\n".join(current))
            current = []
    if current:
        out.append("\n".join(current))
    return out


def test_no_garbled_inline_code_in_the_docs() -> None:
    """Every paragraph of the README and docs/ closes its inline code (issue 40: a
    paragraph read "…what became of each value:crr report` publishes one report…")."""
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for para in paragraphs(path.read_text()):
            assert para.count("`") % 2 == 0, f"{path.name}: {para[:200]}"


def test_the_slurm_bridge_doc_opens_with_where_it_belongs() -> None:
    """docs/bridges-slurm.md opens by pointing at the Slurm section of docs/bridges.md
    (which exists), not with a note that it does not exist yet."""
    intro = paragraphs((ROOT / "docs" / "bridges-slurm.md").read_text())[1]
    assert "did not exist" not in intro
    assert "(bridges.md#slurm)" in intro
    assert "\n## Slurm\n" in (ROOT / "docs" / "bridges.md").read_text()
