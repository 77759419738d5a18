"""The series mapping of exposition reporters: its grammar, its kinds, and the catalog checks
that `crr catalog apply` runs (errors point at the token, as `select[]` errors do)."""

from __future__ import annotations

import pytest

from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.errors import CatalogError, ExpressionError
from crr.schemas.exposition import compile_mapping


@pytest.mark.parametrize(("text", "kind"), [
    ("max(DCGM_FI_DEV_XID_ERRORS) == 0", "boolean"),
    ("count(DCGM_FI_DEV_GPU_TEMP)", "numeric"),
    ('node_filesystem_avail_bytes{mountpoint="/scratch"} / 1073741824', "numeric"),
    ("labels(DCGM_FI_DEV_GPU_TEMP, modelName)", "string_set"),
    ('label(node_infiniband_info{device="mlx5_0"}, board_id)', "string"),
    ('min(node_infiniband_state_id{port="1"}) >= 4', "boolean"),
    ("avg(x) * 2 / 4 < 1e3", "boolean"),
])
def test_kinds(text: str, kind: str) -> None:
    """A comparison is a boolean, labels() a string_set, label() a string, else a number."""
    assert compile_mapping(text).kind == kind


def test_scale_and_matchers_compile() -> None:
    """Scale factors multiply out; matchers keep their label, operator and value."""
    m = compile_mapping('sum(a:b{x="1", y!="", z=~"mlx5_.*", w!~\'q\'}) / 1024 * 2')
    assert m.scale == pytest.approx(2 / 1024)
    assert m.selector.metric == "a:b"
    assert [(x.label, x.op, x.value) for x in m.selector.matchers] == [
        ("x", "=", "1"), ("y", "!=", ""), ("z", "=~", "mlx5_.*"), ("w", "!~", "q")]


@pytest.mark.parametrize(("text", "column", "words"), [
    ("maxx(DCGM_FI_DEV_XID_ERRORS)", 0, "expected min, max"),
    ("max(DCGM_FI_DEV_XID_ERRORS", 26, "expected ')'"),
    ('max(x{gpu="0" job="a"}) == 0', 14, "expected ',' or '}'"),
    ('max(x{"gpu"="0"})', 6, "expected a label name"),
    ("max(x{gpu=0})", 10, "expected a quoted string"),
    ('max(x{gpu=~"("})', 11, "bad regular expression"),
    ("labels(x, modelName) == 1", 21, "cannot be compared"),
    ("label(x) ", 7, "expected ','"),
    ("max(x) == ", 10, "expected a number"),
    ("max(x) / 0", 7, "division by zero"),
    ("max(x) max(y)", 7, "expected *, /"),
    ("max(x) $", 7, "unexpected character"),
])
def test_errors_point_at_the_token(text: str, column: int, words: str) -> None:
    """Every syntax error names what was expected and the column of the token."""
    with pytest.raises(ExpressionError) as exc:
        compile_mapping(text)
    assert words in exc.value.message
    assert exc.value.column == column


CATALOG = """
version: 1
resources:
  gpu_ok: {kind: boolean, reporter: dcgm}
  gpu_models: {kind: string_set, reporter: dcgm}
reporters:
  dcgm:
    type: scrape
    url: http://127.0.0.1:9400/metrics
    series:
      gpu_ok: "max(DCGM_FI_DEV_XID_ERRORS) == 0"
      gpu_models: "labels(DCGM_FI_DEV_GPU_TEMP, modelName)"
    inventory:
      devices: DCGM_FI_DEV_GPU_TEMP
      by: gpu
      attributes: {uuid: "label(DCGM_FI_DEV_GPU_TEMP, UUID)", xid: DCGM_FI_DEV_XID_ERRORS}
"""


def test_a_good_catalog_loads() -> None:
    """Scrape reporter, mappings and inventory load; the agent runs it on its hosts."""
    cat = load_catalog_text(CATALOG)
    spec = cat.reporters["dcgm"]
    assert spec.exposition()
    assert spec.runs_on("gpu-node-1")
    assert spec.series == {"gpu_ok": "max(DCGM_FI_DEV_XID_ERRORS) == 0",
                           "gpu_models": "labels(DCGM_FI_DEV_GPU_TEMP, modelName)"}


def problems_of(text: str) -> list[str]:
    """The problems `crr catalog apply` would list for `text`."""
    with pytest.raises(CatalogError) as exc:
        load_catalog_text(text)
    return exc.value.problems


def test_type_clash_is_rejected_at_apply() -> None:
    """A string label mapped to a numeric resource: rejected with the resource and the reason."""
    text = CATALOG.replace("gpu_models: {kind: string_set", "gpu_models: {kind: numeric")
    assert problems_of(text) == [
        "reporters.dcgm.series.gpu_models: type clash: the mapping gives a string_set value "
        "but 'gpu_models' is declared numeric"]


def test_bad_mapping_points_at_the_token() -> None:
    """A syntax error in a mapping names the path and marks the token, like select[]."""
    text = CATALOG.replace('"max(DCGM_FI_DEV_XID_ERRORS) == 0"',
                           '"max(DCGM_FI_DEV_XID_ERRORS) = 0"')
    assert problems_of(text) == [
        "reporters.dcgm.series.gpu_ok: expected *, /, a comparison or the end of the mapping, "
        "found '=' (at column 29: max(DCGM_FI_DEV_XID_ERRORS) \u2192= 0)"]


def test_every_exposition_problem_at_once() -> None:
    """Unmapped and foreign resources, a missing URL, a command, stream mode, a set attribute."""
    text = """
version: 1
resources:
  a: {kind: numeric, reporter: files}
  b: {kind: numeric, reporter: other}
  c: {kind: numeric, reporter: files, scope: cluster}
reporters:
  other: {type: script, command: [x], series: {b: "max(x)"}}
  files:
    type: textfile
    directory: relative/dir
    command: [x]
    mode: stream
    series: {b: "max(y)", c: "max(z)"}
    inventory: {devices: "y", attributes: {s: "labels(y, gpu)"}}
  web: {type: scrape, url: "ftp://h/metrics", series: {}}
"""
    got = problems_of(text)
    for needle in (
        "reporters.other.series: only for exposition reporters",
        "reporters.files.directory: a textfile reporter needs the absolute path",
        "reporters.files.command: a textfile reporter runs no command",
        "reporters.files.mode: an exposition reporter is periodic",
        "reporters.files.series.b: resource 'b' belongs to reporter 'other', not 'files'",
        "resources.a.reporter: 'files' is an exposition reporter and reporters.files.series "
        "has no mapping for 'a'",
        "resources.c.scope: cluster-scope values must come from an external reporter",
        "reporters.files.inventory.attributes.s: a device attribute is one value",
        "reporters.web.url: a scrape reporter needs an http(s) URL",
        "reporters.web.series: an exposition reporter maps series to resources",
    ):
        assert any(needle in p for p in got), (needle, got)


def test_script_with_prometheus_format() -> None:
    """`format: prometheus` on a script: its stdout is the exposition format."""
    cat = load_catalog_text("""
version: 1
resources: {fs_ok: {kind: boolean, reporter: fs}}
reporters:
  fs: {command: [fs.sh], format: prometheus, series: {fs_ok: "min(fs_ok) == 1"}}
""")
    assert cat.reporters["fs"].exposition()
