"""The status page's tools in headless Chromium: the select[] box, a host's timeline, the
latency chart, bad input on the page; screenshots of each view saved as test artifacts.

Artifacts go to `$CRR_TEST_ARTIFACTS` (default `test-artifacts/`, git-ignored).  Waits
happen inside the page (`tests.rest.test_rest_status_page.until`), never on time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from crr.schemas.subjects import event_subject
from crr.schemas.wire_time import format_time
from tests.rest.test_rest_status_page import CHROMIUM, DevTools, chromium, until
from tests.support.projector import publish_catalog, publish_report
from tests.support.rest import ApiRig, running_api

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")

ARTIFACTS = Path(os.environ.get("CRR_TEST_ARTIFACTS", "test-artifacts"))


def report(reporter: str, host: str | None, values: dict[str, Any], seq: int) -> bytes:
    """A Report observed now."""
    return json.dumps({"reporter": reporter, "host": host, "boot": "b1", "seq": seq,
                       "observed_at": format_time(time.time()), "values": values}).encode()


async def populate(nc: Client, rig: ApiRig) -> int:
    """node00..node11 (scratch_free 10*i; some datasets), a failing reporter, a cluster value."""
    await publish_catalog(nc)
    seq = 0
    for i in range(12):
        name = f"node{i:02d}"
        seq = await publish_report(nc, "scratch", name, {},
                                   raw=report("scratch", name, {"scratch_free": 10.0 * i}, 1))
        if i % 3 == 0:
            seq = await publish_report(
                nc, "datasets", name, {},
                raw=report("datasets", name, {"datasets": ["c4", "imagenet"][: 1 + i % 2]}, 1))
    health = json.dumps({"reporter": "datasets", "host": "node03", "boot": "b1", "seq": 2,
                         "at": format_time(time.time()), "state": "failed",
                         "detail": "exit 3: ls: /data: No such file", "exit_code": 3})
    await nc.jetstream().publish(event_subject("health", "datasets", "node03"), health.encode())
    seq = await publish_report(nc, "flexlm", None, {},
                               raw=report("flexlm", None, {"matlab_free": 4.0}, 1))
    await rig.settle(seq)
    return seq


async def typed(cdp: DevTools, page: str, selector: str, text: str) -> None:
    """Set an input's value as typing would and fire its input event."""
    await until(cdp, page, f"""(() => {{ const i = document.querySelector({json.dumps(selector)});
        i.value = {json.dumps(text)}; i.dispatchEvent(new Event('input')); return true; }})()""")


async def screenshot(cdp: DevTools, page: str, name: str) -> Path:
    """A PNG of the page as rendered now, saved under ARTIFACTS."""
    shot = await cdp.call("Page.captureScreenshot", page, format="png", captureBeyondViewport=True)
    path = ARTIFACTS / f"{name}.png"
    await asyncio.to_thread(save, path, base64.b64decode(shot["data"]))
    return path


def save(path: Path, png: bytes) -> None:
    """Write an artifact (not a blank page: a rendered one is well over 5 kB)."""
    assert len(png) > 5000, path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)


