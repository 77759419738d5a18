"""Exposition in, values out: real dcgm-exporter outputs, bad input, textfile directories, and
properties of the mapping (aggregations are their definitions; matchers are Prometheus')."""

from __future__ import annotations

import asyncio
import base64
import math
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.producers.exposition import (
    Exposition,
    ExpositionError,
    ExpositionMap,
    evaluate,
    parse_exposition,
)
from crr.producers.exposition_sources import ScrapeError, TextfileDirectory, scrape, shown_url
from crr.schemas.catalog import ReporterSpec
from crr.schemas.events import Attribute
from crr.schemas.exposition import InventoryMap, compile_mapping

DCGM = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"

GPU_SERIES = {
    "gpu_xid_ok": "max(DCGM_FI_DEV_XID_ERRORS) == 0",
    "gpu_count": "count(DCGM_FI_DEV_GPU_TEMP)",
    "gpu_temp_max": "max(DCGM_FI_DEV_GPU_TEMP)",
    "gpu_models": "labels(DCGM_FI_DEV_GPU_TEMP, modelName)",
    "gpu_fb_free_gib": "sum(DCGM_FI_DEV_FB_FREE) / 1024",
    "gpu_dbe_ok": "max(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL) == 0",
    "gpu3_temp": 'DCGM_FI_DEV_GPU_TEMP{gpu="3"}',
}
GPU_INVENTORY = InventoryMap(devices="DCGM_FI_DEV_GPU_TEMP", attributes={
    "uuid": "label(DCGM_FI_DEV_GPU_TEMP, UUID)", "temp": "DCGM_FI_DEV_GPU_TEMP",
    "xid": "DCGM_FI_DEV_XID_ERRORS", "healthy": "DCGM_FI_DEV_XID_ERRORS == 0"})


def dcgm_map(**series: str) -> ExpositionMap:
    """The mapping of a scrape reporter of dcgm-exporter (the catalog checked it): the GPU
    series and inventory above, or only `series` when given."""
    if series:
        return ExpositionMap(ReporterSpec(type="scrape", url="http://127.0.0.1:9400/metrics",
                                          series=series))
    return ExpositionMap(ReporterSpec(type="scrape", url="http://127.0.0.1:9400/metrics",
                                      series=GPU_SERIES, inventory=GPU_INVENTORY))


def fixture(name: str) -> bytes:
    """One of the dcgm-exporter outputs in tests/fixtures/dcgm (see SOURCE.md there)."""
    return (DCGM / name).read_bytes()


def test_healthy_eight_gpu_node() -> None:
    """Values, string sets and one device per `gpu` label from a full dcgm-exporter output."""
    out = dcgm_map().from_text(fixture("a100x8.prom"))
    assert out.problems == []
    assert out.values == {
        "gpu_xid_ok": True, "gpu_count": 8.0, "gpu_temp_max": 40.0,
        "gpu_models": ["NVIDIA A100 80GB PCIe"], "gpu_fb_free_gib": 8 * 80328 / 1024,
        "gpu_dbe_ok": True, "gpu3_temp": 36.0}
    assert out.inventory is not None
    assert [d.name for d in out.inventory.devices] == [f"gpu{i}" for i in range(8)]
    assert out.inventory.devices[3].attributes == {
        "uuid": Attribute(string="GPU-c89b14a3-ce7c-6725-8424-b55d37d9c333"),
        "temp": Attribute(int=36), "xid": Attribute(int=0), "healthy": Attribute(bool=True)}


def test_xid_error_turns_the_node_unhealthy() -> None:
    """One GPU with XID 79: the node's boolean is false and that device says why."""
    out = dcgm_map().from_text(fixture("a100x8-xid79.prom"))
    assert out.values is not None
    assert out.values["gpu_xid_ok"] is False
    assert out.inventory is not None
    by_name = {d.name: d.attributes for d in out.inventory.devices}
    assert by_name["gpu3"]["xid"] == Attribute(int=79)
    assert by_name["gpu3"]["healthy"] == Attribute(bool=False)
    assert all(a["healthy"] == Attribute(bool=True) for n, a in by_name.items() if n != "gpu3")


