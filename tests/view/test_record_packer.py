"""The scheduler view's record packer (`crr.view.record_packer`) on its own.

Given a host table holding records as they arrived, when the packer is told rows were
loaded, then it compresses every record (each read back byte for byte); while the
consumer is behind its stream it waits, and it starts again once told it caught up.
"""

from __future__ import annotations

import pytest

from crr.projections.fold import fold
from crr.projections.host_table import HostTable
from crr.projections.record.packing import is_packed
from crr.projections.record.snapshot import host_snapshot
from crr.schemas.codec import encode
from crr.schemas.errors import CrrTimeoutError
from crr.view.record_packer import PACK_BATCH, RecordPacker
from tests.support.fold import CATALOG_OBJ, T0, catalog_env, report_env

HOSTS = PACK_BATCH * 3 + 5
"""More than one step of the packer (it compresses `PACK_BATCH` records a step)."""


def _records() -> dict[str, bytes]:
    evs = [catalog_env(1, T0)]
    for i in range(HOSTS):
        evs.append(report_env(2 + i, T0 + 1, "scratch", f"n{i:03d}",
                              {"scratch_free": i, "scratch_total": 1000}))
    state = fold(evs)
    return {h: encode(host_snapshot(state, h)) for h in state.hosts}


def _table(records: dict[str, bytes]) -> HostTable:
    table = HostTable(CATALOG_OBJ)
    for data in records.values():
        table.upsert_record(data)
    return table


async def test_every_record_is_compressed_and_reads_back_the_same() -> None:
    """Given a table of records kept as they arrived, when the packer runs, then every
    one is kept packed, reads back byte for byte, and the packer counted them."""
    records = _records()
    table = _table(records)
    assert table.unpacked_count == HOSTS
    packer = RecordPacker(lambda: table)
    packer.start()
    try:
        packer.wanted(behind=False)
        await packer.wait_packed(10)
    finally:
        await packer.stop()
    assert table.unpacked_count == 0
    assert packer.packed == HOSTS
    assert packer.pauses == 0
    for host, data in records.items():
        stored = table.stored(host)
        assert isinstance(stored, bytes)
        assert is_packed(stored)
        assert len(stored) < len(data)
        assert table.record(host) == data


async def test_the_packer_waits_while_the_view_is_behind_its_stream() -> None:
    """Given rows loaded while more records are pending (`behind`), when the packer
    runs, then it compresses nothing (a bounded wait times out, saying how many are
    left); once the view caught up, it compresses them all (one pause counted)."""
    table = _table(_records())
    packer = RecordPacker(lambda: table)
    packer.start()
    try:
        packer.wanted(behind=True)
        with pytest.raises(CrrTimeoutError, match=f"{HOSTS} record"):
            await packer.wait_packed(0.2)
        assert table.unpacked_count == HOSTS
        packer.wanted(behind=False)
        await packer.wait_packed(10)
    finally:
        await packer.stop()
    assert table.unpacked_count == 0
    assert packer.pauses == 1


async def test_a_record_replaced_after_packing_is_packed_again() -> None:
    """Given a packed table, when a host's record is replaced (live update) and the
    packer is told, then the new record is packed too and reads back as the new one."""
    records = _records()
    table = _table(records)
    packer = RecordPacker(lambda: table)
    packer.start()
    try:
        packer.wanted(behind=False)
        await packer.wait_packed(10)
        state = fold([catalog_env(1, T0),
                      report_env(2, T0 + 5, "scratch", "n001",
                                 {"scratch_free": 999, "scratch_total": 1000})])
        new = encode(host_snapshot(state, "n001"))
        table.upsert_record(new)
        assert table.unpacked_count == 1
        packer.wanted(behind=False)
        await packer.wait_packed(10)
    finally:
        await packer.stop()
    assert table.unpacked_count == 0
    assert table.record("n001") == new
    assert packer.packed == HOSTS + 1


async def test_waiting_on_a_packer_that_does_not_run_returns_at_once() -> None:
    """Not started (the view packs nothing: `pack_records=False`): nothing to wait for."""
    table = _table(_records())
    packer = RecordPacker(lambda: table)
    await packer.wait_packed(0.01)
    assert table.unpacked_count == HOSTS
