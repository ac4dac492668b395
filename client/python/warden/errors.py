"""The errors of every call: one exception class per `warden.v1.WardenError.Code`, all
subclasses of :class:`WardenError`, plus the failures of the connection itself
(:class:`TransportError`, :class:`DeadlineExceededError`, :class:`ProtocolError`).

A failed gRPC call becomes a :class:`WardenError` here and nowhere else. Servers send the
structured error as the standard rich status: the `grpc-status-details-bin` trailer holds a
`google.rpc.Status` whose `details` carry one `google.protobuf.Any` packing a
`warden.v1.WardenError`, read with `grpc_status.rpc_status.from_call` (the helper every
gRPC Python program has). A status without that detail is a failure of the connection (or
of the gRPC layer), judged by its gRPC code.
"""

import enum
from typing import Any, Dict, Optional, Type

import grpc
from google.protobuf.message import DecodeError
from grpc_status import rpc_status

from warden._proto import warden_pb2 as pb

__all__ = [
    "ErrorCode",
    "WardenError",
    "ServerError",
    "NotLeaderError",
    "WrongGroupError",
    "NoNodeError",
    "NodeExistsError",
    "BadVersionError",
    "NotEmptyError",
    "SessionExpiredError",
    "InvalidPathError",
    "TooLargeError",
    "UnavailableError",
    "CompactedError",
    "NoChildrenForEphemeralsError",
    "InvalidArgumentError",
    "OutcomeUnknownError",
    "SequenceExhaustedError",
    "SlowWatcherError",
    "MovedError",
    "RateLimitedError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "ResourceExhaustedError",
    "TransportError",
    "DeadlineExceededError",
    "ProtocolError",
    "QuotaExceeded",
]


class ErrorCode(enum.IntEnum):
    """`warden.v1.WardenError.Code`: what a Warden error is about (see docs/api.md)."""

    UNKNOWN = 0
    NOT_LEADER = 1
    WRONG_GROUP = 2
    NO_NODE = 3
    NODE_EXISTS = 4
    BAD_VERSION = 5
    NOT_EMPTY = 6
    SESSION_EXPIRED = 7
    INVALID_PATH = 8
    TOO_LARGE = 9
    UNAVAILABLE = 10
    COMPACTED = 11
    NO_CHILDREN_FOR_EPHEMERALS = 12
    INVALID_ARGUMENT = 13
    OUTCOME_UNKNOWN = 14
    SEQUENCE_EXHAUSTED = 15
    SLOW_WATCHER = 16
    MOVED = 17
    RATE_LIMITED = 18
    PERMISSION_DENIED = 19
    UNAUTHENTICATED = 20
    RESOURCE_EXHAUSTED = 21


class QuotaExceeded:
    """Which subtree quota a refused request would exceed (`RESOURCE_EXHAUSTED`)."""

    __slots__ = ("prefix", "kind", "limit", "usage", "share")

    def __init__(self, prefix: str, kind: str, limit: int, usage: int, share: int) -> None:
        #: The quota's prefix.
        self.prefix = prefix
        #: What it limits: `nodes`, `bytes`, `sessions`, `lock waiters` or `watches`.
        self.kind = kind
        #: The quota's limit (for the whole subtree).
        self.limit = limit
        #: The usage the request would have reached in the group that refused it.
        self.usage = usage
        #: That group's share of the limit.
        self.share = share

    def __repr__(self) -> str:
        return f"QuotaExceeded(prefix={self.prefix!r}, kind={self.kind!r}, limit={self.limit}, usage={self.usage}, share={self.share})"


_QUOTA_KINDS = {0: "nodes", 1: "bytes", 2: "sessions", 3: "lock waiters", 4: "watches"}


#: The class of each Warden error code, filled in as the classes are defined.
_BY_CODE: Dict[int, Type["WardenError"]] = {}


