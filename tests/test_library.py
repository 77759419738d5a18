"""`ops.library`, the public import path: every name it offers is the defining module's own."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import ops.library
from tests.cli_support import ROOT


def test_every_exported_name_is_the_original() -> None:
    """Each name in `__all__` resolves, and is the very object its home module defines
    (a re-export, not a copy or a wrapper)."""
    assert sorted(ops.library.__all__) == ops.library.__all__
    for name in ops.library.__all__:
        obj = getattr(ops.library, name)
        home = importlib.import_module(obj.__module__)
        assert getattr(home, name) is obj, name
        assert not obj.__module__.startswith("ops.library"), name


def test_readme_examples_import_from_the_library() -> None:
    """The README's Python examples import crr only through `ops.library`, and every name
    they import exists there."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks
    imports = [line for block in blocks for line in block.splitlines()
               if line.startswith(("from ", "import "))]
    assert imports
    for line in imports:
        m = re.fullmatch(r"from ops\.library import (.+)", line)
        assert m, line
        for name in m.group(1).split(","):
            assert name.strip() in ops.library.__all__, line


def test_the_library_module_defines_nothing() -> None:
    """Only imports and `__all__`: the library path never grows its own code."""
    text = Path(ops.library.__file__ or "").read_text()
    assert not re.search(r"^(def|async def|class) ", text, flags=re.MULTILINE)
