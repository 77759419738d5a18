"""Catching up after a projector outage: time to a caught-up watermark, and flaps written.

`python -m tests.bench.catchup [--hosts N] [--outage S] [--json]`

One embedded server; the `tests.bench.fold` catalog (20 values a host, interval 30 s, so
a value is fresh for 45 s after its report) and one report per host, folded and written
by a projector that then stops (its task ends: no more writes, as after a SIGKILL).  The
hosts keep reporting while it is down: a report per host every interval, spread over
the outage.  Then a new projector starts and catches up.  Measured:

- restart → caught-up watermark: seconds from the new projector's start until its
  watermark (docs/contract.md, "Freshness at the watermark") passes the moment it was
  started, i.e. it has folded every event stored during the outage;
- flaps: values that a host record written during the catch-up shows `stale`, and a
  later one `fresh` again — must be 0: every host reported all along;
- the records written, and the events folded, during the catch-up.

The machine may be shared: the figures are one run's, with the rate the events of the
outage were stored at beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.msg import Msg

from crr.bus.connection import connect
from crr.bus.pipeline_publish import PipelinePublisher
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.projector.service import Projector
from crr.schemas.subjects import event_subject
from tests.bench.fold import INTERVAL, payload
from tests.bench.partitions import publish_hosts, running


class _Values(msgspec.Struct):
    state: str


class _Record(msgspec.Struct):
    host: str
    values: dict[str, _Values]


async def bench_catchup(hosts: int, outage: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "store") as server:
        async with connect(server.url, name="bench-catchup") as nc:
            await provision(nc)
            await publish_hosts(nc, hosts)
            first = Projector(nc)
            async with running([first]):
                pass  # ready: every host written; then it stops
            # Every host reports once an interval, spread evenly over it, through the outage
            # and the catch-up (the reporters do not know the projector is down).
            pipe = PipelinePublisher(nc, max_in_flight=1024)
            await pipe.start()
            start = time.monotonic()
            sent = 0
            reporting = asyncio.Event()

            async def report_forever() -> None:
                nonlocal sent
                n = 0
                while not reporting.is_set():
                    n += 1
                    for i in range(hosts):
                        # A first round at once (the setup's reports are that old), then
                        # one every interval per host: no host's gap outlives its values.
                        due = start if n == 1 else (start + (n - 2) * INTERVAL
                                                    + INTERVAL * i / hosts)
                        if (wait := due - time.monotonic()) > 0.05:
                            await asyncio.sleep(wait)  # the reporters' own rhythm
                        if reporting.is_set():
                            return
                        host = f"node{i:05d}"
                        await pipe.publish(event_subject("report", "bench", host),
                                           payload(host, n))
                        sent += 1

            reporters = asyncio.create_task(report_forever())
            await asyncio.sleep(outage)  # the outage: its length is what is measured
            during_outage = sent
            stored_rate = during_outage / (time.monotonic() - start)
            states: dict[tuple[str, str], list[str]] = {}
            written = 0

            async def on_record(msg: Msg) -> None:
                nonlocal written
                if not msg.data:
                    return
                written += 1
                rec = msgspec.json.decode(msg.data, type=_Record)
                for name, v in rec.values.items():
                    states.setdefault((rec.host, name), []).append(v.state)

            sub = await nc.subscribe("crr.v1.snapshot.host.>", cb=on_record)
            second = Projector(nc)
            restarted = time.time()
            t0 = time.perf_counter()
            async with running([second]) as ready_s:
                # The figure measured has no event of its own: polled, 50 ms resolution.
                while (second.watermark or 0.0) < restarted:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
                caught_up_s = time.perf_counter() - t0
                applied = second.applied
                await nc.flush()
            await sub.unsubscribe()
            reporting.set()
            await reporters
            await pipe.close(1.0)
    flaps = sum(1 for seq in states.values()
                if any(a == "stale" and b == "fresh" for a, b in itertools.pairwise(seq)))
    stale_written = sum(1 for seq in states.values() if "stale" in seq)
    return {"hosts": hosts, "outage_s": outage, "events_during_outage": during_outage,
            "events_during_catchup": sent - during_outage,
            "stored_per_s": round(stored_rate), "ready_s": round(ready_s, 2),
            "caught_up_watermark_s": round(caught_up_s, 2), "events_folded": applied,
            "records_written": written, "stale_values_written": stale_written,
            "flaps_written": flaps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.catchup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=50_000)
    parser.add_argument("--outage", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    res = asyncio.run(bench_catchup(args.hosts, args.outage))
    if args.json:
        print(json.dumps(res))
    else:
        for key, value in res.items():
            print(f"{key:>24}: {value}")
    return 0 if res["flaps_written"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
