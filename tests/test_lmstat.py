"""FlexLM `lmstat -a` parsing on recorded outputs, and the example poller end to end (no NATS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from producers.lmstat import free_seats, parse_lmstat, resource_name

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lmstat"
REPORTERS = Path(__file__).resolve().parents[1] / "ops" / "examples" / "reporters"


def fixture(name: str) -> str:
    """The recorded output `name`."""
    return (FIXTURES / name).read_text()


def test_v11_13_counts_and_singular_license() -> None:
    """An 11.13 output: issued minus in use per feature; `1 license` (singular) parses too."""
    status = parse_lmstat(fixture("v11.13_matlab.txt"))
    assert status.server_up
    assert status.server == "27000@licsrv"
    assert status.version == "v11.13.1"
    assert status.vendors == {"MLM": "UP v11.13.1"}
    assert free_seats(status) == {"matlab_free": 88, "simulink_free": 50,
                                  "signal_toolbox_free": 7,
                                  "distrib_computing_toolbox_free": 0}


def test_v11_16_uncounted_and_error_features_are_unknown() -> None:
    """11.16: two vendors; an uncounted and an erroneous feature report null, not a number."""
    status = parse_lmstat(fixture("v11.16_mixed.txt"))
    assert status.server_up
    assert status.version == "v11.16.4"
    assert set(status.vendors) == {"ansyslmd", "cdslmd"}
    seats = free_seats(status)
    assert seats["cfd_base_free"] == 0
    assert seats["anshpc_pack_free"] == 6
    assert seats["virtuoso_schematic_editor_l_free"] == 1
    assert seats["spectre_node_free"] is None
    assert status.features["spectre-node"].uncounted
    assert seats["affirma_sim_analysis_env_free"] is None
    assert "unsupported" in (status.features["Affirma_sim_analysis_env"].error or "")


def test_v11_19_reservations_are_counted_in_use_and_overdraft_is_zero() -> None:
    """Reservations are part of "in use" (free excludes them); in use > issued gives 0, not < 0."""
    status = parse_lmstat(fixture("v11.19_reservations.txt"))
    matlab = status.features["MATLAB"]
    assert (matlab.issued, matlab.in_use, matlab.reserved, matlab.free) == (200, 57, 21, 143)
    pct = status.features["Parallel_Computing_Toolbox"]
    assert (pct.reserved, pct.free) == (4, 12)
    assert status.features["Statistics_Toolbox"].free == 0


@pytest.mark.parametrize(("name", "cause"), [
    ("server_down.txt", "Cannot connect to license server system"),
    ("lmgrd_down.txt", "lmgrd is not running"),
    ("vendor_down.txt", "MLM: Cannot connect"),
])
def test_server_down_is_not_up_and_says_why(name: str, cause: str) -> None:
    """A server (or its vendor daemon) that cannot be read: not up, no features, the reason kept."""
    status = parse_lmstat(fixture(name))
    assert not status.server_up
    assert status.features == {}
    assert cause in (status.error or "")


def test_garbage_does_not_raise() -> None:
    """Text that is not lmstat output parses as 'not up', never an exception."""
    status = parse_lmstat("segmentation fault\n\x00\xff")
    assert not status.server_up
    assert status.error


def test_resource_names_are_valid_catalog_names() -> None:
    """Feature names become lower-case catalog names ending in `_free`."""
    assert resource_name("MATLAB") == "matlab_free"
    assert resource_name("spectre-node") == "spectre_node_free"
    assert resource_name("3D_Modeler") == "f_3d_modeler_free"


def _poll(env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env_extra}
    return subprocess.run(
        [sys.executable, str(REPORTERS / "flexlm_poller.py"), "--lmutil", "fake_lmutil", *args],
        capture_output=True, text=True, env=env, timeout=30, check=False)


def test_poller_reports_only_its_catalog_names() -> None:
    """With CRR_RESOURCES set, the poller reports exactly those names (unlisted features: null)."""
    run = _poll({"CRR_RESOURCES": "matlab_free,simulink_free,gone_free"},
                "--server", "27000@licsrv")
    assert run.returncode == 0, run.stderr
    values = json.loads(run.stdout)["values"]
    assert set(values) == {"matlab_free", "simulink_free", "gone_free"}
    assert values["gone_free"] is None
    assert 0 <= values["matlab_free"] <= 100


def test_poller_fails_with_the_reason_when_the_server_is_down() -> None:
    """A down server: exit 1, the lmstat reason on stderr, nothing on stdout."""
    run = _poll({}, "--server", "27000@down")
    assert run.returncode == 1
    assert run.stdout == ""
    assert "Cannot connect to license server" in run.stderr
