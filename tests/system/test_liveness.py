"""One truth on every surface: with the projector stopped, every reader says so and shows
expired values stale — `crr hosts` (table and JSON), `crr health`, `crr select`/`explain`,
each REST endpoint, the event stream and the status page's data; `/healthz` says why.

Real nats-server, real projector and view, uvicorn on port 0; the CLI runs in a thread
(`crr.cli.main`, its own event loop) against the same server.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from nats.aio.client import Client

from crr.admin.liveness import SILENT_AFTER_ENV
from crr.bus.server import NatsServer
from crr.cli import main
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.snapshot import ProjectorStatus, RebuildProgress
from crr.schemas.subjects import status_subject
from crr.schemas.wire_time import format_time
from tests.support.faults import eventually
from tests.support.projector import publish_catalog, publish_report, running_projector
from tests.support.rest import served_api

SHORT_YAML = """
version: 1
outage_hold: 1s
resources:
  scratch_free: {kind: numeric, scope: host, reporter: scratch, interval: 1s, min: 0}
  matlab_free:  {kind: numeric, scope: cluster, reporter: flexlm, interval: 1s}
reporters:
  scratch: {type: script, command: [scratch.sh], interval: 1s}
  flexlm:  {type: external, interval: 1s}
"""
SILENT_AFTER = 1.0
"""(With `outage_hold: 1s`: a stopped projector's values are judged at the clock less 1 s
once its watermark lags by more than `HOLDING_AFTER` — they expire on every surface.)"""


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `crr ARGV` (in a thread: it runs its own event loop); (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def sse_event(url: str, name: str, timeout: float = 10.0) -> dict[str, Any]:
    """The data of the first `name` event on /v1/events."""
    async with (httpx.AsyncClient(base_url=url) as http, asyncio.timeout(timeout),
                http.stream("GET", "/v1/events") as resp):
        event = None
        async for line in resp.aiter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == name:
                data: dict[str, Any] = json.loads(line.split(":", 1)[1])
                return data
    raise AssertionError(f"no {name} event")


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_every_surface_tells_a_stopped_projector_and_stale_values(
    nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stop the projector: past `outage_hold` every surface shows the values stale and the
    projector silent and lagging."""
    monkeypatch.setenv(SILENT_AFTER_ENV, str(SILENT_AFTER))
    server = ["--server", nats_url]
    await publish_catalog(nc, load_catalog_text(SHORT_YAML))
    async with running_projector(nc, status_interval=0.2) as projector:
        await publish_report(nc, "flexlm", None, {"matlab_free": 4.0})
        seq = await publish_report(nc, "scratch", "node1", {"scratch_free": 812.5})
        await projector.wait_until(seq, 10)
        async with served_api(nc, silent_after=SILENT_AFTER) as rig, \
                httpx.AsyncClient(base_url=rig.url) as http:
            await rig.view.wait_until(seq, 10)
            ok = await http.get("/healthz")
            assert ok.status_code == 200, ok.text
            assert ok.json()["liveness"]["state"] == "live"
            assert ok.headers["crr-projector-state"] == "live"
            live = await sse_event(rig.url, "liveness")
            assert live["state"] == "live"
    # The projector is stopped; its last writes said "fresh".  A new API and the CLI now.
    async with served_api(nc, silent_after=SILENT_AFTER) as rig, \
            httpx.AsyncClient(base_url=rig.url) as http:

        async def unhealthy() -> httpx.Response | None:
            r = await http.get("/healthz")
            return r if r.status_code == 503 else None

        r = await eventually(unhealthy, 10, "/healthz 503 once the projector is silent")
        body = r.json()
        assert body["status"] == "unavailable"
        assert next(p["code"] for p in body["problems"]) == "projector_silent"
        assert body["nats"] == "connected"
        assert body["liveness"]["state"] == "silent"
        assert body["liveness"]["last_status_age"] > SILENT_AFTER
        assert body["liveness"]["lag"] == 0

        async def expired() -> bool:
            r = await http.get("/v1/hosts/node1")
            return bool(r.json()["values"]["scratch_free"]["state"] == "stale")

        await eventually(expired, 10, "scratch_free past its expires_at + outage_hold")

        async def lagging_said() -> dict[str, Any] | None:
            body: dict[str, Any] = (await http.get("/healthz")).json()
            return body if len(body["problems"]) == 2 else None

        lagging = await eventually(lagging_said, 10, "projector_lagging once 2.5 s behind")
        assert [p["code"] for p in lagging["problems"]] == ["projector_silent",
                                                           "projector_lagging"]
        assert lagging["judgement"]["expired"] is True
        assert lagging["judgement"]["detail"].startswith("past outage_hold (1 s)")
        one = (await http.get("/v1/hosts/node1")).json()["values"]["scratch_free"]
        assert one["value"] is None
        assert one["last_value"] == 812.5
        assert one["stale_since"] == one["expires_at"]
        listed = (await http.get("/v1/hosts")).json()
        assert listed[0]["values"]["scratch_free"]["state"] == "stale"
        assert (await http.get("/v1/hosts", params={"state": "fresh"})).json() == []
        cluster = await http.get("/v1/cluster")
        assert cluster.json()["values"]["matlab_free"]["state"] == "stale"
        for path in ("/v1/hosts", "/v1/hosts/node1", "/v1/cluster", "/v1/reporters",
                     "/v1/resources", "/v1/select?expr=scratch_free>0", "/healthz"):
            resp = await http.get(path)
            assert resp.headers["crr-projector-state"] == "silent", path
            assert float(resp.headers["crr-projector-age"]) > SILENT_AFTER, path
            assert resp.headers["crr-projector-lag"] == "0", path
        info = (await http.get("/v1/projector")).json()
        assert info["liveness"]["state"] == "silent"
        assert len(info["projectors"]) == 1
        sel = (await http.get("/v1/select", params={
            "expr": "scratch_free > 0", "explain": "true", "host": "node1"})).json()
        assert sel["hosts"] == []
        assert "stale" in json.dumps(sel["explanation"])
        # The event stream (the status page's live feed) says so too, and its host events
        # carry values as they are now.
        silent = await sse_event(rig.url, "liveness")
        assert silent["state"] == "silent"
        assert silent["detail"].startswith("silent:")
        # The status page loads /v1/hosts and shows the liveness event in #liveness.
        page = (await http.get("/")).text
        script = (await http.get("/static/app.js")).text
        assert 'id="liveness"' in page
        assert 'addEventListener("liveness"' in script

    code, out, err = await cli(capsys, "hosts", "--json", *server)
    assert code == 0
    snaps = json.loads(out)
    assert snaps[0]["values"]["scratch_free"]["state"] == "stale"
    assert snaps[0]["values"]["scratch_free"]["last_value"] == 812.5
    assert "crr hosts: warning: projector silent" in err
    assert "crr hosts: warning: past outage_hold (1 s)" in err
    code, out, _ = await cli(capsys, "hosts", *server)
    assert code == 0
    assert "~812.5" in out
    assert "projector: silent: last status" in out
    code, out, _ = await cli(capsys, "health", *server)
    assert code == 1  # every reporter looks ok, but nobody is watching them
    assert "projector: silent" in out
    assert "freshness: past outage_hold (1 s)" in out
    code, out, err = await cli(capsys, "health", "--json", *server)
    assert code == 1
    assert all(not row["failing"] for row in json.loads(out)), out
    assert "crr health: warning: projector silent" in err
    code, out, err = await cli(capsys, "select", "scratch_free > 0", "--json", *server)
    assert (code, json.loads(out)) == (0, [])
    assert "crr select: warning: projector silent" in err
    assert "crr select: warning: past outage_hold (1 s)" in err
    code, out, err = await cli(capsys, "explain", "scratch_free > 0", "--host", "node1", *server)
    assert code == 0
    assert "stale" in out
    assert "crr explain: warning: projector silent" in err


