"""The three per-host doors' formats, checked against the real readers' rules.

- NFD: a checker written from nfd-worker's local source (`source/local/local.go`:
  trimmed lines, `#` comments, `# +expiry-time=<RFC 3339>` after which lines are
  ignored, `name[=value]`, no value = `true`) and NFD's label validation
  (Kubernetes label name/value rules, the kubernetes.io namespace denied except
  feature.node / profile.node).
- HTCondor: the output parsed by the `htcondor` package's ClassAd module, with a
  job's Requirements evaluated against it and compared with `crr select`.
- LSF: the output read back by crr's own `format: elim` reader, and by a strict
  checker of IBM's elim protocol (`N name1 value1 …`, N pairs, one line, numbers
  within ±INFINIT_LOAD).
"""

from __future__ import annotations

import asyncio
import io
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import classad2 as classad
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crr.bridges.condor import condor_door, render_condor
from crr.bridges.elim import elim_door, render_elim
from crr.bridges.engine import differs
from crr.bridges.nfd import NfdDoor, render_nfd
from crr.producers.script_output import parse_elim_line
from crr.projections.exports import CompiledExports, NodeWant, ValueOut, compile_exports, plan_host
from crr.projections.host_table import HostTable
from crr.projections.select import compile_select
from crr.schemas.catalog import Catalog, DrainRule, Exports, ReporterSpec, ResourceSpec
from crr.schemas.errors import BridgeError
from tests.support.select import NOW, NULL, STALE, StaleWas, host_snapshot

CAT = Catalog(
    resources={
        "scratch_free": ResourceSpec(kind="numeric", reporter="r", interval=30.0),
        "datasets": ResourceSpec(kind="string_set", reporter="r", interval=30.0),
        "fs_healthy": ResourceSpec(kind="boolean", reporter="r", interval=30.0),
        "fs_type": ResourceSpec(kind="string", reporter="r", interval=30.0),
    },
    reporters={"r": ReporterSpec(type="external", interval=30.0)},
    exports=Exports(features={"imagenet_cached": 'datasets has "imagenet"',
                              "big_scratch": "scratch_free > 500"},
                    drain=[DrainRule(when="!fs_healthy", reason='fs "bad"')],
                    values=["scratch_free", "datasets", "fs_type", "fs_healthy"]),
)
EXPORTS = compile_exports(CAT)
FEATURES = sorted(EXPORTS.features)

# -- a strict NFD reader ------------------------------------------------------------------

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def nfd_label_error(key: str, value: str) -> str | None:
    """NFD's label validation (Kubernetes qualified name and label value, namespaces)."""
    prefix, _, name = key.rpartition("/")
    if prefix:
        if len(prefix) > 253 or not _DNS.match(prefix):
            return f"bad prefix {prefix!r}"
        if (prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")) and not any(
                prefix == ns or prefix.endswith("." + ns)
                for ns in ("feature.node.kubernetes.io", "profile.node.kubernetes.io")):
            return f"namespace {prefix!r} denied"
    if len(name) > 63 or not _NAME.match(name):
        return f"bad name {name!r}"
    if value and (len(value) > 63 or not _NAME.match(value)):
        return f"bad value {value!r}"
    return None


def read_nfd(text: str, now: float) -> dict[str, str]:
    """The labels nfd-worker's local source takes from a feature file at `now`."""
    expiry: float | None = None
    labels: dict[str, str] = {}
    assert len(text.encode()) <= 64 * 1024
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("# +"):
                key, eq, val = line[3:].partition("=")
                assert key == "expiry-time", f"unknown directive {line!r}"
                assert eq, f"malformed directive {line!r}"
                assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)",
                                    val.strip()), f"not RFC 3339: {val!r}"
                expiry = datetime.fromisoformat(val.strip()).timestamp()
            continue
        if expiry is not None and expiry < now:
            continue
        key, eq, value = line.partition("=")
        value = value if eq else "true"
        error = nfd_label_error(key, value)
        assert error is None, f"NFD would reject {line!r}: {error}"
        labels[key] = value
    return labels


