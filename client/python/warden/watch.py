"""Watches (the Rust client's `watch.rs`): :class:`AsyncWatcher`, a watch of a node or a
subtree from a revision on (etcd's watch; ZooKeeper's persistent and persistent-recursive
watches), and :class:`AsyncOneShotWatch`, ZooKeeper's one-shot watch set with a read.

Each owns one `Watch` stream carrying its one watch. Revisions are per shard group (a
recursive watch through a router may span several groups; each response names its group),
so a watcher remembers, per group, the revision after the last event it received; when the
stream breaks (the router died, the connection failed, or the router's own upstream failed)
it opens a new one — on the next router if that one is unreachable — and watches again from
those revisions, so no event is lost or repeated. A watch cancelled by the server as a slow
watcher, for an unavailable group, or because its subtree MOVED to another group (a split or
merge) resumes the same way from the revision the server names (in the new group for a move).
A restart that finds the events compacted away ends the watch with :class:`CompactedError`.
Streams that keep failing without delivering anything get one request timeout in all, then
the error is raised (and the next call tries again).

Responses are read by a task of the stream into a bounded queue, so waiting for an event
can be cancelled (a timeout) without losing one: the next call carries on where the last
stopped.
"""

import asyncio
import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Deque, Dict, FrozenSet, Iterable, Optional, Tuple, Union

import grpc
import grpc.aio

from warden import _convert
from warden._proto import warden_pb2 as pb
from warden._proto import warden_pb2_grpc as pb_grpc
from warden._retry import Backoff, CallKind, is_transient, within
from warden.errors import (
    InvalidArgumentError,
    MovedError,
    NotLeaderError,
    ProtocolError,
    SlowWatcherError,
    TransportError,
    UnavailableError,
    WardenError,
    from_detail,
)
from warden.types import ChildrenPage, EventKind, Node, OneShotKind, Stat, WatchEvent

if TYPE_CHECKING:
    from warden.client import AsyncClient

__all__ = ["AsyncWatcher", "AsyncOneShotWatch", "WatchOptions", "OneShotRead"]

#: Responses read ahead of the consumer per stream; beyond it the stream is not read (the
#: server's bounded queue then cancels a watch that cannot keep up as a slow watcher, which
#: resumes).
RESPONSES_QUEUED_MAX = 64

#: What a one-shot watch read when it was set: a DATA watch's node, an EXISTS watch's stat
#: (None: missing), a CHILDREN watch's first page of children.
OneShotRead = Union[Node, Optional[Stat], ChildrenPage]


def is_at_or_below(path: str, prefix: str) -> bool:
    """Whether `path` is `prefix` or below it, by segments (`/a/b` is below `/a`, `/ab` is
    not)."""
    return prefix == "/" or path == prefix or path.startswith(prefix.rstrip("/") + "/")


@dataclass(frozen=True)
class WatchOptions:
    """What a persistent watch reports."""

    #: The node watched.
    path: str
    #: Also every node below it.
    recursive: bool
    #: First revision to report (inclusive); 0: changes after the watch is registered.
    start_revision: int
    #: Kinds of events reported.
    kinds: FrozenSet[EventKind]
    #: Include each node's previous stat and data (`WatchEvent.prev`).
    prev_data: bool

    @staticmethod
    def of(path: str, *, recursive: bool, start_revision: int, kinds: Optional[Iterable[EventKind]], prev_data: bool) -> "WatchOptions":
        """Checked options."""
        chosen = frozenset(EventKind) if kinds is None else frozenset(kinds)
        if not all(isinstance(kind, EventKind) for kind in chosen) or not chosen:
            raise InvalidArgumentError(f"kinds is a non-empty set of warden.EventKind, not {kinds!r}")
        return WatchOptions(
            _convert.path_of(path), bool(recursive), _convert.u64(start_revision, "start_revision"), chosen, bool(prev_data)
        )

    def create(self, start_revision: int, group_start_revisions: Dict[int, int]) -> pb.WatchCreate:
        """The creation of this watch from `start_revision` (in the group serving its path)
        and `group_start_revisions` (per group, that serving the path included)."""
        return pb.WatchCreate(
            path=self.path,
            kind="PERSISTENT",
            recursive=self.recursive,
            start_revision=start_revision,
            no_create=EventKind.CREATED not in self.kinds,
            no_change=EventKind.CHANGED not in self.kinds,
            no_delete=EventKind.DELETED not in self.kinds,
            prev_data=self.prev_data,
            group_start_revisions=group_start_revisions,
        )


