"""Ctrl-C in a command's first moments: a quiet exit, never a `KeyboardInterrupt` traceback.

A real `crr` child gets SIGINT while it is still importing (its package, the CLI, the
commands) or already connecting; whatever it was doing, stderr has no traceback and
the exit status is 130 (interrupted) or 0 (a long-running command's own clean stop).
The moment is found, not guessed: the child runs with `-X importtime`, which writes a
line as each module finishes importing, and the signal goes right after the line
named (Python's own start-up, before the first line of crr runs, is not crr's).
"""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from tests.support.cli import ROOT, cli_env

STAGES = ["typing", "crr", "asyncio", "crr.bus.connection", "crr.bridges.nfd", "(running)"]
"""Modules after whose import the signal is sent (`typing`: inside `import crr`;
`crr.bridges.nfd`: while the CLI loads its commands); `(running)`: 0.3 s later."""


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("argv", [["hosts"], ["projector"]], ids=["one-shot", "long-running"])
async def test_sigint_while_starting_prints_no_traceback(argv: list[str], stage: str) -> None:
    """SIGINT right after `stage` of `crr ARGV`'s start (NATS unreachable): no traceback."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "importtime", "-m", "crr.cli", *argv,
        "--server", "nats://127.0.0.1:1", cwd=ROOT, env=cli_env(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    other: list[str] = []
    if stage == "(running)":
        await asyncio.sleep(0.3)  # the moment of the Ctrl-C is what is tested, not a sync
    else:
        while line := (await asyncio.wait_for(proc.stderr.readline(), 10)).decode():
            if not line.startswith("import time:"):
                other.append(line)
            elif line.rsplit("|", 1)[-1].strip() == stage:
                break
        else:
            pytest.fail(f"{stage} was never imported: {''.join(other)}")
    proc.send_signal(signal.SIGINT)
    _, rest = await asyncio.wait_for(proc.communicate(), 10)
    text = "".join(other) + "".join(ln for ln in (rest or b"").decode().splitlines(True)
                                    if not ln.startswith("import time:"))
    assert "Traceback" not in text, text
    assert "KeyboardInterrupt" not in text, text
    assert proc.returncode in (0, 130), (proc.returncode, text)
