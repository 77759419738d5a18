"""The LSF door: an elim (`elim.crr` in `LSF_SERVERDIR`, running `crr bridge elim --host H`).

An elim writes load update strings `N name1 value1 … nameN valueN` to stdout;
the melim passes them to LIM, which keeps an index's last value until told
otherwise.  So the door writes a full string on every change and at least every
`interval` seconds, naming every exported value and feature:

- each exported value under its own resource name (declare it in `lsf.shared`
  with that name): a number as is, a boolean as 1/0, a string as is, a string
  set comma-separated (crr's own `format: elim` reader reads it back);
- each feature as `crr_<feature>` 1/0, and `crr_drained` 1/0;
- an unknown or stale value as `-` (as `lsload` shows an index without a value),
  never its last value.

Values must be single tokens (LIM splits on white space): a string with white
space, or an empty one, is written as `-` too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final, TextIO

from crr.bridges.stream_door import StreamDoor
from crr.producers.script_output import ELIM_UNKNOWN
from crr.projections.exports import CompiledExports, NodeWant, ValueOut
from crr.schemas.target_names import CLASSAD_PREFIX

FEATURE_PREFIX: Final = CLASSAD_PREFIX
"""`crr_`: LSF resource names are letters, digits and `_` too."""


def elim_value(v: ValueOut) -> str:
    """One exported value as an elim token (`-` unless fresh and one token)."""
    if v.state != "fresh" or v.value is None:
        return ELIM_UNKNOWN
    if v.kind == "numeric":
        x = float(v.value)
        if not math.isfinite(x):
            return ELIM_UNKNOWN
        return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)
    if v.kind == "boolean":
        return "1" if v.value else "0"
    text = ",".join(sorted(v.value)) if v.kind == "string_set" else str(v.value)
    if not text or any(c.isspace() for c in text) or text == ELIM_UNKNOWN:
        return ELIM_UNKNOWN
    return text


def render_elim(want: NodeWant, features: Sequence[str]) -> str:
    """The load update string for `want` (one line)."""
    pairs = [(f"{FEATURE_PREFIX}{f}", "1" if f in want.features else "0") for f in features]
    pairs.append((f"{FEATURE_PREFIX}drained", "1" if want.drain is not None else "0"))
    pairs.extend((name, elim_value(v)) for name, v in want.values.items())
    return " ".join([str(len(pairs)), *(f"{n} {v}" for n, v in pairs)]) + "\n"


def elim_door(out: TextIO, exports: Callable[[], CompiledExports | None]) -> StreamDoor:
    """The elim door writing to `out` (stdout, read by the melim)."""
    return StreamDoor("elim", out, exports, render_elim)
