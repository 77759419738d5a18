"""FlexLM `lmstat -a` parsing on recorded outputs, and the example poller end to end (no NATS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.producers.lmstat import free_seats, parse_lmstat, resource_name, seat_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lmstat"
REPORTERS = Path(__file__).resolve().parents[2] / "ops" / "examples" / "reporters"


def fixture(name: str) -> str:
    """The recorded output `name`."""
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(("name", "server", "version", "vendors"), [
    ("v11.13_matlab.txt", "27000@licsrv", "v11.13.1", {"MLM": "UP v11.13.1"}),
    ("indented_vendor_doc.txt", "27010@cadlic", "v11.18.1", {"cdslmd": "UP v11.18.1"}),
])
def test_server_vendor_and_version(
    name: str, server: str, version: str, vendors: dict[str, str]
) -> None:
    """The server, its version and its vendor daemons, flush-left or indented output alike."""
    status = parse_lmstat(fixture(name))
    assert status.server_up
    assert (status.server, status.version, status.vendors) == (server, version, vendors)


def test_v11_13_counts_and_singular_license() -> None:
    """An 11.13 output: issued minus in use per feature; `1 license` (singular) parses too."""
    status = parse_lmstat(fixture("v11.13_matlab.txt"))
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
    ("license_file_unreadable.txt", "Error reading license file: /opt/flexlm/licenses/site.lic"),
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
    report = json.loads(run.stdout)
    values = report["values"]
    assert set(values) == {"matlab_free", "simulink_free", "gone_free"}
    assert values["gone_free"] is None
    assert 0 <= values["matlab_free"] <= 100
    assert report["problems"] == ["gone_free: no such feature in lmstat output"]


def test_poller_fails_with_the_reason_when_the_server_is_down() -> None:
    """A down server: exit 1, the lmstat reason on stderr, nothing on stdout."""
    run = _poll({}, "--server", "27000@down")
    assert run.returncode == 1
    assert run.stdout == ""
    assert "Cannot connect to license server" in run.stderr


# -- indentation, duplicates, redundant servers, vendor daemons ----------------------------

def test_indented_output_parses_like_flush_left() -> None:
    """Output pasted indented (vendor docs, wrappers): every feature is found, `borrowable`
    counts, the singular `1 license`, and `None` (no usage information: unknown)."""
    status = parse_lmstat(fixture("indented_vendor_doc.txt"))
    assert free_seats(status) == {"virtuoso_schematic_editor_xl_free": 7, "spectre_sim_free": 0,
                                  "xcelium_borrow_free": 3, "assura_viewer_free": None}
    assert status.features["Spectre_Sim"].vendor == "cdslmd"
    assert "None" in (status.features["Assura_Viewer"].error or "")


def test_redundant_triad_is_one_server_with_the_masters_version() -> None:
    """A three-server redundant configuration: one section, features once, master's version."""
    status = parse_lmstat(fixture("redundant_triad.txt"))
    assert status.server_up
    assert status.servers == ["27000@lic-a,27000@lic-b,27000@lic-c"]
    assert status.version == "v11.19.3"
    assert free_seats(status) == {"cfd_base_free": 28, "anshpc_free": 384}
    assert status.notes == []


def test_a_feature_on_two_servers_is_summed_and_said() -> None:
    """`lmstat -c 27000@east:27000@west`: MATLAB on both servers is two pools, summed."""
    status = parse_lmstat(fixture("two_servers.txt"))
    assert status.servers == ["27000@mlm-east", "27000@mlm-west"]
    matlab = status.features["MATLAB"]
    assert (matlab.issued, matlab.in_use, matlab.free, matlab.blocks) == (80, 45, 35, 2)
    assert free_seats(status)["simulink_free"] == 10
    assert len(status.notes) == 1
    assert "MATLAB: 2 pools summed" in status.notes[0]
    assert "27000@mlm-east (MLM): 50 issued, 20 in use" in status.notes[0]


def test_the_same_server_twice_counts_once_and_a_disagreement_is_ambiguous() -> None:
    """The same server on the license path twice: an identical block counts once; a block
    whose counts changed between the two listings is ambiguous (unknown), never replaced."""
    status = parse_lmstat(fixture("same_server_twice.txt"))
    assert status.features["MATLAB"].free == 143
    stats = status.features["Statistics_Toolbox"]
    assert stats.free is None
    assert "different counts" in (stats.error or "")
    assert "30 issued, 10 in use and 30 issued, 12 in use" in (stats.error or "")
    assert any(n.startswith("MATLAB: listed 2 times identically on 1711@flexsrv1 (MLM)")
               for n in status.notes)
    assert any(n.startswith("Statistics_Toolbox: ambiguous") for n in status.notes)
    seats = seat_report(status, ["matlab_free", "statistics_toolbox_free"])
    assert seats.error is None
    assert seats.values == {"matlab_free": 143, "statistics_toolbox_free": None}
    assert len(seats.problems) == 1
    assert seats.problems[0].startswith("statistics_toolbox_free (Statistics_Toolbox): listed")


