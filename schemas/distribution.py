"""The name crr is installed by: `crr-reporting` on the package index.

The name `crr` on the index belongs to another project, so a hint saying
`pip install 'crr[api]'` would install someone else's code.  The import
packages and the `crr` command keep their names; only what `pip` is told
differs.  Every install hint is built here, so none can drift back.
"""

from __future__ import annotations

from typing import Final

DISTRIBUTION: Final = "crr-reporting"
"""`[project] name` in pyproject.toml (tests/system/test_distribution.py keeps them equal)."""


def install_hint(extra: str) -> str:
    """`pip install 'crr-reporting[EXTRA]'`: what to run for an optional extra."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"
