"""`crr demo`: everything on one machine — embedded NATS, catalog, projector, reporters, live table.

Leaves nothing behind: the server runs in a temporary store and is stopped
on exit (Ctrl-C or `--duration`), and every task is cancelled.

It says what it shows: the server's URL and the `export NATS_URL=…` that points
a second terminal's `crr` commands at it, and that `sim03` stops reporting on
purpose (the example of a failure: stale values, silent reporters, STATUS
failing).  On a terminal the table is redrawn every `--refresh`; when stdout is
not one (a pipe, a log) only changes are printed as they happen (a host's STATUS
or reporter states), then the table once at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from crr.admin.host_status import host_status
from crr.admin.nats_auth import secure_demo_setup
from crr.bus import jetstream
from crr.bus.connection import Connection, connect
from crr.bus.outbox import Outbox
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.host_listing import legend, render_hosts, reporter_problems
from crr.producers.agent import Agent
from crr.producers.external import CentralRunner, ExternalPublisher
from crr.producers.simulator import publish_round, simulated_hosts
from crr.projector.service import Projector
from crr.runtime.shutdown import stop_on_signals
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.codec import encode
from crr.schemas.errors import CrrError
from crr.schemas.subjects import CATALOG
from crr.schemas.wire_time import format_time
from crr.view.snapshot_reader import SnapshotContents, read_snapshot

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

SERVER_EXIT_GRACE: Final = 1.0
"""Seconds an error waits for the server watch before it is taken as the error itself."""
FAILING_SIM: Final = "sim03"
"""The simulated host that stops reporting on purpose: the demo's example of a failure."""
FAILING_AFTER: Final = 3
"""Rounds (2 s apart) it reports before going quiet; its values expire ~12 s in."""
FAILURE_NOTE: Final = (
    f"{FAILING_SIM} fails on purpose: it stops reporting after a few seconds, so from ~12 s "
    "on its values are stale (~), its reporters silent and its STATUS failing: the demo's "
    "example of a failure")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr demo`."""
    p = sub.add_parser("demo", parents=[common],
                       help="all-in-one demo on an embedded NATS server with a live table")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: run until Ctrl-C)")
    p.add_argument("--hosts", type=int, default=3, help="simulated hosts beside the agent")
    p.add_argument("--host", default="demo-node", help="host name of the demo's real agent")
    p.add_argument("--catalog", default=str(EXAMPLES / "resources.yaml"),
                   help="resources.yaml to use (default: the bundled example)")
    p.add_argument("--refresh", type=float, default=1.0, help="table refresh period, seconds")
    p.add_argument("--secure", action="store_true",
                   help="generate credentials and run with the server's authorization on")
    p.add_argument("--tls", action="store_true", help="with --secure: serve tls:// with a "
                   "throw-away CA")
    p.set_defaults(func=run)


async def _simulate(outbox: Outbox, args: argparse.Namespace, stop: asyncio.Event) -> None:
    catalog = load_catalog(args.catalog)
    hosts = simulated_hosts([f"sim{i:02d}" for i in range(1, args.hosts + 1)], seed=1)
    reporters = sorted({r.reporter for r in catalog.resources.values() if r.scope == "host"})
    # FAILING_SIM goes quiet after a while so the table shows values turning stale.
    while not stop.is_set():
        live = [h for h in hosts
                if h.host != FAILING_SIM or h.seq < FAILING_AFTER * len(reporters)]
        publish_round(outbox, live, catalog, reporters, format_time(time.time()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)


def _reporters_dir(catalog_file: str) -> Path:
    """Relative reporter commands resolve against the catalog file's directory."""
    return Path(catalog_file).resolve().parent


def _demo_environment(store: Path) -> dict[str, str]:
    """What the example reporters read: a scratch dir, a dataset cache, a site flag."""
    cache = store / "dataset-cache"
    for name in ("imagenet", "c4", "the-pile"):
        (cache / name).mkdir(parents=True, exist_ok=True)
    flag = store / "site-flag"
    flag.write_text("ok\n")
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
            "CRR_SCRATCH_DIR": str(store), "CRR_DATASET_DIR": str(cache),
            "CRR_SITE_FLAG": str(flag)}


@dataclass
class _Endpoint:
    """Where the demo's components connect, and with which credentials per role."""

    url: str
    server: NatsServer
    tls_ca: str | None = None
    creds: dict[str, str | None] = field(default_factory=dict)


async def _start_server(args: argparse.Namespace, store: Path, sims: list[str]) -> _Endpoint:
    if not args.secure:
        server = NatsServer(store / "nats", port=0)
        await asyncio.to_thread(server.start)
        return _Endpoint(url=server.url, server=server)
    demo = await secure_demo_setup(store, catalog=load_catalog(args.catalog), hosts=[args.host],
                                   simulated_hosts=sims, tls=args.tls)
    roles = {r: demo.creds(r) for r in ("admin", "projector", "simulator", "view")}
    return _Endpoint(
        url=demo.url, server=demo.server, tls_ca=str(demo.tls_ca) if demo.tls_ca else None,
        creds={**roles, "agent": str(demo.bundle.for_host(args.host)),
               "flexlm": str(demo.bundle.for_reporter("flexlm"))},
    )


async def run(args: argparse.Namespace) -> int:
    """Run the demo until Ctrl-C or --duration."""
    if args.tls and not args.secure:
        raise CrrError("--tls goes with --secure")
    catalog = load_catalog(args.catalog)
    stop = stop_on_signals()
    sims = [f"sim{i:02d}" for i in range(1, args.hosts + 1)]
    with tempfile.TemporaryDirectory(prefix="crr-demo-") as tmp:
        store = Path(tmp)
        ep = await _start_server(args, store, sims)
        mode = " with authorization" + (" and TLS" if args.tls else "") if args.secure else ""
        print(f"crr demo: embedded nats-server at {ep.url}{mode}", flush=True)
        print("\n".join(_intro(ep, sims, live=sys.stdout.isatty())), flush=True)
        tasks: list[asyncio.Task[Any]] = []
        watcher = _ServerWatch(ep.server, stop)
        try:
            async with contextlib.AsyncExitStack() as stack:

                async def conn(role: str) -> Connection:
                    return await stack.enter_async_context(connect(
                        ep.url, creds=ep.creds.get(role), tls_ca=ep.tls_ca,
                        name=f"crr-demo-{role}"))

                admin = await conn("admin")
                await provision(admin)
                await jetstream.publish(admin, CATALOG, encode(catalog))
                projector = Projector(await conn("projector"), status_interval=1.0)
                tasks.append(asyncio.create_task(projector.run(stop)))
                await asyncio.wait_for(projector.ready.wait(), 30)
                environ = _demo_environment(store)
                agent = Agent(await conn("agent"), args.host, _reporters_dir(args.catalog),
                              environ=environ)
                tasks.append(asyncio.create_task(agent.run(stop)))
                if "flexlm" in catalog.reporters and catalog.reporters["flexlm"].command:
                    rep = await stack.enter_async_context(ExternalPublisher.connect(
                        reporter="flexlm", url=ep.url, creds=ep.creds.get("flexlm"),
                        tls_ca=ep.tls_ca))
                    central = CentralRunner(rep, reporters_dir=_reporters_dir(args.catalog),
                                            environ=environ)
                    await central.apply(catalog)
                    stack.push_async_callback(central.stop)
                outbox = Outbox(await conn("simulator"))
                await outbox.start()
                stack.push_async_callback(outbox.close, 2.0)
                tasks.append(asyncio.create_task(_simulate(outbox, args, stop)))
                await _show(await conn("view"), catalog, args, stop, live=sys.stdout.isatty())
                stop.set()
                for t in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait_for(t, 10)
        except (CrrError, TimeoutError) as exc:
            # A NATS error after the server died is its consequence: say the cause (the
            # watch may be a moment behind the error: it is given that moment).
            if not await watcher.settled(SERVER_EXIT_GRACE):
                raise
            raise CrrError(watcher.message()) from exc
        finally:
            watcher.closing = True
            for t in tasks:
                t.cancel()
            await asyncio.to_thread(ep.server.stop)
            await watcher.done()
    if watcher.died is not None:
        raise CrrError(watcher.message())
    print("crr demo: stopped; embedded server shut down")
    return 0


class _ServerWatch:
    """Says at once when the embedded server exits on its own (not at the demo's own
    shutdown), with its exit status or signal, and stops the demo."""

    def __init__(self, server: NatsServer, stop: asyncio.Event) -> None:
        self.server = server
        self.stop = stop
        self.closing = False
        """Set before the demo stops the server itself."""
        self.died: str | None = None
        self._task = asyncio.create_task(self._watch())

    def message(self) -> str:
        """The one line the demo ends with when its server died."""
        return (f"the embedded nats-server exited ({self.died}); the demo cannot go on "
                "without it")

    async def _watch(self) -> None:
        how = await asyncio.to_thread(self.server.wait_exit)
        if not self.closing:
            self.died = how
            print(f"crr demo: {self.message()}; stopping", file=sys.stderr, flush=True)
            self.stop.set()

    async def settled(self, timeout: float) -> bool:
        """Whether the server died on its own, waiting up to `timeout` s for the watch."""
        if self.died is None:
            await asyncio.wait({self._task}, timeout=timeout)
        return self.died is not None

    async def done(self) -> None:
        """Wait for the watch to end (the server has been stopped by then)."""
        await self._task


def _intro(ep: _Endpoint, sims: list[str], *, live: bool) -> list[str]:
    """What the demo shows and how to look at it from a second terminal while it runs."""
    env = [f"export NATS_URL={ep.url}"]
    if ep.creds.get("view"):
        env.append(f"export NATS_CREDS={ep.creds['view']}  # read-only `view` credentials")
    if ep.tls_ca:
        env.append(f"export NATS_CA={ep.tls_ca}")
    lines = ["crr demo: to use this server from a second terminal while the demo runs:",
             *(f"    {e}" for e in env),
             "    crr hosts; crr select 'scratch_free > 100'; crr health"]
    if FAILING_SIM in sims:
        lines.append(f"crr demo: {FAILURE_NOTE}")
    if not live:
        lines.append("crr demo: stdout is not a terminal: printing changes as they happen, "
                     "and the table at the end")
    return lines


def _print_table(contents: SnapshotContents, catalog: Catalog, now: float, *,
                 live: bool) -> None:
    """The table of hosts × values, with its legend (and the note on the failing host)."""
    host_res = sorted(n for n, r in catalog.resources.items() if r.scope == "host")
    table = render_hosts(list(contents.hosts.values()), contents.cluster, host_res, now=now)
    status = contents.projector
    print(f"crr demo — {format_time(now)}  projector seq "
          f"{status.last_seq if status else 0}, lag {status.lag if status else 0}"
          + ("  (Ctrl-C to stop)" if live else ""))
    print(table)
    print(legend(status=True))
    if FAILING_SIM in contents.hosts:
        print(f"note: {FAILURE_NOTE}")
    print(flush=True)


class _Changes:
    """What changed since the last look, per host: its STATUS and its reporters' states."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.seen: dict[str, tuple[str, str]] = {}

    def lines(self, contents: SnapshotContents, now: float) -> list[str]:
        """One line per host that appeared or changed (`+12s sim03: ok -> failing (…)`)."""
        out = []
        for host in sorted(contents.hosts):
            snap = contents.hosts[host]
            state = (host_status(snap, now), reporter_problems(snap))
            before = self.seen.get(host)
            if state == before:
                continue
            self.seen[host] = state
            was = "" if before is None or before[0] == state[0] else f"{before[0]} -> "
            why = "" if state[1] == "ok" else f" ({state[1]})"
            deliberate = " - on purpose, see above" if host == FAILING_SIM and \
                state[0] != "ok" else ""
            out.append(f"+{now - self.started:.0f}s {host}: {was}{state[0]}{why}{deliberate}")
        return out


async def _show(nc: Connection, catalog: Catalog, args: argparse.Namespace,
                stop: asyncio.Event, *, live: bool) -> None:
    """Until stop or --duration: on a terminal (`live`) redraw the table every --refresh
    seconds; else print what changed, then the table once at the end."""
    started = time.time()
    deadline = time.monotonic() + args.duration if args.duration else None
    changes = _Changes(started)
    while not stop.is_set():
        contents = await read_snapshot(nc)
        now = time.time()
        if live:
            print("\x1b[2J\x1b[H", end="")
            _print_table(contents, catalog, now, live=True)
        else:
            for line in changes.lines(contents, now):
                print(line, flush=True)
        wait = args.refresh
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
            if wait <= 0:
                break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
    if not live:
        print()
        _print_table(await read_snapshot(nc), catalog, time.time(), live=False)
