"""The values calls take and return: nodes and their stats, sessions' leases, locks'
sequencers, watch events, and the enums of the API. Immutable; built from the protobuf
answers in `warden._convert`, where nothing from the network is trusted."""

import enum
from dataclasses import dataclass
from typing import Optional, Tuple, Union

__all__ = [
    "Consistency",
    "NodeKind",
    "LockMode",
    "EventKind",
    "OneShotKind",
    "SessionState",
    "Stat",
    "Node",
    "Created",
    "Child",
    "ChildrenPage",
    "SessionLease",
    "SessionInfo",
    "Sequencer",
    "LockWaiter",
    "LockInfo",
    "WatchEvent",
    "Data",
]

#: Node data as a caller may give it: bytes, or text (sent as UTF-8).
Data = Union[bytes, bytearray, memoryview, str]


class Consistency(enum.IntEnum):
    """How reads are answered."""

    #: Confirmed with the group's leader before answering: sees every write acknowledged
    #: before the read started.
    LINEARIZABLE = 0
    #: From whichever replica answers, as of its applied state (possibly behind).
    STALE = 1


class NodeKind(enum.IntEnum):
    """What kind of node a node is (ephemerality is `Stat.ephemeral_owner`)."""

    #: An ordinary node.
    PERSISTENT = 0
    #: Removed with its last child.
    CONTAINER = 1
    #: Removed once its TTL passes without a change while it has no children.
    TTL = 2


class LockMode(enum.IntEnum):
    """Who may hold a lock together."""

    #: One holder at a time.
    EXCLUSIVE = 0
    #: Any number of shared holders, and no exclusive one.
    SHARED = 1


class EventKind(enum.IntEnum):
    """What happened to a node."""

    #: It was created.
    CREATED = 0
    #: Its data changed.
    CHANGED = 1
    #: It was deleted.
    DELETED = 2


class OneShotKind(enum.IntEnum):
    """ZooKeeper's one-shot watches: what fires them (and what is read with them)."""

    #: `getData` watch: the first change of the node's data or its deletion (reads the node).
    DATA = 1
    #: `exists` watch: the node's first creation, data change or deletion (reads its stat).
    EXISTS = 2
    #: `getChildren` watch: the first creation or deletion of a child, or of the node itself
    #: (reads the first page of children).
    CHILDREN = 3


class SessionState(enum.Enum):
    """Where a session stands, as far as the client can tell (Chubby's states).

    CONNECTED while keepalives succeed; JEOPARDY once the local lease lapsed without a
    successful keepalive (the server may already have ended the session: what it protects
    must not be relied on; keepalives go on); SAFE when a keepalive succeeds during jeopardy
    (the session survived); EXPIRED when the server says the session ended or the grace
    period passed in jeopardy; CLOSED once closed (or abandoned) by this client. EXPIRED and
    CLOSED are final."""

    CONNECTED = "connected"
    JEOPARDY = "jeopardy"
    SAFE = "safe"
    EXPIRED = "expired"
    CLOSED = "closed"

    @property
    def is_live(self) -> bool:
        """Whether the session is known to be alive (connected or safe)."""
        return self in (SessionState.CONNECTED, SessionState.SAFE)

    @property
    def has_ended(self) -> bool:
        """Whether the session is over (expired or closed)."""
        return self in (SessionState.EXPIRED, SessionState.CLOSED)


@dataclass(frozen=True)
class Stat:
    """A node's metadata."""

    #: Revision of the node's creation (for a lock waiter: its fencing token).
    create_revision: int
    #: Revision of the node's last data change.
    mod_revision: int
    #: Number of data changes (what compare-and-swap compares).
    version: int
    #: Number of child changes.
    cversion: int
    #: The session owning an ephemeral node; None for other nodes.
    ephemeral_owner: Optional[int]
    #: Number of children.
    num_children: int
    #: Leader wall clock at creation, ms since the Unix epoch (informational).
    ctime_ms: int
    #: Leader wall clock at the last data change, ms since the Unix epoch (informational).
    mtime_ms: int
    #: Bytes of data.
    data_length: int
    #: The node's kind.
    kind: NodeKind
    #: For TTL nodes, their TTL.
    ttl_ms: Optional[int]


@dataclass(frozen=True)
class Node:
    """A node read whole."""

    #: Its path.
    path: str
    #: Its data.
    data: bytes
    #: Its metadata.
    stat: Stat


@dataclass(frozen=True)
class Created:
    """A node just created."""

    #: Its actual path (with the 10-digit counter appended for sequential creates).
    path: str
    #: Its metadata (`create_revision` is the revision of the create).
    stat: Stat


@dataclass(frozen=True)
class Child:
    """One child of a node."""

    #: Its name (the last segment of its path).
    name: str
    #: Its stat, when asked for.
    stat: Optional[Stat]


@dataclass(frozen=True)
class ChildrenPage:
    """One page of a listing of children."""

    #: Children in name order.
    children: Tuple[Child, ...]
    #: The parent's stat when the page was read.
    parent: Stat
    #: The revision the page was read at.
    revision: int
    #: More children follow the last one of this page.
    more: bool


@dataclass(frozen=True)
class SessionLease:
    """A session's lease as the leader of its group sees it."""

    #: False: the session has ended; its ephemerals are gone.
    alive: bool
    #: The TTL the session was granted.
    granted_ttl_ms: int
    #: Time the leader still gives the session without keepalives (at least).
    remaining_ms: int


@dataclass(frozen=True)
class SessionInfo:
    """A session's lease and what it owns."""

    #: The lease.
    lease: SessionLease
    #: Ephemeral nodes the session owns in its home group (lock waiters included; other
    #: groups count their own).
    ephemerals: int


@dataclass(frozen=True)
class Sequencer:
    """Chubby's sequencer: names one hold of a lock. Its `token` only grows for a lock path,
    so a resource that remembers the highest token it has seen can refuse a late holder
    (:class:`warden.FenceGuard`)."""

    #: The lock.
    path: str
    #: Exclusive or shared.
    mode: LockMode
    #: The fencing token (the waiter node's create revision).
    token: int
    #: The group serving the lock.
    group_id: int
    #: The waiter node (a child of `path`) that is this hold.
    waiter: str


@dataclass(frozen=True)
class LockWaiter:
    """A holder or waiter of a lock."""

    #: Its waiter node.
    waiter: str
    #: Exclusive or shared.
    mode: LockMode
    #: The session waiting or holding.
    session_id: int
    #: Its fencing token.
    token: int


@dataclass(frozen=True)
class LockInfo:
    """The state of a lock."""

    #: Who holds it.
    holders: Tuple[LockWaiter, ...]
    #: Who waits, in grant order.
    waiters: Tuple[LockWaiter, ...]
    #: When a lock-delay in force ends (the leader's wall clock, ms since the Unix epoch);
    #: None when none is.
    blocked_until_ms: Optional[int]


@dataclass(frozen=True)
class WatchEvent:
    """One change of one node."""

    #: What happened.
    kind: EventKind
    #: The shard group serving the node (revisions are per group).
    group_id: int
    #: The revision of the write in its group (shared by every event of one transaction).
    revision: int
    #: The node after the event (for a deletion: its last stat, and no data).
    node: Node
    #: The node before the event, when asked for (`prev_data`) and it existed.
    prev: Optional[Node]

