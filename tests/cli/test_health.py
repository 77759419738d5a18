"""`crr health` exit codes and output, and `crr latency`, against a real server and projector."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

import pytest
from nats.aio.client import Client

from crr.admin.reporter_health import FAILING_STATES
from crr.commands import health, latency
from crr.history import latency as latency_service
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.subjects import event_subject
from tests.support.faults import eventually
from tests.support.projector import publish_catalog, publish_report, running_projector


def _args(url: str, **kw: object) -> argparse.Namespace:
    return argparse.Namespace(server=url, creds=None, tls_ca=None, reporter=None, **kw)


async def _health_event(nc: Client, reporter: str, host: str, state: str, *, seq: int,
                        detail: str | None = None, exit_code: int | None = None) -> int:
    body = {"reporter": reporter, "host": host, "boot": "b1", "seq": seq, "state": state,
            "at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "detail": detail, "exit_code": exit_code}
    ack = await nc.jetstream().publish(event_subject("health", reporter, host),
                                       json.dumps(body).encode(),
                                       headers={"Nats-Msg-Id": f"{reporter}/{host}/b1/{seq}"})
    return int(ack.seq)


async def test_health_exit_codes(nc: Client, nats_url: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 0 while every reporter is fine; 1 with the failing one first, in JSON and table."""
    async with running_projector(nc) as projector:
        await publish_catalog(nc)
        await publish_report(nc, "scratch", "node1", {"scratch_free": 5.0})
        seq = await publish_report(nc, "scratch", "node2", {"scratch_free": 6.0})
        await projector.wait_until(seq)
        assert await health.run(_args(nats_url, json=False)) == 0
        assert "0 failing of 2" in capsys.readouterr().out
        seq = await _health_event(nc, "scratch", "node2", "failed", seq=2,
                                  detail="exit 3: df: /scratch: No such file", exit_code=3)
        await projector.wait_until(seq)
        assert await health.run(_args(nats_url, json=True)) == 1
        rows = json.loads(capsys.readouterr().out)
        assert rows[0]["host"] == "node2"
        assert rows[0]["state"] == "failed"
        assert rows[0]["failing"] is True
        assert rows[0]["exit_code"] == 3
        assert "No such file" in rows[0]["detail"]
        assert rows[1]["failing"] is False
        assert await health.run(_args(nats_url, json=False)) == 1
        table = capsys.readouterr().out
        assert table.splitlines()[1].split()[:3] == ["scratch", "node2", "failed"]
        assert "\x1b[" not in table  # no ANSI when stdout is not a terminal
        assert "1 failing of 2" in table


def test_failing_states_are_the_documented_ones() -> None:
    """The states that make `crr health` exit 1 are exactly the issue's list, and a bridge
    whose guard holds changes (`held`, issue 39; `holding` is not failing)."""
    assert {"failed", "timeout", "bad_output", "crashed", "quarantined", "silent",
            "rejecting", "deadlettered", "held"} == FAILING_STATES


async def test_latency_from_the_streams(nc: Client, nats_url: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`crr latency` times reports to their snapshot records from CRR_EVENTS and CRR_SNAPSHOT."""
    async with running_projector(nc) as projector:
        await publish_catalog(nc)
        seq = 0
        for i, host in enumerate(["n1", "n2", "n3"]):
            seq = await publish_report(nc, "scratch", host, {"scratch_free": float(i)})
        await projector.wait_until(seq)
        code = await latency.run(_args(nats_url, json=True, since="5m", watch=0.0))
        assert code == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert row["reporter"] == "scratch"
        assert row["reports"] == 3
        # One compacted record per host, each written for that host's report.
        assert row["stored_to_snapshot"]["n"] == 3
        assert 0 <= row["stored_to_snapshot"]["p50"] < 5
        assert row["observed_to_stored"]["n"] == 3
        assert await latency.run(_args(nats_url, json=False, since="5m", watch=0.0)) == 0
        assert "OBSERVED→STORED" in capsys.readouterr().out


MISSING_CATALOG = load_catalog_text("""
version: 1
resources:
  scratch_free: {kind: numeric, scope: host, reporter: scratch, interval: 60s, min: 0}
  scratch_temp: {kind: numeric, scope: host, reporter: scratch, interval: 200ms}
reporters:
  scratch: {type: external, interval: 60s}
""")


async def test_health_shows_missing_resources_and_total_rejections(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A reporter that says ok but never reports one of its declared resources is failing
    once that resource's interval + grace has passed (`missing`); REJECTED is last/total."""
    async with running_projector(nc) as projector:
        await publish_catalog(nc, MISSING_CATALOG)
        await publish_report(nc, "scratch", "node1", {"scratch_free": -1.0}, seq=1)
        seq = await publish_report(nc, "scratch", "node1", {"scratch_free": 5.0}, seq=2)
        await projector.wait_until(seq)

        async def failing() -> list[dict[str, object]] | None:
            if await health.run(_args(nats_url, json=True)) != 1:
                capsys.readouterr()
                return None
            rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)
            return rows

        rows = await eventually(failing, 10, "scratch_temp missing")
        assert (rows[0]["state"], rows[0]["missing"], rows[0]["failing"]) == (
            "ok", ["scratch_temp"], True)
        assert (rows[0]["rejected"], rows[0]["rejected_total"]) == (0, 1)
        assert await health.run(_args(nats_url, json=False)) == 1
        table = capsys.readouterr().out
        assert "missing scratch_temp" in table
        assert table.splitlines()[1].split()[5] == "0/1"


async def test_latency_says_why_a_reporter_has_no_snapshot_sample(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A reporter whose host record was last written for another reporter's report has no
    history sample: n=0 comes with the reason, in JSON and under the table."""
    async with running_projector(nc) as projector:
        await publish_catalog(nc)
        await publish_report(nc, "scratch", "n1", {"scratch_free": 1.0})
        seq = await publish_report(nc, "datasets", "n1", {"datasets": ["c4"]})
        await projector.wait_until(seq)
        assert await latency.run(_args(nats_url, json=True, since="-5m", watch=0.0)) == 0
        rows = {r["reporter"]: r for r in json.loads(capsys.readouterr().out)}
        assert rows["datasets"]["stored_to_snapshot"]["n"] == 1
        assert rows["datasets"]["note"] is None
        assert rows["scratch"]["stored_to_snapshot"]["n"] == 0
        assert rows["scratch"]["note"] == latency_service.NO_SNAPSHOT_SAMPLE
        assert await latency.run(_args(nats_url, json=False, since="5m", watch=0.0)) == 0
        assert f"scratch: {latency_service.NO_SNAPSHOT_SAMPLE}" in capsys.readouterr().out
