"""Load and validate `resources.yaml`, reporting every error at once with its path.

msgspec stops at the first error of a Struct, so each field is converted on
its own and the semantic checks (references, scopes, bounds) run over
whatever parsed; the caller gets one `CatalogError` listing everything.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import yaml

from crr.schemas.catalog import (
    Catalog,
    DrainRule,
    Exports,
    GuardSpec,
    ReporterSpec,
    ResourceSpec,
)
from crr.schemas.duration import parse_duration
from crr.schemas.errors import CatalogError, DurationError
from crr.schemas.exposition_catalog import exposition_problems
from crr.schemas.subjects import CATALOG
from crr.schemas.target_names import feature_name_problems

ExportsCheck = Callable[[Catalog], list[str]]
"""Checks a catalog's `exports:` against its resources (compiling the expressions):
path-qualified problems.  `crr.projections.exports.export_problems`; passed in, because
the `select[]` compiler lives above this layer."""

_DURATION_FIELDS = frozenset({"interval", "grace", "timeout", "backoff_floor", "backoff_cap"})
RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REPORTER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
RESERVED_WORDS = frozenset(
    {"and", "or", "not", "has", "has_any", "has_all", "defined", "count", "true", "false",
     "select"}
)
_KIND_ONLY = {"min": "numeric", "max": "numeric", "max_length": "string", "max_items": "string_set",
              "precision": "numeric"}
MAX_PRECISION = 6


def _field_types(cls: type[msgspec.Struct]) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(cls)}


def _required(cls: type[msgspec.Struct]) -> list[str]:
    return [f.name for f in msgspec.structs.fields(cls) if f.required]


def _literal_choices(tp: Any) -> list[str]:
    """The allowed strings of a Literal (or Optional Literal) field type, else []."""
    if typing.get_origin(tp) is typing.Literal:
        return [str(a) for a in typing.get_args(tp)]
    for arg in typing.get_args(tp):
        if typing.get_origin(arg) is typing.Literal:
            return [str(a) for a in typing.get_args(arg)]
    return []


def _explain(exc: msgspec.ValidationError) -> str:
    # msgspec says "Expected `str`, got `int` - at `$[0]`"; keep the message, move the path.
    msg = str(exc)
    msg, _, at = msg.partition(" - at `$")
    return msg + (f" (at {at.rstrip('`')})" if at else "")


_PLAIN = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9_./-]*$")
"""A string YAML reads as itself without quotes (for the examples in type errors)."""
_WORDS: dict[Any, tuple[str, str]] = {
    str: ("a string", "strings"), int: ("a whole number", "whole numbers"),
    float: ("a number", "numbers"), bool: ("true or false", "true/false values"),
}


def _type_words(tp: Any) -> str | None:
    """A field type in the catalog's terms ("a list of strings"), None when it has no words."""
    args = [a for a in typing.get_args(tp) if a not in (type(None), msgspec.UnsetType)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        tp = args[0]
    if tp in _WORDS:
        return _WORDS[tp][0]
    if typing.get_origin(tp) is list and typing.get_args(tp)[0] in _WORDS:
        return f"a list of {_WORDS[typing.get_args(tp)[0]][1]}"
    if typing.get_origin(tp) is dict:
        return "a mapping"
    return None


def _example(tp: Any, given: Any) -> str:
    """`, e.g. `[x.sh]`` when the value given fits the expected list once bracketed."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    inner = args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and args else tp
    if typing.get_origin(inner) is list and isinstance(given, str | int | float):
        plain = isinstance(given, str) and _PLAIN.match(given)
        return f", e.g. `[{given if plain else json.dumps(given)}]`"
    return ""


def _wrong_type(where: str, tp: Any, given: Any, exc: msgspec.ValidationError) -> str:
    """A type error said in the catalog's terms, not msgspec's (`Expected array | null`)."""
    words = _type_words(tp)
    if words is None:
        return f"{where}: {_explain(exc)}"
    got = "null" if given is None else f"{given!r}"
    return f"{where}: must be {words}{_example(tp, given)} (got {got})"


def _convert_entry(
    cls: type[msgspec.Struct], raw: Any, path: str, problems: list[str]
) -> Any:
    """Convert one mapping to `cls`, recording every bad field; None if any was bad."""
    if not isinstance(raw, dict):
        problems.append(f"{path}: expected a mapping, got {type(raw).__name__}")
        return None
    types = _field_types(cls)
    clean: dict[str, Any] = {}
    ok = True
    for key, value in raw.items():
        where = f"{path}.{key}"
        if not isinstance(key, str) or key not in types:
            problems.append(f"{where}: unknown field (expected one of {', '.join(sorted(types))})")
            ok = False
            continue
        given = value
        if key in _DURATION_FIELDS and value is not None:
            try:
                given = parse_duration(value)
            except DurationError as exc:
                problems.append(f"{where}: {exc.message}")
                ok = False
                continue
        try:
            clean[key] = msgspec.convert(given, types[key], strict=False)
        except msgspec.ValidationError as exc:
            choices = _literal_choices(types[key])
            if choices:
                problems.append(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
            else:
                problems.append(_wrong_type(where, types[key], given, exc))
            ok = False
    for name in _required(cls):
        if name not in raw:
            problems.append(f"{path}.{name}: required field is missing")
            ok = False
    if not ok:
        return None
    return msgspec.convert(clean, cls)


def _check_resource(
    name: str, spec: ResourceSpec, raw: dict[str, Any], reporters: dict[str, Any],
    problems: list[str],
) -> None:
    path = f"resources.{name}"
    if spec.reporter not in reporters:
        problems.append(
            f"{path}.reporter: no reporter named {spec.reporter!r} in 'reporters'"
            + (f" (known: {', '.join(sorted(reporters))})" if reporters else "")
        )
    else:
        rep = reporters[spec.reporter]
        if isinstance(rep, ReporterSpec) and spec.scope == "cluster" and rep.type == "script":
            problems.append(
                f"{path}.scope: cluster-scope values must come from an external reporter, "
                f"but {spec.reporter!r} is a per-host script reporter"
            )
    for key, kind in _KIND_ONLY.items():
        if key in raw and spec.kind != kind:
            problems.append(f"{path}.{key}: only applies to kind {kind}, not {spec.kind}")
    if spec.min is not None and spec.max is not None and spec.min > spec.max:
        problems.append(f"{path}.min: min ({spec.min:g}) is greater than max ({spec.max:g})")
    if spec.interval is not None and spec.interval <= 0:
        problems.append(f"{path}.interval: must be greater than zero")
    if spec.grace is not None and spec.grace < 0:
        problems.append(f"{path}.grace: must not be negative")
    if spec.max_length <= 0:
        problems.append(f"{path}.max_length: must be greater than zero")
    if spec.max_items <= 0:
        problems.append(f"{path}.max_items: must be greater than zero")
    if isinstance(spec.precision, int) and not 0 <= spec.precision <= MAX_PRECISION:
        problems.append(f"{path}.precision: decimals shown, from 0 to {MAX_PRECISION}")


def _default_mode(spec: ReporterSpec, raw: dict[str, Any]) -> ReporterSpec:
    """An elim without an explicit `mode` is long-running (`stream`), as LSF runs elims.

    LSF starts an elim once and reads its stdout for as long as it runs; nearly
    every real elim loops.  An explicit `mode` (`periodic` for a one-shot elim)
    always wins.
    """
    if spec.format == "elim" and "mode" not in raw:
        return msgspec.structs.replace(spec, mode="stream")
    return spec


def elim_mode_notes(path: str | Path) -> list[str]:
    """One note per reporter of the (valid) `resources.yaml` at `path` given the elim default.

    Said by `crr catalog apply`: such a reporter was periodic before the
    default changed, and an operator re-applying an old file should know.
    """
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    reporters = doc.get("reporters") if isinstance(doc, dict) else None
    if not isinstance(reporters, dict):
        return []
    return [f"reporters.{name}: format: elim without mode runs long-running (mode: stream), "
            "as LSF runs elims; say `mode: periodic` for a one-shot elim"
            for name, raw in reporters.items()
            if isinstance(raw, dict) and raw.get("format") == "elim" and "mode" not in raw]


def _check_reporter(name: str, spec: ReporterSpec, problems: list[str]) -> None:
    path = f"reporters.{name}"
    if spec.type == "script" and not spec.command:
        problems.append(f"{path}.command: a script reporter needs a command "
                        "(a list: [path, args…])")
    if spec.command is not None and (not spec.command or not spec.command[0]):
        problems.append(f"{path}.command: must not be empty")
    if spec.interval <= 0:
        problems.append(f"{path}.interval: must be greater than zero")
    if spec.timeout is not None and spec.timeout <= 0:
        problems.append(f"{path}.timeout: must be greater than zero")
    if not spec.hosts:
        problems.append(f"{path}.hosts: must name at least one host pattern (use ['*'] for all)")
    if spec.max_output_bytes <= 0:
        problems.append(f"{path}.max_output_bytes: must be greater than zero")
    if spec.backoff_floor <= 0 or spec.backoff_cap < spec.backoff_floor:
        problems.append(f"{path}.backoff_cap: need 0 < backoff_floor <= backoff_cap")
    if spec.quarantine_after < 1:
        problems.append(f"{path}.quarantine_after: must be at least 1")
    if not 0 <= spec.not_applicable_exit <= 255:
        problems.append(f"{path}.not_applicable_exit: must be an exit code 0..255")


def _convert_exports(raw: Any, resources: dict[str, ResourceSpec],
                     problems: list[str]) -> Exports | None:
    """`exports:` checked for shape, names and references (expressions: `ExportsCheck`)."""
    if not isinstance(raw, dict):
        problems.append(f"exports: expected a mapping with features, drain, values, "
                        f"got {type(raw).__name__}")
        return None
    for key in raw:
        if key not in _EXPORTS_KEYS:
            problems.append(f"exports.{key}: unknown field (expected "
                            f"{', '.join(sorted(_EXPORTS_KEYS))})")
    features: dict[str, str] = {}
    feature_settle: dict[str, float] = {}
    raw_features = raw.get("features") or {}
    if not isinstance(raw_features, dict):
        problems.append("exports.features: expected a mapping of feature name → expression")
        raw_features = {}
    for name, given in raw_features.items():
        expr = given
        where = f"exports.features.{name}"
        if not isinstance(name, str):
            problems.append(f"{where}: a feature name must be a string")
            continue
        problems.extend(f"{where}: {p}" for p in feature_name_problems(name))
        if isinstance(expr, dict):
            expr = _feature_object(expr, where, feature_settle, name, problems)
            if expr is None:
                continue
        if not isinstance(expr, str) or not expr.strip():
            problems.append(f"{where}: expected a select[] expression (a non-empty string)")
            continue
        features[name] = expr
    drain: list[DrainRule] = []
    raw_drain = raw.get("drain") or []
    if not isinstance(raw_drain, list):
        problems.append("exports.drain: expected a list of {when, reason}")
        raw_drain = []
    for i, rule in enumerate(raw_drain):
        spec = _drain_rule(rule, f"exports.drain[{i}]", problems)
        if spec is None:
            continue
        if not spec.reason.strip():
            problems.append(f"exports.drain[{i}].reason: must not be empty")
        if not spec.when.strip():
            problems.append(f"exports.drain[{i}].when: expected a select[] expression")
        drain.append(spec)
    values: list[str] = []
    raw_values = raw.get("values") or []
    if not isinstance(raw_values, list):
        problems.append("exports.values: expected a list of resource names")
        raw_values = []
    for i, name in enumerate(raw_values):
        if not isinstance(name, str) or name not in resources:
            known = f" (known: {', '.join(sorted(resources))})" if resources else ""
            problems.append(f"exports.values[{i}]: no resource named {name!r}{known}")
            continue
        problems.extend(f"exports.values[{i}]: {p}" for p in feature_name_problems(name)
                        if not p.startswith("NFD"))  # NFD: values become label values
        if name in values:
            problems.append(f"exports.values[{i}]: {name!r} is listed twice")
            continue
        values.append(name)
    wire_settle = raw.get("feature_settle") or {}
    if not isinstance(wire_settle, dict):
        problems.append("exports.feature_settle: expected a mapping of feature → duration")
        wire_settle = {}
    for name, value in wire_settle.items():
        # The wire form of the object form `{when, settle}` (an encoded catalog).
        where = f"exports.feature_settle.{name}"
        if name not in features:
            problems.append(f"{where}: no feature named {name!r} in exports.features")
            continue
        got = _duration(value, where, problems)
        if not isinstance(got, msgspec.UnsetType):
            feature_settle.setdefault(name, got)
    guard: GuardSpec | msgspec.UnsetType = msgspec.UNSET
    if raw.get("guard") is not None:
        guard = _guard(raw["guard"], problems) or msgspec.UNSET
    settle: float | msgspec.UnsetType = msgspec.UNSET
    if raw.get("settle") is not None:
        settle = _duration(raw["settle"], "exports.settle", problems)
    # What passed is kept even when something failed: its expressions are still
    # compiled (`ExportsCheck`), so every error comes at once.
    return Exports(features=dict(sorted(features.items())), drain=drain, values=values,
                   guard=guard, settle=settle,
                   feature_settle=dict(sorted(feature_settle.items())) or msgspec.UNSET)


_EXPORTS_KEYS = frozenset({"features", "drain", "values", "guard", "settle", "feature_settle"})


def _duration(raw: Any, where: str, problems: list[str]) -> float | msgspec.UnsetType:
    """A duration field (`0s` allowed: at once); UNSET after recording a problem."""
    try:
        return parse_duration(raw)
    except DurationError as exc:
        problems.append(f"{where}: {exc.message}")
        return msgspec.UNSET


def _feature_object(raw: dict[Any, Any], where: str, settle: dict[str, float], name: str,
                    problems: list[str]) -> str | None:
    """A feature's object form `{when: EXPR, settle: DURATION}`: its expression (None after
    recording a problem); its settle goes into `settle`."""
    for key in raw:
        if key not in ("when", "settle"):
            problems.append(f"{where}.{key}: unknown field (expected settle, when)")
    when = raw.get("when")
    if not isinstance(when, str) or not when.strip():
        problems.append(f"{where}.when: expected a select[] expression (a non-empty string)")
        return None
    if raw.get("settle") is not None:
        got = _duration(raw["settle"], f"{where}.settle", problems)
        if not isinstance(got, msgspec.UnsetType):
            settle[name] = got
    return when


def _drain_rule(raw: Any, where: str, problems: list[str]) -> DrainRule | None:
    """One drain rule `{when, reason, for, resume_after}` (durations as written)."""
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping, got {type(raw).__name__}")
        return None
    times: dict[str, float] = {}
    rest: dict[Any, Any] = {}
    for key, value in raw.items():
        if key in ("for", "resume_after"):
            got = _duration(value, f"{where}.{key}", problems)
            if isinstance(got, msgspec.UnsetType):
                return None
            times["for_" if key == "for" else key] = got
        else:
            rest[key] = value
    spec = _convert_entry(DrainRule, rest, where, problems)
    return None if spec is None else msgspec.structs.replace(spec, **times)


def _limit(raw: Any, where: str, problems: list[str]) -> int | str | None:
    """A guard limit: a count ≥ 0 or a percentage string `"N%"` (0 < N ≤ 100)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw >= 0:
            return raw
    elif isinstance(raw, str) and raw.strip().endswith("%"):
        try:
            pct = float(raw.strip()[:-1])
        except ValueError:
            pct = -1.0
        if 0 < pct <= 100:
            return raw.strip()
    problems.append(f"{where}: expected a node count (0 or more) or a percentage like "
                    f"'10%' (over 0, at most 100%), got {raw!r}")
    return None


