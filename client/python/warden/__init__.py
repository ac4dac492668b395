"""Warden's Python client.

- :class:`Client` (blocking) and :class:`AsyncClient` (asyncio): connect to the routers
  (failing over between them, in order), with a method per call of the public API and the
  retry rules of the Rust client: reads, keepalives and the server-deduplicated lock calls
  are retried until their deadline; a write is sent again only when the failure proves it
  was not applied, else the caller gets :class:`OutcomeUnknownError`.
- Sessions (:meth:`Client.session`): a lease kept alive in the background, with Chubby's
  states (:class:`SessionState`: connected, jeopardy, safe, expired) and callbacks;
  ephemeral nodes (`create(..., session=...)`) and locks (:meth:`Session.lock`, a context
  manager holding the fencing token) belong to one.
- Watches (:meth:`Client.watch`): a node's or subtree's events from a revision on, resumed
  across broken streams and routers without losing or repeating one; one-shot watches set
  with a read (:meth:`Client.watch_once`).
- :class:`Txn`: etcd-style transactions. :class:`FenceGuard`: what a *resource* keeps to
  refuse writes carrying stale fencing tokens.
- :mod:`warden.recipes`: leader election, group membership, semaphore, barriers, counter.

Every error is a :class:`WardenError`, one subclass per Warden error code.

    from warden import Client

    with Client(["127.0.0.1:7100"]) as client:
        client.create("/config/flag", b"on", create_parents=True)
        with client.session(ttl_s=10) as session:
            with session.lock("/locks/etl") as guard:
                ...  # write to the resource with guard.fencing_token

The blocking classes are a facade over the asyncio ones: each runs the same coroutines on a
private event-loop thread.
"""

from warden.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S, AsyncClient, TlsConfig
from warden.errors import (
    BadVersionError,
    CompactedError,
    DeadlineExceededError,
    ErrorCode,
    InvalidArgumentError,
    InvalidPathError,
    MovedError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    NotLeaderError,
    OutcomeUnknownError,
    PermissionDeniedError,
    ProtocolError,
    QuotaExceeded,
    RateLimitedError,
    ResourceExhaustedError,
    SequenceExhaustedError,
    ServerError,
    SessionExpiredError,
    SlowWatcherError,
    TooLargeError,
    TransportError,
    UnauthenticatedError,
    UnavailableError,
    WardenError,
    WrongGroupError,
)
from warden.fence import FenceGuard, StaleTokenError
from warden.lock import AsyncLockGuard
from warden.session import DEFAULT_GRACE_PERIOD_S, AsyncSession
from warden.sync import Client, LockGuard, OneShotWatch, Session, Watcher
from warden.txn import Compare, CompareOp, CompareTarget, Txn, TxnOp, TxnOpResult, TxnResult
from warden.types import (
    Child,
    ChildrenPage,
    Consistency,
    Created,
    EventKind,
    LockInfo,
    LockMode,
    LockWaiter,
    Node,
    NodeKind,
    OneShotKind,
    Sequencer,
    SessionInfo,
    SessionLease,
    SessionState,
    Stat,
    WatchEvent,
)
from warden.watch import AsyncOneShotWatch, AsyncWatcher

__all__ = [
    "AsyncClient",
    "AsyncLockGuard",
    "AsyncOneShotWatch",
    "AsyncSession",
    "AsyncWatcher",
    "BadVersionError",
    "Child",
    "ChildrenPage",
    "Client",
    "CompactedError",
    "Compare",
    "CompareOp",
    "CompareTarget",
    "Consistency",
    "Created",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_GRACE_PERIOD_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DeadlineExceededError",
    "ErrorCode",
    "EventKind",
    "FenceGuard",
    "InvalidArgumentError",
    "InvalidPathError",
    "LockGuard",
    "LockInfo",
    "LockMode",
    "LockWaiter",
    "MovedError",
    "NoChildrenForEphemeralsError",
    "Node",
    "NodeExistsError",
    "NodeKind",
    "NoNodeError",
    "NotEmptyError",
    "NotLeaderError",
    "OneShotKind",
    "OneShotWatch",
    "OutcomeUnknownError",
    "PermissionDeniedError",
    "ProtocolError",
    "QuotaExceeded",
    "RateLimitedError",
    "ResourceExhaustedError",
    "Sequencer",
    "SequenceExhaustedError",
    "ServerError",
    "Session",
    "SessionExpiredError",
    "SessionInfo",
    "SessionLease",
    "SessionState",
    "SlowWatcherError",
    "StaleTokenError",
    "Stat",
    "TlsConfig",
    "TooLargeError",
    "TransportError",
    "Txn",
    "TxnOp",
    "TxnOpResult",
    "TxnResult",
    "UnauthenticatedError",
    "UnavailableError",
    "WardenError",
    "WatchEvent",
    "Watcher",
    "WrongGroupError",
]
