"""The status page agrees with itself (issue 40, item 4), in headless Chromium: after load
and after changes that arrive over the event stream, the header, the summary, the host
table and the failures table say the same thing; the defaults come from the active
catalog; one time format; jitter below a resource's display precision is not a change;
each row shows what the bridges apply (features, drain).

Waits happen inside the page (`tests.rest.test_rest_status_page.until`), never on time.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.subjects import event_subject
from crr.schemas.wire_time import format_time
from tests.rest.test_rest_status_page import CHROMIUM, DevTools, chromium, until
from tests.support.projector import publish_catalog, publish_report
from tests.support.rest import running_api

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")

# Names unlike the demo's (no scratch_free, no datasets): the page's defaults must be these.
CATALOG = load_catalog_text("""
version: 1
resources:
  tmp_gb: {kind: numeric, scope: host, reporter: disk, interval: 60s, min: 0, precision: 0}
  tags:   {kind: string_set, scope: host, reporter: disk, interval: 60s}
  beat:   {kind: numeric, scope: host, reporter: pulse, interval: 200ms}
reporters:
  disk:  {type: script, command: [disk.sh], interval: 60s}
  pulse: {type: script, command: [pulse.sh], interval: 200ms}
exports:
  features:
    roomy: 'tmp_gb > 100'
  drain:
    - when: 'tmp_gb < 5'
      reason: 'scratch nearly full'
""")

# Everything one paint shows, read in one go.
PAINT = """(() => {
  const q = (s) => document.querySelector(s);
  const row = (h) => q(`#hosts tr[data-host="${h}"]`);
  const cells = (h) => row(h) ? [...row(h).children].map((c) => c.textContent.trim()) : null;
  return {
    conn: q('#conn').textContent, connClass: q('#conn').className,
    liveness: q('#liveness').textContent, projector: q('#projector').textContent,
    failingCard: q('#sum-failing').textContent,
    failureRows: [...document.querySelectorAll('#failures tbody tr')].map(
      (t) => [t.dataset.reporter, t.dataset.host]),
    noFailures: q('#no-failures').textContent,
    node1: cells('node1'), node2: cells('node2'),
    statusNode2: row('node2') && row('node2').querySelector('td.status').textContent,
    placeholder: q('#select').placeholder,
    times: [...document.querySelectorAll('time')].map((t) => [t.dateTime, t.title]),
    body: document.body.innerText,
    log: [...document.querySelectorAll('#log li')].map((li) => li.textContent),
    page: crrStatus.page, paints: crrStatus.paints,
  };
})()"""
ISO = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"


def report(reporter: str, host: str, values: dict[str, Any], seq: int) -> bytes:
    """A Report observed now."""
    return json.dumps({"reporter": reporter, "host": host, "boot": "b1", "seq": seq,
                       "observed_at": format_time(time.time()), "values": values}).encode()


async def paint(cdp: DevTools, page: str, condition: str = "true") -> dict[str, Any]:
    """The page's paint once `condition` (JS over `p`, the paint) holds."""
    got: dict[str, Any] = await until(cdp, page, f"(p => ({condition}) && p)({PAINT})")
    return got