def _want(values: dict[str, Any], now: float = NOW) -> NodeWant:
    return plan_host(EXPORTS, host_snapshot("n1", values, now), None, now)


def test_nfd_file_follows_nfd_rules_and_expires_by_itself() -> None:
    """Features as `crr-<f>=true`, values as label values, the expiry directive first; after
    the expiry NFD takes no label (if crr stops, the labels go)."""
    want = _want({"scratch_free": 812.5, "datasets": ["imagenet", "c4"], "fs_healthy": False,
                  "fs_type": "lustre"})
    text, skipped = render_nfd(want, NOW)
    assert text.startswith("# +expiry-time=")
    assert skipped == []
    p = "feature.node.kubernetes.io/crr-"
    assert read_nfd(text, NOW) == {
        f"{p}imagenet_cached": "true", f"{p}big_scratch": "true", f"{p}drained": "true",
        f"{p}scratch_free": "812.5", f"{p}datasets.imagenet": "true",
        f"{p}datasets.c4": "true", f"{p}fs_type": "lustre", f"{p}fs_healthy": "false"}
    assert want.expires_at is not None
    assert read_nfd(text, math.floor(want.expires_at) - 0.5) != {}
    assert read_nfd(text, math.floor(want.expires_at) + 1) == {}


def test_nfd_expiry_is_capped_when_nothing_expires() -> None:
    """Nothing would change by time (all stale): the labels still expire after max_ttl."""
    want = _want({"scratch_free": STALE})
    assert want.expires_at is None
    text, _ = render_nfd(want, NOW, max_ttl=120)
    assert read_nfd(text, NOW + 119) == {}  # only absent facts: no label at all
    assert text.splitlines()[0] == "# +expiry-time=2027-01-15T08:02:00Z"  # NOW + 120 s


@pytest.mark.parametrize(("values", "reason"), [
    ({"scratch_free": -3.0}, "must start and end with a letter or digit"),
    ({"fs_type": "has space"}, "must start and end"),
    ({"fs_type": "x" * 64}, "at most 63"),
    ({"datasets": ["ok", "bad/member"]}, "label name"),
    ({"datasets": ["m" * 60]}, "at most 63"),
])
def test_nfd_leaves_out_what_nfd_would_reject(values: dict[str, Any], reason: str) -> None:
    """A value NFD would reject is left out (and said), never written as a bad line."""
    text, skipped = render_nfd(_want(values), NOW)
    assert any(reason in s for s in skipped), skipped
    read_nfd(text, NOW)  # every remaining line passes NFD's rules


def test_nfd_unknown_and_stale_values_are_absent() -> None:
    """Unknown (null), stale and never reported values are no label (not a stale one)."""
    text, _ = render_nfd(_want({"scratch_free": NULL, "fs_type": StaleWas("lustre")}), NOW)
    labels = read_nfd(text, NOW)
    assert not any("scratch_free" in k or "fs_type" in k or "big_scratch" in k for k in labels)


def test_nfd_door_writes_atomically_and_rewrites_a_changed_file(tmp_path: Path) -> None:
    """The door replaces DIR/crr by rename (no temp file left); observe sees an edit."""
    door = NfdDoor(tmp_path, clock=lambda: NOW)
    want = _want({"scratch_free": 900.0})
    asyncio.run(door.apply({"n1": want}))
    assert [p.name for p in tmp_path.iterdir()] == ["crr"]
    seen = asyncio.run(door.observe(["n1"]))["n1"]
    assert seen.matches == want
    (tmp_path / "crr").write_text("something else\n")
    assert asyncio.run(door.observe(["n1"]))["n1"].matches is None


