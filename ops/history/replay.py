"""IO for history tools: the export file format, reading it fast, and reading CRR_EVENTS.

The fold itself is `crr.projections.fold` (driven by `crr.projections.history.Replay`);
this module only turns stored events — from the stream or from a file written
by `crr events export` — into `Envelope`s, in stream order.

Export format: JSON lines, one stored message per line::

    {"seq": 42, "time": "2027-01-15T08:00:00.123456Z", "ts": 1800000000.123456,
     "subject": "crr.v1.report.host.node1.scratch", "headers": {"Nats-Msg-Id": "..."},
     "payload": {...the payload, verbatim...}}

- `ts` is the server time exactly as the projector sees it (epoch seconds,
  shortest round-trip float), so a replay from a file is byte-identical to one
  from the stream; `time` is the same instant for people (and the fallback
  when `ts` is absent, e.g. in a hand-written file).
- `payload` holds the payload bytes verbatim when they are one line of valid
  JSON (what every crr publisher sends); anything else (NaN literals, binary,
  pretty-printed JSON) is base64 in `payload` with `"payload_encoding":
  "base64"`, so the bytes replayed are always exactly the bytes stored.
- `headers` is omitted when the message had none.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import operator
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Final

import msgspec

from crr.bus.connection import Connection
from crr.bus.follower import read_snapshot_bytes
from crr.bus.jetstream import stream_range
from crr.bus.ordered import Delivery, OrderedReader, StoredMessage
from crr.bus.retry import TORN_READ
from crr.progress import Progress
from crr.projections.coverage import Coverage
from crr.projections.envelope import Envelope
from crr.projections.history import Replay
from crr.schemas.codec import decode
from crr.schemas.duration import parse_duration
from crr.schemas.errors import (
    CrrError,
    CrrTimeoutError,
    DurationError,
    PayloadError,
)
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.subjects import (
    CATALOG,
    EVENTS_STREAM,
    EVERYTHING,
    owner,
    published_subject,
    snapshot_kind,
    status_subject,
    token,
)
from crr.schemas.wire_time import format_time, format_time_precise, parse_time

CHUNK: Final = 256 << 10
"""Bytes read from an export file at a time, decoded as one JSON array (small: cache-warm)."""


# -- the line format --------------------------------------------------------------------


class ExportLine(msgspec.Struct, kw_only=True, gc=False):
    """One line of an export file, as decoded for replay (the payload stays raw bytes).

    `headers` is not decoded: the fold does not use it (and skipping it is cheaper).
    """

    seq: int
    subject: str
    time: str | None = None
    ts: float | None = None
    payload: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    payload_encoding: str | None = None


class _Head(msgspec.Struct, kw_only=True, omit_defaults=True):
    seq: int
    time: str
    ts: float
    subject: str
    headers: dict[str, str] | None = None


_head_encoder: Final = msgspec.json.Encoder()
_any: Final = msgspec.json.Decoder()
_lines: Final = msgspec.json.Decoder(list[ExportLine])
_line: Final = msgspec.json.Decoder(ExportLine)


def _inline(data: bytes) -> bool:
    """Whether `data` can sit verbatim in a line: one line of valid JSON."""
    if not data or b"\n" in data or b"\r" in data:
        return False
    try:
        _any.decode(data)
    except msgspec.DecodeError:
        return False
    return True


def export_line(m: StoredMessage) -> bytes:
    """The export line (with its newline) of one stored message."""
    head = _head_encoder.encode(_Head(seq=m.seq, time=format_time_precise(m.time), ts=m.time,
                                      subject=m.subject, headers=m.headers or None))
    if _inline(m.data):
        return b"".join((head[:-1], b',"payload":', m.data, b"}\n"))
    b64 = base64.b64encode(m.data)
    return b"".join((head[:-1], b',"payload":"', b64, b'","payload_encoding":"base64"}\n'))


def to_envelope(line: ExportLine) -> Envelope:
    """The Envelope a line describes; PayloadError if it is incomplete."""
    if line.ts is not None:
        t = line.ts
    elif line.time is not None:
        t = parse_time(line.time)
    else:
        raise PayloadError("neither ts nor time")
    raw = bytes(line.payload)
    if line.payload_encoding is None:
        data = raw
    elif line.payload_encoding == "base64":
        try:
            data = base64.b64decode(msgspec.json.decode(raw, type=str), validate=True)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise PayloadError(f"payload is not base64: {exc}") from exc
    else:
        raise PayloadError(f"unknown payload_encoding {line.payload_encoding!r}")
    return Envelope(seq=line.seq, subject=published_subject(line.subject), received_at=t,
                    data=data)


# -- reading a file ---------------------------------------------------------------------


@dataclass
class FileReport:
    """What reading an export file found."""

    path: str
    lines: int = 0
    events: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    """(line number, why) of each malformed line (the rest was replayed)."""
    out_of_order: int = 0
    """Lines whose seq was not above the previous one's (skipped too)."""


