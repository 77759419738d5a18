"""Golden wire samples: every type decodes and re-encodes to the same bytes (schema evolution).

The files under tests/golden/ are the contract other languages build on;
a change that breaks one of these tests is a wire change (docs/contract.md, "Schema evolution").
`*.future.json` are events with a field a later version might add: today's
readers must skip it.  `projector_status.before_partitions.json` is a status
record from before `covered_seq`/`partitions`, `catalog.before_tty.json` a
catalog from before a reporter's `tty`: they must still decode.
`*.before_checkpoint.json` are records from before the checkpoint fields
(numeric time twins, `rejected_total`, `missing`, the status's catalog and
start): they decode with those fields' defaults.
`projector_status.before_watermark.json` is a status from before `watermark`/
`watermark_ts`.  `projector_status.before_next_due.json` is a status of checkpoint format 1, from
before `next_due_ts`.  `forget.reporter.json` is a Forget of one reporter's row, the
field added after `forget.json`'s whole-host Forget, which keeps its bytes.
`bridge_release.json` is `crr bridge release slurm`'s admin event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from crr.projections.freshness import watermark_of
from crr.schemas.catalog import Catalog
from crr.schemas.codec import decode, decode_event, encode
from crr.schemas.events import BridgeRelease, DeadLetter, Forget, Health, Inventory, Report
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus
from crr.schemas.wire_time import parse_time

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

SAMPLES: dict[str, type[Any]] = {
    "report": Report,
    "inventory": Inventory,
    "health": Health,
    "catalog": Catalog,
    "host_snapshot": HostSnapshot,
    "cluster_snapshot": ClusterSnapshot,
    "projector_status": ProjectorStatus,
    "projector_status.partition": ProjectorStatus,
    "projector_status.rebuilding": ProjectorStatus,
    "deadletter": DeadLetter,
    "forget": Forget,
    "forget.reporter": Forget,
    "bridge_release": BridgeRelease,
}


@pytest.mark.parametrize(("name", "type_"), sorted(SAMPLES.items()))
def test_golden_round_trip(name: str, type_: type[Any]) -> None:
    """Decoding a golden sample and encoding it again gives the very same bytes."""
    data = (GOLDEN / f"{name}.json").read_bytes().rstrip(b"\n")
    obj = decode(data, type_)
    assert isinstance(obj, type_)
    assert encode(obj) == data


@pytest.mark.parametrize("name", ["report", "inventory", "health"])
def test_events_ignore_unknown_fields(name: str) -> None:
    """An event with a field added by a later version still decodes, equal to today's sample."""
    future = (GOLDEN / f"{name}.future.json").read_bytes()
    current = (GOLDEN / f"{name}.json").read_bytes()
    assert b"added_in_v1_1" in future
    type_ = SAMPLES[name]
    assert decode_event(future, type_) == decode_event(current, type_)


def test_status_from_before_partitions_decodes() -> None:
    """A status record written before `covered_seq`/`partitions` existed decodes with their
    defaults (unpartitioned, coverage "not said"), otherwise equal to today's sample."""
    old = decode((GOLDEN / "projector_status.before_partitions.json").read_bytes(),
                 ProjectorStatus)
    current = decode((GOLDEN / "projector_status.before_checkpoint.json").read_bytes(),
                     ProjectorStatus)
    assert (old.covered_seq, old.partitions) == (0, None)
    assert msgspec.structs.replace(old, covered_seq=current.covered_seq) == current


_NO_WATERMARK: dict[str, Any] = {"watermark": "", "watermark_ts": None}
"""The status's watermark fields as an older writer (before them) leaves them."""


def test_status_from_before_watermark_decodes() -> None:
    """A status written before `watermark`/`watermark_ts` decodes with their defaults, so
    readers judge it at its `last_tick` (`crr.projections.freshness.watermark_of`);
    today's sample carries both, equal."""
    old = decode((GOLDEN / "projector_status.before_watermark.json").read_bytes(),
                 ProjectorStatus)
    new = decode((GOLDEN / "projector_status.json").read_bytes(), ProjectorStatus)
    assert (old.watermark, old.watermark_ts) == ("", None)
    assert watermark_of([old]) == parse_time(old.last_tick)
    assert (new.watermark, new.watermark_ts) == ("2027-01-15T08:00:19.500Z", 1800000019.5)
    assert parse_time(new.watermark) == new.watermark_ts == watermark_of([new])
    assert msgspec.structs.replace(new, **_NO_WATERMARK) == old