def test_nfd_refresh_with_the_same_value_moves_the_expiry(tmp_path: Path) -> None:
    """A report refreshing a value unchanged moves its expiry: the file must be rewritten, or
    NFD would drop the labels at the old expiry-time."""
    door = NfdDoor(tmp_path, clock=lambda: NOW)
    first = _want({"scratch_free": 900.0})
    asyncio.run(door.apply({"n1": first}))
    seen = asyncio.run(door.observe(["n1"]))["n1"]
    assert not differs(first, seen)
    later = _want({"scratch_free": 900.0}, now=NOW + 20)
    assert later.same_as(first)
    assert later.expires_at != first.expires_at
    assert differs(later, seen)


def test_nfd_door_unwritable_dir_is_a_bridge_error(tmp_path: Path) -> None:
    """A directory that is gone: a retriable BridgeError naming the file, nothing raised else."""
    door = NfdDoor(tmp_path / "missing")
    with pytest.raises(BridgeError, match=r"cannot write .*missing/crr"):
        asyncio.run(door.apply({"n1": _want({})}))


# -- HTCondor -----------------------------------------------------------------------------


def _ad(text: str) -> Any:
    blocks = text.split("\n-\n")
    assert blocks[-1] == "", "ended by a '-' line"
    assert len(blocks) == 2, "one update"
    return classad.parseOne(blocks[0])


def test_condor_block_parses_as_classad() -> None:
    """Reals, quoted strings (escaped), booleans, lists, undefined — as ClassAd reads them."""
    want = _want({"scratch_free": 1000, "datasets": ["imagenet"], "fs_healthy": False,
                  "fs_type": NULL})
    ad = _ad(render_condor(want, FEATURES))
    assert ad["crr_scratch_free"] == 1000.0
    assert isinstance(ad["crr_scratch_free"], float)
    assert list(ad["crr_datasets"]) == ["imagenet"]
    assert ad["crr_fs_healthy"] is False
    assert ad["crr_drained"] is True
    assert ad["crr_drain_reason"] == 'fs "bad"'
    assert classad.ExprTree("isUndefined(crr_fs_type)").eval(ad) is True
    assert ad["crr_imagenet_cached"] is True
    assert ad["crr_big_scratch"] is True


REQUIREMENTS = [
    ('member("imagenet", crr_datasets) && crr_scratch_free > 500',
     'datasets has "imagenet" && scratch_free > 500'),
    ("crr_scratch_free > 500 || crr_fs_healthy", "scratch_free > 500 || fs_healthy"),
    ("!crr_fs_healthy", "!fs_healthy"),
    ('crr_fs_type == "lustre"', 'fs_type == "lustre"'),
    ("crr_big_scratch && crr_imagenet_cached", 'scratch_free > 500 && datasets has "imagenet"'),
]

