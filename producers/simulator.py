"""Simulated reporters: many hosts per process, each with its own subject, boot and seq.

Used by `crr demo` (a few hosts beside the real agent) and `crr sim`
(thousands).  Values are realistic and deterministic for a seed: numeric
random walks, string sets that churn slowly, booleans that flap rarely.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bus.outbox import Outbox
from bus.subjects import event_subject, msg_id
from schemas.catalog import Catalog
from schemas.codec import encode
from schemas.events import Report

DATASET_POOL = ("imagenet", "c4", "laion-5b", "the-pile", "redpajama", "openwebtext",
                "wikipedia", "coco", "librispeech", "fineweb")


@dataclass
class SimulatedHost:
    """One simulated host's reporters and the evolving state of their values."""

    host: str
    boot: str
    rng: random.Random
    state: dict[str, Any] = field(default_factory=dict)
    seq: int = 0

    def next_values(self, catalog: Catalog, reporter: str) -> dict[str, Any]:
        """The next values of `reporter`'s host-scope resources on this host."""
        out: dict[str, Any] = {}
        for name in catalog.resources_of(reporter):
            spec = catalog.resources[name]
            if spec.scope != "host":
                continue
            prev = self.state.get(name)
            if spec.kind == "numeric":
                lo = spec.min if spec.min is not None else 0.0
                hi = spec.max if spec.max is not None else 1000.0
                v = float(prev) if prev is not None else self.rng.uniform(lo, hi)
                v = min(hi, max(lo, v + self.rng.gauss(0, (hi - lo) * 0.02)))
                out[name] = round(v, 1)
            elif spec.kind == "boolean":
                out[name] = (not prev) if prev is not None and self.rng.random() < 0.02 else (
                    prev if prev is not None else self.rng.random() < 0.9)
            elif spec.kind == "string":
                out[name] = prev if prev is not None else self.rng.choice(["ok", "ok", "drain"])
            else:
                members = set(prev if prev is not None else self.rng.sample(DATASET_POOL, 3))
                if self.rng.random() < 0.1:
                    members ^= {self.rng.choice(DATASET_POOL)}
                out[name] = sorted(members)
            self.state[name] = out[name]
        return out


def simulated_hosts(names: list[str], seed: int) -> list[SimulatedHost]:
    """Hosts with per-host RNGs derived from `seed` (deterministic values)."""
    return [SimulatedHost(host=n, boot=secrets.token_hex(4), rng=random.Random(f"{seed}/{n}"))
            for n in names]


def reports(
    hosts: list[SimulatedHost], catalog: Catalog, reporters: list[str], observed_at: str
) -> Iterator[tuple[str, bytes, str]]:
    """(subject, payload, msg id) of one round of reports from every host and reporter."""
    for h in hosts:
        for r in reporters:
            values = h.next_values(catalog, r)
            if not values:
                continue
            h.seq += 1
            rep = Report(reporter=r, host=h.host, boot=h.boot, seq=h.seq,
                         observed_at=observed_at, values=values)
            yield (event_subject("report", r, h.host), encode(rep),
                   msg_id(r, h.host, h.boot, h.seq))


def publish_round(
    outbox: Outbox, hosts: list[SimulatedHost], catalog: Catalog, reporters: list[str],
    observed_at: str,
) -> int:
    """Queue one round of reports on `outbox`; returns how many."""
    n = 0
    for subject, payload, mid in reports(hosts, catalog, reporters, observed_at):
        outbox.put(subject, payload, msg_id=mid, keep="latest")
        n += 1
    return n
