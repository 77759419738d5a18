"""Every crr subject: names, filters, builders and parsers, and the subject-token encoding
of docs/contract.md, "Subjects and streams".  No other module spells out a `crr.v1…` subject
or splits one into tokens (tests/system/test_layers.py checks this), so a newcomer reads the
whole subject space here.

`token(s)`: each UTF-8 byte outside `[A-Za-z0-9_-]` becomes `=XX`
(uppercase hex).  Injective, and valid in NATS subjects and KV keys.

Also here: the `Nats-Msg-Id` of an event (docs/contract.md, "Subjects and streams") and the
partitioning of `CRR_EVENTS` by host (`partition(N, host)` in the stream's subject transform),
which is a property of stored subjects.  Pure: no IO.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final, Literal, NamedTuple

from crr.schemas.errors import SubjectError

PREFIX = "crr.v1"
EVENTS_STREAM = "CRR_EVENTS"
SNAPSHOT_STREAM = "CRR_SNAPSHOT"

CATALOG = f"{PREFIX}.catalog"
DEADLETTER = f"{PREFIX}.deadletter"
SNAPSHOT_CATALOG = f"{PREFIX}.snapshot.catalog"
SNAPSHOT_CLUSTER = f"{PREFIX}.snapshot.cluster"
SNAPSHOT_PROJECTOR = f"{PREFIX}.snapshot.projector"
SNAPSHOT_HOST_PREFIX = f"{PREFIX}.snapshot.host."
ADMIN_HOST_PREFIX = f"{PREFIX}.admin.host."
"""`crr.v1.admin.host.<host>.<verb>`: an operator's instruction about a host (`forget`)."""
ADMIN_BRIDGE_PREFIX = f"{PREFIX}.admin.bridge."
"""`crr.v1.admin.bridge.<door>.<verb>`: an operator's instruction to a bridge (`release`)."""
ADMIN_BRIDGE_ALL = f"{ADMIN_BRIDGE_PREFIX}>"
"""Filter: every bridge instruction (a host's timeline shows the releases in its window)."""
ADMIN_ALL = f"{PREFIX}.admin.>"
REPORT_PREFIX = f"{PREFIX}.report."
"""Every Report subject starts with this (host or cluster scope)."""
REPORTS = f"{REPORT_PREFIX}>"
"""Filter: every Report."""
EVERYTHING = f"{PREFIX}.>"
"""Filter: every crr subject (the catch-all a `CRR_EVENTS` reader subscribes with)."""
SNAPSHOT_ALL = f"{PREFIX}.snapshot.>"
"""Filter: every `CRR_SNAPSHOT` record."""
STATUS_PARTITIONS = f"{SNAPSHOT_PROJECTOR}.*"
"""Filter: the status records of every partition (`crr.v1.snapshot.projector.<k>`)."""
LEASE = f"{PREFIX}.snapshot.lease"
"""The projector's lease record (partition `k`: `crr.v1.snapshot.lease.<k>`)."""

MSG_ID_HEADER: Final = "Nats-Msg-Id"
"""The JetStream de-duplication header every crr publish carries."""

EVENT_SUBJECTS = [
    CATALOG,
    DEADLETTER,
    REPORTS,
    f"{PREFIX}.inventory.>",
    f"{PREFIX}.health.>",
    ADMIN_ALL,
]
SNAPSHOT_SUBJECTS = [SNAPSHOT_ALL]

EventType = Literal["report", "inventory", "health"]
EVENT_TYPES: tuple[EventType, ...] = ("report", "inventory", "health")

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
"""A name that is its own token (most host and reporter names): matched in C."""
_HEX = "0123456789ABCDEF"


def token(s: str) -> str:
    """Encode a host or reporter name as one subject token."""
    if not s:
        raise SubjectError("a subject token must not be empty")
    if _SAFE_TOKEN.fullmatch(s):
        return s
    out = []
    for b in s.encode("utf-8"):
        if b in _SAFE:
            out.append(chr(b))
        else:
            out.append("=" + _HEX[b >> 4] + _HEX[b & 15])
    return "".join(out)