async def viewport(cdp: DevTools, page: str) -> None:
    """A laptop-sized window."""
    await cdp.call("Emulation.setDeviceMetricsOverride", page, width=1280, height=1000,
                   deviceScaleFactor=1, mobile=False)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_select_box_narrows_live_and_shows_the_caret(nc: Client, tmp_path: Path) -> None:
    """Typing an expression narrows the table; a value change brings a host in; an invalid
    expression shows the caret; a huge one a clear message."""
    async with running_api(nc) as rig:
        await populate(nc, rig)
        async with chromium(f"{rig.url}/", tmp_path / "profile") as (cdp, page):
            await viewport(cdp, page)
            await until(cdp, page, "crrStatus.connected && crrStatus.loaded")
            assert await until(cdp, page, "crrStatus.total === 12 && crrStatus.rows().length")
            await typed(cdp, page, "#select", "select[scratch_free > 95] rusage[mem=100]")
            rows = await until(cdp, page, "(r => r.length === 2 && r)(crrStatus.rows())")
            assert rows == ["node10", "node11"]
            note = await until(cdp, page, "document.querySelector('#select-note').textContent")
            assert "rusage" in note
            # A value changes: the open page narrows again, without a reload.
            await publish_report(nc, "scratch", "node03", {}, seq=2,
                                 raw=report("scratch", "node03", {"scratch_free": 500.0}, 2))
            rows = await until(cdp, page, "(r => r.length === 3 && r)(crrStatus.rows())")
            assert rows == ["node03", "node10", "node11"]
            assert await until(cdp, page, "crrStatus.cell('node03', 'scratch_free')") == {
                "text": "500", "state": "fresh"}
            await screenshot(cdp, page, "main-select")
            # Sort by a column, filter by name and by reporter state (server-side).
            await until(cdp, page, """(() => { document.querySelector(
                '#hosts th[data-column="scratch_free"]').click(); return true; })()""")
            await typed(cdp, page, "#select", "")
            rows = await until(cdp, page, "(r => r.length === 12 && r)(crrStatus.rows())")
            assert rows[:2] == ["node00", "node01"]
            await until(cdp, page, """(() => { document.querySelector(
                '#hosts th[data-column="scratch_free"]').click(); return true; })()""")
            rows = await until(cdp, page, "(r => r[0] === 'node03' && r)(crrStatus.rows())")
            assert rows[1:3] == ["node11", "node10"]
            await until(cdp, page, """(() => { const s = document.querySelector(
                '#reporter-filter'); s.value = 'failing'; s.dispatchEvent(new Event('change'));
                return true; })()""")
            assert await until(cdp, page, "(r => r.length === 1 && r)(crrStatus.rows())") == [
                "node03"]
            await screenshot(cdp, page, "main-failing")
            # An invalid expression: the message and the caret under the offending token.
            await typed(cdp, page, "#select", "scratch_free > 100 && datasets > 3")
            err = await until(cdp, page, "crrStatus.selectError")
            assert "datasets" in err["text"]
            shown = await until(cdp, page, "!document.querySelector('#select-error').hidden && "
                                           "document.querySelector('#select-error').textContent")
            expr_line, caret_line = shown.splitlines()[-2:]
            assert caret_line.strip() == "^"
            assert expr_line[caret_line.index("^"):].startswith("datasets")
            await screenshot(cdp, page, "main-caret")
            # While it stays invalid the page still paints (header, summaries and tables from
            # one answer, for the last valid expression), as the projector's statuses arrive.
            paints = await until(cdp, page, "crrStatus.paints")
            assert await until(cdp, page, f"crrStatus.paints > {paints} && "
                                          "crrStatus.selectError && crrStatus.paints")
            # Huge and malicious expressions: a clear message, the page stays responsive.
            await typed(cdp, page, "#select", "(" * 3000 + "scratch_free > 1" + ")" * 3000)
            assert "nested too deeply" in (await until(
                cdp, page, "(e => e && /nested/.test(e.text) && e.text)(crrStatus.selectError)"))
            await typed(cdp, page, "#select", "scratch_free > 1 && " * 1000)
            assert "too long" in (await until(
                cdp, page, "(e => e && /too long/.test(e.text) && e.text)(crrStatus.selectError)"))
            await typed(cdp, page, "#select", "scratch_free > 95")
            assert await until(cdp, page, "!crrStatus.selectError && crrStatus.total")


