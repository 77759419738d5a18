"""`crr demo` says what it shows: the server URL and the `export NATS_URL=…` that a second
terminal uses (tried here: `crr hosts` from that environment sees the demo's hosts), sim03
labelled as the deliberate failure; piped, changes only and one table at the end; on a
terminal, the table redrawn."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import sys

import pytest

from tests.support.cli import cli_env, crr
from tests.support.faults import eventually


async def _demo(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", "demo", *argv, env=cli_env(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)


@pytest.mark.slow  # several seconds of real waiting: `pytest -m slow`
async def test_piped_demo_says_what_it_shows_and_prints_one_table() -> None:
    """Piped, for 20 s: the URL and its `export NATS_URL=` line first (a second terminal with
    that environment lists the demo's hosts), the note on sim03, change lines (sim03 turning
    failing, marked as on purpose), then one table — not one per second."""
    proc = await _demo("--duration", "20", "--refresh", "0.5")
    assert proc.stdout is not None
    head: list[str] = []
    while not any(line.strip().startswith("export NATS_URL=") for line in head):
        raw = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert raw, head
        head.append(raw.decode().rstrip("\n"))
    url = re.fullmatch(r"crr demo: embedded nats-server at (\S+)", head[0])
    assert url, head
    assert head[-1].strip() == f"export NATS_URL={url.group(1)}"
    second = cli_env(NATS_URL=url.group(1))

    async def hosts_listed() -> list[str]:
        ran = await crr("hosts", "--json", env=second)
        assert ran.code == 0, ran
        return [h["host"] for h in json.loads(ran.out)]

    listed = await eventually(hosts_listed, 20, "the demo's hosts from a second terminal")
    assert "demo-node" in listed
    rest, err = await asyncio.wait_for(proc.communicate(), 50)
    assert proc.returncode == 0, err.decode()
    lines = head + rest.decode().splitlines()
    assert any(line.startswith("crr demo: sim03 fails on purpose") for line in lines), lines
    assert sum(line.startswith("crr demo — ") for line in lines) == 1, lines
    change = [line for line in lines if re.match(r"\+\d+s sim03: ok -> failing", line)]
    assert change, lines
    assert change[0].endswith("- on purpose, see above")
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("crr demo — ")):]
    rows = {line.split()[0]: line.split()[1] for line in table[2:6]}
    assert rows == {"demo-node": "ok", "sim01": "ok", "sim02": "ok", "sim03": "failing"}, table
    assert any(line.startswith("note: sim03 fails on purpose") for line in table)
    assert lines[-1] == "crr demo: stopped; embedded server shut down"
    assert len(lines) < 40, len(lines)  # not a table per refresh


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_demo_on_a_terminal_redraws_the_table() -> None:
    """With stdout a terminal the table is redrawn every --refresh (clear screen, header)."""
    leader, follower = pty.openpty()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crr.cli", "demo", "--duration", "4", "--refresh", "0.5",
            "--hosts", "1", env=cli_env(), stdin=asyncio.subprocess.DEVNULL, stdout=follower,
            stderr=asyncio.subprocess.PIPE)
        os.close(follower)
        chunks: list[bytes] = []

        def read_all() -> None:
            while True:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # EIO: the child closed the terminal
                    return
                if not data:
                    return
                chunks.append(data)

        reader = asyncio.create_task(asyncio.to_thread(read_all))
        _, err = await asyncio.wait_for(proc.communicate(), 50)
        await asyncio.wait_for(reader, 10)
    finally:
        os.close(leader)
    assert proc.returncode == 0, err.decode()
    out = b"".join(chunks).decode(errors="replace")
    assert out.count("crr demo — ") >= 2, out
    assert "\x1b[2J" in out
    assert "(Ctrl-C to stop)" in out
    assert "stdout is not a terminal" not in out
    assert "sim03" not in out  # one simulated host: no deliberate failure to announce


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_secure_demo_says_which_credentials_to_use() -> None:
    """With --secure, the second-terminal lines also export the read-only credentials."""
    proc = await _demo("--secure", "--duration", "1", "--hosts", "1")
    out, err = await asyncio.wait_for(proc.communicate(), 50)
    assert proc.returncode == 0, err.decode()
    lines = [line.strip() for line in out.decode().splitlines()]
    creds = [line for line in lines if line.startswith("export NATS_CREDS=")]
    assert len(creds) == 1, lines
    assert "view" in creds[0]
    assert any(line.startswith("export NATS_URL=nats://127.0.0.1:") for line in lines)


def _children(pid: int, name: str) -> list[int]:
    """Pids of `pid`'s child processes called `name` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == pid and comm == name:
            found.append(int(entry))
    return found


@pytest.mark.slow  # a real demo and a real server: several seconds
async def test_demo_says_when_its_server_exits_and_why() -> None:
    """The embedded nats-server is killed: the demo says at once that its server exited,
    with the signal, and ends with exit 1 on that cause — not `CRR_SNAPSHOT: no answer in
    time`, not a traceback."""
    proc = await _demo("--duration", "60", "--refresh", "0.5")
    assert proc.stdout is not None
    first = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    assert first.startswith("crr demo: embedded nats-server at"), first
    servers = await eventually(lambda: _children(proc.pid, "nats-server"), 10,
                               "the demo's nats-server")
    assert len(servers) == 1
    head = [first]
    while not any(line.strip().startswith("export NATS_URL=") for line in head):
        raw = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert raw, head
        head.append(raw.decode())
    os.kill(servers[0], 9)
    out, err = await asyncio.wait_for(proc.communicate(), 40)
    text = err.decode()
    assert proc.returncode == 1, (out.decode(), text)
    assert "the embedded nats-server exited (killed by signal 9 (SIGKILL))" in text, text
    assert "no answer in time" not in text
    assert "Traceback" not in text