def untoken(t: str) -> str:
    """Decode a subject token made by `token`."""
    if "=" not in t:
        return t
    out = bytearray()
    i = 0
    while i < len(t):
        c = t[i]
        if c == "=":
            hx = t[i + 1:i + 3]
            if len(hx) != 2 or any(h not in _HEX for h in hx):
                raise SubjectError(f"bad escape at {i} in subject token {t!r}")
            out.append(int(hx, 16))
            i += 3
        else:
            out.append(ord(c))
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubjectError(f"subject token {t!r} is not UTF-8") from exc


def event_subject(kind: EventType, reporter: str, host: str | None) -> str:
    """`crr.v1.<kind>.host.<host>.<reporter>` or `crr.v1.<kind>.cluster.<reporter>`."""
    if host is None:
        return f"{PREFIX}.{kind}.cluster.{token(reporter)}"
    return f"{PREFIX}.{kind}.host.{token(host)}.{token(reporter)}"


def forget_subject(host: str) -> str:
    """`crr.v1.admin.host.<host>.forget`: where `crr hosts forget` publishes a Forget.

    Six tokens like a host event, so a partitioned stream stores it with the host's
    partition token and the owning partition's filter takes it."""
    return f"{ADMIN_HOST_PREFIX}{token(host)}.forget"


def parse_forget_subject(subject: str) -> str | None:
    """The host of a forget subject (as published, or stored with a partition token);
    None if `subject` is not one.  SubjectError for a malformed host token."""
    if not subject.startswith(ADMIN_HOST_PREFIX):
        return None
    parts = subject[len(ADMIN_HOST_PREFIX):].split(".")
    if len(parts) in (2, 3) and parts[1] == "forget" and (len(parts) == 2 or parts[2].isdigit()):
        return untoken(parts[0])
    return None


def release_subject(door: str) -> str:
    """`crr.v1.admin.bridge.<door>.release`: where `crr bridge release DOOR` publishes a
    BridgeRelease.  Five tokens and no host: a partitioned stream stores it as published,
    and no partition folds it (the bridge of `door` reads it)."""
    return f"{ADMIN_BRIDGE_PREFIX}{token(door)}.release"


def release_msg_id(door: str, nonce: str) -> str:
    """`Nats-Msg-Id` of a BridgeRelease (`release/<door token>/<nonce>`)."""
    return f"release/{token(door)}/{nonce}"


def host_snapshot_subject(host: str) -> str:
    """`crr.v1.snapshot.host.<host>`."""
    return SNAPSHOT_HOST_PREFIX + token(host)


def is_projector_status(subject: str) -> bool:
    """`crr.v1.snapshot.projector` (one projector) or `….projector.<k>` (partition k)."""
    return subject == SNAPSHOT_PROJECTOR or (
        subject.startswith(SNAPSHOT_PROJECTOR) and subject[len(SNAPSHOT_PROJECTOR)] == "."
        and subject[len(SNAPSHOT_PROJECTOR) + 1:].isdigit())


def status_subject(partition: int | None) -> str:
    """Where a projector writes its status: `crr.v1.snapshot.projector[.<partition>]`."""
    return SNAPSHOT_PROJECTOR if partition is None else f"{SNAPSHOT_PROJECTOR}.{partition}"


def status_partition(subject: str) -> int | None:
    """The partition whose status `subject` is (None: an unpartitioned projector's);
    SubjectError if `subject` is not a status subject (`is_projector_status`)."""
    if not is_projector_status(subject):
        raise SubjectError(f"not a projector status subject: {subject!r}")
    suffix = subject[len(SNAPSHOT_PROJECTOR) + 1:]
    return int(suffix) if suffix else None


def lease_subject(partition: int | None = None) -> str:
    """The lease record of the (partitioned) projector: `crr.v1.snapshot.lease[.<k>]`."""
    return LEASE if partition is None else f"{LEASE}.{partition}"


def _wild(name: str | None) -> str:
    return "*" if name is None else token(name)


