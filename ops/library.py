"""crr's public library API: the one import path for schedulers and reporters.

    from ops.library import SchedulerView, connect, ExternalReporter, compile_select

Everything here is re-exported from the module that defines it (nothing is
defined in this file), so the names are the same objects wherever they are
imported from; this module is the path the README documents and keeps stable
while the modules behind it move.

- schedulers: `connect` (NATS, reconnecting forever), `SchedulerView` (a live
  cached copy of `CRR_SNAPSHOT` answering `select[]` locally), `loaded_view`
  (a started and ready view for one-shot use), `read_snapshot` (one read of
  every record);
- reporters: `ExternalReporter` (the SDK: publishing, the catalog check at connect,
  `submit` with the projector's verdict), `ReportOutcome`, `PublishError`;
- `select[]`: `compile_select`, `CompiledSelect`, `Explanation`, `Section`;
- wire types (frozen msgspec Structs): the events, the snapshot records, the
  catalog;
- errors: the `CrrError` tree.
"""

from __future__ import annotations

from bus.connection import connect
from ops.services.external_reporter import ExternalReporter
from ops.services.report_outcome import ReportOutcome
from ops.services.snapshot_reader import SnapshotContents, read_snapshot
from ops.services.view import SchedulerView, loaded_view
from producers.external import PublishError
from projections.select import CompiledSelect, Explanation, Section, compile_select
from schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from schemas.errors import (
    CatalogError,
    CrrError,
    CrrTimeoutError,
    ExpressionError,
    NotReadyError,
    PayloadError,
    ReportRejectedError,
    UnknownReporterError,
)
from schemas.events import DeadLetter, Forget, Health, Inventory, Report
from schemas.snapshot import (
    AsOf,
    ClusterSnapshot,
    HostSnapshot,
    InventoryEntry,
    ProjectorStatus,
    ReporterStatus,
    ValueEntry,
)

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
    "compile_select",
    "connect",
    "loaded_view",
    "read_snapshot",
]
