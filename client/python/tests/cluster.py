"""Real `warden` processes on loopback for the tests, as `tests/suite/support/processes.rs`
(`ProcessCluster::start`) starts them: five `warden node`s bootstrapped with `warden admin`
(placement on nodes 1-3, the root group and a group per prefix) behind a `warden router`,
each node restartable on its data directory; extra routers; `warden dev --secure`.

Every wait here is on a condition with a deadline; nothing sleeps to synchronise (the
pauses between probes of a condition are polls, bounded by the condition's deadline).
"""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, TypeVar

import grpc

from warden._proto import warden_pb2 as pb
from warden._proto import warden_pb2_grpc as pb_grpc

T = TypeVar("T")

#: How long one step (start, catch-up, a write after a restart) may take on a loaded machine.
STEP_TIMEOUT_S = 60.0
#: Pause between two probes of a condition.
POLL_S = 0.05
#: The nodes holding placement replicas.
PLACEMENT_NODES = (1, 2, 3)


def binary() -> str:
    """The `warden` binary under test: `WARDEN_BIN`, else the release build."""
    path = os.environ.get("WARDEN_BIN")
    if not path:
        target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/warden-target"))
        path = os.path.join(target, "release", "warden")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no warden binary at {path} (set WARDEN_BIN)")
    return path


def wait_until(what: str, condition: Callable[[], Optional[T]], timeout_s: float = STEP_TIMEOUT_S) -> T:
    """Polls `condition` until it returns something other than None (or False); fails the
    test with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(POLL_S)


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ports_free(ports: List[int]) -> bool:
    """Whether every port of `ports` can be bound on loopback now."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