def test_two_vendor_daemons_one_down() -> None:
    """One vendor daemon down: the server is up, its features are errors (named as problems);
    a feature served by two vendor daemons is two pools, summed."""
    status = parse_lmstat(fixture("two_vendors_one_down.txt"))
    assert status.server_up
    assert status.vendors["cdslmd"].startswith("The desired vendor daemon is down")
    layout = status.features["Virtuoso_Layout_Suite_XL"]
    assert layout.free is None
    assert "vendor daemon is down" in (layout.error or "")
    assert status.features["VCSRuntime_Net"].vendor == "snpslmd"
    accel = status.features["sim_accel"]
    assert (accel.issued, accel.in_use, accel.free, accel.vendor) == (12, 3, 9, None)
    seats = seat_report(status, ["vcsruntime_net_free", "virtuoso_layout_suite_xl_free",
                                 "sim_accel_free"])
    assert seats.error is None
    assert seats.values == {"vcsruntime_net_free": 46, "virtuoso_layout_suite_xl_free": None,
                            "sim_accel_free": 9}
    assert seats.problems == [
        "virtuoso_layout_suite_xl_free (Virtuoso_Layout_Suite_XL): Cannot get users of "
        "Virtuoso_Layout_Suite_XL: Cannot connect to license server system. The vendor daemon "
        "is down (-97,121)"]


def test_up_but_no_declared_feature_is_an_error_not_nulls() -> None:
    """A server that answers but lists none of the declared features fails with the reason
    (what was declared, what lmstat lists) instead of publishing nulls."""
    status = parse_lmstat(fixture("v11.13_matlab.txt"))
    seats = seat_report(status, ["abaqus_free", "cae_free"])
    assert seats.values == {}
    assert seats.error is not None
    assert "none of the declared features" in seats.error
    assert "declared: abaqus_free, cae_free" in seats.error
    assert "MATLAB" in seats.error
    only_errors = parse_lmstat(fixture("two_vendors_one_down.txt"))
    failed = seat_report(only_errors, ["virtuoso_layout_suite_xl_free"])
    assert failed.error is not None
    assert "every declared feature is in error" in failed.error
    empty = seat_report(parse_lmstat(fixture("redundant_triad.txt").split("Feature usage")[0]))
    assert empty.error is not None
    assert "lists no feature" in empty.error


def _lmutil_printing(tmp_path: Path, name: str) -> Path:
    """A stand-in `lmutil` that prints the recorded output `name` (and exits 0, as lmutil does)."""
    script = tmp_path / "lmutil"
    script.write_text(f"#!/bin/sh\ncat '{FIXTURES / name}'\n")
    script.chmod(0o755)
    return script


def test_poller_fails_when_the_server_lists_none_of_its_features(tmp_path: Path) -> None:
    """The poller end to end on indented output whose features are not the declared ones:
    exit 1, the reason on stderr, nothing on stdout (health `failed`, not `ok` with nulls)."""
    lmutil = _lmutil_printing(tmp_path, "indented_vendor_doc.txt")
    run = _poll({"CRR_RESOURCES": "matlab_free,simulink_free"},
                "--lmutil", str(lmutil), "--server", "27010@cadlic")
    assert run.returncode == 1
    assert run.stdout == ""
    assert "none of the declared features" in run.stderr
    assert "Virtuoso_Schematic_Editor_XL" in run.stderr


def test_poller_reports_indented_output_and_notes_duplicates(tmp_path: Path) -> None:
    """Indented output with the declared features: reported; the summing is said on stderr."""
    lmutil = _lmutil_printing(tmp_path, "two_servers.txt")
    run = _poll({"CRR_RESOURCES": "matlab_free,simulink_free"},
                "--lmutil", str(lmutil), "--server", "27000@mlm-east:27000@mlm-west")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"values": {"matlab_free": 35, "simulink_free": 10}}
    assert "note: MATLAB: 2 pools summed" in run.stderr


def test_one_server_of_two_down_is_a_problem_not_a_failure() -> None:
    """`-c 27000@east:27000@west` with west down: east's seats are reported (west's cannot be
    checked out anyway) and the down server is named as a problem."""
    status = parse_lmstat(fixture("two_servers_one_down.txt"))
    assert status.server_up
    assert status.unreadable == {"27000@mlm-west": "lmgrd is not running: License server "
                                 "machine is down or not responding. (-96,7:113 \"No route "
                                 "to host\")"}
    seats = seat_report(status, ["matlab_free"])
    assert seats.values == {"matlab_free": 30}
    assert len(seats.problems) == 1
    assert seats.problems[0].startswith("27000@mlm-west: lmgrd is not running")


FIXTURE_NAMES = sorted(p.name for p in FIXTURES.glob("*.txt"))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(FIXTURE_NAMES), indent=st.text(" \t", max_size=6),
       crlf=st.booleans())
def test_indentation_and_line_endings_do_not_change_the_parse(
    name: str, indent: str, crlf: bool
) -> None:
    """Every fixture parses the same when each line is indented or ends in CRLF."""
    text = fixture(name)
    changed = ("\r\n" if crlf else "\n").join(indent + line for line in text.splitlines())
    assert parse_lmstat(changed) == parse_lmstat(text)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(FIXTURE_NAMES), times=st.integers(2, 4))
def test_the_same_output_repeated_counts_once(name: str, times: int) -> None:
    """The same listing several times (the server repeated on the license path) gives the
    same free seats as once: identical blocks are never added up."""
    once = parse_lmstat(fixture(name))
    repeated = parse_lmstat("\n".join([fixture(name)] * times))
    assert free_seats(repeated) == free_seats(once)
    assert repeated.server_up == once.server_up