async def test_healthz_says_when_nats_is_unreachable(nats_server: NatsServer) -> None:
    """NATS goes away under a loaded API: /healthz is 503 and names NATS; 200 once it is back."""
    from crr.bus.connection import connect  # noqa: PLC0415 - the fixture's connection would retry
    from crr.bus.streams import provision  # noqa: PLC0415

    async with connect(nats_server.url, name="crr-test", attempts=None) as nc:
        await provision(nc)
        await publish_catalog(nc, load_catalog_text(SHORT_YAML))
        async with running_projector(nc, status_interval=0.2), \
                served_api(nc, silent_after=SILENT_AFTER) as rig, \
                httpx.AsyncClient(base_url=rig.url) as http:
            assert (await http.get("/healthz")).status_code == 200
            await asyncio.to_thread(nats_server.stop)

            async def down() -> dict[str, Any] | None:
                r = await http.get("/healthz")
                if r.status_code != 503:
                    return None
                body: dict[str, Any] = r.json()
                return body

            body = await eventually(down, 10, "/healthz 503 with NATS down")
            assert body["nats"] == "unreachable"
            assert "nats_unreachable" in [p["code"] for p in body["problems"]]
            assert "NATS unreachable" in body["problems"][0]["detail"]
            await asyncio.to_thread(nats_server.start)  # same port and store: all recover

            async def up() -> bool:
                return (await http.get("/healthz")).status_code == 200

            await eventually(up, 20, "/healthz 200 again once NATS is back")


