"""A 3-node NATS JetStream cluster on loopback from the same nats-server binary (tests, demos).

Each node gets its own config (server_name, client port, cluster route
port, routes to the others) and store; `url` is the comma-separated list
clients connect with (bus.connection fails over between them).  The config
text is the one shipped for operators in `ops/deploy/nats-cluster/`, with
loopback ports.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import TracebackType
from typing import Protocol

from nats.aio.client import Client

from bus.server import NatsServer
from schemas.subjects import EVENTS_STREAM, SNAPSHOT_STREAM

CLUSTER_NAME = "crr"


def free_ports(n: int) -> list[int]:
    """`n` distinct free TCP ports on loopback (bound then released)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def node_config(name: str, client_port: int, route_port: int, routes: list[int],
                store: Path) -> str:
    """nats-server config of one cluster node (JetStream on, routes to its peers).

    The store is given on the command line (`-sd`, by NatsServer), not here.
    """
    del store
    route_urls = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes)
    return f"""server_name: {name}
listen: 127.0.0.1:{client_port}
jetstream: enabled
cluster {{
  name: {CLUSTER_NAME}
  listen: 127.0.0.1:{route_port}
  routes: [{route_urls}]
}}
"""


class NodeIndex(Protocol):
    """A cluster whose nodes can be found by server name (loopback or Docker)."""

    def index(self, server_name: str) -> int: ...


class NatsCluster:
    """Three `NatsServer`s forming one JetStream cluster; kill/start nodes by index."""

    def __init__(self, base: Path, size: int = 3) -> None:
        ports = free_ports(2 * size)
        self.client_ports, route_ports = ports[:size], ports[size:]
        self.nodes: list[NatsServer] = []
        self.names = [f"n{i}" for i in range(size)]
        for i in range(size):
            store = base / f"n{i}" / "store"
            store.mkdir(parents=True, exist_ok=True)
            conf = base / f"n{i}" / "nats.conf"
            conf.write_text(node_config(self.names[i], self.client_ports[i], route_ports[i],
                                        [p for j, p in enumerate(route_ports) if j != i], store))
            self.nodes.append(NatsServer(store, port=self.client_ports[i], config_file=conf))

    @property
    def url(self) -> str:
        """Comma-separated client URLs of every node."""
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    def index(self, server_name: str) -> int:
        """Index of the node called `server_name` (as stream_info().cluster.leader names it)."""
        return self.names.index(server_name)

    def start(self) -> NatsCluster:
        for node in self.nodes:
            node.start()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


async def all_replicas_current(nc: Client) -> bool:
    """Both streams have a leader and every replica is current with no lag."""
    js = nc.jetstream()
    for stream in (EVENTS_STREAM, SNAPSHOT_STREAM):
        info = await js.stream_info(stream)
        if info.cluster is None or not info.cluster.leader:
            return False
        reps = info.cluster.replicas or []
        if len(reps) != 2 or any(r.offline or not r.current or (r.lag or 0) > 0 for r in reps):
            return False
    return True