class Process:
    """A `warden` child process, its stderr appended to a log file."""

    def __init__(self, args: List[str], log: Path) -> None:
        self.args = args
        self.log = log
        with open(log, "ab") as sink:
            self.popen = subprocess.Popen(
                [binary()] + args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink
            )

    def signal(self, number: int) -> None:
        """Sends signal `number` to the process."""
        self.popen.send_signal(number)

    def kill(self) -> None:
        """SIGKILLs the process and reaps it (its ports are free after)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=STEP_TIMEOUT_S)

    def has_exited(self) -> bool:
        return self.popen.poll() is not None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def raw_stub(addr: str) -> pb_grpc.WardenStub:
    """A plain grpcio stub of `addr` (no retries, no failover: what a test probes with)."""
    return pb_grpc.WardenStub(grpc.insecure_channel(addr))


def sync_ok(addr: str, group_id: int = 0, timeout_s: float = 2.0) -> Optional[pb.SyncResponse]:
    """A linearizable Sync through `addr` (of `group_id`, 0: the router's choice), or None
    when it fails."""
    request = pb.SyncRequest()
    if group_id:
        request.routing.group_id = group_id
    channel = grpc.insecure_channel(addr)
    try:
        return pb_grpc.WardenStub(channel).Sync(request, timeout=timeout_s)
    except grpc.RpcError:
        return None
    finally:
        channel.close()


class Router:
    """A `warden router` process."""

    def __init__(self, directory: Path, seeds: str, name: str) -> None:
        self.addr = f"127.0.0.1:{free_port()}"
        self.process = Process(["router", "--listen", self.addr, "--seeds", seeds], directory / f"{name}.log")

    def wait_ready(self) -> "Router":
        wait_until(f"the router at {self.addr} answers", lambda: sync_ok(self.addr))
        return self

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but runs no code."""
        self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        self.process.signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL."""
        self.process.kill()


class NodeSpec:
    """How one node process is started (the same every time, so a restart finds its data)."""

    def __init__(self, directory: Path, node_id: int) -> None:
        self.id = node_id
        self.listen = f"127.0.0.1:{free_port()}"
        self.data_dir = directory / f"node-{node_id}"
        self.log = directory / f"node-{node_id}.log"
        self.peers = ""

    def args(self) -> List[str]:
        return ["node", "--id", str(self.id), "--listen", self.listen, "--data-dir", str(self.data_dir), "--peers", self.peers]


def admin(args: List[str]) -> None:
    """Runs `warden admin ARGS` to completion; fails with its stderr."""
    done = subprocess.run([binary(), "admin"] + args, capture_output=True, timeout=STEP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise AssertionError(f"warden admin {args}: {done.stderr.decode(errors='replace')}")


class ProcessCluster:
    """Five node processes and a router, bootstrapped, each node restartable on its data."""

    def __init__(self, directory: Path, prefixes: List[str], nodes: int = 5) -> None:
        self.directory = directory
        self.specs = [NodeSpec(directory, node_id) for node_id in range(1, nodes + 1)]
        peers = ",".join(f"{spec.id}={spec.listen}" for spec in self.specs)
        for spec in self.specs:
            spec.peers = peers
        self.seeds = ",".join(spec.listen for spec in self.specs)
        self.nodes: Dict[int, Optional[Process]] = {}
        self.routers: List[Router] = []
        try:
            for spec in self.specs:
                self.nodes[spec.id] = Process(spec.args(), spec.log)
            admin(["bootstrap", "--nodes", peers, "--placement", ",".join(map(str, PLACEMENT_NODES))])
            for prefix in prefixes:
                admin(["create-group", prefix, "--seeds", self.seeds])
            self.router = self.start_router("router")
        except BaseException:
            self.stop()
            raise

    @property
    def router_addr(self) -> str:
        """The cluster's own router (`host:port`)."""
        return self.router.addr

    def start_router(self, name: Optional[str] = None) -> Router:
        """Starts one more router on a fresh port and waits until it answers."""
        router = Router(self.directory, self.seeds, name or f"router-{len(self.routers) + 1}")
        self.routers.append(router)
        return router.wait_ready()

    def spec(self, node_id: int) -> NodeSpec:
        return next(spec for spec in self.specs if spec.id == node_id)

    def kill(self, node_id: int) -> None:
        """SIGKILLs node `node_id`: no chance to flush or say goodbye."""
        process = self.nodes.get(node_id)
        assert process is not None, f"node {node_id} is not running"
        process.kill()
        self.nodes[node_id] = None

    def restart(self, node_id: int) -> None:
        """Starts node `node_id` again with the same flags, on its data directory."""
        assert self.nodes.get(node_id) is None, f"node {node_id} is still running"
        spec = self.spec(node_id)
        self.nodes[node_id] = Process(spec.args(), spec.log)

    def group_leader(self, group_id: int, except_id: Optional[int] = None) -> Optional[int]:
        """The leader of shard group `group_id` as the running nodes other than `except_id`
        see it (None: none of them knows one now), asked directly."""
        for spec in self.specs:
            if spec.id == except_id or self.nodes.get(spec.id) is None:
                continue
            answer = sync_ok(spec.listen, group_id, timeout_s=1.0)
            if answer is not None and answer.header.leader_id not in (0, except_id):
                return int(answer.header.leader_id)
        return None

    def wait_caught_up(self, node_id: int, group_ids: List[int]) -> None:
        """Waits until node `node_id` (after a restart) serves linearizable reads of every
        group of `group_ids`; a node that exited on its own fails the test, unless it could
        not bind its port yet (an outgoing connection may briefly hold it after a kill): it
        is started again."""
        spec = self.spec(node_id)
        for group_id in group_ids:

            def caught_up() -> Optional[bool]:
                process = self.nodes[node_id]
                assert process is not None
                if process.has_exited():
                    tail = process.log_tail()
                    assert "os error 98" in tail.splitlines()[-1] if tail else False, f"node {node_id} exited; its log ends:\n{tail}"
                    self.nodes[node_id] = None
                    self.restart(node_id)
                    return None
                return True if sync_ok(spec.listen, group_id) is not None else None

            wait_until(f"node {node_id} catches up on group {group_id}", caught_up)

    def stop(self) -> None:
        """Kills every process."""
        for router in self.routers:
            router.kill()
        for process in self.nodes.values():
            if process is not None:
                process.kill()


class SecureDev:
    """`warden dev --secure` on free ports in `directory`: TLS everywhere, a throwaway CA,
    a client certificate and a bearer token for `root`."""

    def __init__(self, directory: Path) -> None:
        self.data_dir = directory / "secure-dev"
        base = wait_until("a free block of ports for warden dev", self._free_base, timeout_s=10.0)
        self.router_addr = f"127.0.0.1:{free_port()}"
        etcd = f"127.0.0.1:{free_port()}"
        args = ["dev", "--secure", "--fresh", "--data-dir", str(self.data_dir), "--base-port", str(base), "--router", self.router_addr]
        self.log = directory / "secure-dev.log"
        self.process = Process(args + ["--etcd-listen", etcd], self.log)
        self.tls_dir = self.data_dir / "tls"

    @staticmethod
    def _free_base() -> Optional[int]:
        """A base port whose nodes (base..+4), client ports (+100..), metrics (+199..+204)
        are all free now."""
        base = free_port()
        if base > 60000:
            return None
        ports = [base + offset for offset in list(range(5)) + list(range(100, 105)) + list(range(199, 205))]
        return base if ports_free(ports) else None

    def token(self) -> str:
        """root's bearer token, once `warden dev` has written it."""
        path = self.tls_dir / "root.token"
        # Written by warden dev in place (not atomically): an empty read is no token yet.
        return wait_until("warden dev writes root's token", lambda: (path.read_text().strip() or None) if path.exists() else None)

    def stop(self) -> None:
        self.process.kill()
