"""Value and inventory validation against the catalog (docs/contract.md, "Payloads" and
"`resources.yaml`"): the one rule.

Three forms of one rule, kept together and tested to agree
(tests/projections/test_validation.py): `validate_value` (the rule, with the reason a
value is refused), `value_type` (its msgspec form, for the fold's typed
fast path) and `normalize` (what a reader of the snapshot makes of a stored
value for `select[]`).

A reported value is checked against its resource's kind and bounds and
turned into its canonical form (a string set is sorted and de-duplicated, so
equal sets encode to equal bytes).  `None` is always valid: the reporter
says it cannot tell, and the value becomes `unknown`.  A failure is a
`Rejected` carrying a one-line reason that names the resource; the fold
records it on the reporter and keeps the previous value.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Final

from msgspec import Meta

from crr.schemas.catalog import Kind, ResourceSpec
from crr.schemas.events import Device

MAX_NAME_IN_REASON: Final = 64
"""Names quoted in a reason are cut to this length (a hostile report can't bloat the snapshot)."""

FLOAT_MAX: Final = 1.7976931348623157e308


class Rejected:
    """Why a value or an inventory was refused."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Rejected({self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rejected) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash(self.reason)


def short(name: str) -> str:
    """`name`, cut for quoting in a reason."""
    if len(name) <= MAX_NAME_IN_REASON:
        return name
    return name[:MAX_NAME_IN_REASON] + f"…({len(name)} chars)"


def describe(value: Any) -> str:
    """A short description of a bad value for a reason (never the whole value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return f"{value:g}"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else f"an integer of {len(str(value))} digits"
    if isinstance(value, str):
        return f"a string of {len(value)} characters" if len(value) > 32 else repr(value)
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def validate_value(name: str, spec: ResourceSpec, value: Any) -> Any:
    """The canonical form of `value` for resource `name`, or a `Rejected` saying why.

    numeric: a finite int or float (never a bool) within `min`/`max`;
    boolean: a bool; string: a str of at most `max_length` characters;
    string_set: a list of str with at most `max_items` distinct members,
    returned sorted and de-duplicated.  `None` is valid (unknown).
    """
    if value is None:
        return None
    kind = spec.kind
    if kind == "numeric":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return Rejected(f"{short(name)}: expected a finite number, got {describe(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            return Rejected(f"{short(name)}: expected a finite number, got {describe(value)}")
        if isinstance(value, int) and not -FLOAT_MAX <= value <= FLOAT_MAX:
            return Rejected(f"{short(name)}: number out of range, got {describe(value)}")
        if spec.min is not None and value < spec.min:
            return Rejected(f"{short(name)}: {describe(value)} is below the minimum {spec.min:g}")
        if spec.max is not None and value > spec.max:
            return Rejected(f"{short(name)}: {describe(value)} is above the maximum {spec.max:g}")
        return value
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        return Rejected(f"{short(name)}: expected true or false, got {describe(value)}")
    if kind == "string":
        if not isinstance(value, str):
            return Rejected(f"{short(name)}: expected a string, got {describe(value)}")
        if len(value) > spec.max_length:
            return Rejected(f"{short(name)}: string of {len(value)} characters exceeds "
                            f"max_length {spec.max_length}")
        return value
    # string_set
    if not isinstance(value, list):
        return Rejected(f"{short(name)}: expected a list of strings, got {describe(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            return Rejected(f"{short(name)}: expected a list of strings, item {i} is "
                            f"{describe(item)}")
    members = sorted(set(value))
    if len(members) > spec.max_items:
        return Rejected(f"{short(name)}: {len(members)} members exceed max_items {spec.max_items}")
    return members


def normalize(kind: Kind, value: Any) -> Any:
    """The reader's half of the rule: the value as `select[]` sees it, or None when it is
    null or not of `kind`.

    numeric → finite float (bool is not a number), boolean → bool,
    string → str, string_set → frozenset[str].  Bounds, lengths and sizes are
    not checked again: the projector stored only values `validate_value`
    accepted (and drops those a new catalog refuses); the kind is checked
    because a reader's catalog may declare another kind than the writer's.
    Whatever `validate_value` accepts, this accepts (tests/projections/test_validation.py).
    """
    if value is None:
        return None
    if kind == "numeric":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        try:
            f = float(value)
        except OverflowError:
            return None
        return f if math.isfinite(f) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if kind == "string":
        return value if isinstance(value, str) else None
    if isinstance(value, list | tuple | set | frozenset) and all(isinstance(m, str) for m in value):
        return frozenset(value)
    return None


def value_type(spec: ResourceSpec) -> Any:
    """The msgspec type of `validate_value`'s rule for `spec`, for a typed decoder.

    It accepts a subset of what `validate_value` accepts *unchanged* (a
    string set only if its members are strings; sorting and de-duplicating
    stay with the caller): a report that decodes with it needs no further
    check, and one that does not is checked value by value with
    `validate_value`, which says why.  The fold's fast path decodes with it
    (`crr.projections.plan`); tests/projections/test_validation.py holds the two to agreement.
    """
    if spec.kind == "numeric":
        lo = spec.min if spec.min is not None else -FLOAT_MAX
        hi = spec.max if spec.max is not None else FLOAT_MAX
        int_meta = Meta(ge=math.ceil(lo) if spec.min is not None else None,
                        le=math.floor(hi) if spec.max is not None else None)
        return Annotated[int, int_meta] | Annotated[float, Meta(ge=lo, le=hi)] | None
    if spec.kind == "boolean":
        return bool | None
    if spec.kind == "string":
        return Annotated[str, Meta(max_length=spec.max_length)] | None
    return Annotated[list[str], Meta(max_length=spec.max_items)] | None


def validate_devices(devices: list[Device]) -> Rejected | None:
    """None if an inventory's devices are well-formed, else why not.

    Each attribute has exactly one of `int`, `bool`, `string`, `version`;
    device names are non-empty and unique within the pool.
    """
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        if not dev.name:
            return Rejected(f"inventory: device {i} has an empty name")
        if dev.name in seen:
            return Rejected(f"inventory: duplicate device name {short(dev.name)!r}")
        seen.add(dev.name)
        for attr_name, attr in dev.attributes.items():
            n = ((attr.int is not None) + (attr.bool is not None) + (attr.string is not None)
                 + (attr.version is not None))
            if n != 1:
                return Rejected(
                    f"inventory: device {short(dev.name)!r} attribute {short(attr_name)!r} "
                    f"must have exactly one of int, bool, string, version (has {n})"
                )
    return None
