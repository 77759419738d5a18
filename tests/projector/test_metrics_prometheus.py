"""`OTEL_METRICS_EXPORTER=prometheus`: the projector, the agent and `crr api` serve their
OpenTelemetry metrics for Prometheus; a real HTTP GET on the port each picked (port 0)
finds crr's metrics.  One-shot commands ignore it; a missing extra is a one-line hint."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client

from crr.schemas.catalog_loader import load_catalog_text
from tests.support.faults import REPO, CrrProcess, eventually
from tests.support.projector import publish_catalog, publish_report

pytest.importorskip("opentelemetry.exporter.prometheus",
                    reason="needs the prometheus extra: pip install -e '.[prometheus]'")

_WHERE = re.compile(r"Prometheus metrics on (http://\S+/metrics)")


async def _endpoint(proc: CrrProcess) -> str:
    """The metrics URL the process announced on stderr."""

    def announced() -> str | None:
        assert proc.alive(), proc.output()
        m = _WHERE.search(proc.output())
        return m.group(1) if m else None

    url: str = await eventually(announced, 30, "the Prometheus endpoint line")
    return url


async def _scrape_until(url: str, patterns: list[str]) -> str:
    """GET `url` until every pattern (a regex over one sample line) matches; the answer."""
    async with httpx.AsyncClient() as http:

        async def scraped() -> str | None:
            r = await http.get(url)
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/plain")
            text = r.text
            return text if all(re.search(rf"^{p}", text, re.M) for p in patterns) else None

        text: str = await eventually(scraped, 30, f"{patterns} on {url}")
        return text


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_projector_agent_and_api_serve_prometheus_metrics(
    nc: Client, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each long-running process serves its metrics on its own ephemeral port."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", "0")
    script = tmp_path / "scratch.sh"
    script.write_text("#!/bin/sh\nprintf '{\"values\": {\"scratch_free\": 42}}\\n'\n")
    script.chmod(0o755)
    await publish_catalog(nc, load_catalog_text(f"""
version: 1
resources:
  scratch_free: {{kind: numeric, scope: host, reporter: scratch, interval: 1s}}
reporters:
  scratch: {{type: script, command: [{script}], interval: 0.5s, timeout: 5s}}
"""))
    server = ["--server", nats_url]
    procs = [CrrProcess(["projector", *server], tmp_path / "projector.log").start()]
    try:
        projector = await _endpoint(procs[0])
        await publish_report(nc, "scratch", "elsewhere", {"scratch_free": 1.0})
        await _scrape_until(projector, [
            r"crr_projector_applied_total\{.*\} [1-9]", r"crr_projector_lag\{.*\} 0\.0$",
            r'crr_values\{crr_value_state="fresh".*\} 1\.0$'])
        procs.append(CrrProcess(["agent", "--host", "node1", *server],
                                tmp_path / "agent.log").start())
        agent = await _endpoint(procs[1])
        await _scrape_until(agent, [r'crr_reporter_runs_total\{.*crr_reporter="scratch".*\} '
                                    r"[1-9]"])
        procs.append(CrrProcess(["api", "--listen", "127.0.0.1:0", *server],
                                tmp_path / "api.log").start())
        api = await _endpoint(procs[2])
        await _scrape_until(api, [r"crr_view_hosts\{.*\} [1-9]",
                                  r"crr_view_projector_silent\{.*\} 0\.0$",
                                  r"crr_view_projector_status_age_seconds\{.*\} \d",
                                  r"crr_view_applied_total\{.*\} [1-9]"])
        assert len({projector, agent, api}) == 3  # one port each
    finally:
        for p in procs:
            p.stop()


async def test_one_shot_commands_ignore_it(nc: Client, nats_url: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`crr hosts` with OTEL_METRICS_EXPORTER=prometheus serves nothing (no port taken)."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", "0")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", "hosts", "--server", nats_url, cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert b"Prometheus" not in out + err


def test_missing_extra_is_a_one_line_hint(nats_url: str) -> None:
    """Without the exporter installed: one line naming the extra, exit 1, no traceback."""
    code = ("import sys; sys.modules['opentelemetry.exporter.prometheus'] = None\n"
            "from crr.cli import main\n"
            f"sys.exit(main(['projector', '--server', {nats_url!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          timeout=60, check=False, text=True,
                          env={"PATH": "/usr/bin:/bin", "OTEL_METRICS_EXPORTER": "prometheus"})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "pip install 'crr-reporting[prometheus]'" in lines[0]