def _guard(raw: Any, problems: list[str]) -> GuardSpec | None:
    """`exports.guard: {max_drained, max_changed, window}` (each optional)."""
    if not isinstance(raw, dict):
        problems.append(f"exports.guard: expected a mapping with max_drained, max_changed, "
                        f"window, got {type(raw).__name__}")
        return None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"exports.guard.{key}"
        got: Any
        if key in ("max_drained", "max_changed"):
            got = _limit(value, where, problems)
        elif key == "window":
            got = _duration(value, where, problems)
            if got == 0:
                problems.append(f"{where}: must be longer than 0s")
                got = None
        else:
            problems.append(f"{where}: unknown field (expected max_changed, max_drained, "
                            "window)")
            continue
        if got is None or isinstance(got, msgspec.UnsetType):
            return None
        out[key] = got
    return GuardSpec(**out)


def catalog_from_mapping(doc: Any, *, source: str | None = None,
                         exports_check: ExportsCheck | None = None) -> Catalog:
    """Validate a parsed YAML/JSON document into a Catalog; CatalogError lists all problems.

    `exports_check` (see `ExportsCheck`) compiles the `exports:` expressions against
    the resources, so their errors come with every other one.
    """
    problems: list[str] = []
    if not isinstance(doc, dict):
        raise CatalogError(["(top): expected a mapping with 'version', 'resources', 'reporters'"],
                           where=source)
    for key in doc:
        if key not in {"version", "resources", "reporters", "exports", "outage_hold"}:
            problems.append(
                f"{key}: unknown top-level field (expected version, resources, reporters, "
                "exports, outage_hold)")
    version = doc.get("version", 1)
    if version != 1:
        problems.append(f"version: unsupported version {version!r} (this crr reads version 1)")

    sections: dict[str, dict[str, Any]] = {}
    for section in ("resources", "reporters"):
        raw = doc.get(section) or {}
        if not isinstance(raw, dict):
            problems.append(f"{section}: expected a mapping of name → settings")
            raw = {}
        sections[section] = raw

    reporters: dict[str, Any] = {}
    for name, raw in sections["reporters"].items():
        if not isinstance(name, str) or not REPORTER_NAME.match(name):
            problems.append(f"reporters.{name}: invalid reporter name (letters, digits, _ . -)")
            continue
        spec = _convert_entry(ReporterSpec, raw, f"reporters.{name}", problems)
        if spec is not None:
            spec = _default_mode(spec, raw)
        reporters[name] = spec  # None marks "declared but invalid": still a valid reference
        if spec is not None:
            _check_reporter(name, spec, problems)

    resources: dict[str, ResourceSpec] = {}
    for name, raw in sections["resources"].items():
        if not isinstance(name, str) or not RESOURCE_NAME.match(name):
            problems.append(
                f"resources.{name}: invalid resource name (a letter or _, then letters, digits, _)"
            )
            continue
        if name in RESERVED_WORDS:
            problems.append(f"resources.{name}: {name!r} is a reserved word of select[]")
            continue
        spec = _convert_entry(ResourceSpec, raw, f"resources.{name}", problems)
        ref = raw.get("reporter") if isinstance(raw, dict) else None
        if spec is None and isinstance(ref, str) and ref not in reporters:
            problems.append(f"resources.{name}.reporter: no reporter named {ref!r} in 'reporters'")
        if spec is not None:
            _check_resource(name, spec, raw, reporters, problems)
            resources[name] = spec

    exports: Exports | msgspec.UnsetType = msgspec.UNSET
    if doc.get("exports") is not None:
        checked = _convert_exports(doc["exports"], resources, problems)
        if checked is not None:
            exports = checked
    outage_hold: float | msgspec.UnsetType = msgspec.UNSET
    if doc.get("outage_hold") is not None:
        try:
            outage_hold = parse_duration(doc["outage_hold"])
        except DurationError as exc:
            problems.append(f"outage_hold: {exc.message}")
    catalog = Catalog(
        version=1,
        outage_hold=outage_hold,
        resources=dict(sorted(resources.items())),
        reporters={k: v for k, v in sorted(reporters.items()) if v is not None},
        exports=exports,
    )
    problems.extend(exposition_problems(catalog))
    if exports_check is not None and isinstance(exports, Exports):
        problems.extend(exports_check(catalog))
    if problems:
        raise CatalogError(problems, where=source)
    return catalog


