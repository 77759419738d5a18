"""Catalog checks of exposition reporters (`type: textfile`, `type: scrape`, `format: prometheus`).

Run by `crr.schemas.catalog_loader` over a loaded catalog: every problem is
path-qualified (`reporters.dcgm.series.gpu_ok: …`), and a bad mapping points at
its token, as a bad `select[]` expression does (see `crr.schemas.exposition`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import msgspec

from crr.schemas.catalog import Catalog, ReporterSpec
from crr.schemas.errors import ExpressionError
from crr.schemas.exposition import (
    InventoryMap,
    compile_mapping,
    compile_selector,
    where,
)


def _set(value: object) -> bool:
    return value is not msgspec.UNSET


def _source_problems(path: str, spec: ReporterSpec) -> list[str]:
    problems: list[str] = []
    if spec.type == "textfile":
        if not isinstance(spec.directory, str) or not spec.directory.startswith("/"):
            problems.append(f"{path}.directory: a textfile reporter needs the absolute path "
                            "of its directory of *.prom files")
    elif _set(spec.directory):
        problems.append(f"{path}.directory: only for type: textfile")
    if spec.type == "scrape":
        parts = urlsplit(spec.url) if isinstance(spec.url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"{path}.url: a scrape reporter needs an http(s) URL of the "
                            "exporter's metrics, e.g. http://127.0.0.1:9400/metrics")
    elif _set(spec.url):
        problems.append(f"{path}.url: only for type: scrape")
    if spec.type in ("textfile", "scrape"):
        if spec.command is not None:
            problems.append(f"{path}.command: a {spec.type} reporter runs no command")
        if spec.format not in ("json", "prometheus"):
            problems.append(f"{path}.format: a {spec.type} reporter reads the Prometheus "
                            "exposition format (leave format out, or say prometheus)")
    if spec.mode != "periodic":
        problems.append(f"{path}.mode: an exposition reporter is periodic (one exposition "
                        "per interval)")
    return problems


def _inventory_problems(path: str, inv: InventoryMap) -> list[str]:
    problems: list[str] = []
    try:
        compile_selector(inv.devices)
    except ExpressionError as exc:
        problems.append(where(f"{path}.devices", exc))
    if not inv.by or not inv.by.replace("_", "a").isalnum():
        problems.append(f"{path}.by: expected a label name")
    for name, text in inv.attributes.items():
        try:
            kind = compile_mapping(text).kind
        except ExpressionError as exc:
            problems.append(where(f"{path}.attributes.{name}", exc))
            continue
        if kind == "string_set":
            problems.append(f"{path}.attributes.{name}: a device attribute is one value "
                            "(int, bool or string), not a set: use label(…), not labels(…)")
    return problems


def exposition_problems(catalog: Catalog) -> list[str]:
    """Every problem of `catalog`'s exposition reporters, path-qualified."""
    problems: list[str] = []
    for name, spec in catalog.reporters.items():
        path = f"reporters.{name}"
        mapped = spec.series if isinstance(spec.series, dict) else {}
        if not spec.exposition():
            problems.extend(f"{path}.{key}: only for exposition reporters (type: textfile or "
                            "scrape, or format: prometheus)"
                            for key in ("series", "inventory", "directory", "url")
                            if _set(getattr(spec, key)))
            continue
        problems.extend(_source_problems(path, spec))
        owned = catalog.resources_of(name)
        for resource, text in mapped.items():
            where_ = f"{path}.series.{resource}"
            if resource not in catalog.resources:
                problems.append(f"{where_}: no resource named {resource!r}")
                continue
            if resource not in owned:
                problems.append(f"{where_}: resource {resource!r} belongs to reporter "
                                f"{catalog.resources[resource].reporter!r}, not {name!r}")
                continue
            try:
                mapping = compile_mapping(text)
            except ExpressionError as exc:
                problems.append(where(where_, exc))
                continue
            declared = catalog.resources[resource].kind
            if mapping.kind != declared:
                problems.append(f"{where_}: type clash: the mapping gives a {mapping.kind} "
                                f"value but {resource!r} is declared {declared}")
        for resource in owned:
            if resource not in mapped:
                problems.append(f"resources.{resource}.reporter: {name!r} is an exposition "
                                f"reporter and {path}.series has no mapping for {resource!r}")
            if catalog.resources[resource].scope == "cluster":
                problems.append(f"resources.{resource}.scope: cluster-scope values must come "
                                f"from an external reporter, but {name!r} runs on hosts")
        if isinstance(spec.inventory, InventoryMap):
            problems.extend(_inventory_problems(f"{path}.inventory", spec.inventory))
        if not mapped and not isinstance(spec.inventory, InventoryMap):
            problems.append(f"{path}.series: an exposition reporter maps series to resources "
                            "(series:) or devices (inventory:); it has neither")
    return problems
