"""`crr.projections.coverage`: how far CRR_SNAPSHOT covers CRR_EVENTS, from the status records.

Given/when/then for the layouts an operator goes through (one projector, N
partitions, repartitioning with the old records left in the compacted
stream, writers from before `covered_seq`), and a property over complete
layouts with left-overs of another one.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crr.projections.coverage import Coverage, covered
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.subjects import SNAPSHOT_PROJECTOR, is_projector_status

ONE = SNAPSHOT_PROJECTOR


def sub(k: int) -> str:
    """The status subject of partition `k`."""
    return f"{SNAPSHOT_PROJECTOR}.{k}"


def status(covered_seq: int, *, partition: int | None = None, partitions: int | None = None,
           last_seq: int | None = None, projector_id: str = "") -> ProjectorStatus:
    """A status record; `last_seq` defaults to `covered_seq` (what one projector writes)."""
    last = covered_seq if last_seq is None else last_seq
    return ProjectorStatus(last_seq=last, stream_last_seq=last, lag=0,
                           last_tick="2027-01-15T08:00:00.000Z",
                           started_at="2027-01-15T07:00:00.000Z", partition=partition,
                           partitions=partitions, covered_seq=covered_seq,
                           projector_id=projector_id)


def part(k: int, n: int, covered_seq: int, last_seq: int | None = None) -> ProjectorStatus:
    """Partition `k` of `n`'s status record."""
    return status(covered_seq, partition=k, partitions=n,
                  last_seq=covered_seq if last_seq is None else last_seq)


def test_subjects_of_status_records() -> None:
    """The unpartitioned subject and `.<k>` are status subjects; nothing else is."""
    assert is_projector_status(ONE)
    assert is_projector_status(sub(0))
    assert is_projector_status(sub(12))
    assert not is_projector_status(f"{ONE}x")
    assert not is_projector_status(f"{ONE}.")
    assert not is_projector_status(f"{ONE}.a")
    assert not is_projector_status("crr.v1.snapshot.host.node1")


def test_nothing_seen() -> None:
    """Given no status record, the position is 0 and nothing is current."""
    cov = Coverage()
    assert (cov.position, cov.current, cov.newest, cov.expected) == (0, [], None, None)


def test_one_unpartitioned_projector() -> None:
    """Given one projector's record, when read, then its covered_seq is the position."""
    cov = Coverage()
    st1 = status(40)
    cov.add(ONE, 3, st1)
    assert (cov.position, cov.current, cov.newest, cov.expected) == (40, [st1], st1, 1)
    # when it writes again, the newer record replaces the older one
    st2 = status(55)
    cov.add(ONE, 9, st2)
    assert (cov.position, cov.current) == (55, [st2])


def test_two_partitions_take_the_minimum() -> None:
    """Given both partitions' records, the position is the lower covered_seq (not last_seq)."""
    cov = Coverage()
    p0, p1 = part(0, 2, 90, last_seq=70), part(1, 2, 80, last_seq=79)
    cov.add(sub(1), 5, p1)
    cov.add(sub(0), 4, p0)
    assert cov.current == [p0, p1]  # in partition order, not write order
    assert cov.expected == 2
    assert cov.newest == p1
    assert cov.position == 80


def test_incomplete_layout_is_zero() -> None:
    """Given only one of two partitions has written, the position is 0, not a partial minimum."""
    cov = Coverage()
    p0 = part(0, 2, 90)
    cov.add(sub(0), 4, p0)
    assert (cov.position, cov.current, cov.expected) == (0, [p0], 2)


def test_a_deleted_record_makes_the_layout_incomplete() -> None:
    """Given two partitions, when one record is purged, the position is 0 again."""
    cov = Coverage()
    cov.add(sub(0), 4, part(0, 2, 90))
    cov.add(sub(1), 5, part(1, 2, 80))
    cov.remove(sub(1))
    assert cov.position == 0
    cov.remove(sub(7))  # removing what was never there is harmless
    assert len(cov.current) == 1


def test_repartition_one_to_two_ignores_the_old_record() -> None:
    """Given one projector's record, when two partitions take over, then the old record is
    ignored as soon as a partitioned one is newer: 0 until both wrote, then their minimum."""
    cov = Coverage()
    old = status(500)
    cov.add(ONE, 10, old)
    p0 = part(0, 2, 520)
    cov.add(sub(0), 11, p0)
    assert (cov.current, cov.position, cov.newest) == ([p0], 0, p0)
    p1 = part(1, 2, 510)
    cov.add(sub(1), 12, p1)
    assert (cov.current, cov.position) == ([p0, p1], 510)


