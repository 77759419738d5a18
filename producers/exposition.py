"""Prometheus text exposition in, typed values and an inventory out (docs/contract.md
"Exposition reporters").

`parse_exposition` reads the text with prometheus-client's parser (no parser of
our own); when it fails, the first bad line is found by parsing ever shorter
prefixes, so the error names the line.  `ExpositionMap` applies a reporter's
compiled `series:` mappings and `inventory:` (`crr.schemas.exposition`) to the
series and gives what a script's output gives (`ParsedOutput`): the values, the
devices, and the problems, each naming the resource, the series and the reason.

- A metric the exposition does not have at all is *missing*: the resource is
  left out of the report (its last value stays until it expires, then the
  projector counts it `missing`) and the problem says so.
- A selector that matches no series of a present metric gives null (unknown),
  never 0; `labels(…)` gives the empty set.
- A plain selector or `label(…)` matching several series is *ambiguous*, and a
  NaN/±Inf sample cannot be reported (the contract's rule for reports): the
  resource is left out and named.
Pure functions, no IO.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from crr.producers.script_output import BadOutput, ParsedOutput, ScriptInventory
from crr.schemas.catalog import ReporterSpec
from crr.schemas.events import Attribute, Device
from crr.schemas.exposition import (
    InventoryMap,
    Mapping,
    Matcher,
    Selector,
    compile_mapping,
    compile_selector,
)

Series = tuple[dict[str, str], float]
_MAX_LINE = 160
_SHOWN_SERIES = 3


class ExpositionError(BadOutput):
    """The text is not the exposition format; `line` is the first bad line (1-based)."""

    def __init__(self, message: str, *, line: int) -> None:
        self.line = line
        super().__init__(message)


@dataclass
class Exposition:
    """Parsed series by sample name, and every metric name the text declares."""

    series: dict[str, list[Series]] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)

    def merge(self, other: Exposition) -> None:
        """Add `other`'s series (several `*.prom` files are one exposition)."""
        for name, rows in other.series.items():
            self.series.setdefault(name, []).extend(rows)
        self.names |= other.names

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.series.values())


_COUNTER_TYPE = re.compile(r"^#[ \t]+TYPE[ \t]+(\S+)[ \t]+counter[ \t]*$", re.MULTILINE)


def _families(text: str) -> Exposition:
    """Series under the names the text spells: the library names a counter's samples
    `<family>_total` (OpenMetrics) even where the text wrote `<family>`, so those are
    given back the name its `# TYPE` line declared."""
    expo = Exposition()
    counters = set(_COUNTER_TYPE.findall(text))
    for family in text_string_to_metric_families(text):
        name = family.name
        total = f"{name}_total"
        renamed = family.type == "counter" and name in counters
        expo.names.add(total if family.type == "counter" and total in counters else name)
        for sample in family.samples:
            written = name if renamed and sample.name == total else sample.name
            expo.names.add(written)
            expo.series.setdefault(written, []).append((sample.labels, sample.value))
    return expo


def _fails(text: str) -> BaseException | None:
    try:
        _families(text)
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError…
        return exc
    return None


@functools.lru_cache(maxsize=64)
def _filter(wanted: frozenset[str]) -> tuple[re.Pattern[str], ...]:
    """The lines `parse_exposition` keeps for `wanted`, one pattern per line start: the
    samples of a wanted name (any line that starts with it: a malformed one too, so that
    it is reported), and `# HELP`/`# TYPE` of their families.  Each pattern starts with a
    literal, so `re` finds it with a plain substring search (in C)."""
    families = set(wanted) | {w[:-len(x)] for w in wanted for x in _SUFFIXES if w.endswith(x)}
    either = "|".join(re.escape(f) for f in sorted(families, key=len, reverse=True))
    return (*(re.compile(re.escape(f"\n{n}") + r"(?=[{ \t\r\n]|$)[^\n]*")
              for n in sorted(wanted)),
            re.compile(rf"\n# (?:HELP|TYPE) (?:{either})(?=[ \t\r\n]|$)[^\n]*"))


def _kept(text: str, wanted: Collection[str]) -> tuple[list[str], list[int]]:
    """The kept lines of `text` in order, and their offsets."""
    padded = "\n" + text  # every line, the first too, starts after a newline
    found = sorted((m.start(), m.group()[1:]) for pattern in _filter(frozenset(wanted))
                   for m in pattern.finditer(padded))
    return [line for _, line in found], [at for at, _ in found]