class _Stream:
    """One open watch stream and the task reading it into a bounded queue (items: a
    response; None at its end; a grpc error when it failed)."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.queue: "asyncio.Queue[Any]" = asyncio.Queue(maxsize=RESPONSES_QUEUED_MAX)
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                response = await self.call.read()
                if response is grpc.aio.EOF:
                    await self.queue.put(None)
                    return
                await self.queue.put(response)
        except grpc.aio.AioRpcError as error:
            await self.queue.put(error)
        except Exception as error:  # the stream is broken either way: the watcher reopens it
            await self.queue.put(error)

    def close(self) -> None:
        self.reader.cancel()
        self.call.cancel()


async def _open_stream(
    client: "AsyncClient", stub: pb_grpc.WardenStub, create: pb.WatchCreate, deadline: float
) -> Tuple[grpc.aio.StreamStreamCall, pb.WatchResponse]:
    """Opens a `Watch` stream with one create request and waits (until `deadline`) for the
    server's answer to it; returns the stream and its `created` response. A refusal raises
    the server's error (UNAVAILABLE is retried by the caller, COMPACTED is final)."""
    loop = asyncio.get_running_loop()
    call = stub.Watch(metadata=client._metadata)
    try:
        await call.write(pb.WatchRequest(create=create))
        first = await asyncio.wait_for(call.read(), max(0.0, deadline - loop.time()))
        if first is grpc.aio.EOF:
            raise TransportError("the watch stream ended before the watch was created")
        if first.HasField("created"):
            if first.created.start_revision == 0:
                raise ProtocolError("a watch was created without a start revision")
            return call, first
        if first.HasField("canceled") and first.canceled.HasField("error"):
            raise from_detail(first.canceled.error)
        raise ProtocolError("the first response of a watch neither created nor refused it")
    except BaseException:
        call.cancel()
        raise