def test_missing_gpu_is_absent_not_zero() -> None:
    """GPU 5 gone: 7 devices, count 7, and a selector of GPU 5 alone is null, not 0."""
    five = ExpositionMap(ReporterSpec(
        type="scrape", url="http://127.0.0.1:9400/metrics", inventory=GPU_INVENTORY,
        series={"gpu_count": "count(DCGM_FI_DEV_GPU_TEMP)",
                "gpu5_temp": 'DCGM_FI_DEV_GPU_TEMP{gpu="5"}'}))
    out = five.from_text(fixture("a100x8-gpu5-missing.prom"))
    assert out.values == {"gpu_count": 7.0, "gpu5_temp": None}
    assert out.problems == []
    assert out.inventory is not None
    assert "gpu5" not in [d.name for d in out.inventory.devices]
    assert len(out.inventory.devices) == 7


def test_real_readme_and_issue_samples() -> None:
    """The verbatim samples parse; DCGM's blank sentinel is a (finite) number as exported."""
    out = dcgm_map(mem_temp="max(DCGM_FI_DEV_MEMORY_TEMP)", sm="DCGM_FI_DEV_SM_CLOCK").from_text(
        fixture("readme-sample.prom"))
    assert out.values == {"mem_temp": 9223372036854775794.0, "sm": 139.0}
    out = dcgm_map(xid_ok="max(DCGM_FI_DEV_XID_ERRORS) == 0",
                   fb_free="DCGM_FI_DEV_FB_FREE / 1024").from_text(fixture("a100-80gb-pcie.prom"))
    assert out.values == {"xid_ok": True, "fb_free": 80328 / 1024}


def test_renamed_metric_is_missing_and_named() -> None:
    """An exporter that renamed a metric: the resource is left out (its last value stays
    until it expires) and the problem names the resource, the series and the reason."""
    out = dcgm_map(gpu_xid_ok="max(DCGM_FI_DEV_XID_ERRORS) == 0",
                   throttle="max(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)").from_text(
        fixture("a100x8.prom"))
    assert out.values == {"gpu_xid_ok": True}
    assert out.problems == ["throttle: series DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: missing "
                            "(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is not in the exposition)"]


def test_ambiguous_series_is_rejected() -> None:
    """A bare selector matching 8 series: left out, named with the labels that differ."""
    out = dcgm_map(t="DCGM_FI_DEV_GPU_TEMP", u="label(DCGM_FI_DEV_GPU_TEMP, UUID)").from_text(
        fixture("a100x8.prom"))
    assert out.values is None
    assert out.problems[0].startswith(
        't: series DCGM_FI_DEV_GPU_TEMP matches 8 series ({UUID="GPU-c89b14a3-ce7c-6725-8424-'
        'b55d37d9c330",device="nvidia0",gpu="0"}')
    assert "ambiguous; aggregate it" in out.problems[0]
    assert out.problems[1].startswith("u: series DCGM_FI_DEV_GPU_TEMP matches 8 series")
    assert "with 8 values of label UUID: ambiguous" in out.problems[1]


def test_non_finite_samples_are_dropped_and_named() -> None:
    """NaN and ±Inf cannot be reported (the contract's rule): dropped, named; count still counts."""
    text = b'# TYPE t gauge\nt{gpu="0"} 31\nt{gpu="1"} NaN\nu +Inf\n'
    out = dcgm_map(a="max(t)", b="u", c="count(t)").from_text(text)
    assert out.values == {"c": 2.0}
    assert out.problems == ["a: series t: nan is not a finite number; value dropped",
                            "b: series u: inf is not a finite number; value dropped"]


def test_declared_family_without_series() -> None:
    """A family declared with no series (a real fstab-check.sh on a host without entries):
    labels() is the empty set, an aggregation is null (unknown), nothing is missing."""
    text = (b"# HELP node_fstab_mount_status List and status of filesystem mountpoints\n"
            b"# TYPE node_fstab_mount_status gauge\n")
    out = dcgm_map(m="labels(node_fstab_mount_status, mountpoint)",
                   ok="min(node_fstab_mount_status) == 1").from_text(text)
    assert out.values == {"m": [], "ok": None}
    assert out.problems == []


