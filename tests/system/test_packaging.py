"""The README's install, for real: build the wheel, install it into a fresh venv, run the demo.

A non-editable install does not keep the example reporters' executable bits
(pip drops them from `.py` package data); the demo must be healthy anyway.
Slow-ish (~30-40 s: a wheel build and a venv), so it runs only when selected:
`pytest -m packaging` (`.ci/run` does).  The wheel is installed with
`--no-deps`; its dependencies come from this interpreter's site-packages
through a `.pth` line, so no index is needed for them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from crr.bus.server import find_nats_server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.packaging, pytest.mark.timeout(300)]

_CELL = re.compile(r"\S+")


def _run(argv: list[str], cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=240,
                          cwd=cwd, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the project's wheel installed; returns its bin directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"),
          str(ROOT)])
    wheel = next((tmp / "dist").glob("crr_reporting-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
    # One import package: nothing else lands in site-packages beside other projects'.
    assert tops == {"crr", f"crr_reporting-{wheel.name.split('-')[1]}.dist-info"}, tops
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)])
    site = Path(_run([str(venv / "bin" / "python"), "-c",
                      "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "_crr_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / "bin" / "nats-server").symlink_to(find_nats_server())
    return venv / "bin"


def _env() -> dict[str, str]:
    """This environment without anything that could point the venv at the source tree."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NATS_", "CRR_"))}


def test_the_public_api_and_version_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    """`from crr import …` gives a scheduler's and a reporter's names; `crr --version` says the
    distribution's version."""
    out = _run([str(installed / "python"), "-c",
                "from crr import SchedulerView, ExternalReporter, connect, compile_select; "
                "import crr; print(crr.__version__, SchedulerView.__module__)"],
               cwd=tmp_path, env=_env()).stdout.split()
    assert out == ["0.1.0", "crr.view.scheduler_view"]
    version = _run([str(installed / "crr"), "--version"], cwd=tmp_path, env=_env()).stdout
    assert version.strip() == "crr 0.1.0"


def test_the_wheel_is_what_runs(installed: Path, tmp_path: Path) -> None:
    """The fresh venv imports crr from the installed wheel, not from this source tree, and
    the distribution is named `crr-reporting`."""
    out = _run([str(installed / "python"), "-c", "import crr.cli; print(crr.cli.__file__)"],
               cwd=tmp_path, env=_env()).stdout.strip()
    assert out.startswith(str(installed.parent)), out
    name = _run([str(installed / "python"), "-c", "import importlib.metadata as m; "
                 "print(m.distribution('crr-reporting').metadata['Name'])"],
                cwd=tmp_path, env=_env()).stdout.strip()
    assert name == "crr-reporting"  # the index's `crr` is another project's


def _last_table(output: str) -> list[list[str]]:
    """The rows (cells split on blanks) of the demo's last live table, header first."""
    blocks = output.split("crr demo — ")
    assert len(blocks) > 1, output
    lines = blocks[-1].splitlines()[1:]
    rows = []
    for line in lines:
        if not line.strip() or line.startswith(("cluster:", "~ stale")):
            break
        rows.append(_CELL.findall(line))
    return rows


def test_demo_on_a_non_editable_install_is_healthy(installed: Path, tmp_path: Path) -> None:
    """`crr demo` from the wheel: every example reporter of the demo's real agent is ok or
    not_applicable, its values are fresh, and the central flexlm poller reports."""
    done = _run([str(installed / "crr"), "demo", "--duration", "14", "--hosts", "1"],
                cwd=tmp_path, env=_env())
    out = done.stdout
    rows = _last_table(out)
    header, agent = rows[0], next(r for r in rows if r[0] == "demo-node")
    assert header[0] == "HOST"
    assert header[-1] == "REPORTERS"
    assert len(agent) == len(header), (header, agent)
    values = dict(zip(header[1:-1], agent[1:-1], strict=True))
    assert values.pop("STATUS", "ok") == "ok", out  # every value fresh, every reporter ok
    for name, cell in values.items():
        assert not cell.startswith(("~", "?")), (name, cell, out)
        assert cell != "-", (name, cell, out)
    for state in agent[-1].split(","):
        assert state == "ok" or state.endswith(":not_applicable"), (agent[-1], out)
    cluster = next(line for line in out.splitlines()[::-1] if line.startswith("cluster:"))
    assert re.search(r"matlab_free=\d", cluster), cluster
    assert "failed" not in out
    assert done.stderr == "", done.stderr


def test_bench_outside_a_checkout_says_what_to_do(installed: Path, tmp_path: Path) -> None:
    """The benchmarks are not in the wheel: `crr bench` from it fails in one line that says
    where they are, and `--help` still works."""
    assert _run([str(installed / "crr"), "bench", "--help"], cwd=tmp_path,
                env=_env()).stdout.startswith("usage: crr bench")
    done = subprocess.run([str(installed / "crr"), "bench", "--quick"], capture_output=True,
                          text=True, check=False, timeout=60, cwd=tmp_path, env=_env())
    assert done.returncode == 1, done
    assert done.stderr.splitlines() == [
        "crr bench: error: the benchmarks are not part of the installed package: run `crr bench` "
        "from an editable install of a source checkout (pip install -e '.[bench]'), or "
        "`python -m tests.bench.suite` in the checkout"], done.stderr
    site = _run([str(installed / "python"), "-c", "import crr, pathlib; "
                 "print(pathlib.Path(crr.__file__).parent)"], cwd=tmp_path, env=_env())
    assert not (Path(site.stdout.strip()).parent / "tests").exists()