class WardenError(Exception):
    """Why a call failed. Subclasses name the Warden error code (`code`); the client's own
    failures (:class:`TransportError`, :class:`DeadlineExceededError`,
    :class:`ProtocolError`) have `code` None.

    Every field of the server's `WardenError` detail is kept: `path` (what the error is
    about), `leader_id` / `leader_addr` (NOT_LEADER's hint), `compact_revision`
    (COMPACTED), `limit` (TOO_LARGE, RATE_LIMITED), `op_index` (the failing transaction
    operation), `moved_to_group` (MOVED), `quota` (RESOURCE_EXHAUSTED), and the detail itself
    as `detail` (None when the error did not come from a server's detail)."""

    #: The Warden error code of this class (None: the client's own failure).
    code: Optional[ErrorCode] = None

    def __init_subclass__(cls, *, code: Optional[ErrorCode] = None, **kwargs: Any) -> None:
        """`class NoNodeError(WardenError, code=ErrorCode.NO_NODE)`: the class of that code,
        what a server's error of that code becomes (a subclass without `code` inherits its
        base's and is not registered)."""
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
            _BY_CODE[code] = cls

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        leader_id: int = 0,
        leader_addr: str = "",
        compact_revision: int = 0,
        limit: int = 0,
        op_index: int = 0,
        moved_to_group: int = 0,
        quota: Optional[QuotaExceeded] = None,
        grpc_code: Optional[grpc.StatusCode] = None,
        detail: Optional[pb.WardenError] = None,
    ) -> None:
        super().__init__(message)
        #: The server's (or the client's) explanation.
        self.message = message
        #: The path the error is about, when there is one.
        self.path = path
        #: NOT_LEADER: the node believed to lead (0: unknown).
        self.leader_id = leader_id
        #: NOT_LEADER: that node's address.
        self.leader_addr = leader_addr
        #: COMPACTED: events up to this revision are no longer available.
        self.compact_revision = compact_revision
        #: TOO_LARGE: the limit exceeded; RATE_LIMITED: requests per second allowed.
        self.limit = limit
        #: The index of the failing transaction operation.
        self.op_index = op_index
        #: MOVED: the group serving the moved subtree now.
        self.moved_to_group = moved_to_group
        #: RESOURCE_EXHAUSTED: the quota the request would exceed.
        self.quota = quota
        #: The gRPC status code the error arrived with (None: raised by the client).
        self.grpc_code = grpc_code
        #: The server's `warden.v1.WardenError`, when the error carried one.
        self.detail = detail

    def __str__(self) -> str:
        code = self.code.name if self.code is not None else type(self).__name__
        where = f" ({self.path})" if self.path and self.path not in self.message else ""
        return f"{code}: {self.message}{where}"


class ServerError(WardenError, code=ErrorCode.UNKNOWN):
    """The server failed in a way it did not classify (code UNKNOWN)."""


class NotLeaderError(WardenError, code=ErrorCode.NOT_LEADER):
    """The replica asked is not its group's leader; nothing was applied. Routers follow the
    hint themselves: a caller sees this only if no leader answered before the deadline."""


class WrongGroupError(WardenError, code=ErrorCode.WRONG_GROUP):
    """The path is served by another group than the one asked (routers handle this)."""


class NoNodeError(WardenError, code=ErrorCode.NO_NODE):
    """The node does not exist (or, for a create, its parent does not)."""


class NodeExistsError(WardenError, code=ErrorCode.NODE_EXISTS):
    """A create found the node already there."""


class BadVersionError(WardenError, code=ErrorCode.BAD_VERSION):
    """The node's version was not the expected one (a failed compare-and-swap)."""


class NotEmptyError(WardenError, code=ErrorCode.NOT_EMPTY):
    """A delete of a node that still has children (delete recursively instead)."""


class SessionExpiredError(WardenError, code=ErrorCode.SESSION_EXPIRED):
    """The session has ended (expired or closed); its ephemerals and locks are gone."""


class InvalidPathError(WardenError, ValueError, code=ErrorCode.INVALID_PATH):
    """The path is malformed, too long or reserved."""


class TooLargeError(WardenError, code=ErrorCode.TOO_LARGE):
    """A value, path, request or listing exceeded a limit (`limit`)."""


class UnavailableError(WardenError, code=ErrorCode.UNAVAILABLE):
    """The group could not serve the request (no quorum, no leader yet); nothing was
    applied. Retried by the client until the deadline."""


class CompactedError(WardenError, code=ErrorCode.COMPACTED):
    """A watch asked for events older than the history kept: re-read, then watch from the
    read's revision + 1 (at least `compact_revision` + 1)."""


class NoChildrenForEphemeralsError(WardenError, code=ErrorCode.NO_CHILDREN_FOR_EPHEMERALS):
    """A create below an ephemeral node."""


class InvalidArgumentError(WardenError, ValueError, code=ErrorCode.INVALID_ARGUMENT):
    """The request was malformed or not allowed (for example a transaction spanning groups),
    refused by the server, or bad input refused by the client before sending anything."""


class OutcomeUnknownError(WardenError, code=ErrorCode.OUTCOME_UNKNOWN):
    """A write may or may not have been applied (its deadline passed, or its connection was
    lost after it was sent); it was not sent again. Read to find out."""


class SequenceExhaustedError(WardenError, code=ErrorCode.SEQUENCE_EXHAUSTED):
    """A sequential create found the parent's counter exhausted."""


class SlowWatcherError(WardenError, code=ErrorCode.SLOW_WATCHER):
    """A watch could not keep up and was cancelled by the server (the watcher resumes by
    itself; a caller sees this only from a raw stream)."""