def _line_numbers(text: str, starts: list[int]) -> list[int]:
    """1-based line numbers of the offsets `starts` (ascending) in `text`."""
    out, line, at = [], 1, 0
    for start in starts:
        line += text.count("\n", at, start)
        at = start
        out.append(line)
    return out

_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")
"""Sample-name suffixes of a family's series (counters, histograms, summaries)."""


def parse_exposition(text: str, *, source: str = "output",
                     wanted: Collection[str] | None = None) -> Exposition:
    """The series of `text`; ExpositionError naming `source:line` if it does not parse.

    With `wanted` (the metric names a mapping reads), the lines of other metrics (their
    samples, HELP and TYPE) are left out before the library parses the rest:
    prometheus-client's parser is pure Python, about 0.3 ms a series, and an exporter's
    10k series are mostly ones no resource reads.  Only the kept lines are checked;
    line numbers are those of `text`.
    """
    lines: list[str]
    numbers: list[int] | None = None
    if wanted is not None:
        lines, offsets = _kept(text, wanted)
        numbers = _line_numbers(text, offsets)
        text = "\n".join(lines) + "\n"
    else:
        lines = text.split("\n")
    try:
        return _families(text)
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError…
        first = exc
    lo, hi = 1, len(lines)  # the shortest failing prefix has `hi` lines
    while lo < hi:
        mid = (lo + hi) // 2
        if _fails("\n".join(lines[:mid]) + "\n") is not None:
            hi = mid
        else:
            lo = mid + 1
    reason = _fails("\n".join(lines[:hi]) + "\n") or first
    bad = lines[hi - 1] if hi - 1 < len(lines) else ""
    shown = bad if len(bad) <= _MAX_LINE else bad[:_MAX_LINE] + "…"
    at = numbers[hi - 1] if numbers and hi - 1 < len(numbers) else hi
    raise ExpositionError(f"{source}:{at}: not the Prometheus exposition format "
                          f"({reason or type(reason).__name__}): {shown!r}", line=at)


def _show(selector: Selector, rows: list[Series]) -> str:
    """`rows` named by the labels that tell them apart (the others are the same for all)."""
    names = sorted({k for labels, _ in rows for k in labels})
    apart = [k for k in names if len({labels.get(k) for labels, _ in rows}) > 1] or names
    shown = ", ".join("{" + ",".join(f'{k}="{labels.get(k, "")}"' for k in apart) + "}"
                      for labels, _ in rows[:_SHOWN_SERIES])
    more = f", … {len(rows) - _SHOWN_SERIES} more" if len(rows) > _SHOWN_SERIES else ""
    return f"{selector.text} matches {len(rows)} series ({shown}{more})"


@dataclass(frozen=True)
class Outcome:
    """One mapping's result: a value (None: unknown), or why there is none."""

    value: Any = None
    problem: str | None = None
    missing: bool = False


_AGGREGATE: dict[str, Callable[[list[float]], float]] = {
    "min": min, "max": max, "sum": math.fsum,
    "avg": lambda xs: math.fsum(xs) / len(xs), "count": lambda xs: float(len(xs)),
}
_COMPARE = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def evaluate(mapping: Mapping, expo: Exposition, device: Matcher | None = None) -> Outcome:
    """`mapping` over `expo` (over one device's series when `device` is given)."""
    sel = mapping.selector
    if sel.metric not in expo.names:
        return Outcome(problem=f"series {sel.text}: missing ({sel.metric} is not in the "
                       "exposition)", missing=True)
    rows = [r for r in expo.series.get(sel.metric, ())
            if sel.matches(r[0]) and (device is None or device.matches(r[0]))]
    fn = mapping.function
    if fn == "labels":
        assert mapping.label is not None
        return Outcome(sorted({lab[mapping.label] for lab, _ in rows if lab.get(mapping.label)}))
    if fn == "label":
        assert mapping.label is not None
        found = sorted({lab.get(mapping.label, "") for lab, _ in rows})
        if len(found) > 1:
            return Outcome(problem=f"series {_show(sel, rows)} with {len(found)} values of "
                           f"label {mapping.label}: ambiguous; add label matchers")
        return Outcome(found[0] if found else None)
    if not rows:
        return Outcome(None)  # a missing series is unknown, never 0
    if fn is None and len(rows) > 1:
        return Outcome(problem=f"series {_show(sel, rows)}: ambiguous; aggregate it "
                       "(min, max, sum, count, avg) or add label matchers")
    if fn == "count":
        number = float(len(rows))  # counts series, whatever their values
    else:
        values = [v for _, v in rows]
        if not all(math.isfinite(v) for v in values):
            bad = next(v for v in values if not math.isfinite(v))
            return Outcome(problem=f"series {sel.text}: {bad!r} is not a finite number; "
                           "value dropped")
        number = float(_AGGREGATE[fn](values)) if fn else values[0]
    number *= mapping.scale
    if mapping.compare is not None:
        op, bound = mapping.compare
        return Outcome(bool(_COMPARE[op](number, bound)))
    return Outcome(number)


