"""The shipped systemd units (`ops/deploy/systemd/`): every `crr` command line they run
parses with the real CLI parser, each long-lived bridge has one, and every process that
serves Prometheus metrics gets a port of its own (issue 40: on one machine they collided)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from crr.cli import build_parser
from tests.support.cli import ROOT

UNITS = ROOT / "ops" / "deploy" / "systemd"


def unit(path: Path) -> tuple[dict[str, str], str]:
    """(its `Environment=` variables, its `ExecStart=` line) of one unit file."""
    env: dict[str, str] = {}
    start = ""
    for line in path.read_text().splitlines():
        if line.startswith("Environment="):
            name, _, value = line.removeprefix("Environment=").partition("=")
            env[name] = value
        elif line.startswith("ExecStart="):
            start = line.removeprefix("ExecStart=")
    return env, start


def argv(path: Path) -> list[str]:
    """The unit's `crr` arguments, its variables and systemd's `%i`/`%H` filled in."""
    env, start = unit(path)
    env.setdefault("CRR_PARTITIONS", "1")
    text = re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: env.get(m.group(1), ""), start)
    text = text.replace("%i", "0").replace("%H", "node1")
    words = shlex.split(text)
    assert words[0] == "/opt/crr/bin/crr", path.name
    return words[1:]


def test_every_unit_runs_a_command_the_cli_accepts() -> None:
    """Each ExecStart parses (a renamed option would otherwise fail only on a real host)."""
    parser = build_parser()
    units = sorted(UNITS.glob("*.service"))
    assert len(units) >= 5
    for path in units:
        args = parser.parse_args(argv(path))
        assert args.command in {"projector", "agent", "api", "bridge"}, path.name


def test_the_long_lived_bridges_have_units() -> None:
    """Slurm (one per cluster) and NFD (one per node) run as services; HTCondor and LSF
    are run by their scheduler's daemon, which the units' README says."""
    doors = {argv(p)[1] for p in UNITS.glob("crr-bridge-*.service")}
    assert doors == {"slurm", "nfd"}
    readme = (UNITS / "README.md").read_text()
    assert "STARTD_CRON_CRR" in readme
    assert "elim.crr" in readme


def test_each_metrics_serving_unit_has_its_own_prometheus_port() -> None:
    """Every unit whose command serves Prometheus metrics sets a port, all different, and the
    shared env file sets none (an EnvironmentFile= would override every unit's)."""
    parser = build_parser()
    ports: dict[str, str] = {}
    for path in sorted(UNITS.glob("*.service")):
        env, _ = unit(path)
        serves = getattr(parser.parse_args(argv(path)), "serve_metrics", False)
        port = env.get("OTEL_EXPORTER_PROMETHEUS_PORT")
        assert (port is not None) == serves, path.name
        if port is not None:
            ports[path.name] = port
    assert len(ports) >= 4
    assert len(set(ports.values())) == len(ports), ports
    shared = (UNITS / "crr.env.example").read_text()
    assert not re.search(r"^\s*#?\s*OTEL_EXPORTER_PROMETHEUS_PORT=", shared, re.MULTILINE)
    documented = (ROOT / "docs" / "operating.md").read_text()
    for port in ports.values():
        assert f"| {port} |" in documented