async def test_every_surface_tells_a_rebuilding_projector(
    nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """A projector that folds the retained history (its status says `rebuilding`, with
    progress): `/healthz` is 503 `projector_rebuilding`, and the CLI's listings, `crr
    health` and the page's liveness event say how far it is."""
    server = ["--server", nats_url]
    await publish_catalog(nc, load_catalog_text(SHORT_YAML))
    async with running_projector(nc, status_interval=0.2) as projector:
        seq = await publish_report(nc, "scratch", "node1", {"scratch_free": 812.5})
        await projector.wait_until(seq, 10)
    # What a projector writes while rebuilding (see `crr.projector.start`).
    building = ProjectorStatus(
        last_seq=0, stream_last_seq=seq, lag=1500, last_tick=format_time(time.time()),
        started_at=format_time(time.time()), phase="rebuilding", checkpoint=2,
        start="rebuilt from CRR_EVENTS: first start",
        progress=RebuildProgress(folded=500, to_fold=2000, rate=250.0, eta_s=6.0, from_seq=1))
    await nc.jetstream().publish(status_subject(None), encode(building))
    async with served_api(nc, silent_after=60) as rig, \
            httpx.AsyncClient(base_url=rig.url) as http:

        async def unhealthy() -> httpx.Response | None:
            r = await http.get("/healthz")
            return r if r.status_code == 503 else None

        body = (await eventually(unhealthy, 10, "/healthz 503 while rebuilding")).json()
        assert [p["code"] for p in body["problems"]] == ["projector_rebuilding"]
        assert body["liveness"]["state"] == "rebuilding"
        detail = body["liveness"]["detail"]
        assert detail.startswith("rebuilding: folded 500 of 2000 retained event(s) (25%)")
        assert "ETA 0:06" in detail
        live = await sse_event(rig.url, "liveness")
        assert live["state"] == "rebuilding"
    code, out, err = await cli(capsys, "hosts", "--json", *server)
    assert code == 0
    assert json.loads(out)[0]["values"]["scratch_free"]["value"] == 812.5  # the old record
    assert "crr hosts: warning: projector rebuilding: folded 500 of 2000" in err
    code, out, _ = await cli(capsys, "health", *server)
    assert code == 1
    assert "projector: rebuilding: folded 500 of 2000" in out
