"""`crr replay`: rebuild the snapshot from stored events with the live projector's fold.

    crr replay [--file F] [--at T|SEQ] [--host H] [--json]      the snapshot as of T
    crr replay --diff T1 T2                                     what changed in between
    crr replay --explain EXPR --host H --at T                   why H matched or not at T
    crr replay --select EXPR --at T                             what select[] gave at T
    crr replay --verify                                         replay == live CRR_SNAPSHOT?

Events come from CRR_EVENTS or from a `crr events export` file (`--file`).
The fold is `crr.projections.fold` (the projector's own code), driven by
`crr.projections.history.Replay`; stale flags are those of `expire(T)`.

`--verify` replays exactly the input the running projector folded: the last
event per subject up to its start sequence, then every event up to its
recorded position (`crr.v1.snapshot.projector`), expired at its recorded
tick — and compares each record byte for byte.  (A projector restored from
CRR_SNAPSHOT carries its predecessor's start sequence: its state is the fold
of that same input.)  With partitions it does that
for each partition (`crr.v1.snapshot.projector.<k>`), replaying only the
events it folds (`crr.bus.streams.owns`) and comparing only the records it
writes (`crr.bus.streams.owner`).  Caveats (printed with any
difference): an event delivered to the projector after it already expired
past that event's server time (a reporter exactly at its deadline, or a clock
skew between projector and server) can make the live record differ; records
of hosts whose events all aged out of CRR_EVENTS cannot be rebuilt and are
only listed.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import msgspec

from crr.bus.connection import Connection, connect
from crr.history.replay import (
    SourceReport,
    When,
    check_cuts,
    parse_when,
    read_consistent_cut,
    run_replay,
)
from crr.host_listing import LEGEND, render_hosts
from crr.projections.history import Capture, CapturePoint, Replay, diff, json_differences
from crr.projections.host_table import HostTable
from crr.projections.select import compile_select, explain
from crr.schemas.codec import encode
from crr.schemas.errors import CrrError
from crr.schemas.snapshot import HostSnapshot, ProjectorStatus
from crr.schemas.subjects import SNAPSHOT_CLUSTER, owner, owns
from crr.schemas.wire_time import format_time, parse_time


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr replay`."""
    p = sub.add_parser("replay", parents=[common],
                       help="rebuild the snapshot from history (same fold as the projector)")
    p.add_argument("--file", metavar="FILE", help="replay a `crr events export` file "
                   "(default: the live CRR_EVENTS)")
    p.add_argument("--at", metavar="T|SEQ", help="as of a time (RFC 3339, -15m, now) or a "
                   "stream sequence (default: everything, expired at now)")
    p.add_argument("--host", metavar="H", help="only this host (required with --explain)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--diff", nargs=2, metavar=("T1", "T2"),
                      help="values changed, turned stale, rejected; reporters that failed")
    mode.add_argument("--explain", metavar="EXPR", help="why --host matched EXPR or not at --at")
    mode.add_argument("--select", metavar="EXPR", help="the hosts EXPR selected at --at")
    mode.add_argument("--verify", action="store_true",
                      help="compare with the live CRR_SNAPSHOT byte for byte (exit 1 if not)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _cut(when: When) -> CapturePoint:
    return CapturePoint(seq=when.seq, time=when.time)


def _print_json(obj: Any) -> None:
    sys.stdout.buffer.write(encode(obj) + b"\n")
    sys.stdout.buffer.flush()


def _notes(report: SourceReport) -> None:
    fr = report.file
    if fr is not None and fr.skipped:
        print(f"crr replay: {len(fr.skipped)} malformed line(s) in {fr.path} skipped "
              f"({fr.events} event(s) replayed):", file=sys.stderr)
        for no, why in fr.skipped[:20]:
            print(f"  line {no}: {why}", file=sys.stderr)
        if len(fr.skipped) > 20:
            print(f"  ... and {len(fr.skipped) - 20} more", file=sys.stderr)
    if report.file is None and report.first_seq is not None and report.first_seq > 1:
        first = format_time(report.first_time) if report.first_time is not None else "?"
        print(f"crr replay: note: history before seq {report.first_seq} ({first}) has aged "
              "out of CRR_EVENTS; the replay starts there", file=sys.stderr)


async def run(args: argparse.Namespace) -> int:
    """Dispatch on the mode."""
    if args.explain and not args.host:
        raise CrrError("--explain needs --host H")
    if args.verify and args.at:
        raise CrrError("--verify replays up to the projector's own position; drop --at")
    if args.file is not None and not args.verify:
        return await _run(None, args)
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-replay") as nc:
        return await _run(nc, args)


async def _run(nc: Connection | None, args: argparse.Namespace) -> int:
    if args.verify:
        assert nc is not None
        return await _verify(nc, args)
    now = time.time()
    hosts = [args.host] if args.host and not (args.explain or args.select) else None
    if args.diff:
        w1, w2 = (parse_when(t, now) for t in args.diff)
        replay = Replay([_cut(w1), _cut(w2)], hosts=hosts, log_window=True)
    else:
        at = parse_when(args.at, now) if args.at else When(time=now, text="now")
        replay = Replay([_cut(at)], hosts=hosts)
    # Seq-only cuts: stop right after the last one (no need to see the next event).
    seqs = [c.seq for c in replay.cuts if c.time is None]
    stop = max(s for s in seqs if s is not None) if len(seqs) == len(replay.cuts) else None
    report = await run_replay(replay, nc=nc, file=args.file, stop_seq=stop)
    _notes(report)
    check_cuts(replay, report)
    caps = replay.captures
    if args.diff:
        d = diff(caps[0], caps[1], replay.happenings)
        if args.json:
            _print_json(d)
        else:
            print(d.render())
        return 0
    cap = caps[0]
    if args.explain or args.select:
        return _select(args, cap)
    return _show(args, cap)


def _table(cap: Capture) -> HostTable:
    if cap.catalog is None:
        raise CrrError(f"no catalog had been applied by seq {cap.seq}: nothing to select on")
    table = HostTable(cap.catalog)
    for snap in cap.hosts.values():
        table.upsert(snap)
    table.set_cluster(cap.cluster)
    return table


def _select(args: argparse.Namespace, cap: Capture) -> int:
    table = _table(cap)
    assert cap.catalog is not None
    compiled = compile_select(args.explain or args.select, cap.catalog)
    if args.select:
        names = compiled.select(table, cap.now)
        if args.json:
            _print_json(names)
        else:
            print("\n".join(names) if names else "(no host selected)")
        return 0
    exp = explain(compiled, table, args.host, cap.now)
    if args.json:
        _print_json(exp)
    else:
        print(f"replayed to seq {cap.seq}")
        print(exp.render())
    return 0


def _show(args: argparse.Namespace, cap: Capture) -> int:
    if args.host and args.host not in cap.hosts:
        raise CrrError(f"host {args.host!r} had no events by seq {cap.seq} "
                       f"({format_time(cap.now)})")
    if args.json:
        _print_json({"seq": cap.seq, "now": format_time(cap.now),
                     "hosts": [cap.hosts[h] for h in sorted(cap.hosts)],
                     "cluster": cap.cluster})
        return 0
    print(f"replayed to seq {cap.seq}, as of {format_time(cap.now)}")
    snaps: list[HostSnapshot] = [cap.hosts[h] for h in sorted(cap.hosts)]
    if not snaps:
        print("no hosts")
        return 0
    res = None
    if cap.catalog is not None:
        res = sorted(n for n, s in cap.catalog.resources.items() if s.scope == "host") or None
    print(render_hosts(snaps, cap.cluster, res))
    print(LEGEND)
    return 0


# -- verify -------------------------------------------------------------------------------


async def _verify(nc: Connection, args: argparse.Namespace) -> int:
    statuses, live = await read_consistent_cut(nc)
    failed = False
    for status in statuses:
        failed |= not await _verify_one(nc, args, status, live)
    return 1 if failed else 0


async def _verify_one(nc: Connection, args: argparse.Namespace, status: ProjectorStatus,
                      live: dict[str, bytes]) -> bool:
    """Replay one projector's input (a partition's: only what it folds) and compare the
    records it writes; prints the outcome, True when identical."""
    # The projector expires at its watermark (an older one at its tick): replay does too.
    now = (status.watermark_ts if status.watermark_ts is not None
           else parse_time(status.last_tick))
    hosts = [args.host] if args.host else None
    k, n = status.partition, status.partitions or 1
    name = "the projector" if k is None else f"partition {k} of {n}"
    if status.start_seq == 0 and status.checkpoint == 0:
        print(f"crr replay: note: {name} did not record its start sequence (older "
              "version); replaying the full history", file=sys.stderr)
    replay = Replay([CapturePoint(seq=status.last_seq, now=now)], lps_upto=status.start_seq,
                    hosts=hosts, keep=None if k is None else owns(k, n))
    report = await run_replay(replay, nc=nc, file=args.file, stop_seq=status.last_seq,
                              label="verify" if k is None else f"verify {k}/{n}")
    _notes(report)
    cap = replay.captures[0]
    mine = cap.records()
    if k is not None:  # what this partition writes (the others' hosts are theirs)
        mine = {s: b for s, b in mine.items() if owner(s, n) == k}
        live = {s: b for s, b in live.items() if owner(s, n) == k}
    if hosts is not None:
        live = {s: b for s, b in live.items() if s in mine}
    differences: list[str] = []
    orphans: list[str] = []
    first = report.first_seq or 1
    for subject in sorted(set(mine) | set(live)):
        a, b = mine.get(subject), live.get(subject)
        if a == b:
            continue
        if a is None:
            assert b is not None
            as_of = msgspec.json.decode(b).get("as_of", {}).get("seq", 0)
            if first > 1 and as_of < first:
                orphans.append(subject)
                continue
            differences.append(f"{subject}: in CRR_SNAPSHOT, not in the replay")
        elif b is None:
            if subject == SNAPSHOT_CLUSTER and cap.cluster.as_of.seq == 0:
                continue  # never written: nothing ever changed the cluster record
            differences.append(f"{subject}: in the replay, not in CRR_SNAPSHOT")
        else:
            differences.append(f"{subject}:")
            differences.extend("    " + d for d in json_differences(a, b))
    where = (f"seq {status.last_seq} ({name} {status.projector_id or '?'}, started at seq "
             f"{status.start_seq}, tick {status.last_tick})")
    if orphans:
        print(f"crr replay: note: {len(orphans)} record(s) have no events left in CRR_EVENTS "
              f"(aged out), not compared: {', '.join(orphans[:5])}", file=sys.stderr)
    if differences:
        print(f"replay differs from CRR_SNAPSHOT at {where}:")
        print("\n".join(differences))
        print("(a live record can legitimately differ if an event reached the projector after "
              "it had already expired past that event's server time: clock skew, or a report "
              "landing exactly at its deadline)")
        return False
    compared = len(set(mine) & set(live))
    print(f"verified: {compared} record(s) byte-identical at {where}; "
          f"{report.events} event(s) read")
    return True
