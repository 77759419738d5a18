"""Every report has an outcome: `crr report` waits for the projector and says what happened;
non-finite numbers are refused before publishing; `crr health` shows dead letters."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.admin.reporter_health import ReporterHealth, with_deadletters
from crr.bus import jetstream
from crr.bus.connection import connect
from crr.producers.external import ExternalPublisher
from crr.projector.deadletters import count_deadletters
from crr.schemas.codec import event_message
from crr.schemas.errors import PayloadError
from crr.schemas.events import DeadLetter, Report, check_finite
from crr.schemas.subjects import EVENTS_STREAM
from crr.schemas.wire_time import format_time
from crr.sdk.report_outcome import outcome
from tests.support.cli import crr
from tests.support.projector import publish_catalog, publish_report, running_projector
from tests.support.security import secure_rig


async def _last_seq(nc: Client) -> int:
    info = await nc.jetstream().stream_info(EVENTS_STREAM)
    return int(info.state.last_seq)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_applied_rejected_and_deadlettered_reports(nc: Client, nats_url: str) -> None:
    """Applied → exit 0; a rejected value → exit 1 with the reason; a report on the wrong kind
    of subject → exit 1 before anything is published, with the reason; the same event from
    a publisher that does not check is dead-lettered with that reason; health shows it."""
    await publish_catalog(nc)
    async with running_projector(nc) as projector:
        ok = await crr("report", "--server", nats_url, "--reporter", "scratch", "--host", "n1",
                       "scratch_free=812.5")
        assert ok.code == 0, ok
        assert "applied: scratch_free" in ok.out

        bad = await crr("report", "--server", nats_url, "--reporter", "scratch", "--host", "n1",
                        "scratch_free=-1", "datasets=[\"c4\"]")
        assert bad.code == 1, bad
        assert "rejected: scratch_free: -1 is below the minimum 0" in bad.err
        assert "rejected: datasets: belongs to reporter 'datasets', not 'scratch'" in bad.err

        before = await _last_seq(nc)
        wrong = await crr("report", "--server", nats_url, "--reporter", "flexlm", "--host", "n1",
                          "matlab_free=3")
        assert wrong.code == 1, wrong
        reason = ("reporter 'flexlm' owns cluster-scope resources only (matlab_free): its "
                  "reports name no host (got host 'n1')")
        assert wrong.err_lines == [f"crr report: error: active catalog: {reason}; "
                                   "nothing published"]
        assert await _last_seq(nc) == before
        await projector.wait_until(await publish_report(nc, "flexlm", "n1", {"matlab_free": 3}),
                                   10)

        health = await crr("health", "--json", "--server", nats_url)
        rows = {(r["reporter"], r["host"]): r for r in json.loads(health.out)}
        assert rows[("flexlm", "n1")]["state"] == "deadlettered"
        assert rows[("flexlm", "n1")]["deadletters"] == 1
        assert reason in rows[("flexlm", "n1")]["last_deadletter"]
        assert rows[("scratch", "n1")]["deadletters"] == 0
        table = await crr("health", "--server", nats_url)
        assert "deadlettered" in table.out
        assert health.code == table.code == 1


async def test_partly_rejected_report_names_what_was_applied(nc: Client, nats_url: str) -> None:
    """A report with one good and one bad value: the good one is applied, exit is still 1."""
    await publish_catalog(nc)
    async with running_projector(nc):
        ran = await crr("report", "--server", nats_url, "--reporter", "flexlm",
                        "matlab_free=4", "nope=1")
    assert ran.code == 1
    assert "applied: matlab_free" in ran.out
    assert "rejected: nope: not a resource in the catalog" in ran.err


async def test_report_before_any_catalog_is_pending(nc: Client, nats_url: str) -> None:
    """With no catalog the projector keeps the report: `pending`, exit 1."""
    async with running_projector(nc):
        ran = await crr("report", "--server", nats_url, "--reporter", "flexlm", "matlab_free=4")
    assert ran.code == 1
    assert ran.err_lines == [
        "pending: no catalog is active yet: the projector keeps the report and applies it "
        "once `crr catalog apply` has run"]


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_no_projector_times_out_in_one_line(nc: Client, nats_url: str) -> None:
    """No projector: the wait is bounded by --timeout and says why; --no-wait exits 0."""
    ran = await crr("report", "--server", nats_url, "--reporter", "flexlm", "--timeout", "1s",
                    "matlab_free=4")
    assert ran.code == 1
    assert len(ran.err_lines) == 1
    assert "no outcome for event seq" in ran.err
    assert "is `crr projector` running?" in ran.err
    quick = await crr("report", "--server", nats_url, "--reporter", "flexlm", "--no-wait",
                      "matlab_free=4")
    assert quick.code == 0, quick
    assert quick.err == ""


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity"])
async def test_cli_refuses_non_finite_numbers(nc: Client, nats_url: str, raw: str) -> None:
    """NaN and ±inf are refused in one line before anything is published."""
    before = await _last_seq(nc)
    ran = await crr("report", "--server", nats_url, "--reporter", "flexlm", f"matlab_free={raw}")
    assert ran.code == 1
    assert len(ran.err_lines) == 1
    assert "not a finite number: matlab_free=" in ran.err
    assert await _last_seq(nc) == before


async def test_sdk_refuses_non_finite_numbers(nc: Client, nats_url: str) -> None:
    """`ExternalPublisher.report` raises PayloadError for NaN/inf and publishes nothing."""
    before = await _last_seq(nc)
    async with ExternalPublisher.connect(reporter="flexlm", url=nats_url, attempts=1) as rep:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(PayloadError, match="not a finite number"):
                rep.report({"matlab_free": bad, "simulink_free": 1})
        await rep.flush()
    assert await _last_seq(nc) == before


def test_check_finite_accepts_every_other_value() -> None:
    """Finite numbers, null, booleans, strings and string sets pass."""
    check_finite({"a": 1, "b": 2.5, "c": None, "d": True, "e": "x", "f": ["y"], "g": -0.0})


def test_deadletters_count_per_reporter_and_host() -> None:
    """Dead letters are counted per (reporter, host) with the newest reason; a pair known
    only from dead letters becomes a failing `deadlettered` row, others keep their state."""
    def dl(seq: int, subject: str, reason: str) -> DeadLetter:
        return DeadLetter(seq=seq, subject=subject, reason=reason, payload="",
                          received_at=f"2026-12-03T10:00:0{seq}.000Z")

    counts = count_deadletters([
        dl(1, "crr.v1.report.host.n1.flexlm", "first"),
        dl(2, "crr.v1.report.host.n1.flexlm.1", "second"),  # partitioned stream subject
        dl(3, "crr.v1.report.cluster.scratch", "scope"),
        dl(4, "crr.v1.bogus", "not a crr event subject"),
    ])
    assert counts[("flexlm", "n1")].count == 2
    assert counts[("flexlm", "n1")].last_reason == "second"
    assert counts[("flexlm", "n1")].first_at == "2026-12-03T10:00:01.000Z"
    assert counts[("crr.v1.bogus", None)].count == 1
    rows = with_deadletters(
        [ReporterHealth(reporter="scratch", host=None, state="ok", failing=False)], counts)
    by_key = {(r.reporter, r.host): r for r in rows}
    assert by_key[("scratch", None)].state == "ok"
    assert by_key[("scratch", None)].deadletters == 1
    assert by_key[("flexlm", "n1")].state == "deadlettered"
    assert by_key[("flexlm", "n1")].failing
    assert rows[-1].reporter == "scratch"  # failing rows first


async def test_outcome_with_reporter_credentials(tmp_path: Path) -> None:
    """With a reporter's own credentials (publish its subjects, follow CRR_SNAPSHOT): the
    outcome is read all the same; a rejected value gives its reason."""
    async with secure_rig(tmp_path) as rig:
        creds = str(rig.demo.bundle.for_reporter("flexlm"))
        ok = await crr("report", "--server", rig.url, "--creds", creds, "--reporter", "flexlm",
                       "matlab_free=3")
        assert ok.code == 0, ok
        assert "applied: matlab_free" in ok.out
        bad = await crr("report", "--server", rig.url, "--creds", creds, "--reporter", "flexlm",
                        "matlab_free=-3")
        assert bad.code == 1, bad
        assert bad.err_lines == ["rejected: matlab_free: -3 is below the minimum 0"]


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_deadletter_with_reporter_credentials_is_one_clear_line(tmp_path: Path) -> None:
    """A reporter's credentials cannot read CRR_EVENTS: a dead-lettered report still gets one
    line saying it was not applied and why its reason cannot be read.  (`crr report` now
    refuses this wrong-scope report before publishing; a publisher that does not check
    sends it, and the outcome is read as `crr report` reads it.)"""
    async with secure_rig(tmp_path) as rig:
        creds = str(rig.demo.bundle.for_reporter("dsindex"))
        ran = await crr("report", "--server", rig.url, "--creds", creds, "--reporter", "dsindex",
                        "datasets=[\"c4\"]")
        assert ran.code == 1, ran
        assert ran.err_lines[-1].endswith("each of its reports names its host; nothing published")
        async with connect(rig.url, creds=creds) as rnc:
            report = Report(reporter="dsindex", host=None, boot="b", seq=1,
                            observed_at=format_time(time.time()), values={"datasets": ["c4"]})
            msg = event_message(report)
            seq = await jetstream.publish(rnc, msg.subject, msg.payload, headers=msg.headers)
            verdict = await outcome(rnc, seq=seq, reporter="dsindex", host=None,
                                    observed_at=report.observed_at, names=["datasets"],
                                    timeout=10)
    lines = verdict.lines()
    assert not verdict.ok
    assert len(lines) == 1, lines
    assert lines[0].startswith("not applied: none of its values is in the snapshot; "
                               "cannot read crr.v1.deadletter"), lines


@pytest.mark.slow  # several seconds of real waiting: `pytest -m slow`
async def test_refused_publish_names_the_refusal(tmp_path: Path) -> None:
    """A publish the server's authorization drops ends in a bare timeout in nats-py; the one
    error line names the permissions violation the server reported instead."""
    async with secure_rig(tmp_path) as rig:
        creds = str(rig.demo.bundle.for_reporter("dsindex"))  # another reporter's
        ran = await crr("report", "--server", rig.url, "--creds", creds, "--reporter", "flexlm",
                        "matlab_free=3")
    assert ran.code == 1, ran
    assert len(ran.err_lines) == 1, ran.err
    assert "the server refused it (nats: permissions violation for publish to " \
           "\"crr.v1.report.cluster.flexlm\")" in ran.err, ran.err
