"""The Kubernetes Node Feature Discovery door: `DIR/crr` in NFD's local feature-file format.

nfd-worker's local source reads every non-hidden file of `features.d`: one
`name[=value]` per line (no value: `true`), `#` comments, and the directive
`# +expiry-time=<RFC 3339>` after which it ignores the lines that follow.
Labels without a namespace get `feature.node.kubernetes.io/`.  So:

- each feature that holds is `<prefix>crr-<feature>=true` (a false one is left out:
  absent, as Kleene unknown is);
- a drain rule that holds is `<prefix>crr-drained=true`;
- exported values: a number, boolean or string as its value when NFD accepts it
  as a label value (`crr.schemas.target_names`); a string set as one label
  `<prefix>crr-<name>.<member>=true` per member; unknown and stale values are
  left out, and so is anything NFD would reject (said once in the log, and in a
  comment of the file);
- the first line is `# +expiry-time=` the plan's `expires_at`, capped at
  `now + max_ttl`: **if crr stops, NFD drops the labels by itself** at that time.
  The engine rewrites the file at `expires_at` and every `max_ttl / 3`.

Writes are atomic: a hidden temporary file in the same directory (NFD ignores
dot files), fsynced, then renamed over `DIR/crr`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from crr.bridges.door import Applied, Observed
from crr.projections.exports import NodeWant, ValueOut
from crr.schemas.errors import BridgeError
from crr.schemas.target_names import NFD_FEATURE_PREFIX, nfd_name_problem, nfd_value_problem
from crr.schemas.wire_time import format_time_whole

log = logging.getLogger("crr.bridge.nfd")

DEFAULT_PREFIX: Final = "feature.node.kubernetes.io/"
DEFAULT_MAX_TTL: Final = 300.0
FILE_NAME: Final = "crr"
EXPIRY_DIRECTIVE: Final = "# +expiry-time="


def nfd_value(v: ValueOut) -> list[tuple[str, str]] | None:
    """(name suffix, label value) pairs of one exported value (None: left out)."""
    if v.state != "fresh" or v.value is None:
        return None
    if v.kind == "string_set":
        return [(f".{m}", "true") for m in sorted(v.value)]
    if v.kind == "boolean":
        return [("", "true" if v.value else "false")]
    if v.kind == "numeric":
        x = float(v.value)
        text = str(int(x)) if x.is_integer() and math.fabs(x) < 1e15 else repr(x)
        return [("", text)]
    return [("", str(v.value))]


def render_nfd(want: NodeWant, now: float, *, prefix: str = DEFAULT_PREFIX,
               max_ttl: float = DEFAULT_MAX_TTL) -> tuple[str, list[str]]:
    """The feature file for `want` at `now`, and what had to be left out (NFD would reject it)."""
    expiry = now + max_ttl if want.expires_at is None else min(want.expires_at, now + max_ttl)
    lines = [EXPIRY_DIRECTIVE + format_time_whole(expiry)]
    skipped: list[str] = []
    labels: list[tuple[str, str]] = [(f"{NFD_FEATURE_PREFIX}{f}", "true")
                                     for f in sorted(want.features)]
    if want.drain is not None:
        labels.append((f"{NFD_FEATURE_PREFIX}drained", "true"))
    for name, v in want.values.items():
        for suffix, value in nfd_value(v) or []:
            labels.append((f"{NFD_FEATURE_PREFIX}{name}{suffix}", value))
    for name, value in labels:
        problem = nfd_name_problem(name) or nfd_value_problem(value)
        if problem is not None:
            skipped.append(problem)
            continue
        lines.append(f"{prefix}{name}={value}")
    lines.extend(f"# crr: left out: {s}" for s in skipped)
    return "\n".join(lines) + "\n", skipped


def body(text: str) -> str:
    """The file without its expiry line (what changes only by time)."""
    return "\n".join(x for x in text.splitlines() if not x.startswith(EXPIRY_DIRECTIVE))


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` at once (temp file + fsync + rename); BridgeError on failure."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise BridgeError(f"cannot write {path}: {exc.strerror or exc}") from exc


class NfdDoor:
    """The door of one node's NFD worker (see module doc)."""

    name = "nfd"

    def __init__(self, directory: Path, *, prefix: str = DEFAULT_PREFIX,
                 max_ttl: float = DEFAULT_MAX_TTL,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = directory / FILE_NAME
        self.prefix = prefix
        self.max_ttl = max_ttl
        self._written: dict[str, tuple[str, NodeWant]] = {}
        self._skipped: set[str] = set()
        self.clock = clock

    async def observe(self, nodes: Sequence[str]) -> Mapping[str, Observed]:
        """The file as written last time, if it still says so (else: rewrite)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError:
            text = None
        out: dict[str, Observed] = {}
        for node in nodes:
            last = self._written.get(node)
            same = last is not None and text is not None and body(text) == body(last[0])
            out[node] = Observed(matches=last[1] if same and last is not None else None,
                                 timed=True, written=same)
        return out

    async def apply(self, changes: Mapping[str, NodeWant]) -> Applied:
        """Write the file of the (one) node in `changes`."""
        done: set[str] = set()
        for node, want in changes.items():
            text, skipped = render_nfd(want, self.clock(), prefix=self.prefix, max_ttl=self.max_ttl)
            for s in skipped:
                if s not in self._skipped:
                    self._skipped.add(s)
                    log.warning("bridge nfd: left out of %s: %s", self.path, s)
            write_atomic(self.path, text)
            self._written[node] = (text, want)
            done.add(node)
        return Applied(done=frozenset(done), calls=len(done))
