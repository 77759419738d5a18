"""Slurm hostlist expressions (`node[001-100,205]`): one argument names many nodes.

The Slurm bridge groups the nodes that need the same change and names them in one
`scontrol update NodeName=<hostlist>` call, so a change to 50,000 nodes costs a handful
of calls instead of 50,000.  `compress` writes the expressions, `expand` reads them
back; both follow Slurm's own rules (`scontrol show hostnames` is the reference the
tests compare against):

- a name splits into a prefix and its trailing decimal digits (`rack1-node` + `007`);
  a name without trailing digits stands alone;
- the digits keep their width: `node007` and `node7` are different nodes, so names are
  grouped by (prefix, number of digits) and each range is written zero-padded to that
  width (`node[007-009]`); `node[9-10]` is therefore written `node9,node10` — longer
  but unambiguous;
- ranges are listed in ascending order inside the brackets, comma-separated.

Pure functions, no IO.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")
_BRACKET = re.compile(r"^(?P<prefix>[^\[\],]*)\[(?P<body>[^\]]*)\](?P<suffix>[^\[\],]*)$")

MAX_EXPRESSION_CHARS = 32 * 1024
"""Longest hostlist handed to one command argument (Linux caps one argument at 128 KiB);
a sparse set longer than this is split over several calls."""


def _ranges(numbers: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for n in sorted(set(numbers)):
        if out and n == out[-1][1] + 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


def _group_terms(names: Iterable[str]) -> list[str]:
    """Every name in `names` as one term per (prefix, width) group (`node[001-003,009]`) or
    alone, sorted so that equal inputs give equal output."""
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    alone: set[str] = set()
    for name in names:
        m = _TRAILING_DIGITS.match(name)
        if m is None:
            alone.add(name)
        else:
            groups[(m.group(1), len(m.group(2)))].append(int(m.group(2)))
    terms = sorted(alone)
    for (prefix, width), numbers in sorted(groups.items()):
        spans = _ranges(numbers)
        if len(spans) == 1 and spans[0][0] == spans[0][1]:
            terms.append(f"{prefix}{spans[0][0]:0{width}d}")
            continue
        parts = [f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in spans]
        terms.append(f"{prefix}[{','.join(parts)}]")
    return terms


def compress(names: Iterable[str], max_chars: int = MAX_EXPRESSION_CHARS) -> list[str]:
    """The hostlist expressions naming exactly `names` (duplicates ignored), each at most
    `max_chars` long where a single group allows it.  Usually one expression; more only
    when the set is too sparse to fit one argument."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for term in _split_long(_group_terms(names), max_chars):
        if current and size + 1 + len(term) > max_chars:
            out.append(",".join(current))
            current, size = [], 0
        size += len(term) + (1 if current else 0)
        current.append(term)
    if current:
        out.append(",".join(current))
    return out


def _split_long(terms: list[str], max_chars: int) -> list[str]:
    """A bracketed term longer than `max_chars` cut into several (one group's ranges
    spread over more than one argument)."""
    out: list[str] = []
    for term in terms:
        m = _BRACKET.match(term)
        if len(term) <= max_chars or m is None:
            out.append(term)
            continue
        prefix, parts = m.group("prefix"), m.group("body").split(",")
        chunk: list[str] = []
        for part in parts:
            if chunk and len(prefix) + 2 + len(",".join([*chunk, part])) > max_chars:
                out.append(f"{prefix}[{','.join(chunk)}]")
                chunk = []
            chunk.append(part)
        out.append(f"{prefix}[{','.join(chunk)}]")
    return out


def _split_top(expr: str) -> list[str]:
    """`a[1-2],b,c[3]` → [`a[1-2]`, `b`, `c[3]`]: commas outside brackets separate terms."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(expr[start:i])
            start = i + 1
    terms.append(expr[start:])
    return [t for t in terms if t]


def expand(expr: str) -> list[str]:
    """The node names of a hostlist expression in its order (`node[1-3],x` → node1, node2,
    node3, x).  Handles what `compress` writes, and the one-bracket form admins write in
    `slurm.conf`; raises ValueError on anything else."""
    out: list[str] = []
    for term in _split_top(expr):
        if "[" not in term:
            out.append(term)
            continue
        m = _BRACKET.match(term)
        if m is None:
            raise ValueError(f"hostlist {expr!r}: cannot read term {term!r}")
        for part in m.group("body").split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"hostlist {expr!r}: bad range {part!r}")
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                out.append(f"{m.group('prefix')}{n:0{width}d}{m.group('suffix')}")
    return out
