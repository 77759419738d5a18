"""Events reporters publish to `CRR_EVENTS`: Report, Inventory, Health (docs/contract.md,
"Payloads").

Frozen, keyword-only msgspec Structs.  Unknown fields are ignored so old
readers skip fields added later; missing required fields are an error.
Schema evolution: new fields get defaults, a field's type never changes, a
name is never reused (tests/golden holds encoded samples of every type).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from crr.schemas.errors import PayloadError

HealthState = Literal[
    "ok", "failed", "timeout", "bad_output", "crashed", "restarting", "quarantined",
    "not_applicable", "stopped", "held", "holding",
]
HEALTH_STATES: tuple[str, ...] = (
    "ok", "failed", "timeout", "bad_output", "crashed", "restarting", "quarantined",
    "not_applicable", "stopped", "held", "holding",
)
"""`held` and `holding` are a bridge's (docs/contract.md, bridge health): `held`, its guard
holds changes that exceed a limit; `holding`, crr's own input is behind and the bridge
holds the last state.  Added later: a projector from before them dead-letters such a
Health, so upgrade projectors before bridges."""
FAILING_HEALTH_STATES = frozenset({"failed", "timeout", "bad_output", "crashed", "quarantined",
                                   "held"})

# A reported value as decoded from JSON: number, bool, string, list of strings or null.
Value = Any


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """One reporter's measured values (docs/contract.md, "Payloads": Report)."""

    reporter: str
    boot: str
    seq: int
    observed_at: str
    values: dict[str, Value]
    host: str | None = None


def non_finite(values: Mapping[str, Any]) -> list[str]:
    """The names whose value is NaN or ±infinity, which no report can carry.

    JSON has no such numbers: msgspec would encode them as `null`, which the
    projector stores as "the reporter cannot tell" — not what the reporter meant.
    """
    return [name for name, v in values.items() if isinstance(v, float) and not math.isfinite(v)]


def check_finite(values: Mapping[str, Any]) -> None:
    """Refuse NaN and ±infinity before they are published (PayloadError naming each)."""
    bad = [f"{name}={values[name]!r}" for name in non_finite(values)]
    if bad:
        raise PayloadError(f"not a finite number: {', '.join(bad)} (numeric values must be "
                           "finite; report None/null for 'cannot tell')")


class Attribute(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A device attribute: exactly one of the four fields is set (checked by the fold)."""

    # Field names shadow the builtins inside the class body (and msgspec resolves
    # annotations there), so the types are spelled via `builtins`.
    int: builtins.int | None = None
    bool: builtins.bool | None = None
    string: str | None = None
    version: str | None = None


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    """A device capacity, a Kubernetes quantity string such as `80Gi`."""

    value: str


class Device(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One device of an inventory pool (shaped like a DRA ResourceSlice device)."""

    name: str
    attributes: dict[str, Attribute] = msgspec.field(default_factory=dict)
    capacity: dict[str, Capacity] = msgspec.field(default_factory=dict)


class Pool(msgspec.Struct, frozen=True, kw_only=True):
    """The pool a slice of devices belongs to; generation increases on every change."""

    name: str
    generation: int = 0


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    """A reporter's device inventory (docs/contract.md, "Payloads": Inventory)."""

    reporter: str
    boot: str
    seq: int
    observed_at: str
    pool: Pool
    devices: list[Device] = msgspec.field(default_factory=list)
    host: str | None = None


class Health(msgspec.Struct, frozen=True, kw_only=True):
    """A reporter lifecycle change seen by the agent or an external runner (docs/contract.md,
    "Payloads": Health)."""

    reporter: str
    boot: str
    at: str
    state: HealthState
    host: str | None = None
    detail: str | None = None
    exit_code: int | None = None
    seq: int = 0
    """Position in the publisher's sequence for this boot (used for Nats-Msg-Id)."""


class Forget(msgspec.Struct, frozen=True, kw_only=True):
    """`crr.v1.admin.host.<host>.forget` (`crr hosts forget`): drop everything about a host,
    or (with `reporter`) one reporter's row on it.

    The projector folds a whole-host Forget by deleting the host from its state and
    writing an empty record (a delete marker) on `crr.v1.snapshot.host.<host>`; events
    of the host stored before it are purged by the same command.  Later events bring
    the host back.
    """

    host: str
    requested_at: str
    by: str | None = None
    """Who asked (free text: user@machine), for the record."""
    reporter: str | msgspec.UnsetType = msgspec.UNSET
    """Forget only this reporter on the host: its status row, its values and its
    inventory (a reporter removed from the catalog, a `rejecting` row of a name that was
    never declared).  Added after the whole-host Forget; left out of the encoded event
    when not set, so a whole-host Forget keeps its bytes.  A projector from before the
    field ignores it and forgets the whole host: upgrade projectors before using it."""


class BridgeRelease(msgspec.Struct, frozen=True, kw_only=True):
    """`crr.v1.admin.bridge.<door>.release` (`crr bridge release DOOR [--for D]`): an admin
    lets a held bridge apply what its guard holds.

    `for_seconds` 0: the changes held by the current trip, once; more: the guard is off
    for that long.  The bridge reads it live; the projector folds it as a no-op (it is in
    `CRR_EVENTS` for the record: `crr events export`, `crr replay`)."""

    door: str
    requested_at: str
    by: str | None = None
    """Who released (free text: user@machine)."""
    for_seconds: float = 0.0
    reason: str | None = None


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    """What `crr.v1.deadletter` carries: an event the projector could not apply, and why."""

    seq: int
    subject: str
    reason: str
    payload: str
    """The original payload, decoded as UTF-8 with replacement, cut to 4 KiB."""
    received_at: str
