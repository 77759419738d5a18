"""`crr`, the public import path: every name it offers is the defining module's own."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import crr
from tests.support.cli import ROOT


def test_every_exported_name_is_the_original() -> None:
    """Each name in `__all__` resolves, and is the very object its home module defines
    (a re-export, not a copy or a wrapper)."""
    names = [n for n in crr.__all__ if n != "__version__"]
    assert sorted(names) == names
    for name in names:
        obj = getattr(crr, name)
        home = importlib.import_module(obj.__module__)
        assert getattr(home, name) is obj, name
        assert obj.__module__.startswith("crr."), name
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", crr.__version__)


def test_what_a_scheduler_and_a_reporter_need_is_there() -> None:
    """The names the docs promise a scheduler author and a reporter author."""
    for name in ("SchedulerView", "connect", "loaded_view", "compile_select", "Explanation",
                 "CompiledSelect", "ExternalReporter", "ReportOutcome", "PublishError",
                 "ReportRejectedError", "UnknownReporterError", "CrrError"):
        assert name in crr.__all__, name
    assert "not_a_name" not in dir(crr)


def test_importing_crr_loads_nothing_heavy() -> None:
    """`import crr` (a worker's agent imports `crr.producers…`, which imports `crr` first)
    does not load the scheduler view, numpy or the projector."""
    out = subprocess.run(
        [sys.executable, "-c", "import sys, crr; print(sorted(m for m in sys.modules "
         "if m.startswith(('crr.', 'numpy'))))"],
        capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_readme_examples_import_from_the_library() -> None:
    """The README's Python examples import crr only through `crr`, and every name
    they import exists there."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks
    imports = [line for block in blocks for line in block.splitlines()
               if line.startswith(("from crr", "import crr"))]
    assert imports
    for line in imports:
        m = re.fullmatch(r"from crr import (.+)", line)
        assert m, line
        for name in m.group(1).split(","):
            assert name.strip() in crr.__all__, line
