"""Starting reporter scripts with `os.posix_spawn` and containing them (docs/contract.md,
"`resources.yaml`": Script protocol).

A script runs in its own session and process group (`setsid`), with stdin
from `/dev/null`, stdout and stderr on pipes (stdout on a pseudo-terminal
with the reporter's `tty: true`), no other descriptor, and a
minimal environment: the agent's own environment (credentials, `NATS_*`)
and connections never reach it.  No
`fork()` of the (possibly large, multi-threaded) agent: `posix_spawn` uses
`vfork`/`clone(CLONE_VFORK)` under the hood.

`posix_spawn` cannot change directory before the exec in Python 3.11, so a
script whose `cwd` differs from the agent's is started through a one-line
`/bin/sh` trampoline that `cd`s and then `exec`s it (same pid, same group; `PWD` is then set too).

`ScriptProcess` is the asyncio handle of a spawned script: its exit is
observed through a pidfd (no SIGCHLD handler, no thread per child), the
leader is left a zombie until the whole group has been killed — so its pid,
which is also the group id, cannot be reused while we still signal the
group — and it is always reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import termios
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from crr.schemas.errors import ReporterError

log = logging.getLogger("crr.agent.spawn")

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LANG = "C.UTF-8"
_CHDIR_TRAMPOLINE = 'cd -- "$1" || exit 126; shift; unset OLDPWD; exec "$@"'
_SH = "/bin/sh"


class CommandError(ReporterError):
    """A reporter's command cannot be started (missing, not executable, bad cwd)."""


LSF_PASS_THROUGH = ("LSF_ENVDIR", "LSF_SERVERDIR", "LSF_BINDIR", "LSF_LIBDIR")
"""LSF installation paths an elim may read (`. $LSF_ENVDIR/lsf.conf`), passed to
`format: elim` scripts when the agent itself has them."""


def script_environment(
    *,
    host: str,
    reporter: str,
    interval: float,
    resources: Iterable[str],
    allow: Iterable[str],
    source: Mapping[str, str],
    not_applicable_exit: int = 97,
    elim: bool = False,
    central: bool = False,
) -> dict[str, str]:
    """The whole environment a script sees: the protocol names plus the allowlisted ones.

    `source` is the agent's environment; only `PATH`, `LANG`, the names in
    `allow` and, for an elim (`elim=True`), the `LSF_PASS_THROUGH` paths are
    taken from it.  The protocol names always win over an allowlisted name
    of the same spelling; `PYTHONUNBUFFERED=1` is a default an allowlisted
    value may override.

    LSF's elim names are set for every script: `LSF_RESOURCES` (the same
    names as `CRR_RESOURCES`, space-separated as LSF writes them),
    `ELIM_ABORT_VALUE` (the exit code meaning "not applicable on this
    host") and `LSF_MASTER` (`Y` when run centrally by `crr external run`,
    the place of LSF's master host, else `N`).
    """
    names = list(resources)
    env = {name: source[name] for name in (*LSF_PASS_THROUGH,) if elim and name in source}
    env["PYTHONUNBUFFERED"] = "1"
    env.update({name: source[name] for name in allow if name in source})
    env.update(
        PATH=source.get("PATH") or DEFAULT_PATH,
        LANG=source.get("LANG") or DEFAULT_LANG,
        CRR_HOST=host,
        CRR_REPORTER=reporter,
        CRR_INTERVAL=f"{interval:g}",
        CRR_RESOURCES=",".join(names),
        LSF_RESOURCES=" ".join(names),
        ELIM_ABORT_VALUE=str(not_applicable_exit),
        LSF_MASTER="Y" if central else "N",
    )
    return env


def resolve_command(command: Sequence[str] | None, base_dir: Path, path: str) -> list[str]:
    """The argv to spawn: `command[0]` made absolute, checked to exist and be executable.

    Absolute paths are used as they are; a path with a `/` is relative to
    `base_dir` (the agent's `--reporters-dir`); a bare name is taken from
    `base_dir` when such a file exists there, else looked up on `path`.
    A script without the execute bit runs through the interpreter its `#!`
    line names (`shebang`).  Raises `CommandError` with a message an operator
    can act on.
    """
    if not command:
        raise CommandError("reporter has no command")
    first = command[0]
    if os.path.isabs(first):
        exe = Path(first)
    elif "/" in first or (base_dir / first).exists():
        exe = base_dir / first
    else:
        found = shutil.which(first, path=path)
        if found is None:
            raise CommandError(f"command not found: {first!r} (not in {base_dir} nor on PATH)")
        exe = Path(found)
    if not exe.exists():
        raise CommandError(f"command not found: {exe}")
    if not exe.is_file():
        raise CommandError(f"command is not a file: {exe}")
    if not os.access(exe, os.X_OK):
        interpreter = shebang(exe)
        if interpreter is None:
            raise CommandError(f"command is not executable: {exe} (chmod +x?)")
        return [*interpreter, str(exe), *command[1:]]
    return [str(exe), *command[1:]]


