"""Docs that run: every `crr …` example of the README's code blocks and of `--help`.

Every example is parsed with the real parser.  The one-shot ones are run
with the real CLI (`crr.cli.main`) against a real nats-server with a
projector and the example catalog; the long-running ones (`demo`, `server`,
`agent`, `projector`, `api`) are only parsed.  A README
transcript (`$ crr …` followed by the output) must print that output.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crr.bus.connection import connect
from crr.cli import HELP_EXAMPLES, _subparsers, build_parser, main
from tests.support.cli import ROOT
from tests.support.projector import running_projector

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


@contextlib.contextmanager
def projector_thread(url: str) -> Iterator[None]:
    """A real Projector on its own event loop in a thread, so the examples can run through
    `crr.cli.main` in this one (no interpreter start-up per example)."""
    ready = threading.Event()
    handle: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def serve() -> None:
        async with connect(url, name="t-projector") as nc, running_projector(nc):
            stop = asyncio.Event()
            handle.append((asyncio.get_running_loop(), stop))
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30), "projector not ready"
    try:
        yield
    finally:
        loop, stop = handle[0]
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


@pytest.mark.timeout(240)
def test_one_shot_examples_run(nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """Each one-shot example runs with the real CLI against a real server with the example
    catalog and a projector: exit 0 (`crr health` may say 1: failing reporters), errors and
    notes exactly where the README shows them, never a usage error or a traceback.  (A pipe
    such as `| head` is left out here; tests/system/test_bad_input.py runs one in a shell.)"""
    (tmp_path / "ops").symlink_to(ROOT / "ops")
    (tmp_path / "bad.yaml").write_text(_BAD_YAML)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NATS_URL", nats_url)
    runnable = [e for e in EXAMPLES if _argv(e)[0] not in LONG_RUNNING]
    # The catalog first, then the reports the others read.
    runnable.sort(key=lambda e: (_argv(e)[:2] != ["catalog", "apply"] or bool(e.shown),
                                 _argv(e)[0] != "report"))
    with projector_thread(nats_url):
        for ex in runnable:
            code = main(_argv(ex))
            out, err = capsys.readouterr()
            what = f"{ex.where}: `{ex.command}` → exit {code}\n{out[-2000:]}{err}"
            assert "Traceback" not in err, what
            if ex.shown:
                # The transcript's own messages (`crr …: error/note: …`) are printed as
                # shown (up to a `…`); data lines (host names) depend on the data.
                said = [line for line in ex.shown if line.startswith(("crr ", "  "))]
                assert code == (1 if any(": error:" in line for line in said) else 0), what
                for shown in said:
                    assert any(got.startswith(shown.split("…")[0])
                               for got in err.splitlines()), (shown, what)
            elif _argv(ex)[0] == "health":
                assert code in (0, 1), what
            else:
                assert code == 0, what
                assert "error" not in err, what