_state = st.sampled_from(["fresh", "fresh", "null", "stale", "absent"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(free=st.sampled_from([0.0, 499.0, 501.0, 1e6]), sets=st.sampled_from(
    [[], ["imagenet"], ["c4"], ["imagenet", "c4"]]), ok=st.booleans(),
    fstype=st.sampled_from(["lustre", "nfs"]),
    states=st.tuples(_state, _state, _state, _state))
def test_condor_requirements_agree_with_select(free: float, sets: list[str], ok: bool,
                                               fstype: str, states: tuple[str, ...]) -> None:
    """A job's Requirements over the printed ad match iff `crr select` selects the host."""
    values: dict[str, Any] = {}
    for (name, value), state in zip((("scratch_free", free), ("datasets", sets),
                                     ("fs_healthy", ok), ("fs_type", fstype)), states,
                                    strict=True):
        if state != "absent":
            values[name] = {"fresh": value, "null": NULL, "stale": StaleWas(value)}[state]
    snap = host_snapshot("n1", values)
    table = HostTable(CAT)
    table.upsert(snap)
    ad = _ad(render_condor(plan_host(EXPORTS, snap, None, NOW), FEATURES))
    for requirement, expr in REQUIREMENTS:
        matched = classad.ExprTree(requirement).eval(ad) is True
        assert matched == (compile_select(expr, CAT).select(table, NOW) == ["n1"]), requirement


def test_condor_door_prints_one_block_per_change() -> None:
    """Each apply prints a block ending with '-'; observe reports what was printed."""
    out = io.StringIO()
    door = condor_door(out, lambda: EXPORTS)
    want = _want({"scratch_free": 1.0})
    asyncio.run(door.apply({"n1": want}))
    assert out.getvalue().endswith("\n-\n")
    assert out.getvalue().count("\n-\n") == 1
    assert asyncio.run(door.observe(["n1"]))["n1"].matches == want


# -- LSF elim -----------------------------------------------------------------------------

INFINIT_LOAD = float(0x7FFFFFFF)
"""lsf.h: `#define INFINIT_LOAD (float) (0x7fffffff)`."""
_LSF_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,38}$")


def check_elim(line: str, kinds: dict[str, str]) -> dict[str, str]:
    """IBM's load update string, strictly: `N name value …`, N pairs, one line ending in one
    newline, LSF resource names, numeric values numbers in ±INFINIT_LOAD (or `-`)."""
    assert line.endswith("\n"), "ends with a newline"
    assert "\n" not in line[:-1], "one line"
    tokens = line[:-1].split(" ")
    assert all(tokens), "single spaces between tokens"
    n = int(tokens[0])
    assert len(tokens) == 1 + 2 * n, "the count matches the pairs"
    out: dict[str, str] = {}
    for name, value in zip(tokens[1::2], tokens[2::2], strict=True):
        assert _LSF_NAME.match(name), name
        assert name not in out, f"{name} twice"
        if kinds.get(name, "numeric") in ("numeric", "boolean") and value != "-":
            assert -INFINIT_LOAD < float(value) < INFINIT_LOAD, value
        out[name] = value
    return out


def test_elim_line_reads_back_and_passes_the_strict_checker() -> None:
    """crr's own elim reader gets the values back; stale and null are `-` (unknown)."""
    want = _want({"scratch_free": 812.5, "datasets": ["imagenet", "c4"], "fs_healthy": True,
                  "fs_type": StaleWas("lustre")})
    line = render_elim(want, FEATURES)
    kinds: dict[str, Any] = {n: s.kind for n, s in CAT.resources.items()}
    tokens = check_elim(line, kinds)
    assert tokens["fs_type"] == "-"
    assert tokens["crr_imagenet_cached"] == "1"
    assert tokens["crr_drained"] == "0"
    parsed = parse_elim_line(line, kinds | {f"crr_{f}": "boolean" for f in FEATURES}
                             | {"crr_drained": "boolean"})
    assert parsed.problems == []
    assert parsed.values == {"scratch_free": 812.5, "datasets": ["c4", "imagenet"],
                             "fs_healthy": True, "fs_type": None, "crr_big_scratch": True,
                             "crr_imagenet_cached": True, "crr_drained": False}


@pytest.mark.parametrize("value", ["", "two words", "-"])
def test_elim_string_that_is_not_one_token_is_unknown(value: str) -> None:
    """LIM splits on white space: such a string is written as `-`, the line stays valid."""
    line = render_elim(_want({"fs_type": value}), FEATURES)
    assert check_elim(line, {"fs_type": "string"})["fs_type"] == "-"


def test_elim_door_writes_lines() -> None:
    """Each apply writes one load update string."""
    out = io.StringIO()
    door = elim_door(out, lambda: EXPORTS)
    asyncio.run(door.apply({"n1": _want({"scratch_free": 5.0})}))
    asyncio.run(door.apply({"n1": _want({"scratch_free": 6.0})}))
    lines = out.getvalue().splitlines(keepends=True)
    assert len(lines) == 2
    assert check_elim(lines[1], {})["scratch_free"] == "6"


def test_exports_compile_over_a_catalog_copy() -> None:
    """The support catalog's exports compile (guards the fixtures above)."""
    assert isinstance(EXPORTS, CompiledExports)
    assert msgspec.structs.replace(CAT, exports=msgspec.UNSET).exports_or_empty() == Exports()
    assert ValueOut("x", "numeric", None, "stale", None).value is None