async def test_host_page_timeline_shows_a_stale_period(nc: Client, tmp_path: Path) -> None:
    """A reporter that stopped: the host's timeline shades its value stale after expires_at;
    the host page lists values, reporters (the failing one with its detail) and explain."""
    async with running_api(nc) as rig:
        await populate(nc, rig)
        await publish_report(nc, "blinker", "node03", {},
                             raw=report("blinker", "node03", {"blink": 3.0}, 1))
        async with chromium(f"{rig.url}/", tmp_path / "profile") as (cdp, page):
            await viewport(cdp, page)
            await until(cdp, page, "crrStatus.connected && crrStatus.loaded")
            await until(cdp, page, "(c => c && c.state === 'stale')"
                                   "(crrStatus.cell('node03', 'blink'))")
            await typed(cdp, page, "#select", "scratch_free > 20 && blink > 1")
            await until(cdp, page, "crrStatus.total !== null && !crrStatus.selectError")
            await until(cdp, page, "(() => { location.hash = '#/host/node03'; return true; })()")
            data = await until(cdp, page, "crrStatus.timeline && crrStatus.timeline.host === "
                                          "'node03' && crrStatus.timeline")
            blink = next(v for v in data["values"] if v["resource"] == "blink")
            assert [s["state"] for s in blink["spans"]] == ["fresh", "stale"]
            stale_rects = await until(cdp, page, """document.querySelectorAll(
                'svg.timeline g[data-name="blink"] rect.span.stale').length""")
            assert stale_rects == 1
            explain = await until(cdp, page, "document.querySelector('#explain-text')"
                                             ".textContent")
            assert "not selected" in explain
            assert "blink" in explain
            failing = await until(cdp, page, "[...document.querySelectorAll("
                                             "'#host-reporters tr.failing')].map(t => "
                                             "t.textContent).join('|')")
            assert "No such file" in failing
            assert "blinkersilent" in failing
            # A shorter window (the test's history is seconds long) for the screenshot.
            await until(cdp, page, """(() => { const s = document.querySelector('#window');
                s.value = '1m'; s.dispatchEvent(new Event('change')); return true; })()""")
            short = await until(cdp, page, "crrStatus.timeline && crrStatus.timeline.since && "
                                           "crrStatus.timeline.until - crrStatus.timeline.since"
                                           " < 61 && crrStatus.timeline")
            assert [s["state"] for s in next(v for v in short["values"]
                                             if v["resource"] == "blink")["spans"]] == [
                "fresh", "stale"]
            await screenshot(cdp, page, "host-page")
            # Odd characters in the URL: a clear message, not a hung page.
            await until(cdp, page, "(() => { location.hash = '#/host/a.%2A%20%3E%E2%80%AE';"
                                   " return true; })()")
            msg = await until(cdp, page, "!document.querySelector('#host-error').hidden && "
                                         "document.querySelector('#host-error').textContent")
            assert "no host named" in msg
            await until(cdp, page, "(() => { location.hash = '#/host/%E0%A4%A'; return true; })()")
            msg = await until(cdp, page, "(t => /percent-encoding/.test(t) && t)(document."
                                         "querySelector('#host-error').textContent)")
            assert "not valid" in msg
            # A window beyond retention: the API says so; the page shows it.
            await until(cdp, page, "(() => { location.hash = '#/host/node03'; return true; })()")
            await until(cdp, page, "crrStatus.timeline && crrStatus.timeline.host")
            await until(cdp, page, """(() => { const s = document.querySelector('#window');
                s.value = '48h'; s.dispatchEvent(new Event('change')); return true; })()""")
            err = await until(cdp, page, "crrStatus.timeline && crrStatus.timeline.error")
            assert "keeps" in err


