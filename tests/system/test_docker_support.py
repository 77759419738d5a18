"""tests/support/docker_cluster.py on bad ground: no daemon, a refusing one, a full disk, a failed
start.

The first two run in the default suite (they need no Docker); the others need a daemon and
are marked `docker`.  Each says why Docker cannot be used, and leaves nothing behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
from pathlib import Path

import docker
import pytest

from crr.bus.connection import connect
from crr.bus.streams import StreamSettings, provision
from crr.schemas.subjects import EVENTS_STREAM
from tests.support import docker_cluster
from tests.support.cluster import free_ports
from tests.support.docker_cluster import (
    DockerNatsCluster,
    DockerUnavailable,
    docker_client,
    leftovers,
    nats_image,
)
from tests.support.faults import eventually

REPO = Path(__file__).resolve().parents[2]


def test_missing_daemon_says_where(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """DOCKER_HOST naming a socket that does not exist: DockerUnavailable names it."""
    sock = tmp_path / "no-such-docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    with pytest.raises(DockerUnavailable, match=f"no Docker daemon reachable at unix://{sock}"):
        docker_client()


def test_refusing_daemon_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """DOCKER_HOST on a loopback port nobody listens on: the refusal is the reason."""
    (port,) = free_ports(1)
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{port}")
    with pytest.raises(DockerUnavailable, match="refused"):
        docker_client()


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
def test_partition_tests_skip_with_the_reason(tmp_path: Path) -> None:
    """`pytest -m docker` without a daemon: every docker test is skipped, saying why."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'absent.sock'}"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "docker", "-rs",
         f"--basetemp={tmp_path / 'inner'}", "tests/system/test_docker_partitions.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "3 skipped" in out, out
    assert "no Docker daemon reachable at unix://" in out, out


@pytest.fixture
def client() -> docker.DockerClient:
    """A Docker client, or a skip with the reason."""
    try:
        return docker_client()
    except DockerUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.docker
def test_full_disk_is_a_reason(monkeypatch: pytest.MonkeyPatch,
                               client: docker.DockerClient) -> None:
    """Less free space in Docker's data root than needed: DockerUnavailable says "disk"."""
    client.close()
    monkeypatch.setattr(docker_cluster, "MIN_FREE_BYTES", 2**62)
    with pytest.raises(DockerUnavailable, match="Docker's disk is full"):
        docker_client()


@pytest.mark.docker
def test_failed_start_leaves_nothing(client: docker.DockerClient) -> None:
    """A cluster whose image does not exist fails to start with the reason; its networks
    (created first) are removed, so nothing with its label is left."""
    nats_image(client)  # the real image builds (cached by the binary's hash)
    cluster = DockerNatsCluster(client, "crr-test-nats:no-such-tag")
    try:
        with pytest.raises(DockerUnavailable, match="no-such-tag"):
            cluster.start()
        assert leftovers(client, cluster.run) == []
    finally:
        cluster.close()
        client.close()


@pytest.mark.docker
async def test_killed_node_comes_back_at_the_same_address(
        client: docker.DockerClient) -> None:
    """kill(i)/restart(i): the node's nats-server dies (its clients lose it) and comes back
    on the same published port and store; the cluster forms again with every peer."""
    try:
        cluster = DockerNatsCluster(client, nats_image(client)).start()
    except DockerUnavailable as exc:
        client.close()
        pytest.skip(str(exc))
    try:
        async with connect(cluster.url_of(0), name="crr-test") as nc:
            await eventually(lambda: provision(nc, StreamSettings(replicas=3)), 30,
                             "R3 streams", every=0.5)
        cluster.kill(1)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # nobody listens
            cluster.monitor(1, "/varz", timeout=1)
        cluster.restart(1)
        cluster.wait_formed(60)
        async with connect(cluster.url_of(1), name="crr-test") as nc:
            info = await eventually(lambda: nc.jetstream(timeout=2).stream_info(EVENTS_STREAM),
                                    30, "CRR_EVENTS reachable through the restarted node")
        assert info.config.num_replicas == 3
    finally:
        cluster.close()
        assert leftovers(client, cluster.run) == []
        client.close()
