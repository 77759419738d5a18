"""Host names between crr and Slurm: `crr bridge slurm --host-map RULE|FILE`.

crr names a host as its agent says (`--host`, default the short host name); Slurm
names it by its `NodeName`.  They must be equal for the Slurm bridge to find the node
(docs/bridges-slurm.md).  Where a site's names differ, `--host-map` maps crr's name to
Slurm's before anything is read or written:

- `short`: drop the domain (`node1.example.org` → `node1`): FQDN agents, short NodeNames;
- `FILE`: lines `crr_name slurm_name` (`#` comments, blank lines ignored); a host not
  listed keeps its name.

Two crr hosts mapped to one Slurm node would fight over it: a map that does that is
refused (for a file at start; for `short`, the later host is left out and said once).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from crr.bridges.slurm import SlurmCommands, SlurmDoor
from crr.projections.exports import NodeWant
from crr.schemas.errors import CrrError

log = logging.getLogger("crr.bridge.slurm")

SHORT: Final = "short"


class HostMap:
    """crr host name → Slurm NodeName (see the module doc)."""

    def __init__(self, table: Mapping[str, str] | None = None, *, short: bool = False) -> None:
        self.table = dict(table or {})
        self.short = short
        self._said: set[str] = set()

    @classmethod
    def parse(cls, spec: str) -> HostMap:
        """`short`, or the path of a `crr_name slurm_name` file; CrrError naming the line."""
        if spec == SHORT:
            return cls(short=True)
        where = f"--host-map {spec}"
        try:
            text = Path(spec).read_text(encoding="utf-8")
        except OSError as exc:
            raise CrrError(f"cannot read: {exc.strerror or exc} (give `short` or a file of "
                           "`crr_name slurm_name` lines)", where=where) from None
        table: dict[str, str] = {}
        seen: dict[str, str] = {}
        for n, line in enumerate(text.splitlines(), start=1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 2:
                raise CrrError(f"line {n}: expected `crr_name slurm_name`, got {line.strip()!r}",
                               where=where)
            crr_name, slurm_name = words
            if crr_name in table:
                raise CrrError(f"line {n}: {crr_name!r} is mapped twice", where=where)
            if slurm_name in seen:
                raise CrrError(f"line {n}: {slurm_name!r} is already the Slurm name of "
                               f"{seen[slurm_name]!r}", where=where)
            table[crr_name] = slurm_name
            seen[slurm_name] = crr_name
        return cls(table)

    def slurm_name(self, host: str) -> str:
        """The Slurm NodeName of crr's `host`."""
        if self.short:
            return host.split(".", 1)[0]
        return self.table.get(host, host)

    def apply(self, wants: Mapping[str, NodeWant]) -> dict[str, NodeWant]:
        """`wants` keyed by Slurm names; a second crr host on one Slurm node is left out."""
        out: dict[str, NodeWant] = {}
        owner: dict[str, str] = {}
        for host in sorted(wants):
            node = self.slurm_name(host)
            if node in out:
                if host not in self._said:
                    self._said.add(host)
                    log.warning("bridge slurm: --host-map gives %s and %s the same Slurm node "
                                "%s; leaving %s out (said once)", owner[node], host, node, host)
                continue
            out[node] = wants[host]
            owner[node] = host
        return out


class MappedSlurmDoor(SlurmDoor):
    """A `SlurmDoor` that is told crr's host names and speaks Slurm's (`HostMap`)."""

    def __init__(self, commands: SlurmCommands, host_map: HostMap, *, batch: bool = True) -> None:
        super().__init__(commands, batch=batch)
        self.host_map = host_map

    def slurm_names(self, wants: Mapping[str, NodeWant]) -> dict[str, NodeWant]:
        """The wants renamed to Slurm's node names (`HostMap.apply`)."""
        return self.host_map.apply(wants)
