"""A real node_exporter (Debian's `prometheus-node-exporter`) on a free loopback port.

Started with only the collectors the tests read (filesystem, textfile) and a textfile
directory of the test's own; ready when its `/metrics` answers (a bounded retry, no
sleep-to-synchronise).  Tests that need it are skipped, with the reason, where the
binary is not installed (CI installs it: .ci/run).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

BINARY = os.environ.get("CRR_NODE_EXPORTER", "/usr/bin/prometheus-node-exporter")
COLLECTORS = Path("/usr/share/prometheus-node-exporter-collectors")


@dataclass(frozen=True)
class NodeExporter:
    """A running node_exporter: its metrics URL and textfile directory."""

    url: str
    textfile_dir: Path
    process: subprocess.Popen[bytes]

    def scrape(self) -> str:
        """node_exporter's own `/metrics` text."""
        with urllib.request.urlopen(self.url, timeout=5) as resp:  # noqa: S310 - loopback
            return str(resp.read().decode())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary_or_skip() -> str:
    """The node_exporter binary, or skip the test saying what is missing."""
    path = BINARY if os.access(BINARY, os.X_OK) else shutil.which("prometheus-node-exporter")
    if path is None:
        pytest.skip(f"node_exporter not installed ({BINARY}; Debian: apt-get install "
                    "prometheus-node-exporter)")
    return path


@contextmanager
def running_node_exporter(textfile_dir: Path, *, within: float = 10.0) -> Iterator[NodeExporter]:
    """Start node_exporter on a free loopback port; stop it (and reap it) on exit."""
    binary = binary_or_skip()
    log_path = textfile_dir.parent / "node_exporter.log"
    for _attempt in range(3):  # a free port can be taken between the probe and the bind
        port = _free_port()
        log = log_path.open("wb")  # a file, not a pipe: a full pipe would stall it
        proc = subprocess.Popen(
            [binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
             "--collector.filesystem", "--collector.textfile",
             f"--collector.textfile.directory={textfile_dir}"],
            stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        exporter = NodeExporter(f"http://127.0.0.1:{port}/metrics", textfile_dir, proc)
        deadline = time.monotonic() + within
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                exporter.scrape()
                break
            except OSError:
                time.sleep(0.05)  # the gap of a bounded readiness retry
        else:
            proc.kill()
            proc.wait()
            err = log_path.read_text(errors="replace")[-500:]
            if "address already in use" in err:
                continue
            raise RuntimeError(f"node_exporter did not start within {within:g}s: {err}")
        try:
            yield exporter
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return
    raise RuntimeError("node_exporter: no free loopback port after 3 attempts")
