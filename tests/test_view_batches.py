"""The view's live batches (records applied together while more are pending) equal one by one.

`SchedulerView._live_record` keeps host records that have more pending behind
them and applies them together — after the records read, or once a full
batch is there, or after `LIVE_WAIT` — column-wise when there are enough
(`HostTable.append_records`).  Whatever the pending counts, the batch sizes
and the points where the event loop runs in between, the table, `select`,
`explain`, the position and the listeners' calls must be those of applying
every record in turn.
"""

from __future__ import annotations

import asyncio
from unittest import mock

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.ordered import StoredMessage
from ops.services import view as view_module
from ops.services.view import SchedulerView
from projections import host_table
from projections.host_table import HostTable
from schemas.codec import encode
from schemas.snapshot import HostSnapshot
from schemas.subjects import host_snapshot_subject
from tests.select_support import CATALOG
from tests.test_host_table import _SNAPSHOTS, _assert_same_table
from tests.test_lean_rows import _assert_same_answers, _with_twins

_STEPS = st.lists(
    st.tuples(
        st.one_of(_SNAPSHOTS, st.sampled_from(["h0", "h1", "a"])),  # a record, or a delete
        st.integers(0, 300),  # the pending count the record came with
        st.sampled_from(["", "", "", "yield", "wait"]),  # the loop runs before the next one
    ),
    min_size=1, max_size=70,
)


def _message(seq: int, step: HostSnapshot | str, pending: int, twins: bool) -> StoredMessage:
    if isinstance(step, str):  # a delete marker: no data
        return StoredMessage(seq, 0.0, host_snapshot_subject(step), b"", None, pending)
    data = encode(step)
    return StoredMessage(seq, 0.0, host_snapshot_subject(step.host),
                         _with_twins(data) if twins else data, None, pending)


async def _feed(view: SchedulerView, steps: list[tuple[StoredMessage, str]]) -> None:
    last = steps[-1][0].seq
    done = asyncio.Event()
    unsubscribe = view.subscribe(lambda _s: done.set() if view.position >= last else None)
    for m, then in steps:
        view._live_record(m)  # the follower's live callback, as the consumer calls it
        if then == "yield":
            await asyncio.sleep(0)
        elif then == "wait":  # a batch waiting to fill up is applied after LIVE_WAIT
            await asyncio.sleep(view_module.LIVE_WAIT * 2)
    await asyncio.wait_for(done.wait(), 5)
    unsubscribe()


@settings(max_examples=120, deadline=None)
@given(_STEPS, st.integers(1, 40), st.sampled_from([1, 4, 32]), st.booleans())
def test_live_batches_equal_records_one_by_one(
        steps: list[tuple[HostSnapshot | str, int, str]], live_batch: int, small_batch: int,
        twins: bool) -> None:
    msgs = [(_message(i + 1, step, pending, twins), then)
            for i, (step, pending, then) in enumerate(steps)]
    msgs[-1] = (msgspec.structs.replace(msgs[-1][0], pending=0), "")  # then caught up
    one_by_one = HostTable(CATALOG)
    for m, _ in msgs:
        host = m.subject.rsplit(".", 1)[-1]
        if m.data:
            one_by_one.upsert_row(one_by_one.decode_record(m.data), m.data)
        else:
            one_by_one.remove(host)

    view = SchedulerView(None, pack_records=False)  # type: ignore[arg-type]  # no IO here
    view.table.set_catalog(CATALOG)
    view.catalog = CATALOG
    heard: list[str] = []
    view.subscribe(heard.append)
    with mock.patch.object(view_module, "LIVE_BATCH", live_batch), \
            mock.patch.object(host_table, "SMALL_BATCH", small_batch):
        asyncio.run(_feed(view, msgs))

    assert heard == [m.subject for m, _ in msgs]  # every record heard once, in stream order
    assert view.position == msgs[-1][0].seq
    assert view.applied == len(msgs)
    _assert_same_table(view.table, one_by_one, strict_pool=False, same_docs=False)
    _assert_same_answers(view.table, one_by_one, [*sorted(one_by_one.hosts()), "h1"])
