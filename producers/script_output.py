"""What a reporter script printed, made into values and an inventory (docs/contract.md,
"`resources.yaml`").

Two formats:

* `json` — one object `{"values": {...}, "inventory": {"pool": ..., "devices": [...]}}`
  (either part may be absent, not both).  `periodic` scripts print one such
  document; `stream` scripts print one per line.  An optional `"problems":
  ["...", ...]` lets a script say what it could not measure (a value it
  reports as null, and why): the report is published and the reporter's
  Health turns `bad_output` with those texts.
* `elim` — LSF external LIM lines `N name1 value1 ... nameN valueN`.  Each
  value is converted by the kind the catalog declares for its name
  (numeric → float; boolean → 1/0/true/false/yes/no; string; string_set →
  comma-separated; `-` → null, unknown); a name the catalog does not know is
  passed through as the raw string (the projector rejects it and counts it on the reporter).

Values are otherwise passed through unchecked — kinds, bounds and
ownership are the projector's job — with one exception: a non-finite
number (`NaN`, `Infinity`) cannot be carried by the canonical JSON encoder
(it would become `null`, i.e. "unknown"), so it is dropped here and named
as a problem.

Parsing never raises for a script's mistake: it returns `ParsedOutput`
with the usable part and a list of `problems`; `BadOutput` is raised only
when nothing at all is usable.  Pure functions, no IO.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from crr.schemas.catalog import Kind
from crr.schemas.errors import ReporterError
from crr.schemas.events import Device, Pool, non_finite

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_MAX_PROBLEM = 200


class BadOutput(ReporterError):
    """A script's output is unusable as a whole (empty, not JSON, malformed)."""


class ScriptInventory(msgspec.Struct, frozen=True, kw_only=True):
    """The `inventory` member of a script's output; `pool` may be a bare name."""

    pool: str | Pool | None = None
    devices: list[Device] = msgspec.field(default_factory=list)


class ScriptDocument(msgspec.Struct, frozen=True, kw_only=True):
    """One report as a script prints it (unknown members are ignored, for evolution)."""

    values: dict[str, Any] | None = None
    inventory: ScriptInventory | None = None
    problems: list[str] = msgspec.field(default_factory=list)
    """What the script itself says is wrong with this report (Health `bad_output`)."""


_document = msgspec.json.Decoder(ScriptDocument)


@dataclass(frozen=True)
class ParsedOutput:
    """The usable part of one report and what was wrong with the rest."""

    values: dict[str, Any] | None = None
    inventory: ScriptInventory | None = None
    problems: list[str] = field(default_factory=list)


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_PROBLEM else text[:_MAX_PROBLEM] + "…"


def _finite_values(values: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    bad = non_finite(values)
    for k in bad:
        problems.append(f"{k}: {values[k]!r} is not a finite number; value dropped")
    return {k: v for k, v in values.items() if k not in bad} if bad else values


def parse_json_report(data: bytes) -> ParsedOutput:
    """One JSON document (periodic stdout, or one stream line)."""
    text = data.strip()
    if not text:
        raise BadOutput("no output")
    try:
        doc = _document.decode(text)
    except msgspec.ValidationError as exc:
        raise BadOutput(_clip(f"output is not a crr report: {exc}")) from None
    except msgspec.DecodeError as exc:
        if b"NaN" not in text and b"Infinity" not in text:
            raise BadOutput(_clip(f"output is not valid JSON: {exc}")) from None
        try:  # Python's json.dumps writes NaN/Infinity by default: keep the rest
            doc = msgspec.convert(json.loads(text), ScriptDocument)
        except (ValueError, msgspec.ValidationError):
            raise BadOutput(_clip(f"output is not valid JSON: {exc}")) from None
    if doc.values is None and doc.inventory is None:
        raise BadOutput("output has neither \"values\" nor \"inventory\"")
    problems = [_clip(p) for p in doc.problems]
    values = _finite_values(doc.values, problems) if doc.values is not None else None
    return ParsedOutput(values=values, inventory=doc.inventory, problems=problems)


ELIM_UNKNOWN = "-"
"""An elim's "cannot tell" (as `lsload` shows an index without a value): null, unknown.
`crr bridge elim` writes it for a stale or unknown value."""


def convert_elim_value(raw: str, kind: Kind | None) -> Any:
    """An elim value token as the catalog `kind` wants it; ValueError if it cannot be.

    `-` is unknown (None) for every kind the catalog declares."""
    if raw == ELIM_UNKNOWN and kind is not None:
        return None
    match kind:
        case "numeric":
            number = float(raw)
            if not math.isfinite(number):
                raise ValueError(f"{raw!r} is not a finite number")
            return number
        case "boolean":
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(f"{raw!r} is not a boolean (1/0/true/false/yes/no)")
        case "string_set":
            return [m for m in raw.split(",") if m]
        case _:
            return raw


def parse_elim_line(line: str, kinds: Mapping[str, Kind]) -> ParsedOutput:
    """One elim line `N name1 value1 ... nameN valueN`; BadOutput if it is malformed."""
    tokens = line.split()
    if not tokens:
        raise BadOutput("empty elim line")
    try:
        n = int(tokens[0])
    except ValueError:
        raise BadOutput(_clip(f"elim line does not start with a count: {line!r}")) from None
    if n < 0 or len(tokens) != 2 * n + 1:
        raise BadOutput(_clip(
            f"elim line announces {n} pair(s) but has {len(tokens) - 1} token(s): {line!r}"))
    values: dict[str, Any] = {}
    problems: list[str] = []
    for i in range(n):
        name, raw = tokens[1 + 2 * i], tokens[2 + 2 * i]
        try:
            values[name] = convert_elim_value(raw, kinds.get(name))
        except ValueError as exc:
            problems.append(f"{name}: {exc}")
    return ParsedOutput(values=values, problems=problems)


def parse_elim_text(data: bytes, kinds: Mapping[str, Kind]) -> ParsedOutput:
    """Every line of an elim's output, later lines overriding earlier ones.

    Malformed lines are named in `problems` and the good lines still count;
    BadOutput only when no line is usable.
    """
    values: dict[str, Any] = {}
    problems: list[str] = []
    good = 0
    for raw_line in data.decode("utf-8", "replace").splitlines():
        if not raw_line.strip():
            continue
        try:
            parsed = parse_elim_line(raw_line, kinds)
        except BadOutput as exc:
            problems.append(exc.message)
            continue
        good += 1
        values.update(parsed.values or {})
        problems.extend(parsed.problems)
    if not good:
        raise BadOutput("; ".join(problems[:3]) if problems else "no output")
    return ParsedOutput(values=values, problems=problems)


def parse_report(data: bytes, fmt: str, kinds: Mapping[str, Kind]) -> ParsedOutput:
    """Dispatch on the reporter's `format` (`json` or `elim`)."""
    if fmt == "elim":
        return parse_elim_text(data, kinds)
    return parse_json_report(data)