def test_syntax_error_names_the_line() -> None:
    """The parser's error is given with the line it is on (found by bisecting prefixes)."""
    text = "# TYPE a gauge\na 1\nb 2\n" + "c{x=\"1\"} 3\n" * 50 + 'd{x="1} 4\ne 5\n'
    with pytest.raises(ExpositionError) as exc:
        parse_exposition(text, source="site.prom")
    assert exc.value.line == 54
    assert exc.value.message.startswith("site.prom:54: not the Prometheus exposition format")
    assert exc.value.message.endswith("'d{x=\"1} 4'")


def test_credentials_never_shown() -> None:
    """A scrape URL's user and password never reach a log line or a Health detail."""
    assert shown_url("http://crr:s3cret@127.0.0.1:9400/metrics?x=1") == \
        "http://127.0.0.1:9400/metrics?x=1"


# -- textfile directories -------------------------------------------------------------------

def write_atomically(path: Path, text: str, mtime: float | None = None) -> None:
    """As textfile-collector cron jobs do: write a temporary name, rename it into place."""
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(text)
    if mtime is not None:
        os.utime(tmp, (mtime, mtime))
    tmp.rename(path)


def test_textfile_directory_reads_only_prom_files(tmp_path: Path) -> None:
    """*.prom only (a half-written temporary is never read); the oldest mtime is the time."""
    write_atomically(tmp_path / "a.prom", "x 1\n", mtime=1_700_000_000)
    write_atomically(tmp_path / "b.prom", "x 2\n", mtime=1_700_000_100)
    (tmp_path / "c.prom.1234").write_text("x 100\n")  # a writer still busy
    (tmp_path / "notes.txt").write_text("not metrics\n")
    read = TextfileDirectory(str(tmp_path), limit=1 << 16).read()
    assert read.problems == []
    assert evaluate(compile_mapping("sum(x)"), read.expo).value == 3.0
    assert read.observed_at == 1_700_000_000


def test_bad_file_keeps_its_last_valid_series(tmp_path: Path) -> None:
    """A .prom syntax error: named with file and line; that file's last series stay."""
    files = TextfileDirectory(str(tmp_path), limit=1 << 16)
    write_atomically(tmp_path / "site.prom", "site_ok 1\n", mtime=1_700_000_000)
    assert evaluate(compile_mapping("site_ok"), files.read().expo).value == 1.0
    write_atomically(tmp_path / "site.prom", "site_ok 0\nsite_ok{ 1\n", mtime=1_700_000_060)
    read = files.read()
    assert read.problems == ["site.prom:2: not the Prometheus exposition format (could not "
                             "convert string to float: '{'): 'site_ok{ 1'; its last valid "
                             "series are kept"]
    assert evaluate(compile_mapping("site_ok"), read.expo).value == 1.0


def test_vanished_and_oversized_files(tmp_path: Path) -> None:
    """A removed file's series go; an oversized file is not read and is named."""
    files = TextfileDirectory(str(tmp_path), limit=64)
    write_atomically(tmp_path / "a.prom", "a 1\n")
    write_atomically(tmp_path / "big.prom", "b 1\n" * 100)
    read = files.read()
    assert read.problems == ["big.prom: larger than max_output_bytes (64 bytes); not read"]
    (tmp_path / "a.prom").unlink()
    read = files.read()
    assert "a" not in read.expo.names
    assert files.files == {}


# -- properties -----------------------------------------------------------------------------

VALUES = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)
LABEL_VALUES = st.sampled_from(["", "0", "1", "mlx5_0", "mlx5_1", "ib0", "a.b"])


