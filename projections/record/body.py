"""A host record's body: written from the fold's state in pieces, read lean by the columns.

**Written** (`host_record`, `cluster_record`): the projector's hot path, one
record per report.  The bytes are `crr.schemas.codec.encode` of
`crr.projections.record.snapshot.host_snapshot`, byte for byte
(`tests/projections/test_record_encoding.py` checks it), built with less work: the
fresh entries of one batch differ only in their value (and their lifetime),
so each (batch, lifetime) is encoded once with stand-ins and cut around them
(`_entry_frame`, `_form`); an entry is then that head + the encoded value +
that tail.  Stale and unknown entries (rare) are encoded whole.

**Read in full** with `crr.schemas.codec.DECODERS[HostSnapshot]` (the view's
`get`, REST, `crr hosts`).

**Read lean** (`lean_decoder`): the scheduler view's columns need only each
value's `state`, `value` and expiry, of the catalog's host resources.  A
lean decoder for those names decodes just that — msgspec skips every other
field (reporter, three timestamps, the last value; the inventory and the
reporter statuses) without building objects for it — and nothing of it is
kept: the columns take what they need and the record's bytes stay for
`get()`/explain.  Expiry: the numeric twin `expires_ts` (docs/contract.md, "Payloads": "entries
may carry numeric epoch-seconds twins of their times") when the record has
one (`TwinEntry`: no string per value), otherwise the RFC 3339 `expires_at`
string is parsed (records written before the twins: `LeanEntry`).  These
are read-only views of the wire type, never encoded.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import msgspec

from crr.projections.record.snapshot import fmt, record_parts
from crr.projections.state import Batch, ProjectionState, Record
from crr.schemas.codec import encode
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ValueEntry, ValueState

encode_sorted: Final = msgspec.json.Encoder(order="sorted").encode
"""`crr.schemas.codec.encode` without the call through it (the same settings: sorted keys)."""

# -- written: the spliced encoder ---------------------------------------------

_SENTINEL = "\x00crr:value\x00"
"""Stands for the value in an encoded entry that is split into its shared head and tail."""
_SENTINEL_JSON = encode(_SENTINEL)
_encode = encode_sorted


def host_record(state: ProjectionState, host: str) -> bytes:
    """`encode(host_snapshot(state, host))`, byte for byte, built with less work (the
    projector writes one per report: see `_encoded_values`)."""
    rec = state.hosts[host]
    return encode(HostSnapshot(host=host, **record_parts(
        state, rec, "host", _encoded_values(state, rec, "host"))))


def cluster_record(state: ProjectionState) -> bytes:
    """`encode(cluster_snapshot(state))`, byte for byte (see `host_record`)."""
    rec = state.cluster
    return encode(ClusterSnapshot(**record_parts(
        state, rec, "cluster", _encoded_values(state, rec, "cluster"))))


def _encoded_values(state: ProjectionState, rec: Record,
                    scope: str) -> dict[str, msgspec.Raw] | msgspec.Raw:
    """`value_entries`, each entry already encoded (see the module doc)."""
    out: dict[str, msgspec.Raw] = {}
    lifetimes = state.plan.lifetimes
    raw = msgspec.Raw
    enc = _encode
    if len(rec.reporters) == 1:
        whole = _one_batch(state, rec, scope)
        if whole is not None:
            return whole
    for reporter, rs in rec.reporters.items():
        uniform = state.plan.uniform_life.get((reporter, scope))
        for b in rs.batches:  # oldest first: a newer batch's entry replaces an older one
            received = fmt(b.received_at)
            stale = b.stale
            if not stale and uniform is not None:
                # The steady state: a report of values of one lifetime, all fresh.
                values = b.vals
                if None not in values:
                    head, tail = _form(reporter, b, received, uniform)
                    out.update(zip(b.names, [raw(head + enc(v) + tail) for v in values],
                                   strict=True))
                    continue
            forms: dict[float, tuple[bytes, bytes]] = {}  # lifetime -> (head, tail)
            for name, value in zip(b.names, b.vals, strict=True):
                since = stale.get(name) if stale else None
                if since is not None:
                    at = fmt(since)
                    out[name] = raw(enc(ValueEntry(
                        value=None, state="stale", reporter=reporter, observed_at=b.observed_at,
                        received_at=received, expires_at=at, last_value=value, stale_since=at,
                        received_ts=b.received_at, expires_ts=since)))
                    continue
                life = lifetimes[name]
                if value is None:
                    out[name] = raw(enc(ValueEntry(
                        value=None, state="unknown", reporter=reporter,
                        observed_at=b.observed_at, received_at=received,
                        expires_at=fmt(b.received_at + life), received_ts=b.received_at,
                        expires_ts=b.received_at + life)))
                    continue
                form = forms.get(life)
                if form is None:
                    form = forms[life] = _form(reporter, b, received, life)
                out[name] = raw(form[0] + enc(value) + form[1])
    return out


def _one_batch(state: ProjectionState, rec: Record, scope: str) -> msgspec.Raw | None:
    """The values object of a record whose one reporter's one batch holds all its values,
    all fresh and known, of one lifetime (a host's steady state), encoded in one piece;
    else None.

    A batch's names are in sorted order already (`crr.projections.state.Batch.names`),
    the order the encoder sorts keys in, so the entries are joined as they come."""
    ((reporter, rs),) = rec.reporters.items()
    if len(rs.batches) != 1:
        return None
    b = rs.batches[0]
    uniform = state.plan.uniform_life.get((reporter, scope))
    if b.stale or uniform is None or not b.names:
        return None
    values = b.vals
    if None in values:
        return None
    head, tail = _form(reporter, b, fmt(b.received_at), uniform)
    joints = _joints(b.names, tail)
    if joints is None:
        return None
    first, after = joints
    # head.join: `{"a":` head v1 `},"b":` head v2 ... head vn `}}` (tail = `}`, say).
    parts = [first]
    parts += map(operator.add, map(_encode, values), after)
    return msgspec.Raw(head.join(parts))


@functools.lru_cache(maxsize=256)
def _joints(order: tuple[str, ...], tail: bytes) -> tuple[bytes, list[bytes]] | None:
    """What goes around the entries of a values object of the names `order`:
    `{"first":`, and after each value its entry's tail, then `,"next":` or the final `}`
    (once per reporter, names and entry tail); None if `order` is not sorted (the
    entries would not come in the encoder's order)."""
    if list(order) != sorted(order):
        return None
    keys = [_encode(name) + b":" for name in order]
    return b"{" + keys[0], [tail + b"," + k for k in keys[1:]] + [tail + b"}"]


def _form(reporter: str, b: Batch, received: str, life: float) -> tuple[bytes, bytes]:
    """(head, tail) of an encoded fresh entry of batch `b` with lifetime `life`: the
    entry of a value `v` is head + its encoding + tail (built from `_entry_frame`)."""
    p0, p1, p2, p3, p4, p5, tail = _entry_frame(reporter)
    expires = b.received_at + life
    head = b"".join((p0, _encode(fmt(expires)), p1, _encode(expires), p2,
                     _encode(b.observed_at), p3, _encode(received), p4,
                     _encode(b.received_at), p5))
    return head, tail


_STAND_INS = ("\x00crr:expires_at\x00", -1.2345678901234567e-299, "\x00crr:observed_at\x00",
              "\x00crr:received_at\x00", -2.2345678901234567e-299)
"""Stand-ins for an entry's expires_at, expires_ts, observed_at, received_at and received_ts
(their fields in the order the encoder writes them: sorted keys), then the value."""


@functools.lru_cache(maxsize=1024)
def _entry_frame(reporter: str) -> tuple[bytes, ...]:
    """A fresh entry of `reporter` encoded with stand-ins, cut around them: seven pieces
    that `_form` joins with the encoded times (once per reporter name)."""
    e_at, e_ts, o_at, r_at, r_ts = _STAND_INS
    whole = _encode(ValueEntry(
        value=_SENTINEL, state="fresh", reporter=reporter, observed_at=o_at, received_at=r_at,
        expires_at=e_at, received_ts=r_ts, expires_ts=e_ts))
    pieces: list[bytes] = []
    for stand_in in _STAND_INS:  # (written before `reporter`: the first match is the field)
        before, found, whole = whole.partition(_encode(stand_in))
        assert found, "the entry's fields are encoded in the order of `_STAND_INS`"
        pieces.append(before)
    before, found, tail = whole.rpartition(_SENTINEL_JSON)  # `value`: the last field
    assert found, "an entry's value is where the stand-in was encoded"
    return (*pieces, before, tail)


# -- read lean: what the columns need -------------------------------------------


class LeanEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One value entry as the columns see it (see the module doc).

    `gc=False`: one is built per value of every decoded record and dropped
    right after; none may join the long-lived object graph the cyclic
    collector scans.
    """

    value: Any
    state: ValueState
    expires_at: str
    expires_ts: float | None = None
    """Epoch seconds of `expires_at` (absent in records written before the twins)."""


class TwinEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """`LeanEntry` for records that carry the `expires_ts` twin (every record the projector
    writes now): the twin is required and `expires_at` is skipped unread, so a decode builds
    no string per value.  A record without twins fails this decode (ValidationError) and is
    read with `LeanEntry` instead; `state` is a Literal, so it is one of the Literal's own
    strings, not a new one."""

    value: Any
    state: ValueState
    expires_ts: float


ABSENT_ENTRY: Final = LeanEntry(value=None, state="absent",  # type: ignore[arg-type]  # a sentinel
                                expires_at="", expires_ts=math.inf)
"""What a lean record holds for a resource it has no value of (compare with `is`)."""


class LeanRecord(Protocol):
    """A host record decoded by a `lean_decoder`: its name and one entry per column."""

    host: str
    values: Any
    """A Struct with one `LeanEntry` field per resource the decoder was built for
    (`ABSENT_ENTRY` where the record has no value); the decoder's reader gives them all in
    that order."""


def lean_fields(count: int) -> list[Callable[[Any], Any]]:
    """Getters of each resource's entry in a `lean_decoder`'s values (or a
    `crr.projections.record.columns.columns_decoder`'s `v`), in the order of its names (`count`
    of them)."""
    return [operator.attrgetter(f) for f in field_names(count)]


def field_names(count: int) -> list[str]:
    """The Struct field names of `count` resources in a lean decode (renamed to the wire
    names)."""
    return [f"v{i}" for i in range(count)]


def lean_decoder(names: Sequence[str], entry: type[LeanEntry | TwinEntry] = LeanEntry,
                 ) -> tuple[msgspec.json.Decoder[Any], Callable[[Any], Any]]:
    """A decoder of host records that reads only the values of `names` (as `entry`), and its
    reader.

    Every resource is a field of one Struct (renamed to its wire name), so a
    record decodes to one object per value and no dict; values of other
    names are skipped unread.  The reader (`operator.attrgetter` of all the
    fields) gives a record's entries as a tuple in the order of `names`.
    """
    fields = field_names(len(names))
    values = msgspec.defstruct(
        "LeanValues", [(f, entry, ABSENT_ENTRY) for f in fields],
        rename=dict(zip(fields, names, strict=True)), frozen=True, gc=False, kw_only=True)
    record = msgspec.defstruct(
        "LeanRecord", [("host", str), ("values", values, msgspec.field(default_factory=values))],
        frozen=True, gc=False, kw_only=True)
    if len(fields) == 1:
        one = operator.attrgetter(fields[0])
        return msgspec.json.Decoder(record), lambda v: (one(v),)
    getter = operator.attrgetter(*fields) if fields else (lambda _v: ())
    return msgspec.json.Decoder(record), getter
