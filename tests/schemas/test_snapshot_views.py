"""The partial read views of the host record (`crr.schemas.snapshot_views`) are subsets of
the full type: every field of a view is a field of the full type with the same name and
type, checked recursively through the structs they hold (STYLE: one home per wire type)."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import msgspec
import pytest

from crr.schemas import snapshot_views
from crr.schemas.snapshot import AsOf, ClusterSnapshot, HostSnapshot, ValueEntry
from crr.schemas.snapshot_views import VIEWS


def _is_struct(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, msgspec.Struct)


def mismatches(view: type[msgspec.Struct], full: type[msgspec.Struct],
               where: str = "") -> list[str]:
    """Where `view` is not a subset of `full` (empty: it is)."""
    fields = {f.name: f for f in msgspec.structs.fields(full)}
    out: list[str] = []
    for f in msgspec.structs.fields(view):
        path = f"{where or view.__name__}.{f.name}"
        if f.name not in fields:
            out.append(f"{path}: no such field in {full.__name__}")
            continue
        if f.encode_name != fields[f.name].encode_name:
            out.append(f"{path}: wire name {f.encode_name!r} != {fields[f.name].encode_name!r}")
        out += _type_mismatches(f.type, fields[f.name].type, path)
    return out


def _type_mismatches(v: Any, t: Any, path: str) -> list[str]:
    if _is_struct(v):
        if not _is_struct(t):
            return [f"{path}: a struct where {full_name(t)} is"]
        return mismatches(v, t, path)
    if v == t:
        return []
    # A view reads host and cluster records alike: it may take None where the host's is.
    if typing.get_origin(v) in (typing.Union, types.UnionType) and type(None) in typing.get_args(v):
        rest = [a for a in typing.get_args(v) if a is not type(None)]
        if len(rest) == 1 and typing.get_origin(t) not in (typing.Union, types.UnionType):
            return _type_mismatches(rest[0], t, path)
    vo, to = typing.get_origin(v), typing.get_origin(t)
    if vo is not None and vo == to:
        va, ta = typing.get_args(v), typing.get_args(t)
        if len(va) == len(ta):
            return [m for i, (a, b) in enumerate(zip(va, ta, strict=True))
                    for m in _type_mismatches(a, b, f"{path}[{i}]")]
    return [f"{path}: {full_name(v)} != {full_name(t)}"]


def full_name(t: Any) -> str:
    return getattr(t, "__name__", repr(t))


@pytest.mark.parametrize("view", list(VIEWS), ids=lambda v: v.__name__)
def test_every_view_is_a_subset_of_the_full_type(view: type[msgspec.Struct]) -> None:
    """Each field of a view: a field of the full type, same name, same type (recursively)."""
    assert mismatches(view, VIEWS[view]) == []


def test_every_struct_in_the_module_is_a_listed_view() -> None:
    """A view added without its full type in `VIEWS` would escape the check above."""
    structs = {c for _, c in inspect.getmembers(snapshot_views, _is_struct)
               if c.__module__ == snapshot_views.__name__}
    assert structs == set(VIEWS)


def test_host_and_cluster_records_share_the_fields_views_read() -> None:
    """The record views read cluster records too: ClusterSnapshot's fields are HostSnapshot's
    (without `host`), so checking against HostSnapshot covers both."""
    assert mismatches(ClusterSnapshot, HostSnapshot) == []


class Renamed(msgspec.Struct):
    expiry_ts: float | None = None


class Retyped(msgspec.Struct):
    state: int = 0


class Outer(msgspec.Struct):
    values: dict[str, Retyped] = msgspec.field(default_factory=dict)


def test_the_check_catches_a_renamed_or_retyped_field() -> None:
    """The check itself fails on a field the full type lacks, or of another type, nested too
    (a check that always passes would prove nothing)."""

    assert mismatches(Renamed, ValueEntry) == [
        "Renamed.expiry_ts: no such field in ValueEntry"]
    assert len(mismatches(Retyped, ValueEntry)) == 1
    assert mismatches(Outer, HostSnapshot)[0].startswith("Outer.values[1].state:")


def test_a_view_decodes_a_full_record_as_the_full_type_does() -> None:
    """Decoding a full host record through a view gives the same values for its fields."""
    rec = HostSnapshot(
        host="n1", as_of=AsOf(seq=7, time="2026-01-01T00:00:00Z", ts=1.5),
        values={"x": ValueEntry(value=3, state="stale", reporter="r", observed_at="o",
                                received_at="a", expires_at="e", expires_ts=9.0)})
    data = msgspec.json.encode(rec)
    due = msgspec.json.decode(data, type=snapshot_views.DueRecord)
    assert (due.as_of.seq, due.as_of.ts, due.host) == (7, 1.5, "n1")
    assert (due.values["x"].state, due.values["x"].expires_ts) == ("stale", 9.0)
    census = msgspec.json.decode(data, type=snapshot_views.CensusRecord)
    assert census.values["x"].state == "stale"
    assert msgspec.json.decode(data, type=snapshot_views.SeqRecord).as_of.seq == 7