def _duplicate_keys(node: yaml.Node, path: str, problems: list[str]) -> None:
    """Every key given twice in one mapping of `node`, with both line numbers.

    PyYAML keeps the last of two equal keys without a word; a catalog with two
    resources called `a:` must not be called valid.
    """
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name != "<<":
                line = key.start_mark.line + 1
                where = f"{path}.{name}" if path else str(name)
                if name in first:
                    problems.append(f"{where}: duplicate key (lines {first[name]} and {line}); "
                                    "the second would silently replace the first")
                else:
                    first[name] = line
            _duplicate_keys(value, f"{path}.{name}" if path else str(name), problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _duplicate_keys(item, f"{path}[{i}]", problems)


def _parse_yaml(text: str, source: str) -> Any:
    """The YAML document of `text`; CatalogError on a syntax error or a duplicate key."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        problems: list[str] = []
        _duplicate_keys(node, "", problems)
        if problems:
            raise CatalogError(problems, where=source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_catalog_text(text: str, *, source: str = "resources.yaml",
                      exports_check: ExportsCheck | None = None) -> Catalog:
    """Parse YAML text into a validated Catalog."""
    try:
        doc = _parse_yaml(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise CatalogError([f"(yaml): {problem}"], where=where) from exc
    return catalog_from_mapping(doc, source=source, exports_check=exports_check)


def load_catalog(path: str | Path, *, exports_check: ExportsCheck | None = None) -> Catalog:
    """Read and validate `resources.yaml` at `path`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError([f"(file): cannot read: {exc.strerror or exc}"], where=str(p)) from exc
    return load_catalog_text(text, source=str(p), exports_check=exports_check)


def catalog_from_wire(doc: Any, *, source: str = CATALOG) -> Catalog:
    """Validate a decoded `crr.v1.catalog` payload (an encoded Catalog) into a Catalog.

    An encoded Catalog spells out every field, so a numeric resource carries
    `max_length: 256` and a boolean one `min: null`; those defaults are not
    the operator's doing and must not trip the kind-only check that
    `resources.yaml` gets.  Everything else is validated exactly as the file is.
    """
    if isinstance(doc, dict) and isinstance(doc.get("resources"), dict):
        defaults = {f.name: f.default for f in msgspec.structs.fields(ResourceSpec)}
        resources = {}
        for name, entry in doc["resources"].items():
            resources[name] = entry if not isinstance(entry, dict) else {
                k: v for k, v in entry.items()
                if not (k in _KIND_ONLY and v == defaults.get(k, ...))
            }
        doc = {**doc, "resources": resources}
    return catalog_from_mapping(doc, source=source)