def _natural(value: str) -> tuple[int, int | str]:
    return (0, int(value)) if value.isdigit() else (1, value)


@dataclass(frozen=True)
class _Inventory:
    devices: Selector
    by: str
    prefix: str
    pool: str | None
    attributes: dict[str, Mapping]


def _attribute(name: str, value: Any) -> Attribute:
    if isinstance(value, bool):
        return Attribute(bool=value)
    if isinstance(value, float):
        return Attribute(int=round(value))
    return Attribute(string=str(value))


class ExpositionMap:
    """A reporter's compiled `series:` and `inventory:` (the catalog checked both)."""

    def __init__(self, spec: ReporterSpec) -> None:
        series = spec.series if isinstance(spec.series, dict) else {}
        self.mappings = {name: compile_mapping(text) for name, text in sorted(series.items())}
        self.inventory: _Inventory | None = None
        if isinstance(spec.inventory, InventoryMap):
            inv = spec.inventory
            self.inventory = _Inventory(
                devices=compile_selector(inv.devices), by=inv.by,
                prefix=inv.by if inv.prefix is None else inv.prefix, pool=inv.pool,
                attributes={k: compile_mapping(v) for k, v in sorted(inv.attributes.items())})
        self._wanted = self.metrics

    @property
    def metrics(self) -> frozenset[str]:
        """Every metric name the mappings and the inventory read."""
        selectors = [m.selector for m in self.mappings.values()]
        if self.inventory is not None:
            selectors.append(self.inventory.devices)
            selectors += [m.selector for m in self.inventory.attributes.values()]
        return frozenset(s.metric for s in selectors)

    def apply(self, expo: Exposition, problems: Iterable[str] = ()) -> ParsedOutput:
        """Values and devices from `expo`; `problems` (e.g. of files) come first."""
        said = list(problems)
        values: dict[str, Any] = {}
        for name, mapping in self.mappings.items():
            out = evaluate(mapping, expo)
            if out.problem is not None:
                said.append(f"{name}: {out.problem}")
            else:
                values[name] = out.value
        inventory = self._devices(expo, said) if self.inventory is not None else None
        return ParsedOutput(values=values or None, inventory=inventory, problems=said)

    def _devices(self, expo: Exposition, said: list[str]) -> ScriptInventory | None:
        inv = self.inventory
        assert inv is not None
        sel = inv.devices
        if sel.metric not in expo.names:
            said.append(f"inventory: series {sel.text}: missing ({sel.metric} is not in the "
                        "exposition); the last inventory stays")
            return None
        ids = sorted({labels.get(inv.by, "") for labels, _ in expo.series.get(sel.metric, ())
                      if sel.matches(labels)} - {""}, key=_natural)
        devices = []
        for ident in ids:
            one = Matcher(inv.by, "=", ident)
            attributes: dict[str, Attribute] = {}
            for name, mapping in inv.attributes.items():
                out = evaluate(mapping, expo, one)
                if out.problem is not None:
                    said.append(f"inventory {inv.prefix}{ident}.{name}: {out.problem}")
                elif out.value is not None:
                    attributes[name] = _attribute(name, out.value)
            devices.append(Device(name=f"{inv.prefix}{ident}", attributes=attributes))
        return ScriptInventory(pool=inv.pool, devices=devices)

    def from_text(self, data: bytes, *, source: str = "output") -> ParsedOutput:
        """A script's stdout or a scrape; ExpositionError if it does not parse.  Only the
        series the mapping reads are parsed (`parse_exposition`'s `wanted`); a textfile
        directory's files are parsed whole (`crr.producers.exposition_sources`)."""
        text = data.decode("utf-8", "replace")
        if not text.strip():
            raise BadOutput("no output")
        return self.apply(parse_exposition(text, source=source, wanted=self._wanted))
