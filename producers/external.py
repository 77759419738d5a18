"""The external-reporter SDK: publish crr values from any Python program (docs/contract.md,
"Subjects and streams").

An *external reporter* is a program that is not run by the agent: a
license-server poller, a file-system quota server, a dataset index.  It
connects with its **own** credentials (`crr nats-config` writes one file per
reporter, allowed to publish only its own subjects) and gets the agent's
guarantees: one random `boot` per connection, one `seq` counter per
(reporter, host), `Nats-Msg-Id: <reporter>/<host or _cluster>/<boot>/<seq>`
(retries are de-duplicated by the stream), tenacity-paced retries, and,
while NATS is away, the newest report per subject kept (health changes all
kept) and flushed on reconnect.

Usage::

    from crr import ExternalReporter

    async with ExternalReporter.connect(reporter="flexlm", url="nats://bus:4222",
                                        creds="/etc/crr/flexlm.nk") as rep:
        rep.report({"matlab_free": 12})                    # cluster scope
        rep.report({"scratch_free": 812.5}, host="node1")  # host scope, for node1
        rep.inventory("licenses", devices)                 # pool name → generation kept
        rep.health("ok")
        await rep.flush()                                  # optional: wait for the acks

`report` / `inventory` / `health` never block and never raise for an outage.
`host=None` (the default) publishes on the cluster subjects
`crr.v1.<kind>.cluster.<reporter>`; `host="node1"` on
`crr.v1.<kind>.host.node1.<reporter>` — for resources of `scope: host`
(the projector rejects a value on the wrong kind of subject, and one the
reporter does not own).  A publish the server's authorization refuses is
not retried: it is logged, counted in `errors`, and passed to `on_error`.
Credentials are read from the file by the NATS client; they never appear in
events, logs or error messages.

`crr.ExternalReporter` is this class plus what needs the snapshot
(`crr.sdk.external_reporter`): the catalog check at connect and `submit`,
which waits for the projector's verdict on a report.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from crr.bus.connection import Connection, connect
from crr.bus.outbox import Outbox
from crr.producers.publisher import ReporterPublisher
from crr.producers.runner import ReporterRunner, RunnerConfig
from crr.schemas.catalog import Catalog
from crr.schemas.errors import CrrError
from crr.schemas.events import Device, Health, HealthState, Inventory, Pool, Report, check_finite

log = logging.getLogger("crr.external")

ErrorCallback = Callable[[str, Exception], None]


@dataclass(frozen=True)
class PublishError:
    """A publish the server refused for good (permissions, size): subject and cause."""

    subject: str
    error: str


class ExternalPublisher:
    """Publishes one reporter's values (cluster scope, or per host) through one outbox."""

    def __init__(
        self,
        nc: Connection,
        *,
        reporter: str,
        boot: str | None = None,
        on_error: ErrorCallback | None = None,
        ack_timeout: float = 5.0,
    ) -> None:
        self.nc = nc
        self.reporter = reporter
        self.boot = boot or secrets.token_hex(6)
        self.on_error = on_error
        self.errors: list[PublishError] = []
        """Publishes refused for good, oldest first (the last 100)."""
        self.outbox = Outbox(nc, on_error=self._refused, ack_timeout=ack_timeout)
        self._publishers: dict[str | None, ReporterPublisher] = {}
        self._pools: dict[tuple[str | None, str], tuple[int, list[Device]]] = {}

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        *,
        reporter: str,
        url: str | None = None,
        creds: str | None = None,
        tls_ca: str | None = None,
        on_error: ErrorCallback | None = None,
        attempts: int | None = None,
        flush_timeout: float = 5.0,
    ) -> AsyncIterator[Self]:
        """`async with ExternalPublisher.connect(reporter=..., url=..., creds=...) as rep:`.

        `creds` is a credentials file (nkey seed, `.creds`, or user/password
        file); `attempts=None` retries the first connection forever (a
        service), an int gives up after that many (AuthError at once for
        refused credentials).  On exit, pending events get `flush_timeout`
        seconds to be acknowledged.
        """
        async with connect(url, creds=creds, tls_ca=tls_ca, name=f"crr-external-{reporter}",
                           attempts=attempts) as nc:
            rep = cls(nc, reporter=reporter, on_error=on_error)
            await rep.start()
            try:
                yield rep
            finally:
                await rep.close(flush_timeout)

    async def start(self) -> None:
        """Start the background sender (done by `connect`)."""
        await self.outbox.start()

    async def close(self, flush_timeout: float = 5.0) -> None:
        """Try to flush for `flush_timeout` s, then stop (unsent events are logged)."""
        await self.outbox.close(flush_timeout)

    async def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything published so far is acknowledged (or refused)."""
        await self.outbox.flush(timeout)

    def _refused(self, subject: str, exc: Exception) -> None:
        self.errors.append(PublishError(subject, str(exc)))
        del self.errors[:-100]
        if self.on_error is not None:
            self.on_error(subject, exc)

    def publisher(self, host: str | None = None) -> ReporterPublisher:
        """The publisher (own `seq` counter) for `host`, or the cluster when None."""
        pub = self._publishers.get(host)
        if pub is None:
            pub = self._publishers[host] = ReporterPublisher(
                self.outbox, reporter=self.reporter, host=host, boot=self.boot)
        return pub

    def report(
        self, values: Mapping[str, Any], *, host: str | None = None,
        observed_at: float | None = None,
    ) -> Report:
        """Publish `values` (resource name → value; None means "cannot tell").

        Raises `PayloadError` (a ValueError) for NaN or ±infinity, before anything
        is published: JSON cannot carry them and `null` would mean "cannot tell".
        """
        check_finite(values)
        return self.publisher(host).report(
            values, time.time() if observed_at is None else observed_at)

    def inventory(
        self, pool: Pool | str, devices: Sequence[Device], *, host: str | None = None,
        observed_at: float | None = None,
    ) -> Inventory:
        """Publish the devices of `pool`.

        A bare pool name gets a generation that goes up whenever the devices
        change (DRA ResourceSlice semantics); pass a `Pool` to manage it yourself.
        """
        if isinstance(pool, str):
            generation, previous = self._pools.get((host, pool), (0, []))
            if list(devices) != previous:
                generation += 1
            self._pools[(host, pool)] = (generation, list(devices))
            pool = Pool(name=pool, generation=generation)
        return self.publisher(host).inventory(
            pool, devices, time.time() if observed_at is None else observed_at)

    def health(
        self, state: HealthState, detail: str | None = None, *, host: str | None = None,
        exit_code: int | None = None,
    ) -> Health:
        """Publish the reporter's state (`ok`, `failed`…) with an operator-readable `detail`."""
        return self.publisher(host).health(state, detail, exit_code)