class MovedError(WardenError, code=ErrorCode.MOVED):
    """A watch's subtree moved to another group, `moved_to_group` (the watcher resumes
    there by itself; a caller sees this only from a raw stream)."""


class RateLimitedError(WardenError, code=ErrorCode.RATE_LIMITED):
    """This client's principal is over its request rate at the router (`limit` requests per
    second). Not retried: waiting is the caller's choice."""


class PermissionDeniedError(WardenError, code=ErrorCode.PERMISSION_DENIED):
    """Security is on and the caller's principal may not do this on `path`."""


class UnauthenticatedError(WardenError, code=ErrorCode.UNAUTHENTICATED):
    """Security is on and the call carried no credential the server accepts (no client
    certificate, no bearer token, or one that names nobody)."""


class ResourceExhaustedError(WardenError, code=ErrorCode.RESOURCE_EXHAUSTED):
    """A quota of the subtree `quota.prefix` would be exceeded; nothing was changed."""


class TransportError(WardenError):
    """No router could be reached, or the connection failed (for reads, after retrying every
    router until the deadline). `never_sent` says whether the call provably never reached a
    server (the connection was refused): only then is a write safe to send again."""

    def __init__(self, message: str, *, never_sent: bool = False, grpc_code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message, grpc_code=grpc_code)
        #: The call provably never reached a server.
        self.never_sent = never_sent


class DeadlineExceededError(WardenError):
    """The call's deadline passed before an answer (reads, waits; a write whose deadline
    passes is :class:`OutcomeUnknownError`)."""


class ProtocolError(WardenError):
    """The server answered something this client cannot interpret (a malformed answer or
    error detail, an unknown enum value)."""


#: gRPC codes a failed connection (or a router failing to reach a node) gives, when no
#: Warden detail says otherwise: `warden_proto::follow::is_connection_failure`.
_CONNECTION_FAILURES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)

#: What grpcio says of a connection it could not make (refused, or none at all): the call
#: never left this process.
_NEVER_SENT_MARKERS = ("Connection refused", "failed to connect to all addresses", "tcp connect error")


def from_detail(detail: pb.WardenError, grpc_code: Optional[grpc.StatusCode] = None) -> WardenError:
    """The typed form of a server's `warden.v1.WardenError`."""
    cls = _BY_CODE.get(detail.code)
    quota = None
    if detail.HasField("quota"):
        q = detail.quota
        quota = QuotaExceeded(q.prefix, _QUOTA_KINDS.get(q.kind, "unknown"), q.limit, q.usage, q.share)
    if cls is None:
        cls, message = ProtocolError, f"unknown Warden error code {detail.code}: {detail.message}"
    else:
        message = detail.message
    return cls(
        message,
        path=detail.path,
        leader_id=detail.leader_id,
        leader_addr=detail.leader_addr,
        compact_revision=detail.compact_revision,
        limit=detail.limit,
        op_index=detail.op_index,
        moved_to_group=detail.moved_to_group,
        quota=quota,
        grpc_code=grpc_code,
        detail=detail,
    )


def detail_of(call: grpc.Call) -> Optional[pb.WardenError]:
    """The `warden.v1.WardenError` a failed call carries in its rich status, if any.

    Raises :class:`ProtocolError` when the rich status does not decode, or does not match the
    call's code and message (what `grpc_status.rpc_status.from_call` checks)."""
    try:
        status = rpc_status.from_call(call)
    except (ValueError, DecodeError) as error:
        raise ProtocolError(f"the error detail of a {call.code()} status is not a valid google.rpc.Status: {error}") from None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(pb.WardenError.DESCRIPTOR):
            found = pb.WardenError()
            if not detail.Unpack(found):
                raise ProtocolError(f"a {detail.type_url} detail does not decode")
            return found
    return None


def from_rpc_error(call: grpc.RpcError) -> WardenError:
    """The error a failed gRPC call (sync or asyncio) stands for: its Warden detail when it
    has one, else what its gRPC code says about the connection."""
    code: grpc.StatusCode = call.code()
    message: str = call.details() or ""
    try:
        detail = detail_of(call)
    except ProtocolError as error:
        error.grpc_code = code
        return error
    if detail is not None:
        return from_detail(detail, code)
    text = f"{code.name}: {message}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgumentError(text, grpc_code=code)
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE):
        return TooLargeError(text, grpc_code=code)
    if code in _CONNECTION_FAILURES:
        never_sent = code == grpc.StatusCode.UNAVAILABLE and any(marker in message for marker in _NEVER_SENT_MARKERS)
        return TransportError(text, never_sent=never_sent, grpc_code=code)
    return ProtocolError(text, grpc_code=code)
