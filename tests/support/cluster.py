"""A 3-node NATS JetStream cluster on loopback from the same nats-server binary (tests, demos).

Each node gets its own config (server_name, client port, cluster route
port, routes to the others) and store; `url` is the comma-separated list
clients connect with (crr.bus.connection fails over between them).  The config
text is the one shipped for operators in `ops/deploy/nats-cluster/`, with
loopback ports.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from types import TracebackType
from typing import Protocol

from nats.aio.client import Client

from crr.bus.server import NatsServer
from crr.schemas.subjects import EVENTS_STREAM, SNAPSHOT_STREAM

CLUSTER_NAME = "crr"


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on every address now, taken below the kernel's
    ephemeral range (for servers that take their ports from a config, and restart on them).

    Below that range, because a port the kernel hands out for `bind(0)` is also one it
    hands out as the source port of an outgoing connection: a client's connection (the
    `scontrol ping`s that wait for slurmctld, a NATS client reconnecting while a server is
    down) can hold the port when the server binds it, and the server then exits ("Address
    already in use"; seen in CI as a slurmd that left every node UNKNOWN).
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(10000, max(low, 10001))
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        ports.append(port)
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