def _fast_envs(body: bytes, report: FileReport, last_seq: list[int]) -> list[Envelope] | None:
    """All complete lines of `body` in one msgspec call; None if any line needs a closer look."""
    try:
        decoded = _lines.decode(b"[" + body.replace(b"\n", b",") + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # a malformed or blank line: the careful path finds which
    try:
        out = [Envelope(seq=ln.seq, subject=published_subject(ln.subject), received_at=ln.ts,
                        data=bytes(ln.payload))
               if ln.ts is not None and ln.payload_encoding is None else to_envelope(ln)
               for ln in decoded]
    except PayloadError:
        return None
    if not out:
        return out
    seqs = [e.seq for e in out]
    if seqs[0] <= last_seq[0] or not all(map(operator.lt, seqs, seqs[1:])):
        return None
    last_seq[0] = seqs[-1]
    report.lines += len(out)
    report.events += len(out)
    return out


def _envs_of_chunk(lines: list[bytes], first_no: int, report: FileReport,
                   last_seq: list[int]) -> list[Envelope]:
    """Envelopes of complete lines, line by line: malformed ones are counted and skipped."""
    report.lines += len(lines)
    out: list[Envelope] = []
    prev = last_seq[0]
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            env = to_envelope(_line.decode(raw))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            report.skipped.append((first_no + i, str(exc)))
            continue
        except PayloadError as exc:
            report.skipped.append((first_no + i, exc.message))
            continue
        if env.seq <= prev:
            report.skipped.append((first_no + i, f"seq {env.seq} is not after {prev}"))
            report.out_of_order += 1
            continue
        prev = env.seq
        out.append(env)
    last_seq[0] = prev
    report.events += len(out)
    return out


def read_export(
    path: str | Path, on_batch: Callable[[list[Envelope]], bool],
    *, on_progress: Callable[[int, int], None] | None = None,
) -> FileReport:
    """Feed the events of an export file to `on_batch` in order, chunk by chunk.

    `on_batch` returns False to stop early.  Malformed lines are counted with
    their line numbers and skipped; the rest of the file is still read.
    `on_progress(bytes_read, bytes_total)` is called once per chunk.
    """
    report = FileReport(path=str(path))
    last_seq = [0]
    with open(path, "rb") as f:
        total = os.fstat(f.fileno()).st_size
        done, line_no, rest = 0, 1, b""
        for chunk in _chunks(f):
            done += len(chunk)
            buf = rest + chunk
            end = buf.rfind(b"\n")
            if end < 0:
                rest = buf
                continue
            body, rest = buf[:end], buf[end + 1:]
            count = body.count(b"\n") + 1
            envs = _fast_envs(body, report, last_seq)
            if envs is None:
                envs = _envs_of_chunk(body.split(b"\n"), line_no, report, last_seq)
            line_no += count
            if on_progress is not None:
                on_progress(done, total)
            if envs and not on_batch(envs):
                return report
        if rest.strip():
            envs = _envs_of_chunk([rest], line_no, report, last_seq)
            if envs:
                on_batch(envs)
    return report


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while chunk := f.read(CHUNK):
        yield chunk


# -- reading the stream -----------------------------------------------------------------


def host_filter(host: str) -> Callable[[str], bool]:
    """Whether a subject concerns `host`: its own events and catalog changes."""
    mid = f".host.{token(host)}."

    def keep(subject: str) -> bool:
        return subject == CATALOG or mid in subject

    return keep


async def read_stream(
    nc: Connection, on_message: Callable[[StoredMessage], bool], *,
    subject: str = EVERYTHING, start_seq: int | None = None, start_time: float | None = None,
    stop_seq: int | None = None, stall: float = 30.0,
) -> int:
    """Feed CRR_EVENTS to `on_message` in order, from `start_seq`/`start_time` (else the start).

    Stops after the message that was last in the stream when it was
    delivered (`pending == 0`), after `stop_seq`, or when `on_message`
    returns False.  Returns the number of messages handled.
    CrrTimeoutError if nothing arrives for `stall` seconds.
    """
    rng = await stream_range(nc)
    if rng.empty or (start_seq is not None and start_seq > rng.last_seq) or (
            start_time is not None and rng.last_time is not None
            and start_time > rng.last_time):
        return 0
    done = asyncio.Event()
    handled = 0

    def handle(m: StoredMessage) -> None:
        nonlocal handled
        if done.is_set():
            return
        handled += 1
        go = on_message(m)
        if not go or m.pending == 0 or (stop_seq is not None and m.seq >= stop_seq):
            done.set()

    kwargs: dict[str, object] = {}
    if start_seq is not None:
        kwargs["start_seq"] = start_seq
    elif start_time is not None:
        kwargs["start_time"] = start_time
    reader = OrderedReader(nc, stream=EVENTS_STREAM, subject=subject, handler=handle,
                           deliver=Delivery.ALL, **kwargs)  # type: ignore[arg-type]
    await reader.start()
    try:
        seen = -1
        while not done.is_set():
            if handled == seen:
                raise CrrTimeoutError(f"no message from {EVENTS_STREAM} for {stall:g}s "
                                      f"({handled} read)")
            seen = handled
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), stall)
    finally:
        await reader.stop()
    return handled