def host_event_filter(
    kind: EventType | None = None, host: str | None = None, reporter: str | None = None,
) -> str:
    """A filter over published host event subjects, `crr.v1.<kind>.host.<host>.<reporter>`;
    a part that is None is the `*` wildcard (names are token-encoded)."""
    return f"{PREFIX}.{kind or '*'}.host.{_wild(host)}.{_wild(reporter)}"


def cluster_event_filter(kind: EventType | None = None, reporter: str | None = None) -> str:
    """A filter over cluster event subjects, `crr.v1.<kind>.cluster.<reporter>` (None: `*`)."""
    return f"{PREFIX}.{kind or '*'}.cluster.{_wild(reporter)}"


def host_history_filter(host: str) -> str:
    """Every stored event subject of `host` — reports, inventories, health, Forgets — as
    published or with a partition token: `crr.v1.*.host.<host>.>`."""
    return f"{PREFIX}.*.host.{token(host)}.>"


def partition_event_filter(partition: int) -> str:
    """The host events a partitioned `CRR_EVENTS` stores for `partition`:
    `crr.v1.*.host.*.*.<partition>`."""
    return f"{PREFIX}.*.host.*.*.{partition}"


PARTITION_SOURCE: Final = f"{PREFIX}.*.host.*.*"
"""What the partitioning subject transform of `CRR_EVENTS` applies to: host events."""


def partition_destination(partitions: int) -> str:
    """The transform's destination: the published subject plus `partition(N, host)`."""
    return (f"{PREFIX}.{{{{wildcard(1)}}}}.host.{{{{wildcard(2)}}}}.{{{{wildcard(3)}}}}"
            f".{{{{partition({partitions},2)}}}}")


def destination_partitions(destination: str) -> int:
    """N of a transform destination made by `partition_destination` (1: not partitioned)."""
    if "partition(" not in destination:
        return 1
    return int(destination.split("partition(", 1)[1].split(",", 1)[0])


def partition_of(host_token: str, partitions: int) -> int:
    """The partition `partition(N, host)` of the stream transform gives a host token.

    nats-server hashes the token's bytes with 32-bit FNV-1a, modulo N (checked
    against a real server in tests/projector/test_start_repartition.py).  Projectors use it to
    keep only their own hosts among events stored under an older layout.
    """
    h = 0x811C9DC5
    for b in host_token.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def owner(subject: str, partitions: int) -> int | None:
    """The partition that folds an event (published or stored subject) or writes a
    CRR_SNAPSHOT record: the host's `partition_of`; 0 for cluster and catalog subjects
    (every partition also folds the catalog); None for anything else (dead letters)."""
    parts = subject.split(".", 5)
    if len(parts) >= 5 and parts[3] == "host":  # crr.v1.<kind|snapshot>.host.<host>[…]
        return partition_of(parts[4], partitions)
    if subject in (CATALOG, SNAPSHOT_CATALOG, SNAPSHOT_CLUSTER) or (
            len(parts) == 5 and parts[3] == "cluster"):
        return 0
    return None


def owns(partition: int, partitions: int) -> Callable[[str], bool]:
    """Whether an event (published or stored subject) is partition `partition`'s to fold:
    the catalog (every partition's), cluster subjects (partition 0's) and its hosts.
    Remembers each host token's answer (the projector asks for every event)."""
    known: dict[str, bool] = {}

    def keep(subject: str) -> bool:
        parts = subject.split(".", 5)
        if len(parts) < 5:
            return subject == CATALOG
        if parts[3] == "cluster":
            return partition == 0
        if parts[3] != "host":
            return False
        mine = known.get(parts[4])
        if mine is None:
            mine = known[parts[4]] = partition_of(parts[4], partitions) == partition
        return mine

    return keep


def subject_template(subject: str) -> str:
    """The subject with its host and reporter tokens replaced (`crr.v1.report.host.{host}.
    {reporter}`): a low-cardinality name for spans and metrics."""
    parts = subject.split(".")
    if len(parts) >= 5 and parts[0] == "crr" and parts[2] in EVENT_TYPES:
        if parts[3] == "host" and len(parts) == 6:
            return f"{PREFIX}.{parts[2]}.host.{{host}}.{{reporter}}"
        if parts[3] == "cluster" and len(parts) == 5:
            return f"{PREFIX}.{parts[2]}.cluster.{{reporter}}"
    if subject.startswith(SNAPSHOT_HOST_PREFIX):
        return SNAPSHOT_HOST_PREFIX + "{host}"
    return subject


