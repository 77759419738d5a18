"""Docs that run: every `crr …` example of the README's code blocks and of `--help`.

Every example is parsed with the real parser.  The one-shot ones are run, as
written (through `sh`, so quotes and `| head` work), against a real
nats-server with a projector and the example catalog; the long-running ones
(`demo`, `server`, `agent`, `projector`, `api`) are only parsed.  A README
transcript (`$ crr …` followed by the output) must print that output.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.client import Client

from ops.cli import HELP_EXAMPLES, _subparsers, build_parser
from tests.cli_support import ROOT, cli_env
from tests.projector_support import running_projector

LONG_RUNNING = {"demo", "server", "agent", "projector", "api"}


@dataclass(frozen=True)
class Example:
    """One documented command line, where it is written, and the output shown with it."""

    command: str
    where: str
    shown: tuple[str, ...] = ()


def readme_examples() -> list[Example]:
    """`crr …` lines of the README's fenced code blocks (a `$ ` transcript keeps its output)."""
    out: list[Example] = []
    in_block = False
    lines = (ROOT / "README.md").read_text().splitlines()
    output: set[int] = set()  # lines a transcript shows as its output
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block or i in output:
            continue
        if line.startswith("crr "):
            out.append(Example(line, f"README.md:{i + 1}"))
        elif line.startswith("$ crr "):
            shown = []
            for j, follow in enumerate(lines[i + 1:], start=i + 1):
                if follow.startswith(("```", "$ ")):
                    break
                shown.append(follow)
                output.add(j)
            out.append(Example(line[2:], f"README.md:{i + 1}", tuple(shown)))
    return out


def help_examples() -> list[Example]:
    """The `examples:` lines of every command's `--help` (as the parser prints them)."""
    out = []
    for path, sp in _subparsers(build_parser()).items():
        for line in (sp.epilog or "").splitlines():
            if line.startswith("  crr "):
                out.append(Example(line.strip(), f"crr {path} --help"))
    return out


EXAMPLES = readme_examples() + help_examples()


def _argv(example: Example) -> list[str]:
    return shlex.split(example.command.split(" | ")[0])[1:]


def test_examples_were_found() -> None:
    """Both sources are read: the README block and every command with HELP_EXAMPLES."""
    assert len(readme_examples()) >= 12
    assert {e.command for e in help_examples()} == {c for cs in HELP_EXAMPLES.values()
                                                    for c in cs}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.where}: {e.command}")
def test_every_example_parses(example: Example) -> None:
    """The real parser accepts every documented command line (including `--since -15m`)."""
    try:
        build_parser().parse_args(_argv(example))
    except SystemExit as exc:  # pragma: no cover - the failure message is the point
        pytest.fail(f"{example.where}: `{example.command}` does not parse (exit {exc.code})")


_BAD_YAML = """version: 1
resources:
  datasets: {kind: string_sett, reporter: datasetz}
reporters:
  scratch: {type: script, command: [x], bogus: 1}
"""


async def _sh(command: str, cwd: Path, url: str) -> tuple[int, str, str]:
    line = re.sub(r"^crr ", f"{shlex.quote(sys.executable)} -m ops.cli ", command)
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", line, cwd=cwd, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=cli_env(NATS_URL=url))
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.timeout(240)
async def test_one_shot_examples_run(nc: Client, nats_url: str, tmp_path: Path) -> None:
    """Each one-shot example runs against a real server with the example catalog: exit 0
    (`crr health` may say 1: failing reporters), one-line errors only where the README
    shows them, and never a usage error or a traceback."""
    (tmp_path / "ops").symlink_to(ROOT / "ops")
    (tmp_path / "bad.yaml").write_text(_BAD_YAML)
    runnable = [e for e in EXAMPLES if _argv(e)[0] not in LONG_RUNNING]
    # The catalog first, then the reports the others read.
    runnable.sort(key=lambda e: (_argv(e)[:2] != ["catalog", "apply"] or bool(e.shown),
                                 _argv(e)[0] != "report"))
    async with running_projector(nc):
        for ex in runnable:
            code, out, err = await _sh(ex.command, tmp_path, nats_url)
            what = f"{ex.where}: `{ex.command}` → exit {code}\n{out[-2000:]}{err}"
            assert "Traceback" not in err, what
            assert code != 2, what
            if ex.shown:
                assert code == 1, what
                for shown, got in zip(ex.shown, err.splitlines(), strict=False):
                    assert got.startswith(shown.split("…")[0]), (shown, what)
            elif _argv(ex)[0] == "health":
                assert code in (0, 1), what
            else:
                assert code == 0, what
                assert "error" not in err, what
