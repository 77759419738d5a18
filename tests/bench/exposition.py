"""Exposition reporters: parse-and-map time of a 10k-series scrape, and the agent's CPU.

    python -m tests.bench.exposition [--rounds 30] [--duration 90] [--interval 15]

1. Parse and map, p50 over `--rounds`: a 10,000-series dcgm-exporter `/metrics` body of
   an 8-GPU node (the 54 fields of tests/fixtures/dcgm/a100x8.prom — dcgm-exporter's
   default-counters.csv, commented-out ones included — for 8 GPUs, plus per-lane
   NVLink counters to make up 10,000 series, all with the real label set), mapped by
   ops/examples/gpu-node.yaml's `dcgm` reporter (11 resources, 8 devices × 5
   attributes): `ExpositionMap.from_text`, which parses the lines of the metrics the
   mapping reads.  Baseline in the same run: prometheus-client's parse of the whole
   body (what a mapping would cost without that filter), p50 of 3.
2. Agent CPU: the real `crr agent` (a child process, through the CLI) on an embedded
   nats-server scrapes that body every `--interval` seconds from a local HTTP server
   (`python -m http.server`, another process) with the `dcgm` reporter of
   gpu-node.yaml; its own utime+stime from /proc over `--duration` seconds after its
   first report, as a share of one core.  Goal: <= 1 %.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import nats
from nats.aio.msg import Msg

from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.producers.exposition import ExpositionMap, parse_exposition
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.codec import encode
from crr.schemas.subjects import REPORTS, SNAPSHOT_CATALOG
from tests.bench.agent import share, usage

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "dcgm" / "a100x8.prom"
EXAMPLE = ROOT / "ops" / "examples" / "gpu-node.yaml"
LABELS = ('gpu="{i}",UUID="GPU-c89b14a3-ce7c-6725-8424-b55d37d9c33{i}",device="nvidia{i}",'
          'modelName="NVIDIA A100 80GB PCIe",Hostname="nvidia-dcgm-exporter-d2khm",'
          'DCGM_FI_DRIVER_VERSION="510.47.03",container="",namespace="",pod=""')
KINDS = ("CRC_FLIT_ERROR_COUNT", "CRC_DATA_ERROR_COUNT", "REPLAY_ERROR_COUNT",
         "RECOVERY_ERROR_COUNT", "BANDWIDTH", "TX_BYTES", "RX_BYTES", "ERROR_DL_CRC")


def body(series: int = 10_000) -> str:
    """The 8-GPU `/metrics` body: the fixture's fields, then per-lane NVLink counters."""
    lines = FIXTURE.read_text().splitlines()
    count = sum(1 for line in lines if line and not line.startswith("#"))
    lane = 0
    while count < series:
        name = f"DCGM_FI_DEV_NVLINK_{KINDS[lane % len(KINDS)]}_L{lane // len(KINDS)}"
        lines += [f"# HELP {name} NVLink counter of one lane.", f"# TYPE {name} counter"]
        for gpu in range(8):
            if count < series:
                lines.append(f"{name}{{{LABELS.format(i=gpu)}}} {lane * 1000 + gpu}")
                count += 1
        lane += 1
    return "\n".join(lines) + "\n"


def dcgm_catalog(url: str, interval: float) -> Catalog:
    """gpu-node.yaml's `dcgm` reporter and its resources alone, scraping `url`."""
    full = load_catalog(EXAMPLE)
    spec = msgspec.structs.replace(full.reporters["dcgm"], url=url, interval=interval)
    return Catalog(resources={n: full.resources[n] for n in full.resources_of("dcgm")},
                   reporters={"dcgm": spec})


def parse_and_map(text: str, rounds: int) -> int:
    """Part 1: print the p50 of parse-and-map and of the library's whole parse."""
    data = text.encode()
    mapping = ExpositionMap(load_catalog(EXAMPLE).reporters["dcgm"])
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = mapping.from_text(data)
        times.append(time.perf_counter() - t0)
    whole = []
    for _ in range(3):
        t0 = time.perf_counter()
        parse_exposition(text)
        whole.append(time.perf_counter() - t0)
    print(f"exposition: {len(data) / 1e6:.2f} MB, "
          f"{sum(1 for ln in text.splitlines() if ln and ln[0] != '#')} series, 8 GPUs; "
          f"mapped {len(out.values or {})} values, "
          f"{len(out.inventory.devices) if out.inventory else 0} devices, "
          f"{len(out.problems)} problems")
    print(f"parse-and-map (gpu-node.yaml dcgm): p50 {statistics.median(times) * 1e3:.1f} ms "
          f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}, n={rounds})")
    print(f"baseline, prometheus-client parse of all series: p50 "
          f"{statistics.median(whole) * 1e3:.0f} ms (n=3)")
    return 0 if not out.problems else 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def agent_cpu(text: str, interval: float, duration: float) -> int:
    """Part 2: the agent's CPU share scraping `text` every `interval` seconds."""
    with tempfile.TemporaryDirectory(prefix="crr-bench-expo-") as tmp, \
            NatsServer(Path(tmp) / "store") as server:
        (Path(tmp) / "metrics").write_text(text)
        port = _free_port()
        web = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
            "--directory", tmp, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        nc = await nats.connect(server.url)
        await provision(nc)
        reports: list[float] = []
        got = asyncio.Event()

        async def on_report(_msg: Msg) -> None:
            reports.append(time.monotonic())
            got.set()

        await nc.subscribe(REPORTS, cb=on_report)
        await nc.jetstream().publish(SNAPSHOT_CATALOG, encode(
            dcgm_catalog(f"http://127.0.0.1:{port}/metrics", interval)))
        agent = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crr.cli", "agent", "--host", "bench", "--reporters-dir", tmp,
            "--server", server.url, env={**os.environ, "NATS_URL": server.url})
        try:
            await asyncio.wait_for(got.wait(), 60)  # the first scrape went through
            a0 = usage(agent.pid)
            first = len(reports)
            await asyncio.sleep(duration)  # the measured window, not synchronisation
            a1 = usage(agent.pid)
            scrapes = len(reports) - first
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(agent.wait(), 15)
            except TimeoutError:
                agent.kill()
                await agent.wait()
            web.kill()
            await web.wait()
            await nc.drain()
    cpu = share(a0, a1)
    print(f"agent, dcgm scrape of {len(text) / 1e6:.2f} MB every {interval:g}s: "
          f"{cpu:.2f} % of a core over {duration:g}s ({scrapes} reports), "
          f"RSS {a1.rss_mb:.1f} MB (peak {a1.hwm_mb:.1f}); {os.cpu_count()} CPU(s), shared machine")
    ok = cpu <= 1.0 and scrapes > 0
    print("goal (<= 1 % of a core):", "met" if ok else "NOT met")
    return 0 if ok else 1


def main() -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.exposition", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--interval", type=float, default=15.0)
    p.add_argument("--duration", type=float, default=90.0)
    p.add_argument("--skip-agent", action="store_true")
    args = p.parse_args()
    text = body()
    rc = parse_and_map(text, args.rounds)
    if not args.skip_agent:
        rc |= asyncio.run(agent_cpu(text, args.interval, args.duration))
    return rc


if __name__ == "__main__":
    sys.exit(main())
