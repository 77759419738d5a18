"""Subject names and the subject-token encoding of DESIGN §3.

`token(s)`: each UTF-8 byte outside `[A-Za-z0-9_-]` becomes `=XX`
(uppercase hex).  Injective, and valid in NATS subjects and KV keys.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from schemas.errors import SubjectError

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


EVENT_SUBJECTS = [
    CATALOG,
    DEADLETTER,
    f"{PREFIX}.report.>",
    f"{PREFIX}.inventory.>",
    f"{PREFIX}.health.>",
    f"{PREFIX}.admin.>",
]
SNAPSHOT_SUBJECTS = [f"{PREFIX}.snapshot.>"]

EventType = Literal["report", "inventory", "health"]
EVENT_TYPES: tuple[EventType, ...] = ("report", "inventory", "health")

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_HEX = "0123456789ABCDEF"


def token(s: str) -> str:
    """Encode a host or reporter name as one subject token."""
    if not s:
        raise SubjectError("a subject token must not be empty")
    if s.isascii() and all(b in _SAFE for b in s.encode()):
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


def host_snapshot_subject(host: str) -> str:
    """`crr.v1.snapshot.host.<host>`."""
    return SNAPSHOT_HOST_PREFIX + token(host)


def is_projector_status(subject: str) -> bool:
    """`crr.v1.snapshot.projector` (one projector) or `….projector.<k>` (partition k)."""
    return subject == SNAPSHOT_PROJECTOR or (
        subject.startswith(SNAPSHOT_PROJECTOR) and subject[len(SNAPSHOT_PROJECTOR)] == "."
        and subject[len(SNAPSHOT_PROJECTOR) + 1:].isdigit())


class EventAddress(NamedTuple):
    """What an event subject says: its type, the reporter and the host (None for cluster)."""

    kind: EventType
    reporter: str
    host: str | None


def published_subject(stored: str) -> str:
    """The subject an event was published on, from the one CRR_EVENTS stores it under.

    A partitioned stream (`bus.streams.partition_transform`) stores host events
    as `crr.v1.<kind>.host.<host>.<reporter>.<partition>`; every reader that
    folds or parses stored events goes through this (or `parse_event_subject`,
    which accepts both forms), whatever layout stored the event.
    """
    if stored.count(".") == 6:
        head, _, tail = stored.rpartition(".")
        if tail.isdigit() and ".host." in head:
            return head
    return stored


def parse_event_subject(subject: str) -> EventAddress:
    """Split an event subject (as published, or as a partitioned stream stores it);
    SubjectError if it is not one of DESIGN §3's forms."""
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
