"""crr: custom resource reporting — runtime values that batch schedulers filter hosts on.

The public API is what this package exports (`__all__`); everything else is internal::

    from crr import SchedulerView, connect, ExternalReporter, compile_select

- schedulers: `connect` (NATS, reconnecting forever), `SchedulerView` (a live cached copy
  of `CRR_SNAPSHOT` answering `select[]` locally), `loaded_view` (a started and ready view
  for one-shot use), `read_snapshot` (one read of every record);
- reporters: `ExternalReporter` (the SDK: publishing, the catalog check at connect,
  `submit` with the projector's verdict), `ReportOutcome`, `PublishError`,
  `ReportRejectedError`, `UnknownReporterError`;
- `select[]`: `compile_select`, `CompiledSelect`, `Explanation`, `Section`;
- wire types (frozen msgspec Structs): the events, the snapshot records, the catalog;
- errors: the `CrrError` tree.

Every name is the object of the module that defines it, imported on first use (PEP 562),
so `import crr.producers.agent` on a worker does not load the scheduler view.

The source tree maps onto this package (`pyproject.toml`, `[tool.setuptools.package-dir]`):
`ops/` is `crr` itself, and `bus/`, `schemas/`, `projections/`, `producers/` are
`crr.bus`, `crr.schemas`, `crr.projections`, `crr.producers` (docs/architecture.md).
"""

from __future__ import annotations

import signal as _signal
import sys as _sys


def _interrupted_early(_signum: int, _frame: object) -> None:
    """Ctrl-C while the `crr` command is still importing: a quiet exit 130, no traceback."""
    raise SystemExit(130)


# Only in the `crr` command's own process (its console script, or `python -m crr.cli`), and
# first of all, before the imports that fill a command's first 0.3 s; `crr.cli.main` puts
# Python's handler back and catches KeyboardInterrupt from there on.  A library user's
# process is left alone.
if ((_sys.argv and _sys.argv[0].rsplit("/", 1)[-1] == "crr")
        or ("-m", "crr.cli") in zip(_sys.orig_argv, _sys.orig_argv[1:], strict=False)) \
        and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, _interrupted_early)

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crr.bus.connection import connect
    from crr.producers.external import PublishError
    from crr.projections.select import CompiledSelect, Explanation, Section, compile_select
    from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
    from crr.schemas.errors import (
        CatalogError,
        CrrError,
        CrrTimeoutError,
        ExpressionError,
        NotReadyError,
        PayloadError,
        ReportRejectedError,
        UnknownReporterError,
    )
    from crr.schemas.events import DeadLetter, Forget, Health, Inventory, Report
    from crr.schemas.snapshot import (
        AsOf,
        ClusterSnapshot,
        HostSnapshot,
        InventoryEntry,
        ProjectorStatus,
        ReporterStatus,
        ValueEntry,
    )
    from crr.sdk.external_reporter import ExternalReporter
    from crr.sdk.report_outcome import ReportOutcome
    from crr.view.scheduler_view import SchedulerView, loaded_view
    from crr.view.snapshot_reader import SnapshotContents, read_snapshot


__all__ = [
    "AsOf",
    "Catalog",
    "CatalogError",
    "ClusterSnapshot",
    "CompiledSelect",
    "CrrError",
    "CrrTimeoutError",
    "DeadLetter",
    "Explanation",
    "ExpressionError",
    "ExternalReporter",
    "Forget",
    "Health",
    "HostSnapshot",
    "Inventory",
    "InventoryEntry",
    "NotReadyError",
    "PayloadError",
    "ProjectorStatus",
    "PublishError",
    "Report",
    "ReportOutcome",
    "ReportRejectedError",
    "ReporterSpec",
    "ReporterStatus",
    "ResourceSpec",
    "SchedulerView",
    "Section",
    "SnapshotContents",
    "UnknownReporterError",
    "ValueEntry",
    "__version__",
    "compile_select",
    "connect",
    "loaded_view",
    "read_snapshot",
]

_HOMES: dict[str, str] = {
    "AsOf": "crr.schemas.snapshot",
    "Catalog": "crr.schemas.catalog",
    "CatalogError": "crr.schemas.errors",
    "ClusterSnapshot": "crr.schemas.snapshot",
    "CompiledSelect": "crr.projections.select",
    "CrrError": "crr.schemas.errors",
    "CrrTimeoutError": "crr.schemas.errors",
    "DeadLetter": "crr.schemas.events",
    "Explanation": "crr.projections.select",
    "ExpressionError": "crr.schemas.errors",
    "ExternalReporter": "crr.sdk.external_reporter",
    "Forget": "crr.schemas.events",
    "Health": "crr.schemas.events",
    "HostSnapshot": "crr.schemas.snapshot",
    "Inventory": "crr.schemas.events",
    "InventoryEntry": "crr.schemas.snapshot",
    "NotReadyError": "crr.schemas.errors",
    "PayloadError": "crr.schemas.errors",
    "ProjectorStatus": "crr.schemas.snapshot",
    "PublishError": "crr.producers.external",
    "Report": "crr.schemas.events",
    "ReportOutcome": "crr.sdk.report_outcome",
    "ReportRejectedError": "crr.schemas.errors",
    "ReporterSpec": "crr.schemas.catalog",
    "ReporterStatus": "crr.schemas.snapshot",
    "ResourceSpec": "crr.schemas.catalog",
    "SchedulerView": "crr.view.scheduler_view",
    "Section": "crr.projections.select",
    "SnapshotContents": "crr.view.snapshot_reader",
    "UnknownReporterError": "crr.schemas.errors",
    "ValueEntry": "crr.schemas.snapshot",
    "compile_select": "crr.projections.select",
    "connect": "crr.bus.connection",
    "loaded_view": "crr.view.scheduler_view",
    "read_snapshot": "crr.view.snapshot_reader",
}
"""Where each public name lives (imported when first asked for)."""


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415
        try:
            return version("crr-reporting")
        except PackageNotFoundError:  # a source tree that is not installed
            return "0+unknown"
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'crr' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