def assert_agrees(p: dict[str, Any]) -> None:
    """The header, the summary, the failures table and the rows say the same thing."""
    page = p["page"]
    n = page["summary"]["failing_reporters"]
    assert p["failingCard"] == f"{n} failing"
    assert len(p["failureRows"]) == n == page["failures_total"]
    assert p["noFailures"] == (f"{n} failing" if n else "none")
    for host, mark in page["marks"].items():
        failing = sorted(m["reporter"] for m in mark["reporters"] if m["failing"])
        listed = sorted(r for r, h in p["failureRows"] if h == host)
        assert failing == listed, (host, failing, listed)
    live = page["summary"]["liveness"]
    assert p["liveness"] == f"projector {live['detail']}"
    [status] = page["projectors"]
    assert p["projector"] == f"projector seq {status['last_seq']}, lag {status['lag']}"
    assert p["conn"] == "live"
    assert p["connClass"] == "conn up"
    for dt, title in p["times"]:
        assert re.match(ISO, dt), dt
        assert title == dt
    assert not re.search(r"\d:\d\d:\d\d\s?[AP]M", p["body"]), "a locale time on the page"


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_the_page_agrees_with_itself_after_load_and_after_changes(
        nc: Client, tmp_path: Path) -> None:
    """After load and after each change pushed over the event stream, one answer paints
    everything: the failing reporter shows in the row, the summary and the failures table
    alike; the placeholder and the explain default use this catalog's resources; times are
    ISO with their zone; jitter below `precision: 0` logs nothing; the bridges column shows
    the exported feature and the drain rule that hold."""
    async with running_api(nc) as rig:
        await publish_catalog(nc, CATALOG)
        await publish_report(nc, "disk", "node1", {},
                             raw=report("disk", "node1", {"tmp_gb": 500.0, "tags": ["a"]}, 1))
        await publish_report(nc, "disk", "node2", {},
                             raw=report("disk", "node2", {"tmp_gb": 3.0, "tags": []}, 1))
        await publish_report(nc, "pulse", "node2", {}, raw=report("pulse", "node2",
                                                                 {"beat": 1.0}, 1))
        stopped = json.dumps({"reporter": "pulse", "host": "node2", "boot": "b1", "seq": 2,
                              "at": format_time(time.time()), "state": "stopped"})
        ack = await nc.jetstream().publish(event_subject("health", "pulse", "node2"),
                                           stopped.encode())
        await rig.settle(ack.seq)
        async with chromium(f"{rig.url}/", tmp_path / "profile") as (cdp, page):
            await until(cdp, page, "crrStatus.connected && crrStatus.loaded")
            # pulse stopped and its value went stale: `crr health` lists it as failing.
            first = await paint(cdp, page, "p.node2 && /pulse: stopped/.test(p.node2.join('|'))")
            assert_agrees(first)
            assert first["page"]["summary"]["failing_reporters"] == 1
            assert first["failureRows"] == [["pulse", "node2"]]
            # STATUS is `crr hosts`' (a stale value; its failing rule is the state alone).
            assert first["statusNode2"] == "stale"
            assert "pulse: stopped (missing beat)" in first["node2"]
            # Defaults from this catalog, never the demo's names.
            example = first["page"]["display"]["example"]
            assert example == "beat > 0 && count(tags) > 0"
            assert first["placeholder"].startswith(example)
            assert "scratch_free" not in first["body"] + first["placeholder"]
            # What the bridges apply.
            assert "roomy" in first["node1"]
            assert "drain: scratch nearly full" in first["node2"]

            # Jitter below precision 0, pushed over the event stream: no change logged.
            await publish_report(nc, "disk", "node1", {}, seq=2, raw=report(
                "disk", "node1", {"tmp_gb": 500.4, "tags": ["a"]}, 2))
            jitter = await paint(cdp, page, "p.page && p.page.table.rows.some((r) => r.host === "
                                            "'node1' && r.snapshot.values.tmp_gb.value === 500.4)")
            assert_agrees(jitter)
            assert "500" in jitter["node1"]
            assert not any("node1 tmp_gb" in line for line in jitter["log"])
            # A real change: logged once, with an ISO time; the feature goes, a drain holds.
            await publish_report(nc, "disk", "node1", {}, seq=3, raw=report(
                "disk", "node1", {"tmp_gb": 4.0, "tags": ["a"]}, 3))
            changed = await paint(cdp, page, "p.node1 && p.node1.includes('4')")
            assert_agrees(changed)
            logged = [line for line in changed["log"] if "node1 tmp_gb" in line]
            assert len(logged) == 1
            assert logged[0].endswith("node1 tmp_gb: 500 → 4 (fresh)")
            assert "roomy" not in changed["node1"]
            assert "drain: scratch nearly full" in changed["node1"]

            # A host's page: explain defaults to the catalog's example, and it works.
            await until(cdp, page, "(location.hash = '#/host/node1', true)")
            text = await until(cdp, page, "document.querySelector('#explain-text').textContent")
            expr = await until(cdp, page, "document.querySelector('#explain-expr').textContent")
            assert expr == example
            assert "beat" in text
            assert "unknown resource" not in text
