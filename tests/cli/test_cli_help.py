"""`crr` offers no option it ignores, and its help says only what is true."""

from __future__ import annotations

import contextlib
import io

import pytest

from crr.cli import build_parser


def _help(*path: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*path, "--help"])
    return out.getvalue()


@pytest.mark.parametrize("command", ["server", "demo"])
@pytest.mark.parametrize("option", [["--server", "nats://elsewhere:4222"], ["--creds", "x.creds"],
                                    ["--tls-ca", "ca.pem"]])
def test_commands_with_their_own_server_refuse_connection_options(command: str,
                                                                  option: list[str]) -> None:
    """`crr server`/`crr demo` run their own NATS server: `--server`/`--creds` are refused, not
    accepted and ignored; `--log-level` is still theirs."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        build_parser().parse_args([command, *option])
    assert info.value.code == 2
    assert f"unrecognized arguments: {option[0]}" in err.getvalue()
    assert build_parser().parse_args([command, "--log-level", "INFO"]).log_level == "INFO"
    assert "--server" not in _help(command)


@pytest.mark.parametrize("command", ["api", "projector"])
def test_help_of_commands_that_run_no_scripts_does_not_mention_them(command: str) -> None:
    """Only the commands that run scripts say their scripts are killed on a stop."""
    text = " ".join(_help(command).split())
    assert "stops it within" in text
    assert "scripts" not in text


@pytest.mark.parametrize("command", [["agent"], ["external", "run"]], ids=["agent", "external"])
def test_help_of_commands_that_run_scripts_says_they_are_killed(command: list[str]) -> None:
    """`crr agent` and `crr external` run scripts: their stop note says what becomes of them."""
    assert "the scripts it runs are killed" in " ".join(_help(*command).split())


def test_bridge_help_shows_no_developer_docstring() -> None:
    """`crr bridge --help` describes the doors, not the module's plug-in hook."""
    text = _help("bridge")
    assert "register_bridge" not in text
    assert "exports:" in text
