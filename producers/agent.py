"""The worker agent: runs this host's script reporters and follows the catalog live.

The agent takes the active catalog from `crr.v1.snapshot.catalog`
(`crr.bus.catalog_watch`), runs every `script` reporter whose `hosts` patterns
match its host, and applies every catalog change without a restart: a new
reporter starts, a removed one is stopped (its process group killed, Health
`stopped`), a changed one (its spec, or the resources it owns) is restarted
with the new settings.  Events go through one `Outbox`, so a NATS outage
costs nothing but latency.  Each agent start has a random boot id; every
reporter keeps one publisher (one `seq` counter) for the whole boot.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from crr.bus.cancel import cancel_and_wait
from crr.bus.catalog_watch import follow_catalog
from crr.bus.connection import Connection
from crr.bus.outbox import Outbox
from crr.producers.publisher import ReporterPublisher
from crr.producers.runner import ReporterRunner, RunnerConfig
from crr.schemas.catalog import Catalog
from crr.schemas.errors import CrrTimeoutError

log = logging.getLogger("crr.agent")


class Agent:
    """Script reporters of one host, driven by the catalog (see module doc)."""

    def __init__(
        self,
        nc: Connection,
        host: str,
        reporters_dir: str | Path,
        *,
        environ: Mapping[str, str] | None = None,
        boot: str | None = None,
        kill_grace: float = 1.0,
        exit_grace: float = 0.5,
    ) -> None:
        self.nc = nc
        self.host = host
        self.reporters_dir = Path(reporters_dir).resolve()
        self.environ = dict(os.environ if environ is None else environ)
        self.boot = boot or secrets.token_hex(6)
        self.kill_grace = kill_grace
        self.exit_grace = exit_grace
        self.outbox = Outbox(nc, on_error=self._on_publish_error)
        self.runners: dict[str, ReporterRunner] = {}
        self.publishers: dict[str, ReporterPublisher] = {}
        self.catalog: Catalog | None = None
        self.catalogs_applied = 0
        self.applied = asyncio.Condition()
        self._follow: asyncio.Task[None] | None = None
        self._stopped = False

    def _on_publish_error(self, subject: str, exc: Exception) -> None:
        log.error("the server refused a publish on %s (check this host's NATS permissions): %s",
                  subject, exc)

    async def start(self) -> None:
        """Start publishing and following the catalog (returns at once)."""
        await self.outbox.start()
        self._follow = asyncio.create_task(self._follow_catalog(), name="crr-agent-catalog")

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set (or the catalog watch fails), then shut down cleanly."""
        await self.start()
        assert self._follow is not None
        follow = self._follow
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([stopping, follow], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            await self.stop()
        if follow.done() and not follow.cancelled() and follow.exception() is not None:
            raise follow.exception()  # type: ignore[misc]

    async def _follow_catalog(self) -> None:
        """Follow the catalog for good; a missing stream or a NATS error is retried.

        The agent may start before the streams are provisioned or while the
        server is away: it keeps its current reporters running and retries.
        """
        await follow_catalog(self.nc, self.apply)

    def _publisher(self, name: str) -> ReporterPublisher:
        pub = self.publishers.get(name)
        if pub is None:
            pub = self.publishers[name] = ReporterPublisher(
                self.outbox, reporter=name, host=self.host, boot=self.boot)
        return pub

    async def apply(self, catalog: Catalog) -> None:
        """Make the running reporters match `catalog` (start, stop, restart)."""
        if self._stopped:
            return
        wanted = {
            name: RunnerConfig.from_catalog(catalog, name)
            for name, spec in catalog.reporters.items() if spec.runs_on(self.host)
        }
        stops = []
        for name, runner in list(self.runners.items()):
            config = wanted.get(name)
            if config is None:
                log.info("reporter %s removed (or not for %s): stopping", name, self.host)
                stops.append(runner.stop(publish=True))
                del self.runners[name]
            elif config != runner.config:
                log.info("reporter %s changed: restarting", name)
                stops.append(runner.stop(publish=False))
                del self.runners[name]
        await asyncio.gather(*stops)
        for name, config in wanted.items():
            if name not in self.runners:
                runner = ReporterRunner(
                    config, host=self.host, publisher=self._publisher(name),
                    reporters_dir=self.reporters_dir, agent_env=self.environ,
                    kill_grace=self.kill_grace, exit_grace=self.exit_grace)
                self.runners[name] = runner
                runner.start()
        self.catalog = catalog
        async with self.applied:
            self.catalogs_applied += 1
            self.applied.notify_all()

    async def wait_applied(self, count: int = 1, within: float = 10.0) -> None:
        """Wait until `count` catalogs have been applied (tests and tools; never a sleep)."""
        async with self.applied:
            try:
                await asyncio.wait_for(
                    self.applied.wait_for(lambda: self.catalogs_applied >= count), within)
            except TimeoutError:
                raise CrrTimeoutError(
                    f"agent applied {self.catalogs_applied} catalog(s), not {count}, "
                    f"within {within:g}s") from None

    async def stop(self, flush_timeout: float = 5.0) -> None:
        """Stop every reporter (no child left), publish `stopped`, flush the outbox."""
        if self._stopped:
            return
        self._stopped = True
        if self._follow is not None:
            try:
                await cancel_and_wait(self._follow)
            except Exception:  # re-raised by run(); logged for start()/stop() users
                log.exception("following the catalog failed")
            self._follow = None
        runners = list(self.runners.values())
        self.runners.clear()
        await asyncio.gather(*(r.stop(publish=True) for r in runners))
        await self.outbox.close(flush_timeout)
