"""The HTCondor door: a startd cron job in continuous mode (`crr bridge condor --host H`).

A continuous startd cron job prints ClassAd attribute lines and a line starting
with `-` after each complete update; the startd merges the attributes into
the machine ad.  For each update the door prints:

- `crr_<feature> = true|false` for every feature (false when the expression is not
  TRUE: unknown is absent, as in `select[]`);
- `crr_drained = true|false` and `crr_drain_reason = "…"` (or `undefined`);
- `crr_<value> = …` for each exported value: numbers as reals, strings quoted,
  booleans, string sets as ClassAd lists (`{"imagenet", "c4"}`), and an unknown or
  stale-unknown value as `undefined` — so ClassAd's own three-valued logic
  (`crr_scratch_free > 500` is undefined, not true) matches crr's Kleene logic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Final, TextIO

from crr.bridges.stream_door import StreamDoor
from crr.projections.exports import CompiledExports, NodeWant, ValueOut
from crr.schemas.target_names import CLASSAD_PREFIX

UNDEFINED: Final = "undefined"
SEPARATOR: Final = "-"


def classad_string(s: str) -> str:
    """A ClassAd string literal (backslash and quote escaped, control characters too)."""
    out = s.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c >= " " else f"\\u{ord(c):04x}" for c in out) + '"'


def classad_real(x: float) -> str:
    """A ClassAd real literal (always with a fraction or exponent)."""
    text = repr(float(x))
    return text if ("." in text or "e" in text or "n" in text) else text + ".0"


def classad_value(v: ValueOut) -> str:
    """One exported value as a ClassAd expression (`undefined` unless fresh)."""
    if v.state != "fresh" or v.value is None:
        return UNDEFINED
    value: Any = v.value
    if v.kind == "numeric":
        return classad_real(value) if math.isfinite(value) else UNDEFINED
    if v.kind == "boolean":
        return "true" if value else "false"
    if v.kind == "string_set":
        return "{" + ", ".join(classad_string(m) for m in sorted(value)) + "}"
    return classad_string(str(value))


def render_condor(want: NodeWant, features: Sequence[str]) -> str:
    """One update block for `want`: attribute lines then the `-` separator line."""
    lines = [f"{CLASSAD_PREFIX}{f} = {'true' if f in want.features else 'false'}"
             for f in features]
    lines.append(f"{CLASSAD_PREFIX}drained = {'true' if want.drain is not None else 'false'}")
    lines.append(f"{CLASSAD_PREFIX}drain_reason = "
                 + (classad_string(want.drain) if want.drain is not None else UNDEFINED))
    lines.extend(f"{CLASSAD_PREFIX}{name} = {classad_value(v)}"
                 for name, v in want.values.items())
    lines.append(SEPARATOR)
    return "\n".join(lines) + "\n"


def condor_door(out: TextIO, exports: Callable[[], CompiledExports | None]) -> StreamDoor:
    """The condor door writing to `out` (stdout, read by the startd)."""
    return StreamDoor("condor", out, exports, render_condor)