class _Torn(CrrError):
    """CRR_SNAPSHOT was read while the projector was writing (a record after the status).

    Retriable: the next read usually finds the flush done."""

    retriable = True


def _cut_of(raw: dict[str, tuple[int, bytes]]) -> tuple[list[ProjectorStatus], dict[str, bytes]]:
    """The current layout's status records (one projector, or partitions 0..N-1) and every
    record that is not a status record.

    Status records of an earlier layout are left out (`crr.projections.coverage`).  Each
    record belongs to the projector that writes it (`crr.bus.streams.owner`); one written
    after its projector's status belongs to a flush still in progress (`_Torn`).
    """
    statuses = {s: raw.pop(s) for s in [s for s in raw if snapshot_kind(s) == "projector"]}
    coverage = Coverage()
    for subject, (seq, data) in statuses.items():
        if data:  # empty: a delete marker
            coverage.add(subject, seq, decode(data, ProjectorStatus))
    current = coverage.current
    if not current:
        raise CrrError("no projector status in CRR_SNAPSHOT (has a projector run?)")
    n = coverage.expected
    if n is None or len(current) < n:
        raise CrrError(f"only {len(current)} of {n or '?'} projector partitions have written a "
                       "status to CRR_SNAPSHOT: start every partition (or wait) and try again")
    status_seq = {st.partition: statuses[status_subject(st.partition)][0] for st in current}
    # The records a projector writes (not the HA lease records, nor anything unknown).
    # An empty host record is a delete marker (`crr hosts forget`): no record.
    records = {s: r for s, r in raw.items()
               if (kind := snapshot_kind(s)) in ("catalog", "cluster") or (kind == "host" and r[1])}
    for subject, (seq, _) in records.items():
        if seq > status_seq[None if n == 1 else owner(subject, n)]:
            raise _Torn(f"{subject} is newer than its projector's status")
    return current, {s: b for s, (_, b) in records.items()}


async def read_consistent_cut(nc: Connection) -> tuple[list[ProjectorStatus], dict[str, bytes]]:
    """The projector status records of the current layout and every other CRR_SNAPSHOT
    record, read at a consistent point.

    A projector writes its status after the records of the flushes it covers (after
    the flush that caught up, and while behind about every `STATUS_GAP`), so each
    projector's status is newer than every record it covers; a record newer than its
    writer's status belongs to a flush no status covers yet, and the read is retried
    (bounded).
    """
    try:
        async for attempt in TORN_READ.retrying(attempts=20, on=(_Torn,)):
            with attempt:
                return _cut_of(await read_snapshot_bytes(nc))
    except _Torn:
        raise CrrError("CRR_SNAPSHOT kept changing while being read (the projector is "
                       "busy); try again") from None
    raise AssertionError("unreachable")  # pragma: no cover