def test_status_from_before_next_due_decodes() -> None:
    """A status of checkpoint format 1 (before `next_due_ts`) decodes with None there,
    otherwise equal to today's sample; today's says format 2 and a bound."""
    old = decode((GOLDEN / "projector_status.before_next_due.json").read_bytes(),
                 ProjectorStatus)
    new = decode((GOLDEN / "projector_status.json").read_bytes(), ProjectorStatus)
    assert (old.checkpoint, old.next_due_ts) == (1, None)
    assert (new.checkpoint, new.next_due_ts) == (2, 1800000045.5)
    assert msgspec.structs.replace(new, checkpoint=1, next_due_ts=None, **_NO_WATERMARK) == old


def test_status_from_before_rebuild_progress_decodes() -> None:
    """A status written before `phase`/`progress`/`retained_from` decodes as not
    rebuilding, otherwise equal to today's sample; a rebuilding one carries its progress."""
    old = decode((GOLDEN / "projector_status.before_rebuild.json").read_bytes(), ProjectorStatus)
    new = decode((GOLDEN / "projector_status.json").read_bytes(), ProjectorStatus)
    assert (old.phase, old.progress, old.retained_from) == ("", None, None)
    assert old == msgspec.structs.replace(new, **_NO_WATERMARK)
    rebuilding = decode((GOLDEN / "projector_status.rebuilding.json").read_bytes(),
                        ProjectorStatus)
    assert rebuilding.phase == "rebuilding"
    assert rebuilding.progress is not None
    assert (rebuilding.progress.folded, rebuilding.progress.to_fold) == (800, 2000)
    assert rebuilding.last_seq == 0


@pytest.mark.parametrize(("name", "type_"), [("host_snapshot", HostSnapshot),
                                            ("cluster_snapshot", ClusterSnapshot),
                                            ("projector_status", ProjectorStatus)])
def test_records_from_before_checkpoint_decode(name: str, type_: type[Any]) -> None:
    """A record written before the checkpoint fields decodes with their defaults (None
    twins, no totals, nothing missing, status not restorable); today's sample of the same
    record differs only by those fields."""
    old = decode((GOLDEN / f"{name}.before_checkpoint.json").read_bytes(), type_)
    new = decode((GOLDEN / f"{name}.json").read_bytes(), type_)
    if type_ is ProjectorStatus:
        assert (old.checkpoint, old.catalog_seq, old.start) == (0, 0, "")
        assert msgspec.structs.replace(new, checkpoint=0, catalog_seq=0, catalog_digest="",
                                       start="", next_due_ts=None, **_NO_WATERMARK) == old
        return
    assert old.as_of.ts is None
    assert new.as_of.ts is not None
    for name_, entry in old.values.items():
        assert (entry.received_ts, entry.expires_ts) == (None, None)
        assert new.values[name_].expires_at == entry.expires_at
    for reporter, status in old.reporters.items():
        assert (status.rejected_total, status.missing, status.since_ts) == (0, [], None)
        assert new.reporters[reporter].state == status.state


def test_catalog_from_before_tty_decodes() -> None:
    """A catalog written before reporters had `tty` decodes with `tty` off, otherwise equal."""
    old = decode((GOLDEN / "catalog.before_tty.json").read_bytes(), Catalog)
    current = decode((GOLDEN / "catalog.json").read_bytes(), Catalog)
    assert b'"tty"' not in (GOLDEN / "catalog.before_tty.json").read_bytes()
    assert all(not r.tty for r in old.reporters.values())
    assert old == current


def test_catalog_without_tty_keeps_the_old_bytes() -> None:
    """`tty` is on the wire only where an admin set it, so a catalog that does not use it
    encodes exactly as before and agents from before `tty` (which reject unknown fields)
    still read it; one that sets it carries it."""
    data = (GOLDEN / "catalog.before_tty.json").read_bytes().rstrip(b"\n")
    catalog = decode(data, Catalog)
    assert encode(catalog) == data
    name, spec = next(iter(catalog.reporters.items()))
    with_tty = msgspec.structs.replace(
        catalog, reporters={**catalog.reporters, name: msgspec.structs.replace(spec, tty=True)})
    assert b'"tty":true' in encode(with_tty)
    assert decode(encode(with_tty), Catalog).reporters[name].tty is True


def test_catalog_rejects_unknown_fields() -> None:
    """Operator input is strict: an unknown field in a catalog is an error, not ignored."""
    data = (GOLDEN / "catalog.json").read_bytes().replace(b'"version":1', b'"version":1,"x":1')
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(data, type=Catalog)


def test_forget_of_one_reporter_adds_a_field_only() -> None:
    """A whole-host Forget has no `reporter` on the wire (old bytes, old readers); the
    one-reporter Forget differs from it by that field alone."""
    whole = decode((GOLDEN / "forget.json").read_bytes(), Forget)
    one = decode((GOLDEN / "forget.reporter.json").read_bytes(), Forget)
    assert whole.reporter is msgspec.UNSET
    assert b"reporter" not in encode(whole)
    assert one.reporter == "nosuch"
    assert msgspec.structs.replace(one, reporter=msgspec.UNSET) == whole