class CentralRunner:
    """Runs an external reporter's `command` centrally: `crr external run` (LSF `[all]` pattern).

    The command follows the script protocol and gets the agent's containment
    (`crr.producers.runner.ReporterRunner`: own process group, minimal
    environment — no NATS credentials —, timeout, bounded output, backoff,
    quarantine); its reports, inventories and health go to the reporter's
    **cluster** subjects through an `ExternalPublisher`.  `apply(catalog)`
    starts, restarts (on a change of the reporter or its resources) or stops
    the runner, as the agent does.
    """

    def __init__(
        self,
        rep: ExternalPublisher,
        *,
        reporters_dir: str | Path,
        environ: Mapping[str, str] | None = None,
        label: str | None = None,
        kill_grace: float = 1.0,
        exit_grace: float = 0.5,
    ) -> None:
        self.rep = rep
        self.reporter = rep.reporter
        self.reporters_dir = Path(reporters_dir).resolve()
        self.environ = dict(os.environ if environ is None else environ)
        self.label = label or socket.gethostname().split(".", 1)[0]
        """`CRR_HOST` the command sees: the machine it runs on (its values are cluster-wide)."""
        self.kill_grace = kill_grace
        self.exit_grace = exit_grace
        self.runner: ReporterRunner | None = None
        self.applied = 0

    def check(self, catalog: Catalog) -> RunnerConfig:
        """The reporter's runner config in `catalog`; CrrError if it cannot be run centrally."""
        spec = catalog.reporter_spec(self.reporter)
        if spec.type != "external":
            raise CrrError(f"reporter {self.reporter!r} is a {spec.type} reporter: the agents "
                           "run it on the hosts; `crr external run` is for type: external")
        if not spec.command:
            raise CrrError(f"reporter {self.reporter!r} has no command to run (add "
                           "`command: [...]` to it, or publish with the SDK)")
        host_scope = [r for r in catalog.resources_of(self.reporter)
                      if catalog.resources[r].scope == "host"]
        if host_scope:
            log.warning("reporter %s owns host-scope resources (%s): `crr external run` "
                        "publishes cluster subjects only; report those per host with the SDK",
                        self.reporter, ", ".join(host_scope))
        return RunnerConfig.from_catalog(catalog, self.reporter)

    async def apply(self, catalog: Catalog) -> None:
        """Make the running command match `catalog` (start, restart, or stop it)."""
        try:
            config: RunnerConfig | None = self.check(catalog)
        except CrrError as exc:
            if self.applied == 0:
                raise
            log.error("%s; stopping it", exc)  # noqa: TRY400 - an operator error, no traceback
            config = None
        if self.runner is not None and self.runner.config != config:
            log.info("reporter %s %s", self.reporter, "changed: restarting" if config
                     else "stopped")
            await self.runner.stop(publish=config is None)
            self.runner = None
        if config is not None and self.runner is None:
            self.runner = ReporterRunner(
                config, host=self.label, publisher=self.rep.publisher(None),
                reporters_dir=self.reporters_dir, agent_env=self.environ,
                kill_grace=self.kill_grace, exit_grace=self.exit_grace)
            self.runner.start()
        self.applied += 1

    async def stop(self) -> None:
        """Stop the command (its whole process group) and publish Health `stopped`."""
        if self.runner is not None:
            await self.runner.stop(publish=True)
            self.runner = None