def snapshot_host(subject: str) -> str:
    """The host of a `crr.v1.snapshot.host.<host>` record subject; SubjectError if it is
    not one (or its host token is malformed)."""
    if not subject.startswith(SNAPSHOT_HOST_PREFIX):
        raise SubjectError(f"not a host snapshot subject: {subject!r}")
    return untoken(subject[len(SNAPSHOT_HOST_PREFIX):])


SnapshotKind = Literal["host", "cluster", "catalog", "projector"]
"""What a `CRR_SNAPSHOT` record is: a host record, the cluster record, the catalog in
force, or a projector's status (one per partition)."""


def snapshot_kind(subject: str) -> SnapshotKind | None:
    """The kind of record a `CRR_SNAPSHOT` subject holds; None for any other subject (the
    lease, or one this crr does not know).  Every reader of the snapshot routes by this."""
    if subject.startswith(SNAPSHOT_HOST_PREFIX):
        return "host"
    if subject == SNAPSHOT_CLUSTER:
        return "cluster"
    if subject == SNAPSHOT_CATALOG:
        return "catalog"
    if is_projector_status(subject):
        return "projector"
    return None


class EventAddress(NamedTuple):
    """What an event subject says: its type, the reporter and the host (None for cluster)."""

    kind: EventType
    reporter: str
    host: str | None


def published_subject(stored: str) -> str:
    """The subject an event was published on, from the one CRR_EVENTS stores it under.

    A partitioned stream (`crr.bus.streams.partition_transform`) stores host events
    as `crr.v1.<kind>.host.<host>.<reporter>.<partition>`; every reader that
    folds or parses stored events goes through this (or `parse_event_subject`,
    which accepts both forms), whatever layout stored the event.
    """
    if stored.count(".") == 6:  # the projector asks for every event: one cheap test first
        head, _, tail = stored.rpartition(".")
        if tail.isdigit() and ".host." in head:
            return head
    return stored


def parse_event_subject(subject: str) -> EventAddress:
    """Split an event subject (as published, or as a partitioned stream stores it);
    SubjectError if it is not one of the forms of docs/contract.md, "Subjects and streams"."""
    parts = subject.split(".")
    if len(parts) < 5 or parts[0] != "crr" or parts[1] != "v1" or parts[2] not in EVENT_TYPES:
        raise SubjectError(f"not a crr event subject: {subject!r}")
    kind: EventType = parts[2]
    if parts[3] == "host" and (len(parts) == 6 or (len(parts) == 7 and parts[6].isdigit())):
        return EventAddress(kind, untoken(parts[5]), untoken(parts[4]))
    if parts[3] == "cluster" and len(parts) == 5:
        return EventAddress(kind, untoken(parts[4]), None)
    raise SubjectError(f"not a crr event subject: {subject!r}")


def msg_id(reporter: str, host: str | None, boot: str, seq: int) -> str:
    """`Nats-Msg-Id` of an event: `<reporter>/<host or _cluster>/<boot>/<seq>`.

    Report, Inventory and Health share one `seq` counter per (reporter, host,
    boot) in crr's publishers, so the id is unique across the three types.
    """
    return f"{reporter}/{host if host is not None else '_cluster'}/{boot}/{seq}"


def catalog_msg_id(nonce: str) -> str:
    """`Nats-Msg-Id` of a catalog publish (`catalog/<nonce>`: each apply is a new event)."""
    return f"catalog/{nonce}"


def forget_msg_id(host: str, nonce: str) -> str:
    """`Nats-Msg-Id` of a Forget (`forget/<host token>/<nonce>`)."""
    return f"forget/{token(host)}/{nonce}"


def deadletter_msg_id(seq: int) -> str:
    """`Nats-Msg-Id` of the dead letter of `CRR_EVENTS` event `seq` (`deadletter/<seq>`: a
    projector that restarts and dead-letters it again is de-duplicated)."""
    return f"deadletter/{seq}"
