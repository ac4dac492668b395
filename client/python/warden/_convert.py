"""The one place the client's types meet the generated protobuf types: requests are built
(and the caller's input checked) here, and answers are checked and converted here. Nothing
from the network is trusted: a missing field or an unknown enum value is a
:class:`ProtocolError`; bad input is an :class:`InvalidArgumentError` before anything is
sent."""

import math
from typing import Any, Iterable, Optional, Tuple

from warden._proto import warden_pb2 as pb
from warden.errors import InvalidArgumentError, ProtocolError
from warden.types import (
    Child,
    ChildrenPage,
    Consistency,
    Created,
    Data,
    EventKind,
    LockInfo,
    LockMode,
    LockWaiter,
    Node,
    NodeKind,
    Sequencer,
    SessionInfo,
    SessionLease,
    Stat,
    WatchEvent,
)

U64_MAX = (1 << 64) - 1


def data_bytes(data: Data) -> bytes:
    """Node data as bytes (text as UTF-8)."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise InvalidArgumentError(f"node data is bytes or str, not {type(data).__name__}")


def path_of(path: Any, what: str = "path") -> str:
    """A path argument, checked to be a string (the server checks its form)."""
    if not isinstance(path, str):
        raise InvalidArgumentError(f"a {what} is a str, not {type(path).__name__}")
    return path


def u64(value: Any, what: str) -> int:
    """A non-negative integer argument that fits the wire's uint64."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise InvalidArgumentError(f"{what} is an integer in [0, 2^64), not {value!r}")
    return value


