"""Authorization at scale: `python -m tests.bench.auth [--hosts 10000] [--auth nkey|password]`.

Generates `crr nats-config` output for the example catalog and `--hosts`
hosts, starts nats-server with it, and measures:

* generation time (keys + config);
* server start time (process start to "Server is ready" in its log) and
  RSS after start (`/proc/<pid>/status` VmRSS);
* one host's connect time (the server checks its nkey signature / bcrypt
  hash among all users) and a JetStream publish with ack on its own subject.

Baseline, in the same run: the same nats-server with no authorization.
Password mode hashes every password with bcrypt (cost `--bcrypt-cost`,
default 11 as nats-server's own `passwd` tool): expect minutes for 10k.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from crr.admin.nats_auth import EXAMPLE_CATALOG, generate, server_config
from crr.bus.connection import connect
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.subjects import event_subject


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _start(store: Path, config: Path | None) -> tuple[NatsServer, float, float]:
    server = NatsServer(store, port=0, config_file=config, ready_timeout=120)
    started = time.monotonic()
    server.start()
    took = time.monotonic() - started
    assert server.proc is not None
    return server, took, _rss_mib(server.proc.pid)


async def _probe(url: str, creds: str | None, subject: str) -> float:
    started = time.monotonic()
    async with connect(url, creds=creds, name="bench-auth", attempts=1) as nc:
        took = time.monotonic() - started
        if creds is None:
            await provision(nc)
        await nc.jetstream().publish(subject, b"{}")
    return took


def main() -> None:
    """Run the benchmark and print each figure beside its baseline."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=10_000)
    p.add_argument("--auth", choices=["nkey", "password"], default="nkey")
    p.add_argument("--bcrypt-cost", type=int, default=11)
    args = p.parse_args()
    catalog = load_catalog(EXAMPLE_CATALOG)
    hosts = [f"node{i:05d}" for i in range(args.hosts)]
    with tempfile.TemporaryDirectory(prefix="crr-bench-auth-") as tmp:
        d = Path(tmp)
        t0 = time.monotonic()
        bundle = generate(catalog, hosts, d / "auth", mode=args.auth,
                          bcrypt_cost=args.bcrypt_cost)
        gen = time.monotonic() - t0
        conf = d / "auth" / "server.conf"
        conf.write_text(server_config(bundle))
        size = bundle.config.stat().st_size / 2**20

        base, base_start, base_rss = _start(d / "base", None)
        try:
            subject = event_subject("report", "scratch", hosts[-1])
            base_conn = asyncio.run(_probe(base.url, None, subject))
        finally:
            base.stop()
        server, start, rss = _start(d / "auth-store", conf)
        try:
            # Streams are provisioned by admin; the probe is the last host (worst case).
            async def admin() -> None:
                async with connect(server.url, creds=str(bundle.creds["admin"])) as nc:
                    await provision(nc)
            asyncio.run(admin())
            conn = asyncio.run(_probe(server.url, str(bundle.for_host(hosts[-1])), subject))
        finally:
            server.stop()
    print(f"{args.hosts} hosts, auth={args.auth}: config {size:.1f} MiB, "
          f"{len(bundle.creds)} identities, generated in {gen:.2f}s")
    print(f"{'':24}{'with auth':>12}{'baseline':>12}{'ratio':>8}")
    for name, a, b, unit in (("server start", start, base_start, "s"),
                             ("server RSS", rss, base_rss, "MiB"),
                             ("host connect", conn * 1000, base_conn * 1000, "ms")):
        print(f"{name + ' (' + unit + ')':24}{a:12.2f}{b:12.2f}{a / b:8.1f}")


if __name__ == "__main__":
    main()
