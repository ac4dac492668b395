""":class:`AsyncClient`: calls to the routers over grpc.aio, with failover between them and
the retry rules of `warden._retry`, each call bounded by its deadline (sent along as the
call's `grpc-timeout`, so the router and the node answer within it).

The client keeps one channel per router. Calls go to the current router; when it cannot be
reached (a failed connection, not an answer) calls move on to the next, in order, wrapping
around. A NOT_LEADER or UNAVAILABLE answer is retried on the same router (the router follows
leaders itself), after a pause that starts at 10 ms and doubles up to 500 ms.
"""

import asyncio
import collections
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Deque, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc
import grpc.aio

from warden import _convert
from warden._proto import warden_pb2 as pb
from warden._proto import warden_pb2_grpc as pb_grpc
from warden._retry import Backoff, CallKind, judge, retried, timed_out
from warden._util import Pending, Tasks
from warden.errors import (
    InvalidArgumentError,
    ProtocolError,
    TooLargeError,
    TransportError,
    WardenError,
    from_rpc_error,
)
from warden.txn import Txn, TxnResult, txn_result
from warden.types import (
    Child,
    ChildrenPage,
    Consistency,
    Created,
    Data,
    LockInfo,
    Node,
    NodeKind,
    Sequencer,
    SessionInfo,
    SessionLease,
    Stat,
)

__all__ = ["AsyncClient", "TlsConfig", "DEFAULT_REQUEST_TIMEOUT_S", "DEFAULT_CONNECT_TIMEOUT_S"]

LOG = logging.getLogger("warden")

#: Deadline of one call, retries included, unless configured otherwise.
DEFAULT_REQUEST_TIMEOUT_S = 10.0
#: Time allowed to open a connection to one router, unless configured otherwise.
DEFAULT_CONNECT_TIMEOUT_S = 2.0
#: Interval of HTTP/2 pings on a connection with open calls: a silently dead router is noticed
#: within the interval plus PING_TIMEOUT_S (as the Rust client's channels).
PING_INTERVAL_S = 10.0
#: Time a ping may go unanswered before the connection is closed.
PING_TIMEOUT_S = 5.0
#: Largest response accepted (the router's own limit on what it sends).
RESPONSE_BYTES_MAX = 64 << 20
#: Reconnection pauses of a channel whose router went away: short, since failover moves on
#: anyway and a router that comes back should be used again soon.
RECONNECT_BACKOFF_MIN_MS = 100
RECONNECT_BACKOFF_MAX_MS = 1000
#: Longest bearer token sent (the servers' limit).
TOKEN_BYTES_MAX = 512
#: Sessions one keepalive carries at most (the servers' limit).
KEEPALIVE_SESSIONS_MAX = 1024
#: Renewals waiting in one client at most (over all groups); beyond it a renewal is refused
#: (TooLargeError): a client with this many sessions renewing at once is stuck, not busy.
RENEWALS_WAITING_MAX = 1 << 16
#: A session id names its home group in its high bits (above this many).
SESSION_SEQUENCE_BITS = 40

T = TypeVar("T")


@dataclass(frozen=True)
class TlsConfig:
    """TLS to the routers: the CA they must prove themselves by and, optionally, the
    certificate and key naming this client (`warden://client/NAME`). Without a certificate,
    name the client with a bearer token (`AsyncClient.connect(token=...)`).

    Warden's own processes verify each other by the identity a certificate names in a URI
    (`warden://router/NAME`); grpcio verifies the chain to the CA and the host name it
    connects to, so a router's certificate must name that host: the ones `warden dev
    --secure` and `warden admin certs` make name loopback (`localhost`, `127.0.0.1`, `::1`)
    and the hosts they were made for. `server_name` overrides the name checked (and sent as
    SNI), for an endpoint reached by another name than its certificate's."""

    #: The cluster's CA certificate (PEM).
    ca_pem: bytes
    #: This client's certificate (PEM), or None.
    cert_pem: Optional[bytes] = None
    #: This client's private key (PEM), or None.
    key_pem: Optional[bytes] = None
    #: The name to verify the routers' certificates against (and send as SNI); None: the host
    #: of each endpoint.
    server_name: Optional[str] = None

    @staticmethod
    def from_files(
        ca: Union[str, Path],
        cert: Optional[Union[str, Path]] = None,
        key: Optional[Union[str, Path]] = None,
        server_name: Optional[str] = None,
    ) -> "TlsConfig":
        """Reads the PEM files (the CA; the client's certificate and key, both or neither)."""
        if (cert is None) != (key is None):
            raise InvalidArgumentError("a client certificate needs its key, and a key its certificate")
        return TlsConfig(
            Path(ca).read_bytes(),
            Path(cert).read_bytes() if cert is not None else None,
            Path(key).read_bytes() if key is not None else None,
            server_name,
        )


