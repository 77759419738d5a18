"""Tests are found from the source's path (docs/testing.md): every room of the source has its
folder under tests/, and every test file in a room's folder is named after a module of that
room (or after the room itself)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ROOMS: dict[str, tuple[str, ...]] = {
    "bus": ("bus",),
    "schemas": ("schemas",),
    "projections": ("projections",),
    "producers": ("producers",),
    "projector": ("ops/projector",),
    "view": ("ops/view",),
    "sdk": ("ops/sdk",),
    "history": ("ops/history",),
    "admin": ("ops/admin",),
    "runtime": ("ops/runtime",),
    "bridges": ("ops/bridges",),
    "rest": ("ops/rest",),
    "cli": ("ops/commands", "ops/cli.py", "ops/host_listing.py", "ops/progress.py"),
}
"""Each room's folder under tests/, and the source it tests (docs/testing.md, the table)."""

OTHER = {"system", "support", "bench", "golden", "fixtures"}
"""Folders under tests/ that are not a room: end to end, helpers, benchmarks, data."""

SINGULAR = {"bridges": "bridge"}


def module_names(room: str) -> set[str]:
    """The names a test file of `room` may start with: each module's name (`<package>_<module>`
    inside a sub-package, and the sub-package's own), and the room's."""
    names = {room, SINGULAR.get(room, room)}
    for src in ROOMS[room]:
        path = ROOT / src
        base = path.parent if path.is_file() else path
        for f in [path] if path.is_file() else path.rglob("*.py"):
            parts = list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts:
                names.add("_".join(parts))
    return names


def test_every_test_folder_is_a_room_or_named_otherwise() -> None:
    """No test file outside a folder; no folder that is neither a room nor listed in OTHER."""
    folders = {p.name for p in (ROOT / "tests").iterdir()
               if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders <= set(ROOMS) | OTHER
    assert set(ROOMS) <= folders
    assert sorted((ROOT / "tests").glob("test_*.py")) == []
    assert sorted((ROOT / "tests" / "support").glob("test_*.py")) == []


def test_every_test_file_is_named_after_a_module_of_its_room() -> None:
    """`tests/<room>/test_<module>[_<aspect>].py`: the module's name, or the room's."""
    misplaced = []
    for room in ROOMS:
        names = module_names(room)
        for test in sorted((ROOT / "tests" / room).glob("test_*.py")):
            stem = test.stem.removeprefix("test_")
            if not any(stem == n or stem.startswith(f"{n}_") for n in names):
                misplaced.append(str(test.relative_to(ROOT)))
    assert misplaced == []


def test_the_rule_sees_a_misplaced_file() -> None:
    """(The check above is not vacuous: a view test in the projector's room fails it.)"""
    assert "scheduler_view" not in module_names("projector")
    assert {"scheduler_view", "record_packer", "view"} <= module_names("view")
    assert {"host_table", "host_table_table", "select_parser"} <= module_names("projections")