@st.composite
def expositions(draw: st.DrawFn) -> tuple[str, list[tuple[dict[str, str], float]]]:
    """An exposition of one metric with distinct label sets, as text and as (labels, value)."""
    rows: dict[tuple[str, str], float] = draw(st.dictionaries(
        st.tuples(LABEL_VALUES, LABEL_VALUES), VALUES, max_size=12))
    series = []
    lines = ["# TYPE m gauge"]
    for (dev, port), value in rows.items():
        labels = {k: v for k, v in (("device", dev), ("port", port)) if v}
        series.append((labels, value))
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"m{{{inner}}} {value!r}")
    return "\n".join(lines) + "\n", series


@settings(max_examples=200, deadline=None)
@given(expositions(), st.sampled_from(["min", "max", "sum", "count", "avg"]))
def test_aggregation_is_its_definition(
        expo: tuple[str, list[tuple[dict[str, str], float]]], fn: str) -> None:
    """Over any set of series, an aggregation equals its definition; none matched is null."""
    text, series = expo
    got = evaluate(compile_mapping(f"{fn}(m)"), parse_exposition(text)).value
    values = [v for _, v in series]
    if not values:
        assert got is None
        return
    want = {"min": min(values), "max": max(values), "sum": math.fsum(values),
            "count": float(len(values)), "avg": math.fsum(values) / len(values)}[fn]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-6)


def reference_matches(labels: dict[str, str], label: str, op: str, value: str) -> bool:
    """Prometheus' matcher semantics, written out: a missing label is "", regexes anchored."""
    have = labels.get(label, "")
    return {"=": have == value, "!=": have != value,
            "=~": re.match(f"^(?:{value})$", have) is not None,
            "!~": re.match(f"^(?:{value})$", have) is None}[op]


@settings(max_examples=300, deadline=None)
@given(expositions(), st.sampled_from(["device", "port", "absent"]),
       st.sampled_from(["=", "!=", "=~", "!~"]),
       st.sampled_from(["", "0", "mlx5_0", "mlx5_.*", "mlx5", "ib0|mlx5_1", ".*", ".+", "a.b"]))
def test_matchers_are_prometheus_semantics(
        expo: tuple[str, list[tuple[dict[str, str], float]]], label: str, op: str,
        value: str) -> None:
    """count(m{label op "value"}) selects exactly the series the reference selects."""
    text, series = expo
    parsed = parse_exposition(text)
    got = evaluate(compile_mapping(f'count(m{{{label}{op}"{value}"}})'), parsed).value
    want = sum(1 for labels, _ in series if reference_matches(labels, label, op, value))
    assert got == (float(want) if want else None)


def test_exposition_merge_counts() -> None:
    """Several files are one exposition: their series add up."""
    one, two = parse_exposition("a 1\n"), parse_exposition("a 2\nb 3\n")
    merged = Exposition()
    merged.merge(one)
    merged.merge(two)
    assert len(merged) == 3
    assert merged.names == {"a", "b"}


def test_counter_names_as_written() -> None:
    """A counter is found under the name the text spells (`X_TOTAL`, `z`, `y_total`), not the
    `_total` name prometheus-client's parser gives its samples."""
    text = ("# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\nDCGM_FI_DEV_ECC_DBE_VOL_TOTAL 2\n"
            "# TYPE z counter\nz 4\n# TYPE y_total counter\ny_total 3\n")
    expo = parse_exposition(text)
    assert sorted(expo.series) == ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "y_total", "z"]
    assert evaluate(compile_mapping("max(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)"), expo).value == 2.0


METRIC_NAMES = ["a", "b_total", "c", "d_bucket"]


@st.composite
def mixed_expositions(draw: st.DrawFn) -> str:
    """Several families (gauges, counters with and without `_total`, untyped), any order."""
    lines: list[str] = []
    for name in draw(st.lists(st.sampled_from(METRIC_NAMES), unique=True)):
        kind = draw(st.sampled_from(["gauge", "counter", None]))
        if kind is not None and not name.endswith("_bucket"):
            lines.append(f"# HELP {name} some help")
            lines.append(f"# TYPE {name} {kind}")
        for dev in draw(st.lists(LABEL_VALUES, unique=True, max_size=4)):
            lines.append(f'{name}{{device="{dev}"}} {draw(VALUES)!r}')
    return "\n".join(lines) + "\n"


