"""Builders for fold tests: a small catalog and envelopes as the bus would deliver them."""

from __future__ import annotations

import json
from typing import Any

from crr.projections.envelope import Envelope
from crr.projections.record.snapshot import host_snapshot
from crr.projections.state import ProjectionState
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.subjects import CATALOG, event_subject

T0 = 1_800_000_000.0
"""An arbitrary fixed epoch for tests (2027-01-15)."""

CATALOG_YAML = """
version: 1
resources:
  scratch_free:  {kind: numeric, scope: host, reporter: scratch, interval: 10s, min: 0}
  scratch_total: {kind: numeric, scope: host, reporter: scratch, interval: 10s}
  datasets:      {kind: string_set, scope: host, reporter: datasets, interval: 20s, max_items: 3}
  site_ok:       {kind: boolean, scope: host, reporter: site, interval: 10s}
  site_state:    {kind: string, scope: host, reporter: site, interval: 10s, max_length: 8}
  matlab_free:   {kind: numeric, scope: cluster, reporter: flexlm, interval: 10s, min: 0}
reporters:
  scratch:  {type: script, command: [scratch.sh], interval: 10s}
  datasets: {type: script, command: [datasets.py], mode: stream, interval: 20s}
  site:     {type: script, command: [site.sh], interval: 10s}
  gpus:     {type: script, command: [gpus.py], interval: 10s}
  flexlm:   {type: external, interval: 10s}
"""
"""Lifetimes (interval + grace): scratch, site, flexlm values 15 s; datasets 30 s; gpus 15 s."""

CATALOG_OBJ: Catalog = load_catalog_text(CATALOG_YAML)


def catalog_env(seq: int, t: float, catalog: Catalog = CATALOG_OBJ) -> Envelope:
    """A `crr.v1.catalog` event carrying `catalog` encoded as on the wire."""
    return Envelope(seq=seq, subject=CATALOG, received_at=t, data=encode(catalog))


def raw_env(seq: int, t: float, subject: str, data: bytes) -> Envelope:
    """An event with an arbitrary subject and payload."""
    return Envelope(seq=seq, subject=subject, received_at=t, data=data)


def report_env(
    seq: int, t: float, reporter: str, host: str | None, values: dict[str, Any],
    *, payload: dict[str, Any] | None = None,
) -> Envelope:
    """A Report on its proper subject; `payload` overrides or adds payload fields."""
    body: dict[str, Any] = {"reporter": reporter, "host": host, "boot": "b1", "seq": seq,
                            "observed_at": "2027-01-15T08:00:00.000Z", "values": values}
    body.update(payload or {})
    return Envelope(seq=seq, subject=event_subject("report", reporter, host), received_at=t,
                    data=json.dumps(body).encode())


def inventory_env(
    seq: int, t: float, reporter: str, host: str | None, devices: list[dict[str, Any]],
    *, generation: int = 1,
) -> Envelope:
    """An Inventory on its proper subject."""
    body = {"reporter": reporter, "host": host, "boot": "b1", "seq": seq,
            "observed_at": "2027-01-15T08:00:00.000Z",
            "pool": {"name": f"{host}/{reporter}", "generation": generation},
            "devices": devices}
    return Envelope(seq=seq, subject=event_subject("inventory", reporter, host), received_at=t,
                    data=json.dumps(body).encode())


def health_env(
    seq: int, t: float, reporter: str, host: str | None, state: str,
    *, detail: str | None = None, exit_code: int | None = None,
) -> Envelope:
    """A Health event on its proper subject."""
    body = {"reporter": reporter, "host": host, "boot": "b1", "at": "2027-01-15T08:00:00.000Z",
            "state": state, "detail": detail, "exit_code": exit_code}
    return Envelope(seq=seq, subject=event_subject("health", reporter, host), received_at=t,
                    data=json.dumps(body).encode())


def snap(state: ProjectionState, host: str) -> HostSnapshot:
    """The host snapshot (shorthand)."""
    return host_snapshot(state, host)


def encoded_hosts(state: ProjectionState) -> dict[str, bytes]:
    """Every host snapshot, encoded: what byte-identity is checked on."""
    return {h: encode(host_snapshot(state, h)) for h in sorted(state.hosts)}