def _target(endpoint: str) -> str:
    """A `host:port` grpc target from an endpoint (`host:port` or an `http(s)://` URI)."""
    if not isinstance(endpoint, str) or not endpoint:
        raise InvalidArgumentError(f"an endpoint is a non-empty 'host:port' string, not {endpoint!r}")
    for scheme in ("http://", "https://"):
        if endpoint.startswith(scheme):
            endpoint = endpoint[len(scheme) :]
    endpoint = endpoint.rstrip("/")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"endpoint {endpoint!r} is not 'host:port'")
    return endpoint


def _channel(target: str, tls: Optional[TlsConfig]) -> grpc.aio.Channel:
    options: List[Tuple[str, Any]] = [
        ("grpc.keepalive_time_ms", int(PING_INTERVAL_S * 1000)),
        ("grpc.keepalive_timeout_ms", int(PING_TIMEOUT_S * 1000)),
        ("grpc.max_receive_message_length", RESPONSE_BYTES_MAX),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MIN_MS),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MIN_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
    ]
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    credentials = grpc.ssl_channel_credentials(root_certificates=tls.ca_pem, private_key=tls.key_pem, certificate_chain=tls.cert_pem)
    return grpc.aio.secure_channel(target, credentials, options=options)


class _Endpoints:
    """One channel per router and the one calls go to now."""

    def __init__(self, targets: List[str], channels: List[grpc.aio.Channel], current: int) -> None:
        self.targets = targets
        self.channels = channels
        self.stubs = [pb_grpc.WardenStub(channel) for channel in channels]  # type: ignore[no-untyped-call]
        self.current = current

    def pick(self) -> Tuple[int, pb_grpc.WardenStub]:
        """The router calls go to now (its index and a stub of it)."""
        index = self.current % len(self.stubs)
        return index, self.stubs[index]

    def failed(self, index: int) -> None:
        """Moves on from the router at `index` (unless another call already has)."""
        if self.current == index:
            self.current = (index + 1) % len(self.stubs)


def home_group(session_id: int) -> int:
    """The group a session id names as its home (where its keepalives go)."""
    return session_id >> SESSION_SEQUENCE_BITS


class _Renewal:
    __slots__ = ("session_id", "deadline", "answer")

    def __init__(self, session_id: int, deadline: float, answer: "asyncio.Future[SessionLease]") -> None:
        self.session_id = session_id
        self.deadline = deadline
        self.answer = answer


class _Renewals:
    """Keepalives of many sessions in one call (the Rust client's `renewal.rs`): a renewal
    that falls due while a keepalive of its home group is on the way waits for that call to
    end and goes with every other one waiting in the next call (at most
    KEEPALIVE_SESSIONS_MAX sessions each), so a process with many sessions costs a few calls
    per renewal interval. One call per home group at a time."""

    def __init__(self) -> None:
        self.groups: Dict[int, Deque[_Renewal]] = {}
        self.sending: Dict[int, bool] = {}

    def waiting(self) -> int:
        return sum(len(queue) for queue in self.groups.values())

    def next_batch(self, group: int) -> List[_Renewal]:
        """The next call's renewals of `group` (those whose callers stopped waiting are
        dropped unsent)."""
        queue = self.groups.get(group, collections.deque())
        batch: List[_Renewal] = []
        ids: List[int] = []
        while queue:
            renewal = queue[0]
            if renewal.answer.done():
                queue.popleft()
                continue
            if renewal.session_id not in ids:
                if len(ids) == KEEPALIVE_SESSIONS_MAX:
                    break
                ids.append(renewal.session_id)
            batch.append(queue.popleft())
        return batch