_SHEBANG_MAX = 256


def shebang(script: Path) -> list[str] | None:
    """The interpreter argv a `#!` first line names (as the kernel reads it), or None.

    Lets a script run without its executable bit, which packaging does not
    keep (a wheel installed by pip drops it from `.py` package data, so the
    shipped example reporters would otherwise fail on a non-editable install).
    None when the file has no `#!` line or names an interpreter that is
    missing or not executable.
    """
    try:
        with script.open("rb") as f:
            head = f.read(_SHEBANG_MAX)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    interp, _, arg = line.partition(" ")  # Linux: the interpreter and at most one argument
    if not os.path.isabs(interp) or not os.access(interp, os.X_OK):
        return None
    return [interp, arg.strip()] if arg.strip() else [interp]


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a script ended: an exit `code`, or the `signal` that killed it."""

    code: int | None
    signal: int | None

    def describe(self) -> str:
        """`exit 3` or `killed by SIGSEGV`."""
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"killed by {name}"
        return f"exit {self.code}"


def _status_from_waitid(res: os.waitid_result) -> ExitStatus:
    if res.si_code == os.CLD_EXITED:
        return ExitStatus(code=res.si_status, signal=None)
    return ExitStatus(code=None, signal=res.si_status)


def _status_from_waitpid(raw: int) -> ExitStatus:
    if os.WIFSIGNALED(raw):
        return ExitStatus(code=None, signal=os.WTERMSIG(raw))
    return ExitStatus(code=os.waitstatus_to_exitcode(raw), signal=None)


class ScriptProcess:
    """A spawned script: its pid (= process group id), pipes, exit and cleanup.

    `exited` resolves (without reaping) when the leader ends.  `close()`
    kills whatever is left of the group and reaps the leader; it is safe to
    call more than once and from a cancelled task (reaping then happens in
    the exit callback).
    """

    def __init__(self, pid: int, stdout_fd: int, stderr_fd: int) -> None:
        self.pid = pid
        self._stdout_fd: int | None = stdout_fd
        self._stderr_fd: int | None = stderr_fd
        self._loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[ExitStatus] = self._loop.create_future()
        self._transports: list[asyncio.BaseTransport] = []
        self._reap_requested = False
        self._reaped = False
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None
        if self._pidfd is not None:
            self._loop.add_reader(self._pidfd, self._on_pidfd)
        else:  # pragma: no cover - kernels before 5.3 / non-Linux
            fut = self._loop.run_in_executor(
                None, os.waitid, os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            fut.add_done_callback(self._on_waitid_done)

    # -- exit ---------------------------------------------------------------------------

    def _on_pidfd(self) -> None:
        try:
            res = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            res = None
        if res is None:
            return  # spurious wake-up
        self._loop.remove_reader(self._pidfd)  # type: ignore[arg-type]
        self._exit_observed(_status_from_waitid(res))

    def _on_waitid_done(self, fut: asyncio.Future[os.waitid_result | None]) -> None:
        res = fut.result() if not fut.cancelled() and fut.exception() is None else None
        self._exit_observed(_status_from_waitid(res) if res is not None
                            else ExitStatus(code=None, signal=None))

    def _exit_observed(self, status: ExitStatus) -> None:
        if not self.exited.done():
            self.exited.set_result(status)
        if self._reap_requested:
            self._reap()

    @property
    def running(self) -> bool:
        """Whether the leader has not ended yet."""
        return not self.exited.done()

    # -- signals ------------------------------------------------------------------------

    def signal_group(self, sig: int) -> None:
        """Send `sig` to every process of the script's group (none left: no error)."""
        if self._reaped:
            return  # the pid may belong to someone else now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def terminate(self, grace: float) -> None:
        """SIGTERM the group; SIGKILL it if the leader is still there after `grace` s."""
        self.signal_group(signal.SIGTERM)
        if self.running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.exited), grace)
        self.signal_group(signal.SIGKILL)

    # -- pipes --------------------------------------------------------------------------

    async def read_pipes(
        self,
        stdout: Callable[[], asyncio.Protocol],
        stderr: Callable[[], asyncio.Protocol],
    ) -> tuple[asyncio.Protocol, asyncio.Protocol]:
        """Attach protocols to stdout and stderr; the transports are closed by `close()`."""
        protocols: list[asyncio.Protocol] = []
        for attr, factory in (("_stdout_fd", stdout), ("_stderr_fd", stderr)):
            fd = getattr(self, attr)
            assert fd is not None
            setattr(self, attr, None)
            pipe = os.fdopen(fd, "rb", buffering=0)  # owned (and closed) by the transport
            transport, protocol = await self._loop.connect_read_pipe(factory, pipe)
            self._transports.append(transport)
            protocols.append(protocol)
        return protocols[0], protocols[1]

    # -- cleanup ------------------------------------------------------------------------

    def _reap(self) -> None:
        if self._reaped:
            return
        # The leader is a zombie: its pid (the group id) is still ours, so this
        # reaches only the script's own leftovers (children holding pipes...).
        self.signal_group(signal.SIGKILL)
        try:
            _, raw = os.waitpid(self.pid, 0)
            if not self.exited.done():
                self.exited.set_result(_status_from_waitpid(raw))
        except ChildProcessError:
            pass
        self._reaped = True
        if self._pidfd is not None:
            with contextlib.suppress(ValueError, RuntimeError):
                self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    async def close(self, wait: float = 5.0) -> ExitStatus | None:
        """Kill the whole group, close the pipes and reap the leader; its status if known."""
        self._reap_requested = True
        self.signal_group(signal.SIGKILL)
        for t in self._transports:
            t.close()
        self._transports.clear()
        for attr in ("_stdout_fd", "_stderr_fd"):
            fd = getattr(self, attr)
            if fd is not None:
                os.close(fd)
                setattr(self, attr, None)
        if self.exited.done():
            self._reap()
        else:
            # SIGKILL is pending; the exit callback reaps even if we are cancelled here.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.exited), wait)
            if not self.exited.done():
                log.error("script pid %d did not die after SIGKILL; will reap it later", self.pid)
                return None
        return self.exited.result()