async def test_latency_chart_renders(nc: Client, tmp_path: Path) -> None:
    """The latency view draws bars for every reporter with samples and lists the slowest."""
    async with running_api(nc) as rig:
        await populate(nc, rig)
        async with chromium(f"{rig.url}/#/latency", tmp_path / "profile") as (cdp, page):
            await viewport(cdp, page)
            data = await until(cdp, page, "crrStatus.latency && crrStatus.latency.reporters "
                                          "&& crrStatus.latency")
            scratch = next(r for r in data["reporters"] if r["reporter"] == "scratch")
            assert scratch["reports"] == 12
            assert scratch["stored_to_snapshot"]["n"] >= 1
            bars = await until(cdp, page, """document.querySelectorAll(
                'svg.latency g.bar[data-reporter="scratch"] rect[data-q]').length""")
            assert bars >= 6  # observed→stored and at least one snapshot leg, 3 quantiles each
            widths = await until(cdp, page, """[...document.querySelectorAll(
                'svg.latency rect[data-q]')].map(r => +r.getAttribute('width'))""")
            assert max(widths) > 1
            slow = await until(cdp, page, "document.querySelectorAll('#slowest tbody tr').length")
            assert slow >= 1
            # The table and the chart show the same numbers (issue 40): every bar's figure is
            # in the figures table, and the slowest report is the chart's observed →
            # snapshot max.
            bars = await until(cdp, page, """[...document.querySelectorAll(
                'svg.latency rect[data-q] title')].map(t => t.textContent)""")
            figures = await until(cdp, page, """Object.fromEntries([...document.querySelectorAll(
                '#latency-figures tbody tr')].map(tr => [tr.dataset.reporter + ' ' +
                tr.dataset.leg, [...tr.children].map(td => td.textContent)]))""")
            legs = {"observed → stored": "observed_to_stored",
                    "stored → snapshot": "stored_to_snapshot",
                    "observed → snapshot": "observed_to_snapshot"}
            for title in bars:
                head, _, rest = title.partition(": ")
                label = next(lab for lab in legs if f" {lab} " in head + " ")
                reporter = head.split(f" {label} ")[0]
                quantile = head.rsplit(" ", 1)[1]
                row = figures[f"{reporter} {legs[label]}"]
                column = {"p50": 3, "p95": 4, "p99": 5}[quantile]
                assert row[column] == rest.split(" (")[0], (title, row)
            top = await until(cdp, page, "document.querySelector('#slowest tbody tr')"
                                         ".children[5].textContent")
            maxima = [r["observed_to_snapshot"]["max"] for r in data["reporters"]
                      if r["observed_to_snapshot"]["n"]]
            assert top.endswith(" ms")
            assert abs(float(top.removesuffix(" ms")) - max(maxima) * 1000) <= 0.051  # rounding
            await screenshot(cdp, page, "latency")


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_page_at_50k_hosts(nc: Client, tmp_path: Path) -> None:
    """50k hosts: the page shows the total, scrolling to the middle shows the middle rows,
    an expression narrows the table; prints how long each took (`pytest -m slow -s`)."""
    async with running_api(nc) as rig:
        await publish_catalog(nc)
        js = nc.jetstream()
        pending: list[Any] = []
        last = 0
        for i in range(50_000):
            name = f"node{i:05d}"
            pending.append(js.publish(event_subject("report", "scratch", name),
                                      report("scratch", name, {"scratch_free": float(i % 977)},
                                             1)))
            if len(pending) >= 500 or i == 49_999:
                last = (await asyncio.gather(*pending))[-1].seq
                pending = []
        await rig.projector.wait_until(last, 300)
        await rig.view.wait_until(last, 300)
        async with chromium(f"{rig.url}/", tmp_path / "profile") as (cdp, page):
            await viewport(cdp, page)
            t0 = time.monotonic()
            await until(cdp, page, "crrStatus.loaded && crrStatus.total === 50000", 60000)
            opened = time.monotonic() - t0
            t0 = time.monotonic()
            n = await until(cdp, page, """(() => { const r = crrStatus.refreshes;
                document.querySelector('#table-scroll').scrollTop = 26 * 25000;
                return r + 1; })()""")
            first = await until(cdp, page, f"crrStatus.refreshes >= {n} && "
                                           "crrStatus.rows()[0] > 'node2' && crrStatus.rows()",
                                30000)
            scrolled = time.monotonic() - t0
            assert "node25000" in first
            assert len(first) < 200  # only the rows in view (and a margin) are in the page
            t0 = time.monotonic()
            await typed(cdp, page, "#select", "scratch_free > 970")
            total = await until(cdp, page, "crrStatus.total < 50000 && crrStatus.total", 30000)
            narrowed = time.monotonic() - t0
            assert total == sum(1 for i in range(50_000) if i % 977 > 970)
            await screenshot(cdp, page, "main-50k")
            print(f"50k hosts: first table {opened:.2f} s after opening, scroll to the middle "
                  f"{scrolled:.2f} s, select narrowed in {narrowed:.2f} s")