def test_back_from_two_partitions_to_one() -> None:
    """Given two partitions' records, when one projector takes over, only its record counts
    (even though the partitions' records are still in the stream and cover more)."""
    cov = Coverage()
    cov.add(sub(0), 10, part(0, 2, 700))
    cov.add(sub(1), 11, part(1, 2, 710))
    one = status(650)
    cov.add(ONE, 12, one)
    assert (cov.current, cov.position, cov.expected) == ([one], 650, 1)


def test_four_to_two_leaves_partitions_two_and_three_behind() -> None:
    """Given four partitions, when two take over, `.2`/`.3` (written under N=4) are ignored:
    0 while only `.0` has written under N=2, then the minimum of the new `.0` and `.1`."""
    cov = Coverage()
    for k in range(4):
        cov.add(sub(k), 20 + k, part(k, 4, 300 + k))
    assert cov.position == 300
    new0 = part(0, 2, 400)
    cov.add(sub(0), 30, new0)
    assert (cov.current, cov.position, cov.expected) == ([new0], 0, 2)  # .1 is still N=4's
    new1 = part(1, 2, 390)
    cov.add(sub(1), 31, new1)
    assert (cov.current, cov.position) == ([new0, new1], 390)


def test_older_writers_without_covered_seq() -> None:
    """Given records from before `covered_seq`: an unpartitioned one covers its last_seq; a
    partition's last_seq proves nothing (and without `partitions` the layout is unknown)."""
    assert covered(status(0, last_seq=42)) == 42
    assert covered(status(0, partition=1, last_seq=42)) == 0
    cov = Coverage()
    cov.add(ONE, 1, status(0, last_seq=42))
    assert cov.position == 42
    old0 = status(0, partition=0, last_seq=50)
    old1 = status(0, partition=1, last_seq=51)
    cov.add(sub(0), 2, old0)
    cov.add(sub(1), 3, old1)
    assert (cov.current, cov.expected, cov.position) == ([old0, old1], None, 0)


@st.composite
def complete_layouts(draw: st.DrawFn) -> tuple[list[tuple[str, ProjectorStatus]],
                                                list[tuple[str, ProjectorStatus]]]:
    """(the current layout's records, left-overs of another layout on other subjects)."""
    n = draw(st.integers(1, 6))
    m = draw(st.integers(1, 6).filter(lambda m: m != n))
    cov = st.integers(1, 10**6)
    if n == 1:
        current = [(ONE, status(draw(cov)))]
        leftovers = [(sub(k), part(k, m, draw(cov))) for k in range(m)]
    else:
        current = [(sub(k), part(k, n, draw(cov))) for k in range(n)]
        leftovers = [(sub(k), part(k, m, draw(cov))) for k in range(n, m)]
        if m == 1:
            leftovers = [(ONE, status(draw(cov)))]
    leftovers = draw(st.lists(st.sampled_from(leftovers), unique=True) if leftovers
                     else st.just([]))
    return current, leftovers


@given(complete_layouts(), st.data())
def test_position_is_the_minimum_of_a_complete_layout(
        layout: tuple[list[tuple[str, ProjectorStatus]], list[tuple[str, ProjectorStatus]]],
        data: st.DataObject) -> None:
    """For any complete layout (added in any order, left-overs of another layout older than
    its newest record), position == min(covered) <= every current record's covered."""
    current, leftovers = layout
    records = current + leftovers
    seqs = data.draw(st.lists(st.integers(1, 10**9), min_size=len(records),
                              max_size=len(records), unique=True))
    # the newest record belongs to the current layout: that is what makes it current
    newest_at = data.draw(st.integers(0, len(current) - 1))
    top = seqs.index(max(seqs))
    seqs[top], seqs[newest_at] = seqs[newest_at], seqs[top]
    cov = Coverage()
    for i in data.draw(st.permutations(range(len(records)))):
        subject, rec = records[i]
        cov.add(subject, seqs[i], rec)
    want = min(covered(rec) for _, rec in current)
    assert cov.position == want
    assert all(cov.position <= covered(rec) for rec in cov.current)
    assert sorted(map(id, cov.current)) == sorted(id(rec) for _, rec in current)