def inherited_fds() -> list[int]:
    """Descriptors above 2 a spawned child would inherit (not close-on-exec).

    Python opens everything close-on-exec, but descriptors the agent itself
    inherited (from a shell, a supervisor) are not; `posix_spawn` has no
    `close_fds`, so `spawn` closes these in the child explicitly.
    """
    try:
        names = os.listdir("/proc/self/fd")
    except FileNotFoundError:  # pragma: no cover - no procfs
        names = os.listdir("/dev/fd")
    fds = []
    for name in names:
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):  # e.g. the listing's own, now closed
                if os.get_inheritable(fd):
                    fds.append(fd)
    return fds


def _open_tty() -> tuple[int, int]:
    """A pseudo-terminal for a script's stdout: (master, slave), both close-on-exec.

    Output post-processing is off (no `\\n` → `\\r\\n`) and so is echo, so the
    master reads exactly the bytes the script wrote.  The slave is opened
    without becoming anybody's controlling terminal (glibc's openpty uses
    O_NOCTTY), and the script, in its own session, does not acquire it either.
    """
    master, slave = os.openpty()
    try:
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~(termios.OPOST | termios.ONLCR)  # oflag
        attrs[3] &= ~(termios.ECHO | termios.ICANON | termios.ISIG)  # lflag
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except BaseException:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


def spawn(
    argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None, *, tty: bool = False
) -> ScriptProcess:
    """Start `argv` in a new session with /dev/null stdin and piped stdout/stderr.

    `cwd=None` keeps the agent's directory.  `tty=True` puts stdout on a
    pseudo-terminal instead of a pipe (the script's stdio then line-buffers
    it); its master end reads like a pipe and reports EIO, taken as end of
    file, once every writer has gone.  Raises `OSError` if the kernel
    refuses the exec (glibc reports exec errors from posix_spawn) or has no
    pseudo-terminal left.
    """
    args = list(argv)
    if cwd is not None and os.path.realpath(cwd) != os.path.realpath(os.getcwd()):
        if not os.path.isdir(cwd):
            raise CommandError(f"working directory does not exist: {cwd}")
        args = [_SH, "-c", _CHDIR_TRAMPOLINE, "crr-chdir", cwd, *args]
    # O_CLOEXEC: only the dup2'ed copies reach the child
    try:
        out_r, out_w = _open_tty() if tty else os.pipe()
    except OSError as exc:
        if not tty:
            raise
        raise CommandError(f"cannot open a pseudo-terminal for `tty: true`: "
                           f"{exc.strerror or exc} (is /dev/pts mounted?)") from None
    try:
        err_r, err_w = os.pipe()
    except BaseException:
        os.close(out_r)
        os.close(out_w)
        raise
    try:
        pid = os.posix_spawn(
            args[0], args, dict(env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
                *((os.POSIX_SPAWN_CLOSE, fd) for fd in inherited_fds()),
            ],
            setsid=True,
        )
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)  # the slave too: the master sees EIO once the script's copies close
        os.close(err_w)
    return ScriptProcess(pid, out_r, err_r)
