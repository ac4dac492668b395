"""etcd-style transactions: if every compare holds, run the `then` operations, else the
`otherwise` ones; atomically, at one revision, in the one group serving every path (a
transaction spanning groups is refused with :class:`InvalidArgumentError`; at most 128
operations).

    txn = (Txn()
           .when(Compare.version("/a", CompareOp.EQUAL, 3))
           .then(TxnOp.delete("/a"))
           .then(TxnOp.create("/b", b"token"))
           .or_else(TxnOp.get("/a")))
    result = await client.txn(txn)
"""

import enum
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple, Union

from warden import _convert
from warden._proto import warden_pb2 as pb
from warden.errors import InvalidArgumentError, ProtocolError
from warden.types import Created, Data, Node, NodeKind, Stat

__all__ = ["CompareOp", "CompareTarget", "Compare", "TxnOp", "Txn", "TxnResult", "TxnOpResult"]


class CompareOp(enum.IntEnum):
    """How a compare relates the node's field to the given value."""

    EQUAL = 0
    NOT_EQUAL = 1
    LESS = 2
    GREATER = 3


class CompareTarget(enum.IntEnum):
    """What a compare looks at. A missing node has version 0, revisions 0 and an empty
    value."""

    #: The node's version (data changes).
    VERSION = 0
    #: The node's create revision (EQUAL 0: the node does not exist).
    CREATE_REVISION = 1
    #: The revision of its last data change.
    MOD_REVISION = 2
    #: Its data, compared bytewise.
    VALUE = 3
    #: Whether it exists.
    EXISTS = 4
    #: Writes of its data counting its creation (etcd's version): 0 when missing.
    WRITES = 5
    #: The session owning it (0 for a missing or persistent node).
    OWNER = 6


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction. Build with the static methods."""

    #: The node compared.
    path: str
    #: What is compared.
    target: CompareTarget
    #: How.
    op: CompareOp = CompareOp.EQUAL
    #: The number compared with (numeric targets).
    number: int = 0
    #: The value compared with (VALUE).
    compare_value: bytes = b""
    #: Whether the node must exist (EXISTS).
    must_exist: bool = False

    @staticmethod
    def _numeric(path: str, target: CompareTarget, op: CompareOp, number: int) -> "Compare":
        if not isinstance(op, CompareOp):
            raise InvalidArgumentError(f"op is a warden.CompareOp, not {op!r}")
        return Compare(_convert.path_of(path), target, op, number=_convert.u64(number, f"a {target.name} compare's number"))

    @staticmethod
    def version(path: str, op: CompareOp, version: int) -> "Compare":
        """Compares the node's version."""
        return Compare._numeric(path, CompareTarget.VERSION, op, version)

    @staticmethod
    def create_revision(path: str, op: CompareOp, revision: int) -> "Compare":
        """Compares the node's create revision."""
        return Compare._numeric(path, CompareTarget.CREATE_REVISION, op, revision)

    @staticmethod
    def mod_revision(path: str, op: CompareOp, revision: int) -> "Compare":
        """Compares the node's last modification revision."""
        return Compare._numeric(path, CompareTarget.MOD_REVISION, op, revision)

    @staticmethod
    def writes(path: str, op: CompareOp, writes: int) -> "Compare":
        """Compares the writes of the node's data counting its creation (etcd's version)."""
        return Compare._numeric(path, CompareTarget.WRITES, op, writes)

    @staticmethod
    def owner(path: str, op: CompareOp, session_id: int) -> "Compare":
        """Compares the session owning the node (0: none)."""
        return Compare._numeric(path, CompareTarget.OWNER, op, session_id)

    @staticmethod
    def value(path: str, op: CompareOp, value: Data) -> "Compare":
        """Compares the node's data, bytewise."""
        if not isinstance(op, CompareOp):
            raise InvalidArgumentError(f"op is a warden.CompareOp, not {op!r}")
        return Compare(_convert.path_of(path), CompareTarget.VALUE, op, compare_value=_convert.data_bytes(value))

    @staticmethod
    def exists(path: str, exists: bool = True) -> "Compare":
        """Holds when the node exists (`exists=True`) or when it does not (`False`)."""
        return Compare(_convert.path_of(path), CompareTarget.EXISTS, CompareOp.EQUAL, must_exist=bool(exists))

    def _message(self) -> pb.Compare:
        return pb.Compare(path=self.path, target=self.target.name, op=self.op.name, number=self.number, value=self.compare_value, exists=self.must_exist)