@settings(max_examples=200, deadline=None)
@given(mixed_expositions(), st.sets(st.sampled_from(METRIC_NAMES)))
def test_filtered_parse_is_the_full_parse_restricted(text: str, wanted: set[str]) -> None:
    """Parsing only the wanted metrics' lines gives exactly the full parse's series of them,
    and the same presence (missing or not) for each."""
    full = parse_exposition(text)
    part = parse_exposition(text, wanted=wanted)
    for name in wanted:
        assert part.series.get(name) == full.series.get(name), name
        assert (name in part.names) == (name in full.names), name


def test_filtered_error_keeps_line_numbers() -> None:
    """A bad line among the read metrics is named by its line in the whole text; a bad line
    of a metric no resource reads is not looked at."""
    text = "# TYPE a gauge\na 1\nunread{ 2\nb 3\nb{x=\"1} 4\n"
    with pytest.raises(ExpositionError) as exc:
        parse_exposition(text, wanted={"a", "b"})
    assert exc.value.line == 5
    assert parse_exposition(text, wanted={"a"}).series == {"a": [({}, 1.0)]}


def test_a_read_still_running_is_not_stacked(tmp_path: Path) -> None:
    """While a read is still going on (a hung file system), the next one fails at once."""
    files = TextfileDirectory(str(tmp_path), limit=1 << 16)
    assert files._busy.acquire()
    try:
        with pytest.raises(ScrapeError, match="has not finished"):
            files.read()
    finally:
        files._busy.release()
    assert files.read().problems == []


# -- scrapes against a real socket ------------------------------------------------------------

async def serve(response: bytes, requests: list[bytes], *, hang: bool = False) -> asyncio.Server:
    """A one-response HTTP server on a free loopback port (records each request's head)."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            requests.append(await reader.readuntil(b"\r\n\r\n"))
            if hang:  # never answers: the scrape's timeout ends it (and closes the connection)
                await reader.read()
            writer.write(response)
            await writer.drain()
        except ConnectionError:
            pass  # the client stopped reading (over its limit)
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def url_of(server: asyncio.Server, auth: str = "") -> str:
    """The server's metrics URL."""
    port = server.sockets[0].getsockname()[1]
    return f"http://{auth}127.0.0.1:{port}/metrics"


async def test_scrape_sends_basic_auth_and_reads_the_body() -> None:
    """HTTP/1.0 GET with the URL's credentials as basic auth; the body comes back whole."""
    requests: list[bytes] = []
    async with await serve(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nup 1\n",
                           requests) as server:
        body = await scrape(url_of(server, "crr:s3cret@"), timeout=5, limit=1024)
    assert body == b"up 1\n"
    head = requests[0].decode()
    assert head.startswith("GET /metrics HTTP/1.0\r\n")
    assert "Authorization: Basic " + base64.b64encode(b"crr:s3cret").decode() in head


@pytest.mark.parametrize(("response", "hang", "words"), [
    (b"HTTP/1.0 404 Not Found\r\n\r\nno\n", False, ": HTTP 404 Not Found"),
    (b"HTTP/1.0 200 OK\r\n\r\n" + b"x 1\n" * 400, False, "exceeds max_output_bytes (1024"),
    (b"", True, "timed out after 0.2s"),
    (b"garbage\r\n\r\n", False, "not an HTTP response"),
])
async def test_scrape_failures_name_the_url_without_credentials(
        response: bytes, hang: bool, words: str) -> None:
    """Each failure is a ScrapeError naming the URL (no user, no password) and the reason."""
    async with await serve(response, [], hang=hang) as server:
        shown = url_of(server)
        with pytest.raises(ScrapeError) as exc:
            await scrape(url_of(server, "crr:s3cret@"), timeout=0.2, limit=1024)
    assert words in exc.value.message
    assert shown in exc.value.message
    assert "s3cret" not in exc.value.message
