"""Run the real `crr` command line in a child process (as an operator's shell would)."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Ran:
    """Exit status and output of one `crr` run."""

    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        """Non-empty stderr lines."""
        return [ln for ln in self.err.splitlines() if ln.strip()]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a child `crr`: this one without crr/NATS settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "CRR_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


async def crr(*argv: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> Ran:
    """`crr ARGV…` in a child process; its exit status and output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", *argv, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env if env is not None else cli_env())
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())
