"""The folders show the layers, and the code keeps to them (read from the source, no imports).

- `schemas/` (wire vocabulary) imports nothing else of crr; `projections/` (the pure
  core) only `schemas/`; `bus/` only `schemas/`; `producers/` `bus/` and `schemas/`;
  `ops/` composes them all, and its rooms (the projector, the view, the SDK, history,
  admin, runtime) run without the CLI or the REST API.  The pure layers take no third-party
  library but the
  ones named below.
- No import cycle between crr modules, counting every import: those under
  `TYPE_CHECKING` and inside functions hide a cycle from the interpreter, not from
  a reader.
- The bus is the port: no module outside `bus/` imports `nats` (nats-py); services take a
  `crr.bus.connection.Connection` and call `bus/` (`crr.bus.jetstream`, the readers, the
  publishers), whose errors are the error tree (tests may use nats-py directly).
- Every `crr.v1…` subject string and the `Nats-Msg-Id` header name are spelled out
  only in `schemas/subjects.py`; RFC 3339 text is parsed and formatted only in
  `schemas/wire_time.py`.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "projections", "bus", "producers", "ops")

ALLOWED_CRR: dict[str, frozenset[str]] = {
    "schemas": frozenset({"schemas"}),
    "projections": frozenset({"schemas", "projections"}),
    "bus": frozenset({"schemas", "bus"}),
    "producers": frozenset({"schemas", "bus", "producers"}),
    "ops": frozenset(PACKAGES),
}
"""The crr packages each package may import."""

ALLOWED_THIRD_PARTY: dict[str, frozenset[str]] = {
    "schemas": frozenset({"msgspec", "yaml", "numpy"}),
    "projections": frozenset({"msgspec", "numpy", "lz4"}),  # lz4: compression, no IO
}
"""Third-party libraries the pure layers may import (others: anything installed)."""

FOLDER_OF: dict[str, str] = {"crr.schemas": "schemas", "crr.projections": "projections",
                             "crr.bus": "bus", "crr.producers": "producers"}
"""The sub-packages of `crr` that are folders of their own; every other `crr.*` is `ops/`."""

_SURFACES = ("crr.cli", "crr.commands", "crr.rest")
FORBIDDEN_IN: dict[str, tuple[str, ...]] = {
    room: _SURFACES for room in ("crr.projector", "crr.view", "crr.sdk", "crr.history",
                                 "crr.admin", "crr.runtime")
}
"""Rooms and the crr modules they must not import (prefixes)."""

_RESTART_PATH = ("crr.projector",)
"""The projector's restart path reads CRR_SNAPSHOT itself: it imports no history tool."""


def layer(module: str) -> str | None:
    """The folder (layer) a `crr.*` module lives in; None: not crr."""
    if module != "crr" and not module.startswith("crr."):
        return None
    for prefix, folder in FOLDER_OF.items():
        if module == prefix or module.startswith(prefix + "."):
            return folder
    return "ops"


def _modules() -> dict[str, Path]:
    """Every crr module by its import name (`ops/x.py` is `crr.x`, `bus/x.py` `crr.bus.x`)."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("crr", *parts[1:]) if package == "ops" else ("crr", *parts))
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import anywhere in `tree`; `from p import m` of a
    submodule `m` counts as importing `p.m`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield node.lineno, sub if sub in MODULES else node.module


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of string constants that are documentation (bare string statements)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


def _strings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, text) of every string constant in code (f-string parts included), not docs."""
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_packages_import_only_their_lower_layers() -> None:
    """No import (module level, TYPE_CHECKING or inside a function) crosses a layer upwards."""
    stdlib = sys.stdlib_module_names | {"__future__"}
    bad = []
    for name, tree in TREES.items():
        package = layer(name)
        assert package is not None
        for line, module in _imports(tree):
            top = module.split(".")[0]
            target = layer(module)
            if target is not None:
                ok = target in ALLOWED_CRR[package]
            elif package in ALLOWED_THIRD_PARTY:
                ok = top in stdlib or top in ALLOWED_THIRD_PARTY[package]
            else:
                ok = True
            for inside, forbidden in FORBIDDEN_IN.items():
                if name.startswith(inside + ".") and module.startswith(forbidden):
                    ok = False
            if name.startswith(_RESTART_PATH) and module.startswith("crr.history"):
                ok = False
            if not ok:
                bad.append(f"{MODULES[name].relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


def test_no_import_cycles() -> None:
    """The crr import graph (every import counted) has no cycle."""
    graph = {name: {m for _, m in _imports(tree) if m in MODULES and m != name}
             for name, tree in TREES.items()}
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycles.append([*path[path.index(name):], name])
            return
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert cycles == []


def test_only_the_bus_imports_nats() -> None:
    """An import of `nats` (module level, TYPE_CHECKING or inside a function) outside `bus/`
    is a service talking to NATS past the port."""
    bad = [f"{MODULES[name].relative_to(ROOT)}:{line} imports {module}"
           for name, tree in TREES.items() if layer(name) != "bus"
           for line, module in _imports(tree) if module.split(".")[0] == "nats"]
    assert bad == []


@pytest.mark.parametrize(("needle", "home"), [
    ("crr.v1", "schemas/subjects.py"),
    ("Nats-Msg-Id", "schemas/subjects.py"),
    ("%Y-%m-%d", "schemas/wire_time.py"),
])
def test_wire_vocabulary_is_spelled_out_in_one_module(needle: str, home: str) -> None:
    """A subject, the de-duplication header or a timestamp format written outside its home
    module (documentation aside) is vocabulary leaking into the code."""
    found = [f"{MODULES[name].relative_to(ROOT)}:{line}: {text!r}"
             for name, tree in TREES.items() if str(MODULES[name].relative_to(ROOT)) != home
             for line, text in _strings(tree) if needle in text]
    assert found == []


def test_timestamps_are_parsed_only_in_wire_time() -> None:
    """`fromisoformat` / `isoformat` / `strptime` outside `schemas/wire_time.py`: RFC 3339
    text handled somewhere it should arrive as float epoch seconds."""
    found = [f"{MODULES[name].relative_to(ROOT)}:{node.lineno}: {node.attr}"
             for name, tree in TREES.items() if name != "crr.schemas.wire_time"
             for node in ast.walk(tree)
             if isinstance(node, ast.Attribute)
             and node.attr in {"fromisoformat", "isoformat", "strptime"}]
    assert found == []


def test_the_checks_see_what_they_look_for() -> None:
    """The walkers find the vocabulary where it does live (so the checks above are not
    vacuous): subjects in schemas/subjects.py, parsing in wire_time, imports in projections."""
    subjects = [t for _, t in _strings(TREES["crr.schemas.subjects"]) if "crr.v1" in t]
    assert subjects
    assert any(isinstance(n, ast.Attribute) and n.attr == "fromisoformat"
               for n in ast.walk(TREES["crr.schemas.wire_time"]))
    assert ("crr.schemas.subjects" in {m for _, m in _imports(TREES["crr.projections.fold"])})
    assert "nats.js.client" in {m for _, m in _imports(TREES["crr.bus.jetstream"])}


def test_every_folder_is_a_listed_package() -> None:
    """Every source folder with an `__init__.py` is in pyproject's `packages` (under its `crr.*`
    name), and nothing else is: an unlisted folder would be missing from the wheel."""
    import tomllib  # noqa: PLC0415

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert listed == found
