"""Bad input, real processes: a wrong URL, a down server, a refused credential, a malformed
flag, a fresh server, a port in use, a closed pipe, a missing extra — one line on stderr,
a non-zero exit, nothing left running."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.bus.server import NatsServer
from crr.cli import main
from tests.support.cli import ROOT, cli_env, crr
from tests.support.projector import publish_catalog, running_projector

NO_STREAMS = "no crr streams on this server: start `crr projector` (it creates them)"


def _one_error_line(err: str, command: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"crr {command}: error: "), err
    assert "WARNING" not in err
    assert "Traceback" not in err
    return lines[0]


def _stores(directory: Path) -> list[Path]:
    """`crr server`'s temporary stores under `directory`."""
    return sorted(directory.glob("crr-nats-*"))


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (to prove nothing was left running)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if text in cmd:
            found.append(int(d.name))
    return found


async def test_url_with_another_scheme_is_refused_at_once() -> None:
    """`http://` (the monitoring port, a common slip) is refused before any attempt."""
    started = time.monotonic()
    ran = await crr("hosts", "--server", "http://127.0.0.1:8222")
    assert ran.code == 1
    line = _one_error_line(ran.err, "hosts")
    assert "unsupported URL scheme 'http' in http://127.0.0.1:8222: use nats://, tls://" in line
    assert time.monotonic() - started < 10  # no retries (a child's start-up is the cost)


@pytest.mark.slow  # several seconds of real waiting: `pytest -m slow`
async def test_down_server_is_one_precise_line() -> None:
    """Several one-shot commands against a closed port: one line each, the cause said once,
    never an empty `(last error: )`, no WARNING lines from the retries."""
    commands = [["hosts"], ["health"], ["report", "--reporter", "flexlm", "matlab_free=1"],
                ["catalog", "show"]]
    runs = await asyncio.gather(*(crr(*c, "--server", "nats://127.0.0.1:1") for c in commands))
    for argv, ran in zip(commands, runs, strict=True):
        assert ran.code == 1, (argv, ran)
        line = _one_error_line(ran.err, argv[0])
        assert line.endswith("cannot reach NATS at nats://127.0.0.1:1: "
                             "[Errno 111] Connect call failed ('127.0.0.1', 1)"), line
        assert line.count("cannot reach NATS") == 1
        assert "last error: )" not in line


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_fresh_server_says_to_start_the_projector(nats_url: str) -> None:
    """No streams yet: the listing commands say what to do, not `NotFoundError … 10059`."""
    commands = [["hosts"], ["health"], ["select", "x > 1"], ["explain", "x > 1", "--host", "a"],
                ["latency"], ["report", "--reporter", "flexlm", "matlab_free=1"]]
    runs = await asyncio.gather(*(crr(*c, "--server", nats_url) for c in commands))
    for argv, ran in zip(commands, runs, strict=True):
        assert ran.code == 1, (argv, ran)
        assert _one_error_line(ran.err, argv[0]).endswith(NO_STREAMS), ran.err


async def test_refused_credentials_are_one_line(tmp_path: Path) -> None:
    """A server with authorization and a wrong password: one line naming the refusal."""
    conf = tmp_path / "auth.conf"
    conf.write_text('authorization { user: "crr", password: "right" }\n')
    creds = tmp_path / "wrong.creds"
    creds.write_text("user: crr\npassword: wrong\n")
    with NatsServer(tmp_path / "store", config_file=conf) as server:
        ran = await crr("hosts", "--server", server.url, "--creds", str(creds))
    assert ran.code == 1
    line = _one_error_line(ran.err, "hosts")
    assert f"NATS at {server.url} refused the credentials" in line
    assert "wrong" not in line.split("refused")[0]  # the secret is never shown


@pytest.mark.parametrize("argv", [
    ["report", "--reporter", "r", "--timeout", "soon", "x=1"],
    ["health", "--deadletters-since", "yesterday"],
    ["latency", "--watch", "x"],
    ["hosts", "--bogus"],
])
def test_malformed_flags_are_one_line_exit_2(argv: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed flag: argparse's exit 2 with one line, before connecting anywhere."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err


async def test_server_on_a_port_in_use_exits_with_the_reason(
        nats_server: NatsServer, tmp_path: Path) -> None:
    """`crr server --port P` with P taken: exit 1, nats-server's own reason, and its temporary
    store removed (this raced: EOF on the log came before the child was reaped)."""
    ran = await crr("server", "--port", str(nats_server.port),
                    env=cli_env(TMPDIR=str(tmp_path)))
    assert ran.code == 1, ran
    line = _one_error_line(ran.err, "server")
    assert "address already in use" in line
    assert "ready" not in ran.out
    assert _stores(tmp_path) == []


async def test_server_removes_its_temporary_store_and_child(tmp_path: Path) -> None:
    """`crr server` without --store: on SIGTERM the nats-server child is gone and so is the
    temporary store."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", "server", "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=cli_env(TMPDIR=str(tmp_path)))
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    assert line.startswith("nats-server ready at nats://"), line
    (store,) = _stores(tmp_path)
    assert _processes_mentioning(str(store))  # the nats-server child, while running
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert not store.exists()
    assert _processes_mentioning(str(store)) == []


async def test_listing_into_a_closed_pipe_is_quiet(nc: Client, nats_url: str) -> None:
    """`crr catalog show | head` (here `| true`): no "Broken pipe" error, and --help too."""
    await publish_catalog(nc)
    async with running_projector(nc) as projector:
        await projector.wait_until(1)
        for command in ("catalog show", "catalog show --json", "hosts --help"):
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", f"{sys.executable} -m crr.cli {command} | true",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=cli_env(NATS_URL=nats_url), cwd=ROOT)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
            assert err.decode() == "", (command, err)


@pytest.mark.parametrize("argv", [
    ["nats-config", "--catalog", str(ROOT / "ops/examples/resources.yaml"), "--host", "n1"],
    ["demo", "--secure", "--duration", "1"],
])
def test_missing_auth_extra_is_a_one_line_hint(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without `nkeys` (the auth extra), nats-config and demo --secure say how to get it,
    in one line, and write nothing."""
    monkeypatch.setitem(sys.modules, "nkeys", None)  # makes `import nkeys` fail
    out = tmp_path / "out"
    code = main([*argv, "--out", str(out)] if argv[0] == "nats-config" else argv)
    err = capsys.readouterr().err
    assert code == 1
    line = _one_error_line(err, argv[0])
    assert line.endswith("nkeys is not installed (nkey credentials need the auth extra): "
                         "pip install 'crr-reporting[auth]'"), line
    assert not out.exists()


def test_nkey_credentials_without_nkeys_are_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An nkey seed file given to any command without `nkeys` installed: the hint, at once."""
    seed = tmp_path / "host.nk"
    seed.write_text("SUAMK2FG4MI6UE3ACF3FK3OIQBCEIEZV7NSWFFEW63UXMRLFM2XLAXK4GY\n")
    monkeypatch.setitem(sys.modules, "nkeys", None)
    code = main(["hosts", "--server", "nats://127.0.0.1:1", "--creds", str(seed)])
    line = _one_error_line(capsys.readouterr().err, "hosts")
    assert code == 1
    assert "pip install 'crr-reporting[auth]'" in line
    assert os.fspath(seed) in line