class AsyncClient:
    """A connection to a Warden cluster through its routers (asyncio). Open one with
    :meth:`AsyncClient.connect`; every method may be called concurrently from the event loop
    it was opened on. Close it with :meth:`close` (or `async with`)."""

    def __init__(
        self,
        endpoints: _Endpoints,
        request_timeout_s: float,
        metadata: Optional[Tuple[Tuple[str, str], ...]],
        consistency: Consistency,
        shared: Optional["AsyncClient"] = None,
    ) -> None:
        self._endpoints = endpoints
        self._request_timeout_s = request_timeout_s
        self._metadata = metadata
        self._consistency = consistency
        # Clients made by `with_consistency` and `with_request_timeout` share the connections,
        # tasks and sessions of the client they came from, which alone closes them.
        self._tasks: Tasks = shared._tasks if shared else Tasks()
        self._renewals: _Renewals = shared._renewals if shared else _Renewals()
        self._sessions: Dict[int, Any] = shared._sessions if shared else {}
        self._closed = shared is not None

    @staticmethod
    def connect(
        endpoints: Sequence[str],
        *,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        tls: Optional[TlsConfig] = None,
        token: Optional[str] = None,
        consistency: Consistency = Consistency.LINEARIZABLE,
    ) -> "Pending[AsyncClient]":
        """Connects to the routers at `endpoints` (`host:port`, failover in this order):
        opens a connection to each, all at once, within `connect_timeout_s`, and starts at the
        first that accepted. Fails with :class:`TransportError` when none did; routers
        unreachable now are tried again whenever calls move on to them.

        `request_timeout_s` is the deadline of one call, retries and failover included.
        `tls` turns TLS on; `token` names this client's principal with a bearer token
        (`authorization: Bearer TOKEN` on every call: with TLS, for a client without a
        certificate of its own). `consistency` is the default of reads.

        Await the result, or use it in `async with` (the client is closed on exit)."""
        return Pending(
            AsyncClient._connect(
                endpoints,
                request_timeout_s=request_timeout_s,
                connect_timeout_s=connect_timeout_s,
                tls=tls,
                token=token,
                consistency=consistency,
            )
        )

    @staticmethod
    async def _connect(
        endpoints: Sequence[str],
        *,
        request_timeout_s: float,
        connect_timeout_s: float,
        tls: Optional[TlsConfig],
        token: Optional[str],
        consistency: Consistency,
    ) -> "AsyncClient":
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        targets = [_target(endpoint) for endpoint in endpoints]
        if not targets:
            raise InvalidArgumentError("a client needs at least one endpoint")
        request_timeout_s = _convert.seconds(request_timeout_s, "request_timeout_s", allow_zero=False)
        connect_timeout_s = _convert.seconds(connect_timeout_s, "connect_timeout_s", allow_zero=False)
        if tls is not None and not isinstance(tls, TlsConfig):
            raise InvalidArgumentError(f"tls is a warden.TlsConfig, not {tls!r}")
        if not isinstance(consistency, Consistency):
            raise InvalidArgumentError(f"consistency is a warden.Consistency, not {consistency!r}")
        metadata = None
        if token is not None:
            if (
                not isinstance(token, str)
                or not token
                or len(token) > TOKEN_BYTES_MAX
                or not all(" " < ch <= "~" for ch in token)
            ):
                raise InvalidArgumentError(f"a token is 1 to {TOKEN_BYTES_MAX} printable ASCII characters without spaces")
            metadata = (("authorization", f"Bearer {token}"),)
        channels = [_channel(target, tls) for target in targets]

        async def ready(channel: grpc.aio.Channel) -> Optional[str]:
            try:
                await asyncio.wait_for(channel.channel_ready(), connect_timeout_s)
                return None
            except asyncio.TimeoutError:
                return f"no connection within {connect_timeout_s} s"

        failures = await asyncio.gather(*(ready(channel) for channel in channels))
        reachable = [index for index, failure in enumerate(failures) if failure is None]
        if not reachable:
            for channel in channels:
                await channel.close()
            described = "; ".join(f"{target}: {failure}" for target, failure in zip(targets, failures))
            raise TransportError(f"no endpoint is reachable ({described})")
        return AsyncClient(_Endpoints(targets, channels, reachable[0]), request_timeout_s, metadata, consistency)

    def with_consistency(self, consistency: Consistency) -> "AsyncClient":
        """The same client (same connections) whose reads use `consistency` by default.
        Closing it closes nothing: close the client it came from."""
        if not isinstance(consistency, Consistency):
            raise InvalidArgumentError(f"consistency is a warden.Consistency, not {consistency!r}")
        return AsyncClient(self._endpoints, self._request_timeout_s, self._metadata, consistency, shared=self)

    def with_request_timeout(self, request_timeout_s: float) -> "AsyncClient":
        """The same client (same connections) whose calls each have `request_timeout_s` as
        their deadline: a per-call deadline, as in `client.with_request_timeout(0.5).get(p)`.
        Closing it closes nothing: close the client it came from."""
        timeout_s = _convert.seconds(request_timeout_s, "request_timeout_s", allow_zero=False)
        return AsyncClient(self._endpoints, timeout_s, self._metadata, self._consistency, shared=self)

    @property
    def request_timeout_s(self) -> float:
        """The deadline of one call, retries included."""
        return self._request_timeout_s

    @property
    def endpoints(self) -> List[str]:
        """The routers, in failover order."""
        return list(self._endpoints.targets)

    @property
    def current_endpoint(self) -> str:
        """The router calls go to now."""
        return self._endpoints.targets[self._endpoints.pick()[0]]

    async def close(self) -> None:
        """Closes the client: its sessions still open are closed (best effort, within the
        connect timeout; their ephemerals go), its background tasks stop and its connections
        close. Idempotent; does nothing for a client made by `with_consistency` or
        `with_request_timeout`."""
        if self._closed:
            return
        self._closed = True
        sessions = list(self._sessions.values())
        if sessions:
            closing = [asyncio.ensure_future(session._close_quietly()) for session in sessions]
            _, late = await asyncio.wait(closing, timeout=DEFAULT_CONNECT_TIMEOUT_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self._tasks.cancel_all()
        for channel in self._endpoints.channels:
            await channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- the retry loop ---------------------------------------------------------------------

    async def _retrying(
        self,
        kind: CallKind,
        timeout_s: float,
        attempt: Callable[[pb_grpc.WardenStub, float], Awaitable[T]],
    ) -> T:
        """Runs `attempt(stub, deadline)` against the current router until it succeeds, fails
        for good, or the deadline `timeout_s` from now passes; between attempts it backs off
        and, when the router was unreachable, moves to the next one. `attempt` raises a
        grpc error or a :class:`WardenError`; `deadline` is on the loop's clock."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        backoff = Backoff()
        while True:
            index, stub = self._endpoints.pick()
            if loop.time() >= deadline:
                raise timed_out(kind, timeout_s)
            try:
                return await attempt(stub, deadline)
            except grpc.aio.AioRpcError as failed:
                error = from_rpc_error(failed)
                if failed.code() == grpc.StatusCode.DEADLINE_EXCEEDED and error.detail is None and loop.time() >= deadline - 0.001:
                    raise timed_out(kind, timeout_s) from None
            except asyncio.TimeoutError:
                raise timed_out(kind, timeout_s) from None
            except WardenError as refused:
                error = refused
            verdict = judge(error, kind)
            if verdict.next_endpoint:
                self._endpoints.failed(index)
            pause_s = backoff.next_pause_s()
            if not retried(error, kind) or loop.time() + pause_s >= deadline:
                raise verdict.error
            await asyncio.sleep(pause_s)

    async def _unary(self, method: str, request: Any, kind: CallKind, timeout_s: Optional[float] = None) -> Any:
        """One unary call of `method`, retried by :meth:`_retrying`; each attempt carries the
        time left as its `grpc-timeout`."""
        timeout_s = self._request_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()

        async def attempt(stub: pb_grpc.WardenStub, deadline: float) -> Any:
            call = getattr(stub, method)
            return await call(request, timeout=max(deadline - loop.time(), 0.001), metadata=self._metadata)

        return await self._retrying(kind, timeout_s, attempt)

    # -- the namespace ----------------------------------------------------------------------

    async def create(
        self,
        path: str,
        data: Data = b"",
        *,
        kind: NodeKind = NodeKind.PERSISTENT,
        session: Any = None,
        sequential: bool = False,
        create_parents: bool = False,
        ttl_s: Optional[float] = None,
    ) -> Created:
        """Creates a node with `data`; returns its actual path and stat.

        `session` (a session or its id) makes it ephemeral: deleted when the session ends,
        and childless. `kind` CONTAINER is removed with its last child; TTL (with `ttl_s`) once
        its TTL passes without a change while it has no children. `sequential` appends a
        10-digit per-parent counter to the name; `create_parents` creates missing ancestors.

        Not retried after an ambiguous failure: :class:`OutcomeUnknownError` then."""
        request = _convert.create_request(
            path, data, kind=kind, session=session, sequential=sequential, create_parents=create_parents, ttl_s=ttl_s
        )
        return _convert.created(await self._unary("Create", request, CallKind.WRITE))

    async def get(self, path: str, *, consistency: Optional[Consistency] = None) -> Node:
        """A node's data and stat (:class:`NoNodeError` when it does not exist)."""
        request = pb.GetRequest(path=_convert.path_of(path), consistency=_convert.consistency(consistency, self._consistency))
        response = await self._unary("Get", request, CallKind.IDEMPOTENT)
        return _convert.node(path, response.data, response)

    async def exists(self, path: str, *, consistency: Optional[Consistency] = None) -> Optional[Stat]:
        """A node's stat, or None when it does not exist."""
        request = pb.ExistsRequest(path=_convert.path_of(path), consistency=_convert.consistency(consistency, self._consistency))
        response = await self._unary("Exists", request, CallKind.IDEMPOTENT)
        return _convert.stat(response.stat) if response.HasField("stat") else None

    async def set(self, path: str, data: Data, *, expected_version: Optional[int] = None) -> Stat:
        """Replaces a node's data; with `expected_version`, only at that version
        (compare-and-swap: :class:`BadVersionError` otherwise). Returns the new stat."""
        request = pb.SetRequest(path=_convert.path_of(path), data=_convert.data_bytes(data))
        if expected_version is not None:
            request.expected_version = _convert.u64(expected_version, "expected_version")
        return _convert.required_stat(await self._unary("Set", request, CallKind.WRITE))

    async def delete(self, path: str, *, expected_version: Optional[int] = None, recursive: bool = False) -> int:
        """Deletes a node (or, `recursive`, its subtree); returns how many nodes went
        (emptied containers included). A node with children is :class:`NotEmptyError`."""
        request = pb.DeleteRequest(path=_convert.path_of(path), recursive=bool(recursive))
        if expected_version is not None:
            request.expected_version = _convert.u64(expected_version, "expected_version")
        response = await self._unary("Delete", request, CallKind.WRITE)
        return int(response.deleted)

    async def children_page(
        self,
        path: str,
        *,
        start_after: str = "",
        limit: int = 0,
        with_stats: bool = False,
        consistency: Optional[Consistency] = None,
    ) -> ChildrenPage:
        """One page of the children of `path` whose names sort after `start_after`
        (`limit` per page, 0: the server's maximum, 10,000), with their stats if asked."""
        request = pb.GetChildrenRequest(
            path=_convert.path_of(path),
            consistency=_convert.consistency(consistency, self._consistency),
            with_stats=bool(with_stats),
            limit=_convert.u32(limit, "limit"),
            start_after=_convert.path_of(start_after, "start_after"),
        )
        response = await self._unary("GetChildren", request, CallKind.IDEMPOTENT)
        return _convert.children_page(response, with_stats)

    async def children(
        self, path: str, *, with_stats: bool = False, page_size: int = 0, consistency: Optional[Consistency] = None
    ) -> List[Child]:
        """Every child of `path` in name order, read a page at a time (each page is one read,
        so a listing of several pages is not a snapshot)."""
        found: List[Child] = []
        start_after = ""
        while True:
            page = await self.children_page(
                path, start_after=start_after, limit=page_size, with_stats=with_stats, consistency=consistency
            )
            found.extend(page.children)
            if not page.more:
                return found
            if not page.children or page.children[-1].name <= start_after:
                raise ProtocolError(f"a page of {path}'s children said more follow but did not advance")
            start_after = page.children[-1].name

    async def txn(self, txn: Txn) -> TxnResult:
        """Runs a transaction (atomic, at one revision, in the one group serving its
        paths). Not retried after an ambiguous failure: :class:`OutcomeUnknownError`."""
        if not isinstance(txn, Txn):
            raise InvalidArgumentError(f"a transaction is a warden.Txn, not {txn!r}")
        response = await self._unary("Txn", txn._request(), CallKind.WRITE)
        return txn_result(response, txn)

    async def sync(self, group_id: int = 0) -> int:
        """Waits until the replica answering has applied everything committed in group
        `group_id` (0: the group serving `/`) before the call; returns that group's
        revision."""
        request = pb.SyncRequest()
        if _convert.u64(group_id, "group_id"):
            request.routing.group_id = group_id
        return _convert.revision(await self._unary("Sync", request, CallKind.IDEMPOTENT))

    # -- sessions ---------------------------------------------------------------------------

    def session(
        self,
        ttl_s: float = 10.0,
        *,
        grace_period_s: float = 45.0,
        path_hint: Optional[str] = None,
        on_jeopardy: Optional[Callable[[Any], Any]] = None,
        on_safe: Optional[Callable[[Any], Any]] = None,
        on_expired: Optional[Callable[[Any], Any]] = None,
    ) -> "Pending[Any]":
        """Opens a session of `ttl_s` (the server may raise it to its minimum, 3 s by
        default, or lower it to its maximum) and starts keeping it alive. See
        :class:`warden.AsyncSession` for the states and the callbacks. Await the result, or
        use it in `async with` (the session is closed on exit)."""
        from warden.session import AsyncSession

        return Pending(
            AsyncSession._open(
                self,
                ttl_s,
                grace_period_s=grace_period_s,
                path_hint=path_hint,
                on_jeopardy=on_jeopardy,
                on_safe=on_safe,
                on_expired=on_expired,
            )
        )

    async def _create_session(self, ttl_s: float, path_hint: Optional[str]) -> Tuple[int, float]:
        """Creates a session; returns its id and granted TTL."""
        request = pb.CreateSessionRequest(ttl_ms=_convert.millis(ttl_s), path_hint=path_hint or "")
        response = await self._unary("CreateSession", request, CallKind.WRITE)
        if response.session_id == 0:
            raise ProtocolError("a session was created without an id")
        return int(response.session_id), response.granted_ttl_ms / 1000.0

    async def keep_alive(self, session_id: int, timeout_s: Optional[float] = None) -> SessionLease:
        """Renews a session's lease within `timeout_s` (default: the request timeout);
        returns the lease the leader gives it from when it got the request. Renewals of one
        home group that fall due while a keepalive of that group is on the way go together in
        the next call. Sessions renew themselves: this is for a session kept by id."""
        session_id = _convert.session_id_of(session_id)
        timeout_s = self._request_timeout_s if timeout_s is None else _convert.seconds(timeout_s, "timeout_s")
        loop = asyncio.get_running_loop()
        if self._renewals.waiting() >= RENEWALS_WAITING_MAX:
            raise TooLargeError("keepalives waiting in this client", limit=RENEWALS_WAITING_MAX)
        group = home_group(session_id)
        answer: "asyncio.Future[SessionLease]" = loop.create_future()
        self._renewals.groups.setdefault(group, collections.deque()).append(_Renewal(session_id, loop.time() + timeout_s, answer))
        if not self._renewals.sending.get(group):
            self._renewals.sending[group] = True
            self._tasks.spawn(self._send_renewals(group), "sending keepalives")
        try:
            return await asyncio.wait_for(answer, timeout_s)
        except asyncio.TimeoutError:
            raise timed_out(CallKind.IDEMPOTENT, timeout_s) from None

    async def _send_renewals(self, group: int) -> None:
        """Sends the renewals waiting for `group`, one keepalive call at a time, until none
        waits. Should this task end early (cancelled with the client), its waiters hear so at
        once and the next renewal starts a new sender."""
        loop = asyncio.get_running_loop()
        batch: List[_Renewal] = []
        try:
            while True:
                batch = self._renewals.next_batch(group)
                if not batch:
                    return
                ids = list(dict.fromkeys(renewal.session_id for renewal in batch))
                timeout_s = max(0.0, max(renewal.deadline for renewal in batch) - loop.time())
                request = pb.KeepAliveRequest(session_ids=ids)
                try:
                    response = await self._unary("KeepAlive", request, CallKind.IDEMPOTENT, timeout_s)
                    for renewal in batch:
                        if not renewal.answer.done():
                            try:
                                renewal.answer.set_result(_convert.lease_of(renewal.session_id, response.leases))
                            except WardenError as error:
                                renewal.answer.set_exception(error)
                except WardenError as error:
                    for renewal in batch:
                        if not renewal.answer.done():
                            renewal.answer.set_exception(error)
                batch = []
        finally:
            self._renewals.sending.pop(group, None)
            stranded = batch + list(self._renewals.groups.pop(group, ()))
            for renewal in stranded:
                if not renewal.answer.done():
                    renewal.answer.set_exception(TransportError("the keepalive sender of this client stopped"))

    async def close_session(self, session_id: int) -> int:
        """Ends a session now, in every group (before it answers); returns how many
        ephemerals went with it in its home group."""
        request = pb.CloseSessionRequest(session_id=_convert.session_id_of(session_id))
        response = await self._unary("CloseSession", request, CallKind.WRITE)
        return int(response.deleted)

    async def session_info(self, session_id: int) -> SessionInfo:
        """A session's lease as its group's leader sees it (without renewing it), and the
        ephemeral nodes it owns."""
        request = pb.SessionInfoRequest(session_id=_convert.session_id_of(session_id))
        return _convert.session_info(await self._unary("SessionInfo", request, CallKind.IDEMPOTENT))

    # -- locks ------------------------------------------------------------------------------

    async def _lock(self, request: pb.LockRequest) -> Tuple[bool, Optional[Sequencer]]:
        """Asks for a lock; the server waits up to `request.timeout_ms` for it, so the call's
        deadline is that wait plus the request timeout. Idempotent: the server returns the
        same waiter for the same session and request id. Returns whether it was acquired and
        the sequencer (also of a waiter left queued)."""
        timeout_s = request.timeout_ms / 1000.0 + self._request_timeout_s
        response = await self._unary("Lock", request, CallKind.IDEMPOTENT, timeout_s)
        if response.acquired and not response.HasField("sequencer"):
            raise ProtocolError("a lock was acquired without a sequencer")
        sequencer = _convert.sequencer(response.sequencer) if response.HasField("sequencer") else None
        return bool(response.acquired), sequencer

    async def unlock(self, sequencer: Sequencer) -> None:
        """Releases a lock hold (or gives up waiting for it); no lock-delay applies.
        Idempotent: releasing a hold that is already gone succeeds."""
        request = pb.UnlockRequest(sequencer=_convert.sequencer_request(sequencer))
        await self._unary("Unlock", request, CallKind.IDEMPOTENT)

    async def check_sequencer(self, sequencer: Sequencer) -> bool:
        """Whether a sequencer still holds its lock (confirmed with the lock group's
        leader): what a resource asks before trusting a request's sequencer."""
        request = pb.CheckSequencerRequest(sequencer=_convert.sequencer_request(sequencer))
        response = await self._unary("CheckSequencer", request, CallKind.IDEMPOTENT)
        return bool(response.holds)

    async def lock_info(self, path: str) -> LockInfo:
        """The holders and waiters of a lock, and its lock-delay if one is in force."""
        request = pb.LockInfoRequest(path=_convert.path_of(path))
        return _convert.lock_info(await self._unary("LockInfo", request, CallKind.IDEMPOTENT))

    # -- watches ----------------------------------------------------------------------------

    def watch(
        self,
        path: str,
        *,
        recursive: bool = False,
        start_revision: int = 0,
        kinds: Optional[Any] = None,
        prev_data: bool = False,
    ) -> "Pending[Any]":
        """Starts a watch of `path` (and, `recursive`, of every node below it) reporting
        every event from `start_revision` on (inclusive; 0: changes after the watch is
        registered), of `kinds` (a set of :class:`EventKind`; None: all), with the previous
        node when `prev_data`. Returns once the server registered it: await the result for an
        :class:`warden.AsyncWatcher`, or use it in `async with` (cancelled on exit)."""
        from warden.watch import AsyncWatcher, WatchOptions

        options = WatchOptions.of(path, recursive=recursive, start_revision=start_revision, kinds=kinds, prev_data=prev_data)
        return Pending(AsyncWatcher._open(self, options))

    def watch_once(self, path: str, kind: Any, *, consistency: Optional[Consistency] = None) -> "Pending[Any]":
        """ZooKeeper's one-shot watch set with a read (`getData`, `exists`, `getChildren`
        with `watch = true`): `kind` (a :class:`OneShotKind`) says what is read now and what
        fires the watch once. The read and the watch are atomic: no change after the read is
        missed. Await the result for an :class:`warden.AsyncOneShotWatch`, or use it in
        `async with`."""
        from warden.watch import AsyncOneShotWatch

        return Pending(AsyncOneShotWatch._open(self, _convert.path_of(path), kind, _convert.consistency(consistency, self._consistency)))
