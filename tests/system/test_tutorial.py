"""docs/tutorial.md runs: its commands are executed against real processes, its outputs compared.

The tutorial's own markup is the script: a ```` ```lang file=PATH ```` block is written
to PATH; in a ```` ```console ```` block each `$ ` line is a command and the lines under
it its expected output; a command ending in ` &` is a service started in the
background (`kill %N` stops the Nth, as a shell's job numbers); `export K=V` sets the
environment of what follows.  Outputs are compared after masking what differs from
machine to machine (numbers, times, runs of spaces).  A command whose output does not
match yet is retried (bounded) — that is how the test waits for the agent's first report
and for the value to turn stale, never with a fixed sleep.  The tutorial's port (4333)
is replaced with a free one.  `CRR_TUTORIAL_RECORD=1` prints the real outputs instead
of failing, to refresh the page.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
PORT = "4333"
BASH = shutil.which("bash") or "/bin/bash"
RETRY_FOR = 15.0  # seconds a command's output may take to become what the page shows


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)
    line: int = 0


@dataclass
class Page:
    files: dict[str, str]
    steps: list[Step]


def parse(text: str) -> Page:
    files: dict[str, str] = {}
    steps: list[Step] = []
    block: str | None = None
    path = ""
    body: list[str] = []
    for i, line in enumerate(text.splitlines(), start=1):
        if block is None:
            m = re.match(r"```(\w+)(?:\s+file=(\S+))?\s*$", line)
            if m:
                block, path, body = m.group(1), m.group(2) or "", []
            continue
        if line.startswith("```"):
            if path:
                files[path] = "\n".join(body) + "\n"
            block, path = None, ""
            continue
        if path:
            body.append(line)
        elif block == "console":
            if line.startswith("$ "):
                steps.append(Step(line[2:], line=i))
            elif steps:
                steps[-1].expected.append(line)
    return Page(files, steps)


_MASKS = [
    (re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z?"), "T"),
    (re.compile(r"\d+(\.\d+)?"), "N"),
    (re.compile(r"[ \t]+"), " "),
]


def mask(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        masked = line
        for pattern, repl in _MASKS:
            masked = pattern.sub(repl, masked)
        out.append(masked.strip())
    return [line for line in out if line]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_the_page_parses_into_the_journey() -> None:
    page = parse(TUTORIAL.read_text())
    assert set(page.files) == {"resources.yaml", "reporters/free.sh"}
    commands = [s.command for s in page.steps]
    for needed in ("crr server", "crr projector", "crr agent", "crr hosts", "crr select",
                   "crr explain", "crr health"):
        assert any(c.startswith(needed) for c in commands), needed
    assert sum(c.endswith("&") for c in commands) == 3
    assert all(s.expected for s in page.steps if s.command.startswith(("crr hosts", "crr explain")))


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
def test_the_tutorial_runs(tmp_path: Path) -> None:
    page = parse(TUTORIAL.read_text())
    record = os.environ.get("CRR_TUTORIAL_RECORD") == "1"
    port = _free_port()
    for rel, content in page.files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    env = dict(os.environ)
    env.pop("NATS_URL", None)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env["COLUMNS"] = "120"
    jobs: list[subprocess.Popen[bytes]] = []
    health_exits: list[int] = []
    try:
        for step in page.steps:
            command = step.command.replace(PORT, port)
            where = f"docs/tutorial.md:{step.line}: {step.command}"
            if command.startswith("export "):
                key, _, value = command[len("export "):].partition("=")
                env[key] = value
                continue
            if command.endswith("&"):
                with (tmp_path / f"job{len(jobs) + 1}.log").open("wb") as log:
                    jobs.append(subprocess.Popen(shlex.split(command[:-1]), cwd=tmp_path,
                                                 env=env, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True))
                continue
            m = re.fullmatch(r"kill %(\d+)", command)
            if m:
                job = jobs[int(m.group(1)) - 1]
                job.send_signal(signal.SIGTERM)
                job.wait(timeout=20)
                continue
            want = mask(step.expected)
            deadline = time.monotonic() + (4.0 if record else RETRY_FOR)
            while True:
                r = subprocess.run([BASH, "-c", command], cwd=tmp_path, env=env, check=False,
                                   capture_output=True, text=True, timeout=30)
                got = (r.stdout + r.stderr).splitlines()
                if mask(got) == want or time.monotonic() > deadline:
                    break
                time.sleep(0.2)  # a bounded retry's pause, not a synchronisation
            if command.startswith("crr health"):
                health_exits.append(r.returncode)
            if record:
                print(f"\n### {where} (exit {r.returncode})\n" + "\n".join(got))
                continue
            assert mask(got) == want, f"{where}\nshown:\n" + "\n".join(step.expected) + \
                "\ngot:\n" + "\n".join(got)
        for n, job in enumerate(jobs, start=1):
            if not record:
                assert job.poll() is not None, f"background job {n} was never stopped by the page"
        # The tutorial leaves nothing failing: its last `crr health` exits 0 (issue 40).
        assert health_exits, "the tutorial runs `crr health`"
        assert health_exits[-1] == 0, health_exits
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    if record:
        pytest.skip("recorded")
