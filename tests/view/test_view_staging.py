"""The view's live records are staged in the table and written to its columns on the next
read; whatever the reads in between, the answers are those of applying each record at once.

`SchedulerView._live_record` lean-decodes each live host record and stages it
(`HostTable.upsert_row`); the columns take every staged row in one column-wise
pass when a query reads them, or once `STAGE_LIMIT` rows wait.  Whatever the
pending counts, the stage limit and the points where queries read the table,
the table, `select`, `explain`, the position and the listeners' calls must be
those of writing every record into the columns as it arrives — here the full
decode's eager `HostTable.upsert`, an independent implementation of the same rule.
"""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.bus.ordered import StoredMessage
from crr.projections.host_table import HostTable, staging
from crr.projections.select import compile_select
from crr.schemas.codec import DECODERS, encode
from crr.schemas.snapshot import AsOf, HostSnapshot
from crr.schemas.subjects import host_snapshot_subject
from crr.schemas.wire_time import format_time
from crr.view.scheduler_view import SchedulerView
from tests.projections.test_host_table import _SNAPSHOTS, _assert_same_table
from tests.projections.test_host_table_lean_rows import (
    EXPRESSIONS,
    _assert_same_answers,
    _with_twins,
)
from tests.support.select import CATALOG, NOW

_STEPS = st.lists(
    st.tuples(
        st.one_of(_SNAPSHOTS, st.sampled_from(["h0", "h1", "a"])),  # a record, or a delete
        st.integers(0, 300),  # the pending count the record came with
        st.sampled_from(["", "", "", "read"]),  # a query reads the table after it
        st.booleans(),  # the record carries expires_ts twins
    ),
    min_size=1, max_size=70,
)
_full = DECODERS[HostSnapshot]


def _message(seq: int, step: HostSnapshot | str, pending: int, twins: bool) -> StoredMessage:
    if isinstance(step, str):  # a delete marker: no data
        return StoredMessage(seq, 0.0, host_snapshot_subject(step), b"", None, pending)
    data = encode(step)
    return StoredMessage(seq, 0.0, host_snapshot_subject(step.host),
                         _with_twins(data) if twins else data, None, pending)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@settings(max_examples=150, deadline=None)
@given(_STEPS, st.sampled_from([1, 3, 1024]), st.sampled_from(EXPRESSIONS))
def test_staged_records_give_the_answers_of_records_applied_at_once(
        steps: list[tuple[HostSnapshot | str, int, str, bool]], limit: int, expr: str) -> None:
    compiled = compile_select(expr, CATALOG)
    view = SchedulerView(None, pack_records=False)  # type: ignore[arg-type]  # no IO here
    view.table.set_catalog(CATALOG)
    view.catalog = CATALOG
    heard: list[str] = []
    view.subscribe(heard.append)
    at_once = HostTable(CATALOG)
    msgs = []
    with mock.patch.object(staging, "STAGE_LIMIT", limit):
        for i, (step, pending, then, twins) in enumerate(steps):
            m = _message(i + 1, step, pending, twins)
            msgs.append(m)
            view._live_record(m)  # the follower's live callback, as the consumer calls it
            if m.data:
                at_once.upsert(_full.decode(m.data))
            else:
                at_once.remove(m.subject.rsplit(".", 1)[-1])
            assert view.table.staged_count < limit
            if then == "read":  # a query in between sees everything applied so far
                assert compiled.select(view.table, NOW) == compiled.select(at_once, NOW)
                view.table.column("free")  # any column read writes every staged row
                assert view.table.staged_count == 0

    assert heard == [m.subject for m in msgs]  # every record heard once, in stream order
    assert view.position == msgs[-1].seq
    assert view.applied == len(msgs)
    _assert_same_table(view.table, at_once, strict_pool=False, same_docs=False)
    _assert_same_answers(view.table, at_once, [*sorted(at_once.hosts()), "h1"])


def test_a_record_that_does_not_decode_leaves_the_row_as_it_was() -> None:
    """A bad live record is rejected at once (decoded when it arrives, not when the columns
    are written): the host keeps its last good record, staged or written."""
    view = SchedulerView(None, pack_records=False)  # type: ignore[arg-type]  # no IO here
    view.table.set_catalog(CATALOG)
    view.catalog = CATALOG
    good = encode(HostSnapshot(host="h0", as_of=AsOf(seq=1, time=format_time(NOW)), values={}))
    view._live_record(StoredMessage(1, 0.0, host_snapshot_subject("h0"), good, None, 0))
    view._live_record(StoredMessage(2, 0.0, host_snapshot_subject("h0"), b"{not json", None, 0))
    assert view.rejected == 1
    assert view.position == 2
    assert view.table.record("h0") == good
    assert view.table.hosts() == ["h0"]