# -- command-line times -------------------------------------------------------------------


@dataclass(frozen=True)
class When:
    """A point given on the command line: a stream sequence or a time (epoch seconds)."""

    seq: int | None = None
    time: float | None = None
    text: str = ""


def parse_when(text: str, now: float, *, allow_seq: bool = True) -> When:
    """`1234` (a sequence), `now`, `-15m` (relative to `now`) or an RFC 3339 time."""
    s = text.strip()
    if allow_seq and s.isdigit():
        return When(seq=int(s), text=s)
    if s == "now":
        return When(time=now, text=s)
    if s.startswith("-"):
        try:
            return When(time=now - parse_duration(s[1:]), text=s)
        except DurationError as exc:
            raise CrrError(f"bad relative time {text!r}: {exc.message}") from None
    try:
        t = parse_time(s)
    except PayloadError:
        seq = "a sequence number, " if allow_seq else ""
        raise CrrError(f"expected {seq}`now`, a relative time like -15m or an RFC 3339 time, "
                       f"got {text!r}") from None
    if not math.isfinite(t):
        raise CrrError(f"bad time {text!r}")
    return When(time=t, text=s)


# -- driving a replay ---------------------------------------------------------------------


@dataclass
class SourceReport:
    """Where a replay read its events from, and what it found."""

    source: str
    events: int = 0
    first_seq: int | None = None
    first_time: float | None = None
    file: FileReport | None = None


async def run_replay(replay: Replay, *, nc: Connection | None, file: str | None,
                     stop_seq: int | None = None, label: str = "replay") -> SourceReport:
    """Feed `replay` from `file` (an export) or from CRR_EVENTS; then `finish` it.

    A progress bar (rate, ETA) runs on a TTY.  `stop_seq` ends a stream read
    early (the replay needs nothing after it).
    """
    if file is not None:
        report = SourceReport(source=file)
        with Progress(label, total=None, unit="B") as bar:
            fr = read_export(file, replay.feed_many,
                             on_progress=lambda done, total: bar.update(done, total=total))
        report.file = fr
        report.events = fr.events
    else:
        assert nc is not None
        rng = await stream_range(nc)
        report = SourceReport(source=EVENTS_STREAM, first_seq=rng.first_seq,
                              first_time=rng.first_time)
        total = max((stop_seq or rng.last_seq) - rng.first_seq + 1, 0)
        feed = replay.feed
        with Progress(label, total=total or None, unit="events") as bar:
            def on_message(m: StoredMessage) -> bool:
                go = feed(Envelope(seq=m.seq, subject=published_subject(m.subject),
                                   received_at=m.time, data=m.data))
                bar.update(m.seq - rng.first_seq + 1)
                return go

            report.events = await read_stream(nc, on_message, stop_seq=stop_seq)
    replay.finish()
    if replay.first is not None and report.first_seq is None:
        report.first_seq, report.first_time = replay.first.seq, replay.first.received_at
    return report


def check_cuts(replay: Replay, report: SourceReport) -> None:
    """CrrError when a cut lies before the first available event and history is missing."""
    first_seq = report.first_seq
    if first_seq is None or first_seq <= 1:
        return  # nothing aged out: before the first event, the state is simply empty
    for cut in replay.cuts:
        before = (cut.seq is not None and cut.seq < first_seq) or (
            cut.time is not None and report.first_time is not None
            and cut.time < report.first_time)
        if before:
            what = f"seq {cut.seq}" if cut.seq is not None else format_time(cut.time or 0.0)
            where = "CRR_EVENTS starts" if report.file is None else f"{report.source} starts"
            first_t = (f" ({format_time(report.first_time)})"
                       if report.first_time is not None else "")
            raise CrrError(f"{what} is outside retention: {where} at seq {first_seq}{first_t}")