@dataclass(frozen=True)
class TxnOp:
    """One operation of a transaction. Build with the static methods."""

    #: `create`, `set`, `delete` or `get`.
    kind: str
    #: The node the operation is about (the parent's prefix, for sequential creates).
    path: str
    _message: pb.TxnOp = field(repr=False, compare=False)

    @staticmethod
    def create(
        path: str,
        data: Data = b"",
        *,
        kind: NodeKind = NodeKind.PERSISTENT,
        session: Any = None,
        sequential: bool = False,
        create_parents: bool = False,
        ttl_s: Optional[float] = None,
    ) -> "TxnOp":
        """A create, with the options of :meth:`AsyncClient.create`."""
        request = _convert.create_request(
            path, data, kind=kind, session=session, sequential=sequential, create_parents=create_parents, ttl_s=ttl_s
        )
        return TxnOp("create", path, pb.TxnOp(create=request))

    @staticmethod
    def set(path: str, data: Data, *, expected_version: Optional[int] = None) -> "TxnOp":
        """A set, only at `expected_version` when given."""
        request = pb.SetRequest(path=_convert.path_of(path), data=_convert.data_bytes(data))
        if expected_version is not None:
            request.expected_version = _convert.u64(expected_version, "expected_version")
        return TxnOp("set", path, pb.TxnOp(set=request))

    @staticmethod
    def delete(path: str, *, expected_version: Optional[int] = None, recursive: bool = False) -> "TxnOp":
        """A delete, only at `expected_version` when given."""
        request = pb.DeleteRequest(path=_convert.path_of(path), recursive=bool(recursive))
        if expected_version is not None:
            request.expected_version = _convert.u64(expected_version, "expected_version")
        return TxnOp("delete", path, pb.TxnOp(delete=request))

    @staticmethod
    def get(path: str) -> "TxnOp":
        """A read (a missing node reads as None, not as an error)."""
        return TxnOp("get", path, pb.TxnOp(get=pb.GetRequest(path=_convert.path_of(path))))


#: The result of one operation: a create's :class:`Created`, a set's new :class:`Stat`, a
#: delete's count of deleted nodes, a get's :class:`Node` (None when missing).
TxnOpResult = Union[Created, Stat, int, Optional[Node]]


class Txn:
    """A transaction being built: `when(...)` adds a condition, `then(...)` an operation run
    when every condition holds, `or_else(...)` one run otherwise. Each returns the
    transaction, so calls chain."""

    def __init__(self) -> None:
        #: The conditions, all of which must hold for `then` to run.
        self.compares: List[Compare] = []
        #: Run when every compare holds.
        self.then_ops: List[TxnOp] = []
        #: Run otherwise.
        self.else_ops: List[TxnOp] = []

    def when(self, compare: Compare) -> "Txn":
        """Adds a condition."""
        if not isinstance(compare, Compare):
            raise InvalidArgumentError(f"a condition is a warden.Compare, not {compare!r}")
        self.compares.append(compare)
        return self

    def then(self, op: TxnOp) -> "Txn":
        """Adds an operation run when every condition holds."""
        if not isinstance(op, TxnOp):
            raise InvalidArgumentError(f"an operation is a warden.TxnOp, not {op!r}")
        self.then_ops.append(op)
        return self

    def or_else(self, op: TxnOp) -> "Txn":
        """Adds an operation run when a condition fails."""
        if not isinstance(op, TxnOp):
            raise InvalidArgumentError(f"an operation is a warden.TxnOp, not {op!r}")
        self.else_ops.append(op)
        return self

    def _request(self) -> pb.TxnRequest:
        request = pb.TxnRequest()
        request.compares.extend(c._message() for c in self.compares)
        request.then.extend(op._message for op in self.then_ops)
        getattr(request, "else").extend(op._message for op in self.else_ops)
        return request


@dataclass(frozen=True)
class TxnResult:
    """What a transaction did."""

    #: Whether every compare held (so `then` ran, not `otherwise`).
    succeeded: bool
    #: The group's revision after the transaction (unchanged by read-only or failed ones).
    revision: int
    #: One result per operation of the branch that ran, in order.
    results: Tuple[TxnOpResult, ...]


def _result(op: TxnOp, message: pb.TxnOpResult) -> TxnOpResult:
    which = message.WhichOneof("result")
    if which != op.kind:
        raise ProtocolError(f"a {which} result answers a {op.kind} operation")
    if which == "create":
        return _convert.created(message.create)
    if which == "set":
        return _convert.required_stat(message.set)
    if which == "delete":
        return int(message.delete.deleted)
    got = message.get
    return _convert.node(op.path, got.data, got) if got.HasField("stat") else None


def txn_result(response: pb.TxnResponse, txn: Txn) -> TxnResult:
    """The results of the branch of `txn` that ran, paired with its operations."""
    ran = txn.then_ops if response.succeeded else txn.else_ops
    if len(response.results) != len(ran):
        raise ProtocolError(f"{len(response.results)} results for {len(ran)} operations")
    results = tuple(_result(op, message) for op, message in zip(ran, response.results))
    return TxnResult(succeeded=response.succeeded, revision=_convert.revision(response), results=results)
