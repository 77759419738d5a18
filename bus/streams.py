"""Idempotent provisioning of the two JetStream streams crr uses (docs/contract.md, "Subjects and
streams").

Safe to re-run: a stream that exists with the same settings is left alone;
one whose settings conflict with what crr needs is reported (StreamConfigError
listing each difference), never silently changed — unless the operator asks
for `update=True` (for settings JetStream can change in place).  One change is
made without asking: subjects a newer crr captures that an existing stream
lacks (e.g. `crr.v1.admin.>`) are added in place, nothing else touched —
adding subjects changes no stored message and no reader's meaning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import nats.js.errors
from nats.aio.client import Client
from nats.js.api import (
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)

from crr.schemas.errors import StreamConfigError
from crr.schemas.subjects import (
    EVENT_SUBJECTS,
    EVENTS_STREAM,
    PARTITION_SOURCE,
    SNAPSHOT_STREAM,
    SNAPSHOT_SUBJECTS,
    partition_destination,
)

DEFAULT_EVENTS_MAX_AGE = 24 * 3600.0
DUPLICATE_WINDOW = 120.0
MAX_EVENT_BYTES = 1024 * 1024


@dataclass(frozen=True)
class StreamSettings:
    """What crr provisions; `replicas` 3 on a NATS cluster."""

    events_max_age: float = DEFAULT_EVENTS_MAX_AGE
    replicas: int = 1
    events_max_bytes: int = -1
    partitions: int = 1
    """Projector partitions: >1 stores host events with a partition token (see below)."""


def partition_transform(partitions: int) -> SubjectTransform | None:
    """CRR_EVENTS transform appending `partition(N, host)` to every host event subject.

    `crr.v1.<kind>.host.<host>.<reporter>` is stored as `….<reporter>.<p>`, so
    projector `p` filters `crr.v1.*.host.*.*.<p>`.  Publishers (and their
    permissions) keep the subjects of docs/contract.md, "Subjects and streams"; only the stored
    subject changes.
    """
    if partitions <= 1:
        return None
    return SubjectTransform(src=PARTITION_SOURCE, dest=partition_destination(partitions))


def events_config(s: StreamSettings) -> StreamConfig:
    """CRR_EVENTS: history of every event, limits retention, bounded by age."""
    return StreamConfig(
        name=EVENTS_STREAM,
        description="crr events: reports, inventories, health, catalog, dead letters",
        allow_direct=False,
        subjects=list(EVENT_SUBJECTS),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=s.events_max_age,
        max_msgs_per_subject=-1,
        max_bytes=s.events_max_bytes,
        duplicate_window=DUPLICATE_WINDOW,
        max_msg_size=MAX_EVENT_BYTES,
        num_replicas=s.replicas,
        discard=DiscardPolicy.OLD,
        subject_transform=partition_transform(s.partitions),
    )


def snapshot_config(s: StreamSettings) -> StreamConfig:
    """CRR_SNAPSHOT: compacted (one message per subject), direct-get enabled."""
    return StreamConfig(
        name=SNAPSHOT_STREAM,
        description="crr snapshot: one record per host, the cluster, the catalog, the projector",
        subjects=list(SNAPSHOT_SUBJECTS),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msgs_per_subject=1,
        duplicate_window=DUPLICATE_WINDOW,
        allow_direct=True,
        allow_rollup_hdrs=True,
        num_replicas=s.replicas,
        discard=DiscardPolicy.OLD,
    )


# The settings whose value changes what crr means; others (limits) may be tuned by operators.
_CHECKED = ("subjects", "retention", "storage", "max_msgs_per_subject", "allow_direct",
            "duplicate_window", "max_age", "num_replicas", "subject_transform")


def _norm(field: str, value: Any) -> Any:
    if field == "subjects":
        return sorted(value or [])
    if field in ("max_age", "duplicate_window"):
        return round(float(value or 0), 3)
    if isinstance(value, SubjectTransform):
        return f"{value.src} -> {value.dest}"
    if hasattr(value, "value"):
        return value.value
    return value


def _differences(want: StreamConfig, have: StreamConfig, *, update: bool) -> list[str]:
    diffs = []
    for f in _CHECKED:
        if getattr(want, f) is None and not (update and f == "subject_transform"):
            # crr leaves this setting to the server's default — except that `--update` to
            # one projector partition removes the partition transform.
            continue
        w, h = _norm(f, getattr(want, f)), _norm(f, getattr(have, f))
        if w != h:
            diffs.append(f"{want.name}.{f}: existing {h!r}, crr needs {w!r}")
    return diffs


async def ensure_stream(nc: Client, want: StreamConfig, *, update: bool = False) -> str:
    """Create `want` if missing; return "created", "unchanged" or "updated"."""
    js = nc.jetstream()
    assert want.name is not None
    try:
        info = await js.stream_info(want.name)
    except nats.js.errors.NotFoundError:
        await js.add_stream(want)
        return "created"
    diffs = _differences(want, info.config, update=update)
    if not diffs:
        return "unchanged"
    have_subjects = set(info.config.subjects or [])
    if (not update and diffs == [d for d in diffs if d.startswith(f"{want.name}.subjects:")]
            and have_subjects < set(want.subjects or [])):
        added = sorted(set(want.subjects or []) - have_subjects)
        try:
            await js.update_stream(dataclasses.replace(
                info.config, subjects=[*(info.config.subjects or []), *added]))
        except nats.js.errors.APIError as exc:
            raise StreamConfigError(f"cannot add subjects {added} to {want.name}: "
                                    f"{exc.description}") from exc
        return "updated"
    if not update:
        raise StreamConfigError(
            "stream exists with conflicting settings (re-run with --update to change them): "
            + "; ".join(diffs)
        )
    try:
        await js.update_stream(want)
    except nats.js.errors.APIError as exc:
        raise StreamConfigError(f"cannot update {want.name}: {exc.description}") from exc
    return "updated"


async def provision(
    nc: Client, settings: StreamSettings | None = None, *, update: bool = False
) -> dict[str, str]:
    """Ensure CRR_EVENTS and CRR_SNAPSHOT exist as crr needs them; idempotent."""
    s = settings or StreamSettings()
    return {
        EVENTS_STREAM: await ensure_stream(nc, events_config(s), update=update),
        SNAPSHOT_STREAM: await ensure_stream(nc, snapshot_config(s), update=update),
    }
