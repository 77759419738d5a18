"""Running one script reporter on one host: schedule, containment, health, backoff.

`periodic`: the script runs every `interval` (fixed rate, missed slots are
skipped); a run ends when its stdout is closed and the leader has exited.
Non-zero exit, a signal or a timeout discards the output.  With
`format: elim` (a one-shot elim, `mode: periodic` said explicitly) every
line of the run counts (later lines override earlier ones); an elim still
running `exit_grace` after its first line is taken to be a looping LSF elim
after all: the lines so far are the report and the elim is stopped (its
exit status then means nothing).

`stream`: the script runs for good; each line is a report.  When it ends,
it is restarted after a backoff.  This is how LSF runs an elim, and the
default for `format: elim` (see `crr.schemas.catalog_loader`): each complete
line `N name value …` is one report (a value a later line does not repeat
keeps its own expiry; a line `0` reports nothing and is fine).  An elim
that exits 0 after reporting is restarted one interval after its start
(LSF restarts an elim that exits) without a failure; any other end is one.
A stream script that wrote nothing at all within `interval + timeout` gets
Health `timeout` with a hint that its output is probably block-buffered
(the script keeps running; its first line makes it `ok`).

`tty: true` runs the script with stdout on a pseudo-terminal, so that
stdio, perl and python line-buffer as on a terminal (see `spawn`).

Containment: every script has its own process group.  A timeout sends
SIGTERM to the group and SIGKILL after `kill_grace`; when the leader exits
and a descendant still holds stdout past `exit_grace`, the group is killed;
after every run whatever is left of the group is killed and the leader is
reaped.  Output is bounded by `max_output_bytes` (see `script_pipes`).

Health (docs/contract.md, "Payloads"), published when the state (or exit code) changes:

- `ok`: a run (or stream line) produced a usable report;
- `failed`: the command is missing, not executable or cannot start, or a
  periodic run exited non-zero;
- `timeout`: a periodic run outlived `timeout` and was killed, or a stream
  script has written nothing at all yet (see above);
- `bad_output`: empty, non-JSON, truncated, malformed or over-size output
  (partly usable output is reported, and the state says what was dropped);
- `crashed`: a periodic run was killed by a signal, or a stream script
  ended (whatever its status);
- `restarting`: a stream script will be restarted after the backoff in `detail`;
- `quarantined`: `quarantine_after` consecutive failures; no more runs until
  the reporter changes in the catalog (or the agent restarts);
- `not_applicable`: the script exited with `not_applicable_exit`; not run
  again on this host;
- `stopped`: the reporter was removed from the catalog, or the agent stopped.

Backoff: a failure delays the next run by a full-jitter exponential delay
between `backoff_floor` and `min(backoff_cap, floor·2ⁿ⁻¹)` (`crr.bus.retry.Backoff`
with `full_jitter`); a periodic reporter also waits at least its
interval.  A usable report resets the count.

Nothing a script does may crash the agent: every run is guarded.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crr.bus.cancel import cancel_and_wait
from crr.bus.retry import Backoff
from crr.producers.exposition import ExpositionMap
from crr.producers.exposition_sources import ScrapeError, TextfileDirectory, scrape
from crr.producers.observe import RunObserver
from crr.producers.publisher import ReporterPublisher
from crr.producers.script_output import (
    BadOutput,
    ParsedOutput,
    ScriptInventory,
    parse_elim_line,
    parse_json_report,
    parse_report,
)
from crr.producers.script_pipes import BoundedCapture, LineReader, TailCapture
from crr.producers.spawn import (
    DEFAULT_PATH,
    CommandError,
    ExitStatus,
    ScriptProcess,
    resolve_command,
    script_environment,
    spawn,
)
from crr.schemas.catalog import Catalog, Kind, ReporterSpec
from crr.schemas.events import Device, HealthState, Pool

log = logging.getLogger("crr.agent.runner")

_MAX_DETAIL = 1500
BUFFERING_HINT = (
    "its output is probably block-buffered (stdout is a pipe, not a terminal): flush after "
    "each line — perl: `$| = 1;`, python: `python3 -u` or print(..., flush=True), C: "
    "setvbuf/fflush, other programs: `stdbuf -oL COMMAND` — or set `tty: true` on the reporter")
"""Why a long-running script may have written nothing, and the fixes (Health detail)."""


@dataclass(frozen=True)
class RunnerConfig:
    """Everything a runner depends on: a change of any of it restarts the runner."""

    name: str
    spec: ReporterSpec
    kinds: tuple[tuple[str, Kind], ...]
    """The resources this reporter owns and their kinds, sorted by name."""

    @classmethod
    def from_catalog(cls, catalog: Catalog, name: str) -> RunnerConfig:
        """The config of reporter `name` in `catalog`."""
        kinds = tuple((r, catalog.resources[r].kind) for r in catalog.resources_of(name))
        return cls(name=name, spec=catalog.reporters[name], kinds=kinds)


@dataclass(frozen=True)
class Outcome:
    """How one run (periodic) or one process lifetime (stream) went."""

    state: HealthState
    detail: str | None = None
    exit_code: int | None = None
    success: bool = False
    """A usable report came out of it (resets the backoff)."""


def _detail(what: str, stderr: str = "") -> str:
    text = f"{what}: {stderr}" if stderr else what
    return text if len(text) <= _MAX_DETAIL else text[:_MAX_DETAIL] + "…"


async def _first(*futures: asyncio.Future[Any], within: float | None) -> bool:
    """Wait until one of `futures` is done (True) or `within` seconds pass (False)."""
    if any(f.done() for f in futures):
        return True
    if within is not None and within <= 0:
        return False
    # asyncio.wait neither cancels nor consumes the futures, on timeout or cancellation.
    done, _ = await asyncio.wait(futures, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    return bool(done) or any(f.done() for f in futures)


class ReporterRunner:
    """Runs one reporter's script on this host until stopped (see module doc)."""

    def __init__(
        self,
        config: RunnerConfig,
        *,
        host: str,
        publisher: ReporterPublisher,
        reporters_dir: Path,
        agent_env: Mapping[str, str],
        kill_grace: float = 1.0,
        exit_grace: float = 0.5,
        observer: RunObserver | None = None,
    ) -> None:
        self.config = config
        self.observer = observer if observer is not None else RunObserver()
        """Optional hook: a span around each periodic run, run and lifecycle metrics."""
        self.spec = config.spec
        self.host = host
        self.publisher = publisher
        self.reporters_dir = reporters_dir
        self.kill_grace = kill_grace
        self.exit_grace = exit_grace
        self.kinds: dict[str, Kind] = dict(config.kinds)
        self.env = script_environment(
            host=host, reporter=config.name, interval=self.spec.interval,
            resources=self.kinds, allow=self.spec.env, source=agent_env,
            not_applicable_exit=self.spec.not_applicable_exit,
            elim=self.spec.format == "elim", central=self.spec.type == "external")
        self.state: HealthState | None = None
        self.failures = 0
        self.runs = 0
        self._last_health: tuple[HealthState, int | None] | None = None
        self._backoff = Backoff(first=self.spec.backoff_floor, cap=self.spec.backoff_cap,
                                full_jitter=True)
        self._proc: ScriptProcess | None = None
        self._task: asyncio.Task[None] | None = None
        self._inventory_devices: list[Device] | None = None
        self._inventory_generation = 0
        self._said_looping = False
        self._exposition = ExpositionMap(self.spec) if self.spec.exposition() else None
        self._textfiles = (TextfileDirectory(self.spec.directory, limit=self.spec.max_output_bytes)
                           if isinstance(self.spec.directory, str) else None)

    @property
    def name(self) -> str:
        """The reporter's name."""
        return self.config.name

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start running the script in a background task."""
        if self._task is None:
            self._task = asyncio.create_task(self._main(), name=f"crr-reporter-{self.name}")

    async def stop(self, *, publish: bool = True) -> None:
        """Stop the schedule, kill the script's group, reap it; then Health `stopped`."""
        await cancel_and_wait(self._task)
        self._task = None
        if self._proc is not None:  # cancelled between spawn and cleanup
            await self._proc.close()
            self._proc = None
        if publish:
            self._set_health("stopped")

    async def _main(self) -> None:
        if self.spec.mode == "stream":
            await self._stream_loop()
        else:
            await self._periodic_loop()

    # -- health and backoff --------------------------------------------------------------

    def _set_health(
        self, state: HealthState, detail: str | None = None, exit_code: int | None = None
    ) -> None:
        key = (state, exit_code)
        self.state = state
        if key == self._last_health:
            return
        self._last_health = key
        self.publisher.health(state, detail, exit_code)
        self.observer.health(self.name, state)
        if state in ("ok", "stopped", "restarting", "not_applicable"):  # not_applicable: by design
            log.info("reporter %s: %s%s", self.name, state, f" ({detail})" if detail else "")
        else:
            log.warning("reporter %s: %s%s", self.name, state, f" ({detail})" if detail else "")

    def backoff(self, failures: int) -> float:
        """Seconds to wait after `failures` consecutive failures (`crr.bus.retry`, full jitter)."""
        return self._backoff.delay(failures)

    def _count_failure(self, outcome: Outcome) -> bool:
        """Record a failed run; True if the reporter is now quarantined."""
        self.failures += 1
        if self.failures >= self.spec.quarantine_after:
            self._set_health(
                "quarantined",
                _detail(f"{self.failures} consecutive failures, not retried until the "
                        f"reporter changes; last: {outcome.state}", outcome.detail or ""),
                outcome.exit_code)
            return True
        return False

    async def _guarded(self, run: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """`_attempt`, observed: a periodic run is the span a report's trace starts from."""
        with self.observer.run(self.name, self.host,
                               traced=self.spec.mode == "periodic") as record:
            outcome = await self._attempt(run)
            record(outcome.state, outcome.exit_code)
            return outcome

    async def _attempt(self, run: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """Run one attempt; a bug in the agent becomes a `failed` outcome, never a crash."""
        self.runs += 1
        try:
            return await run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("reporter %s: internal error", self.name)
            return Outcome("failed", _detail(f"agent error running the script: {exc!r}"))
        finally:
            if self._proc is not None:
                await self._proc.close()
                self._proc = None

    # -- schedules ------------------------------------------------------------------------

    async def _periodic_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            started = loop.time()
            outcome = await self._guarded(self._run_periodic_once)
            if outcome.state == "not_applicable":
                self._set_health(outcome.state, outcome.detail, outcome.exit_code)
                return
            self._set_health(outcome.state, outcome.detail, outcome.exit_code)
            now = loop.time()
            if outcome.success:
                self.failures = 0
                # Fixed rate; after an overrun, skip the missed slots.
                next_at = max(started + self.spec.interval, now)
            else:
                if self._count_failure(outcome):
                    return
                next_at = max(started + self.spec.interval, now + self.backoff(self.failures))

    async def _stream_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            outcome = await self._guarded(self._run_stream_once)
            if outcome.state == "not_applicable":
                self._set_health(outcome.state, outcome.detail, outcome.exit_code)
                return
            if outcome.success:
                # An elim that ended cleanly after reporting: LSF restarts it, so
                # do we, once per interval; its health stays what its lines made it.
                self.failures = 0
                log.info("reporter %s: %s", self.name, outcome.detail)
                await asyncio.sleep(max(0.0, started + self.spec.interval - loop.time()))
                continue
            self._set_health(outcome.state, outcome.detail, outcome.exit_code)
            if self._count_failure(outcome):
                return
            delay = self.backoff(self.failures)
            self._set_health("restarting", _detail(
                f"restart in {delay:.2f}s (failure {self.failures} of at most "
                f"{self.spec.quarantine_after})", outcome.detail or ""))
            await asyncio.sleep(delay)

    # -- one run --------------------------------------------------------------------------

    def _spawn(self) -> ScriptProcess:
        argv = resolve_command(self.spec.command, self.reporters_dir,
                               self.env.get("PATH", DEFAULT_PATH))
        try:
            return spawn(argv, self.env, self.spec.cwd, tty=bool(self.spec.tty))
        except OSError as exc:
            raise CommandError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None

    def _judge_exit(self, status: ExitStatus, stderr: TailCapture) -> Outcome | None:
        """The outcome of an unsuccessful exit, or None for exit 0."""
        if status.signal is not None:
            return Outcome("crashed", _detail(status.describe(), stderr.text()))
        if status.code == self.spec.not_applicable_exit:
            return Outcome("not_applicable",
                           _detail(f"exit {status.code}: not applicable on this host",
                                   stderr.text()), exit_code=status.code)
        if status.code != 0:
            return Outcome("failed", _detail(status.describe(), stderr.text()),
                           exit_code=status.code)
        return None

    async def _run_periodic_once(self) -> Outcome:
        if self.spec.type in ("textfile", "scrape"):
            return await self._collect_once()
        loop = asyncio.get_running_loop()
        timeout = self.spec.effective_timeout()
        deadline = loop.time() + timeout
        limit = self.spec.max_output_bytes
        try:
            proc = self._proc = self._spawn()
        except CommandError as exc:
            return Outcome("failed", exc.message)
        out, err = await proc.read_pipes(lambda: BoundedCapture(limit), TailCapture)
        assert isinstance(out, BoundedCapture)
        assert isinstance(err, TailCapture)
        elim = self.spec.format == "elim"

        def remaining() -> float:
            return max(0.0, deadline - loop.time())

        def too_much() -> Outcome:
            proc.signal_group(signal.SIGKILL)
            return Outcome("bad_output", _detail(
                f"output exceeds max_output_bytes ({limit} bytes); script stopped", err.text()))

        async def timed_out() -> Outcome:
            await proc.terminate(self.kill_grace)
            what = f"no result within {timeout:g}s; process group killed"
            if elim and not out.buffer:
                what += (" and no output at all: a looping elim wants `mode: stream` (the "
                         "default for format: elim)" + ("" if self.spec.tty else
                                                        "; " + BUFFERING_HINT))
            return Outcome("timeout", _detail(what, err.text()))

        waits: list[asyncio.Future[Any]] = [out.finished, proc.exited]
        if elim:
            waits.append(out.line_seen)
        if not await _first(*waits, within=remaining()):
            return await timed_out()
        if out.overflow:
            return too_much()
        if (elim and proc.running and out.line_seen.done()
                and not await _first(proc.exited, within=min(self.exit_grace, remaining()))):
            # Still running after its line: a looping LSF elim.  Its complete
            # lines are this interval's report; stop it (its status means nothing).
            if not self._said_looping:
                self._said_looping = True
                log.warning("reporter %s: elim still running after its first line, stopped "
                            "each run; a looping elim wants `mode: stream` (the default "
                            "for format: elim)", self.name)
            await proc.terminate(self.kill_grace)
            return self._use_output(out.complete_lines(), err)
        if proc.running:  # stdout closed; wait for the exit status
            if not await _first(proc.exited, within=remaining()):
                return await timed_out()
        elif not out.finished.done():
            # The leader exited but something still holds stdout: a child left behind.
            if not await _first(out.finished, within=min(self.exit_grace, remaining())):
                log.info("reporter %s: killing processes left holding stdout", self.name)
                proc.signal_group(signal.SIGKILL)
                await _first(out.finished, within=self.exit_grace)
            if out.overflow:
                return too_much()
        await self._drain(err)
        failure = self._judge_exit(proc.exited.result(), err)
        if failure is not None:
            return failure
        return self._use_output(bytes(out.buffer), err)

    async def _drain(self, err: TailCapture) -> None:
        """Let the exited script's last stderr bytes arrive before they are quoted.

        The exit status and the pipe's data are separate events of the loop: the
        exit can be seen first, with the stderr tail (the Health detail) still in
        flight.  EOF on stderr ends the wait; a child left holding stderr only
        delays it by `exit_grace`.
        """
        await _first(err.finished, within=self.exit_grace)

    async def _collect_once(self) -> Outcome:
        """One read of a textfile directory or one scrape (`crr.producers.exposition_sources`)."""
        assert self._exposition is not None
        timeout = self.spec.effective_timeout()
        try:
            if self._textfiles is not None:
                read = await asyncio.wait_for(asyncio.to_thread(self._textfiles.read), timeout)
                return self._publish(self._exposition.apply(read.expo, read.problems),
                                     read.observed_at)
            assert isinstance(self.spec.url, str)
            data = await scrape(self.spec.url, timeout=timeout, limit=self.spec.max_output_bytes)
            return self._publish(self._exposition.from_text(data, source="scrape"))
        except TimeoutError:
            return Outcome("failed", f"reading {self.spec.directory} took over {timeout:g}s")
        except ScrapeError as exc:
            return Outcome("failed", _detail(exc.message))
        except BadOutput as exc:
            return Outcome("bad_output", _detail(exc.message))

    def _use_output(self, data: bytes, err: TailCapture) -> Outcome:
        try:
            parsed = (self._exposition.from_text(data) if self._exposition is not None
                      else parse_report(data, self.spec.format, self.kinds))
        except BadOutput as exc:
            return Outcome("bad_output", _detail(exc.message, err.text()))
        return self._publish(parsed)

    def _publish(self, parsed: ParsedOutput, observed: float | None = None) -> Outcome:
        observed_at = time.time() if observed is None else observed
        if parsed.values is not None:
            self.publisher.report(parsed.values, observed_at)
        if parsed.inventory is not None:
            pool = self._pool(parsed.inventory)
            self.publisher.inventory(pool, parsed.inventory.devices, observed_at)
        if parsed.problems:
            return Outcome("bad_output", _detail("; ".join(parsed.problems)), success=True)
        return Outcome("ok", success=True)

    def _pool(self, inv: ScriptInventory) -> Pool:
        """The script's pool, or `<host>/<reporter>` with a generation bumped on change."""
        if isinstance(inv.pool, Pool):
            return inv.pool
        if inv.devices != self._inventory_devices:
            self._inventory_devices = list(inv.devices)
            self._inventory_generation += 1
        name = inv.pool if inv.pool else f"{self.host}/{self.name}"
        return Pool(name=name, generation=self._inventory_generation)

    async def _run_stream_once(self) -> Outcome:
        try:
            proc = self._proc = self._spawn()
        except CommandError as exc:
            return Outcome("failed", exc.message)
        good = False
        elim = self.spec.format == "elim"
        # Elim lines that arrive together are merged into one report (later
        # lines win, as LSF's MELIM merges): the outbox keeps only the newest
        # pending report, so two lines naming different resources, published
        # one by one, could lose the first.
        pending: dict[str, Any] | None = None
        problems: list[str] = []

        def report(parsed: ParsedOutput) -> None:
            nonlocal good
            outcome = self._publish(parsed)
            good = True
            self.failures = 0
            self._set_health(outcome.state, outcome.detail)

        def flush() -> None:
            nonlocal pending
            if pending is not None:
                parsed = ParsedOutput(values=pending, problems=list(problems))
                pending = None
                problems.clear()
                report(parsed)

        def on_line(line: bytes) -> None:
            nonlocal pending
            try:
                if elim:
                    parsed = parse_elim_line(line.decode("utf-8", "replace"), self.kinds)
                else:
                    parsed = parse_json_report(line)
            except BadOutput as exc:
                flush()  # the good lines before it first: health follows the line order
                self._set_health("bad_output", exc.message)
                return
            if not elim:
                report(parsed)
                return
            if pending is None:
                pending = {}
                asyncio.get_running_loop().call_soon(flush)
            pending.update(parsed.values or {})
            problems.extend(parsed.problems)

        limit = self.spec.max_output_bytes
        out, err = await proc.read_pipes(lambda: LineReader(limit, on_line), TailCapture)
        assert isinstance(out, LineReader)
        assert isinstance(err, TailCapture)
        quiet = self.spec.interval + self.spec.effective_timeout()
        if not await _first(out.first_data, out.finished, proc.exited, within=quiet):
            self._set_health("timeout", _detail(self._silence(quiet), err.text()))
        await _first(out.finished, proc.exited, within=None)
        flush()
        if out.overflow:
            proc.signal_group(signal.SIGKILL)
            return Outcome("bad_output", _detail(
                f"a line exceeds max_output_bytes ({limit} bytes); script stopped", err.text()))
        if proc.running:  # stdout closed but still running: useless as a stream
            if not await _first(proc.exited, within=self.exit_grace):
                await proc.terminate(self.kill_grace)
        elif not await _first(out.finished, within=self.exit_grace):
            proc.signal_group(signal.SIGKILL)  # a child left holding stdout
        flush()  # lines read while waiting for the exit
        status = proc.exited.result() if proc.exited.done() else ExitStatus(None, None)
        await self._drain(err)
        failure = self._judge_exit(status, err)
        if failure is not None and failure.state == "not_applicable":
            return failure
        if good and status.code == 0 and self.spec.format == "elim":
            return Outcome("ok", f"elim exited 0 after reporting; restarted every "
                           f"{self.spec.interval:g}s (as LSF restarts an elim that exits; "
                           "`mode: periodic` says it is meant to)", exit_code=0, success=True)
        what = "stream ended" + (f" ({status.describe()})" if proc.exited.done() else "")
        if good:
            what += " after reporting"
        return Outcome("crashed", _detail(what, err.text()), exit_code=status.code)

    def _silence(self, seconds: float) -> str:
        """Health detail for a running script that has written nothing at all yet."""
        what = f"no output at all within {seconds:g}s; the script is still running"
        return what if self.spec.tty else f"{what}; {BUFFERING_HINT}"