class _Resumable:
    """A watch on a stream of its own that resumes where it stopped (see the module)."""

    def __init__(self, client: "AsyncClient", path: str) -> None:
        self._client = client
        self._path = path
        #: The group serving the watched path (0 until the server first answered).
        self._owner = 0
        #: Per group: the first revision not yet received.
        self._next_revisions: Dict[int, int] = {}
        self._stream: Optional[_Stream] = None
        #: The watch is over (cancelled, or failed for good).
        self._ended = False
        self._backoff = Backoff()
        #: Since when (loop clock) streams have failed without delivering anything.
        self._broken_since: Optional[float] = None

    def _create(self) -> pb.WatchCreate:
        raise NotImplementedError

    def _started(self, created: pb.WatchResponse) -> None:
        """A stream's `created` response (after the first one, for a resumed watch)."""

    def _advance(self, group: int, revision: int) -> None:
        """Raises group `group`'s resume revision to `revision` (never lowers it)."""
        self._next_revisions[group] = max(self._next_revisions.get(group, 0), revision)

    async def _connect(self, timeout_s: float) -> None:
        """Opens a stream and registers the watch from the resume revisions."""
        create = self._create()
        call, first = await self._client._retrying(
            CallKind.IDEMPOTENT, timeout_s, lambda stub, deadline: _open_stream(self._client, stub, create, deadline)
        )
        if first.header.group_id:
            self._owner = first.header.group_id
        self._advance(self._owner, first.created.start_revision)
        for group, revision in first.created.start_revisions.items():
            self._advance(group, revision)
        self._stream = _Stream(call)
        self._started(first)

    async def _reconnect(self) -> None:
        """Reopens a broken stream after a backoff pause; streams that keep failing without
        delivering anything get one request timeout in all."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self._backoff.next_pause_s())
        if self._broken_since is None:
            self._broken_since = loop.time()
        left_s = self._client.request_timeout_s - (loop.time() - self._broken_since)
        try:
            await self._connect(max(0.0, left_s))
        except WardenError as error:
            self._broken_since = None
            self._ended = not is_transient(error)
            raise

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _canceled(self, canceled: pb.WatchCanceled) -> None:
        """The server ended the watch: resumes from where it says if the reason passes,
        else ends (raising the reason, if any)."""
        self._drop_stream()
        if not canceled.HasField("error"):
            self._ended = True
            return
        error = from_detail(canceled.error)
        if not isinstance(error, (SlowWatcherError, UnavailableError, NotLeaderError, MovedError)):
            self._ended = True
            raise error
        self._advance(self._owner, canceled.resume_revision)
        for group, revision in canceled.resume_revisions.items():
            self._advance(group, revision)
        if isinstance(error, MovedError):
            # Nothing in a moved subtree changed between the move's revision in the old group
            # and the new group's first one, so the new group resumes from it too, and owns
            # the watched path if that moved. A group watched already keeps its own place.
            to_group = error.moved_to_group
            if to_group not in self._next_revisions:
                self._advance(to_group, canceled.resume_revision)
            if is_at_or_below(self._path, error.path):
                self._owner = to_group

    async def _response(self) -> Optional[pb.WatchResponse]:
        """The next response of the stream, reopening it when broken; None when the watch
        ended or the stream broke (the caller looks again)."""
        if self._ended:
            return None
        if self._stream is None:
            await self._reconnect()
            return None
        item = await self._stream.queue.get()
        if isinstance(item, pb.WatchResponse):
            if item.HasField("canceled"):
                self._canceled(item.canceled)
                return None
            self._broken_since = None
            self._backoff = Backoff()
            return item
        self._drop_stream()
        return None

    def _group_of(self, response: pb.WatchResponse) -> int:
        return response.header.group_id or self._owner

    async def close(self) -> None:
        """Cancels the watch (closes its stream). Idempotent."""
        self._ended = True
        self._drop_stream()


class AsyncWatcher(_Resumable):
    """A running watch: its events one at a time, in revision order, resumed across broken
    streams and routers. Iterate it (`async for event in watcher`) or call :meth:`next`;
    one consumer at a time. Close it with :meth:`close` (or `async with`)."""

    def __init__(self, client: "AsyncClient", options: WatchOptions) -> None:
        super().__init__(client, options.path)
        self._options = options
        #: Events of the last response not yet returned (one response's worth at most).
        self._buffered: Deque[WatchEvent] = collections.deque()

    @staticmethod
    async def _open(client: "AsyncClient", options: WatchOptions) -> "AsyncWatcher":
        watcher = AsyncWatcher(client, options)
        await watcher._connect(client.request_timeout_s)
        return watcher

    @property
    def options(self) -> WatchOptions:
        """What the watch reports."""
        return self._options

    @property
    def resume_revisions(self) -> Dict[int, int]:
        """Per group: the revision the watch would resume from (every event of the group
        before it has been received)."""
        return dict(self._next_revisions)

    def _create(self) -> pb.WatchCreate:
        start = self._next_revisions.get(self._owner, self._options.start_revision)
        # Every group's, the owner's included: the path may be served by another group now,
        # and a group the watched subtree moved into checks that none of its events in the
        # group it came from were missed.
        return self._options.create(start, dict(self._next_revisions))

    async def next(self, timeout_s: Optional[float] = None) -> Optional[WatchEvent]:
        """The next event; None once the watch ended (cancelled) without an error. Waits as
        long as no event comes, or `timeout_s` (then :class:`DeadlineExceededError`, and no
        event is lost: the next call carries on)."""
        return await within(self._next, timeout_s)

    async def _next(self) -> Optional[WatchEvent]:
        while True:
            if self._buffered:
                return self._buffered.popleft()
            if self._ended:
                return None
            response = await self._response()
            if response is not None:
                self._absorb(response)

    def _absorb(self, response: pb.WatchResponse) -> None:
        """Takes one response's events (only revisions not received yet: a server never
        repeats one; this makes sure)."""
        group = self._group_of(response)
        if response.progress and response.HasField("header"):
            self._advance(group, response.header.revision + 1)
        try:
            events = [_convert.watch_event(event, group) for event in response.events]
        except WardenError:
            self._drop_stream()
            self._ended = True
            raise
        first_new = self._next_revisions.get(group, 0)
        for event in events:
            if event.revision >= first_new:
                self._advance(group, event.revision + 1)
                self._buffered.append(event)

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        event = await self.next()
        if event is None:
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> "AsyncWatcher":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncOneShotWatch(_Resumable):
    """ZooKeeper's one-shot watch, set atomically with a read: :attr:`read` is what was
    read, :meth:`wait` returns the one event that fires it (the first change after the read).
    Resumes across broken streams from the revision after the read, so the change that fires
    it is never missed."""

    def __init__(self, client: "AsyncClient", path: str, kind: OneShotKind, consistency: str) -> None:
        super().__init__(client, path)
        self._kind = kind
        self._consistency = consistency
        self._read: OneShotRead = None
        self._revision = 0
        self._fired: Optional[WatchEvent] = None

    @staticmethod
    async def _open(client: "AsyncClient", path: str, kind: OneShotKind, consistency: str) -> "AsyncOneShotWatch":
        if not isinstance(kind, OneShotKind):
            raise InvalidArgumentError(f"kind is a warden.OneShotKind, not {kind!r}")
        watch = AsyncOneShotWatch(client, path, kind, consistency)
        await watch._connect(client.request_timeout_s)
        return watch

    @property
    def kind(self) -> OneShotKind:
        """What fires the watch."""
        return self._kind

    @property
    def read(self) -> OneShotRead:
        """What was read when the watch was set: the node (DATA), its stat or None
        (EXISTS), the first page of its children (CHILDREN)."""
        return self._read

    @property
    def revision(self) -> int:
        """The revision of the read: the watch fires on the first change after it."""
        return self._revision

    def _create(self) -> pb.WatchCreate:
        if not self._next_revisions:
            return pb.WatchCreate(path=self._path, kind=self._kind.name, read=True, consistency=self._consistency)
        # Resumed: from the first revision not yet seen, without a read.
        return pb.WatchCreate(path=self._path, kind=self._kind.name, start_revision=self._next_revisions[self._owner])

    def _started(self, created: pb.WatchResponse) -> None:
        if self._revision:
            return
        self._revision = created.header.revision
        read = created.created.WhichOneof("read")
        if read == "get":
            self._read = _convert.node(self._path, created.created.get.data, created.created.get)
        elif read == "exists":
            exists = created.created.exists
            self._read = _convert.stat(exists.stat) if exists.HasField("stat") else None
        elif read == "children":
            self._read = _convert.children_page(created.created.children, False)
        else:
            raise ProtocolError("a one-shot watch set with a read answered no read")

    async def wait(self, timeout_s: Optional[float] = None) -> Optional[WatchEvent]:
        """The event that fired the watch (the first of its revision); None if the watch was
        cancelled first. :class:`DeadlineExceededError` after `timeout_s` (the watch stays
        set: wait again)."""
        return await within(self._wait, timeout_s)

    async def _wait(self) -> Optional[WatchEvent]:
        while True:
            if self._fired is not None:
                return self._fired
            if self._ended:
                return None
            response = await self._response()
            if response is None:
                continue
            group = self._group_of(response)
            if response.progress and response.HasField("header"):
                self._advance(group, response.header.revision + 1)
            if response.events:
                self._fired = _convert.watch_event(response.events[0], group)
                self._ended = True
                self._drop_stream()

    async def __aenter__(self) -> "AsyncOneShotWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
