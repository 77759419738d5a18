"""Replay throughput: `python -m tests.bench.replay [--hosts N] [--reports N]`.

Three rates over the same events (the `tests.bench.fold` workload: 20-value
reports round-robin over the hosts), measured in the same run:

- raw fold: `crr.projections.fold.apply` over in-memory Envelopes (the baseline);
- replay from a file: `crr events export` lines read and decoded by
  `crr.history.replay.read_export`, folded by `crr.projections.history.Replay`;
- replay from the stream: the same events published to CRR_EVENTS on an
  embedded nats-server, read back with an ordered consumer and folded.

Goal: replay from a file at >= 50% of the raw fold rate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path

from crr.bus.connection import connect
from crr.bus.ordered import StoredMessage
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.history.replay import export_line, read_export, run_replay
from crr.projections.envelope import Envelope
from crr.projections.fold import apply
from crr.projections.history import CapturePoint, Replay
from crr.projections.state import ProjectionState
from crr.schemas.subjects import MSG_ID_HEADER
from tests.bench.fold import catalog_envelope, envelopes


def fold_seconds(envs: list[Envelope]) -> float:
    """The raw fold: apply every envelope to a fresh state."""
    state = ProjectionState()
    gc.collect()
    t = time.perf_counter()
    for env in envs:
        apply(state, env)
    return time.perf_counter() - t


def write_file(envs: list[Envelope], path: Path) -> None:
    """An export file of `envs`, written with the exporter's own line encoder."""
    with path.open("wb") as f:
        for env in envs:
            f.write(export_line(StoredMessage(env.seq, env.received_at, env.subject, env.data,
                                              {MSG_ID_HEADER: f"bench/{env.seq}"}, 0)))


def file_seconds(path: Path, n: int) -> float:
    """Replay the whole file (read, decode, fold)."""
    replay = Replay([CapturePoint()])
    gc.collect()
    t = time.perf_counter()
    report = read_export(path, replay.feed_many)
    replay.finish()
    elapsed = time.perf_counter() - t
    assert report.events == n, report
    assert not report.skipped, report.skipped[:3]
    return elapsed


async def stream_seconds(envs: list[Envelope], store: Path) -> float:
    """Publish `envs` to a fresh server, then time a replay from CRR_EVENTS."""
    with NatsServer(store) as server:
        async with connect(server.url, name="crr-bench-replay") as nc:
            await provision(nc)
            js = nc.jetstream()
            window = 2000
            for i in range(0, len(envs), window):
                await asyncio.gather(*(js.publish(e.subject, e.data)
                                       for e in envs[i:i + window]))
            replay = Replay([CapturePoint()])
            gc.collect()
            t = time.perf_counter()
            report = await run_replay(replay, nc=nc, file=None)
            elapsed = time.perf_counter() - t
            assert report.events == len(envs), report
            return elapsed


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 if the file replay misses its goal."""
    ap = argparse.ArgumentParser(prog="python -m tests.bench.replay",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--hosts", type=int, default=2000, help="hosts reporting (default 2000)")
    ap.add_argument("--reports", type=int, default=100_000, help="reports (default 100k)")
    ap.add_argument("--stream-reports", type=int, default=50_000,
                    help="reports for the stream replay (default 50k; 0 skips it)")
    ap.add_argument("--runs", type=int, default=3, help="timings per variant; best counts")
    args = ap.parse_args(argv)

    envs = [catalog_envelope(), *envelopes(args.hosts, args.reports)]
    n = len(envs)
    print(f"{n} events (20-value reports over {args.hosts} hosts, after a catalog), "
          f"best of {args.runs}")
    with tempfile.TemporaryDirectory(prefix="crr-bench-replay-") as tmp:
        path = Path(tmp) / "events.jsonl"
        write_file(envs, path)
        size = path.stat().st_size
        t_fold = min(fold_seconds(envs) for _ in range(args.runs))
        t_file = min(file_seconds(path, n) for _ in range(args.runs))
        rate_fold, rate_file = n / t_fold, n / t_file
        print(f"  raw fold (in-memory Envelopes): {rate_fold:>10,.0f} events/s")
        print(f"  replay from a file:             {rate_file:>10,.0f} events/s "
              f"({size / t_file / 1e6:.0f} MB/s)   {rate_file / rate_fold:.0%} of raw fold "
              f"(goal >= 50%)")
        if args.stream_reports:
            senvs = [catalog_envelope(), *envelopes(args.hosts, args.stream_reports)]
            t_stream = asyncio.run(stream_seconds(senvs, Path(tmp) / "nats"))
            rate_stream = len(senvs) / t_stream
            print(f"  replay from CRR_EVENTS:         {rate_stream:>10,.0f} events/s "
                  f"({len(senvs)} events)   {rate_stream / rate_fold:.0%} of raw fold")
    return 0 if rate_file / rate_fold >= 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