def u32(value: Any, what: str) -> int:
    """A non-negative integer argument that fits the wire's uint32."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << 32):
        raise InvalidArgumentError(f"{what} is an integer in [0, 2^32), not {value!r}")
    return value


def seconds(value: Any, what: str, *, allow_zero: bool = True) -> float:
    """A duration argument in seconds: a finite number, non-negative (positive unless
    `allow_zero`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgumentError(f"{what} is a finite number of seconds, not {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidArgumentError(f"{what} must be {'at least' if allow_zero else 'more than'} 0 s, not {value!r}")
    return float(value)


def millis(value_s: float) -> int:
    """Seconds as whole milliseconds (rounded up, so a positive wait never becomes 0)."""
    return min(U64_MAX, math.ceil(value_s * 1000))


def session_id_of(session: Any) -> int:
    """A session argument: a session object (its `id`) or a session id."""
    ident = getattr(session, "id", session)
    if isinstance(ident, bool) or not isinstance(ident, int) or not 0 < ident <= U64_MAX:
        raise InvalidArgumentError(f"a session is a session object or a positive session id, not {session!r}")
    return ident


def consistency(value: Optional[Consistency], default: Consistency) -> str:
    """A read's consistency on the wire (by name, as protobuf takes enum values)."""
    chosen = default if value is None else value
    if not isinstance(chosen, Consistency):
        raise InvalidArgumentError(f"consistency is a warden.Consistency, not {chosen!r}")
    return chosen.name


def create_request(
    path: str,
    data: Data,
    *,
    kind: NodeKind = NodeKind.PERSISTENT,
    session: Any = None,
    sequential: bool = False,
    create_parents: bool = False,
    ttl_s: Optional[float] = None,
) -> pb.CreateRequest:
    """A create, its options checked: an ephemeral node (`session`) is persistent otherwise
    and has no TTL; a TTL node needs `ttl_s`, which no other kind takes."""
    if not isinstance(kind, NodeKind):
        raise InvalidArgumentError(f"kind is a warden.NodeKind, not {kind!r}")
    session_id = 0 if session is None else session_id_of(session)
    if session_id and kind != NodeKind.PERSISTENT:
        raise InvalidArgumentError(f"an ephemeral node is of kind PERSISTENT, not {kind.name}")
    ttl_ms = 0
    if kind == NodeKind.TTL:
        if ttl_s is None:
            raise InvalidArgumentError("a TTL node needs ttl_s")
        ttl_ms = millis(seconds(ttl_s, "ttl_s", allow_zero=False))
    elif ttl_s is not None:
        raise InvalidArgumentError(f"ttl_s is for TTL nodes, not {kind.name} ones")
    return pb.CreateRequest(
        path=path_of(path),
        data=data_bytes(data),
        kind=kind.name,
        sequential=bool(sequential),
        create_parents=bool(create_parents),
        ttl_ms=ttl_ms,
        session_id=session_id,
    )


def _enum(cls: Any, value: int, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise ProtocolError(f"unknown {what} {value}") from None


def stat(message: pb.Stat) -> Stat:
    """A stat from the wire."""
    return Stat(
        create_revision=message.create_revision,
        mod_revision=message.mod_revision,
        version=message.version,
        cversion=message.cversion,
        ephemeral_owner=message.ephemeral_owner or None,
        num_children=message.num_children,
        ctime_ms=message.ctime_ms,
        mtime_ms=message.mtime_ms,
        data_length=message.data_length,
        kind=_enum(NodeKind, message.kind, "node kind"),
        ttl_ms=message.ttl_ms or None,
    )


def required_stat(message: Any, field: str = "stat") -> Stat:
    """The stat `message` must carry in `field`."""
    if not message.HasField(field):
        raise ProtocolError(f"a {type(message).__name__} lacks its {field}")
    return stat(getattr(message, field))


def revision(message: Any) -> int:
    """The revision of a response's header."""
    if not message.HasField("header"):
        raise ProtocolError(f"a {type(message).__name__} lacks its header")
    return int(message.header.revision)


def created(response: pb.CreateResponse) -> Created:
    """A create's answer."""
    return Created(path=response.path, stat=required_stat(response))


def node(path: str, data: bytes, message: Any) -> Node:
    """A node of `path` from a response carrying its data and stat."""
    return Node(path=path, data=bytes(data), stat=required_stat(message))


def children_page(response: pb.GetChildrenResponse, with_stats: bool) -> ChildrenPage:
    """A page of children, stats paired with names when asked for."""
    names = list(response.names)
    if with_stats:
        if len(response.stats) != len(names):
            raise ProtocolError(f"{len(names)} names but {len(response.stats)} stats")
        children: Tuple[Child, ...] = tuple(Child(name, stat(s)) for name, s in zip(names, response.stats))
    else:
        children = tuple(Child(name, None) for name in names)
    return ChildrenPage(children=children, parent=required_stat(response), revision=revision(response), more=response.more)


def lease(message: pb.SessionLease) -> SessionLease:
    """A session lease from the wire."""
    return SessionLease(alive=message.alive, granted_ttl_ms=message.granted_ttl_ms, remaining_ms=message.remaining_ms)


def lease_of(session_id: int, leases: Iterable[pb.SessionLease]) -> SessionLease:
    """The lease of `session_id` among a keepalive's answers."""
    for message in leases:
        if message.session_id == session_id:
            return lease(message)
    raise ProtocolError(f"a keepalive answer lacks session {session_id:#x}")


def session_info(response: pb.SessionInfoResponse) -> SessionInfo:
    """A session's info."""
    if not response.HasField("lease"):
        raise ProtocolError("session info without a lease")
    return SessionInfo(lease=lease(response.lease), ephemerals=response.ephemerals)


def sequencer(message: pb.Sequencer) -> Sequencer:
    """A sequencer from the wire."""
    return Sequencer(
        path=message.path,
        mode=_enum(LockMode, message.mode, "lock mode"),
        token=message.token,
        group_id=message.group_id,
        waiter=message.waiter,
    )


def sequencer_request(value: Sequencer) -> pb.Sequencer:
    """A sequencer for the wire."""
    if not isinstance(value, Sequencer):
        raise InvalidArgumentError(f"a sequencer is a warden.Sequencer, not {value!r}")
    return pb.Sequencer(path=value.path, mode=value.mode.name, token=value.token, group_id=value.group_id, waiter=value.waiter)


def lock_info(response: pb.LockInfoResponse) -> LockInfo:
    """A lock's holders and waiters."""

    def waiter(message: pb.LockWaiter) -> LockWaiter:
        return LockWaiter(
            waiter=message.waiter,
            mode=_enum(LockMode, message.mode, "lock mode"),
            session_id=message.session_id,
            token=message.token,
        )

    return LockInfo(
        holders=tuple(waiter(w) for w in response.holders),
        waiters=tuple(waiter(w) for w in response.waiters),
        blocked_until_ms=response.blocked_until_ms or None,
    )


def watch_event(event: pb.WatchEvent, group_id: int) -> WatchEvent:
    """An event of a response from group `group_id`."""
    prev = Node(path=event.path, data=bytes(event.prev_data), stat=stat(event.prev_stat)) if event.HasField("prev_stat") else None
    return WatchEvent(
        kind=_enum(EventKind, event.type, "event type"),
        group_id=group_id,
        revision=event.revision,
        node=node(event.path, event.data, event),
        prev=prev,
    )
