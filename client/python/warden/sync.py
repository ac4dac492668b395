"""The blocking API: a facade over the asyncio one, not a second implementation. A
:class:`Client` owns a private event loop on a thread of its own; every blocking method runs
the asyncio method's coroutine there (`asyncio.run_coroutine_threadsafe`) and waits for its
result, so both APIs share one implementation of failover, retries, sessions, locks and
watches.

Session callbacks run on a callback thread of the client (in order, one at a time), not on
the loop thread, so a callback may call the blocking client. A blocking method called from
the loop thread itself (from an asyncio callback of this client) raises RuntimeError rather
than deadlock.
"""

import asyncio
import logging
import queue
import threading
from typing import Any, Callable, Coroutine, Dict, Generic, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar

from warden import _convert
from warden.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S, AsyncClient, TlsConfig
from warden.errors import SessionExpiredError, WardenError
from warden.lock import AsyncLockGuard
from warden.session import AsyncSession, StateListener
from warden.txn import Txn, TxnResult
from warden.types import (
    Child,
    ChildrenPage,
    Consistency,
    Created,
    Data,
    EventKind,
    LockInfo,
    LockMode,
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
from warden.watch import AsyncOneShotWatch, AsyncWatcher, OneShotRead, WatchOptions

__all__ = ["Client", "Session", "LockGuard", "Watcher", "OneShotWatch"]

LOG = logging.getLogger("warden")

T = TypeVar("T")

#: Callbacks waiting for the callback thread at most; beyond it one is dropped (and logged):
#: a callback thread this far behind is stuck, and the loop must never block on it.
CALLBACKS_QUEUED_MAX = 10_000


class _Callbacks:
    """The thread session callbacks of a blocking client run on, in order."""

    def __init__(self) -> None:
        self._queue: "queue.Queue[Optional[Tuple[Callable[[Any], Any], Any]]]" = queue.Queue(maxsize=CALLBACKS_QUEUED_MAX)
        self._thread = threading.Thread(target=self._run, name="warden-callbacks", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            callback, argument = item
            try:
                callback(argument)
            except Exception:  # one failing callback must not stop the others
                LOG.exception("a warden callback failed")

    def wrap(self, callback: Callable[[Any], Any]) -> Callable[[Any], None]:
        """A function that hands `callback`'s call to this thread."""

        def hand_over(argument: Any) -> None:
            try:
                self._queue.put_nowait((callback, argument))
            except queue.Full:
                LOG.error("dropped a warden callback: %d are waiting for the callback thread", CALLBACKS_QUEUED_MAX)

        return hand_over

    def stop(self) -> None:
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            return  # daemon thread: it goes with the process
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=DEFAULT_CONNECT_TIMEOUT_S)


class _Runner:
    """A private event loop on a daemon thread, and the callback thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="warden-loop", daemon=True)
        self._thread.start()
        self.callbacks = _Callbacks()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs `coroutine` on the loop and waits for its result (a KeyboardInterrupt while
        waiting cancels it)."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a blocking warden call on the client's own event loop thread would deadlock: use the asyncio API there")
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def call(self, function: Callable[[], T]) -> T:
        """Runs a plain function on the loop thread (for what touches the loop's state)."""

        async def called() -> T:
            return function()

        return self.run(called())

    def stop(self) -> None:
        """Stops the loop and the callback thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=DEFAULT_CONNECT_TIMEOUT_S)
            if not self._thread.is_alive():
                self.loop.close()
        self.callbacks.stop()


A = TypeVar("A")
H = TypeVar("H", bound="_Held[Any]")


class _Facade(Generic[A]):
    """A blocking handle on an asyncio object: its coroutines run on the client's loop
    thread (`_runner`)."""

    def __init__(self, runner: _Runner, inner: A) -> None:
        self._runner = runner
        self._async = inner


class _Held(_Facade[A]):
    """A blocking handle on something held until given up (a lock, a leadership, a
    membership, a permit): given up on leaving `with`, where a failure to give it up is
    raised unless the block itself failed."""

    def _release(self) -> None:
        raise NotImplementedError

    def __enter__(self: H) -> H:
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        try:
            self._release()
        except WardenError:
            if error is None:
                raise
            LOG.debug("giving up %r after an error in its block", self, exc_info=True)


class _Fenced(_Held[A]):
    """A blocking handle on something held with a fencing token (a lock hold, a leadership,
    a semaphore permit)."""

    @property
    def fencing_token(self) -> int:
        """The fencing token to send with every action the hold protects: it grows from each
        holder to the next, so a resource can refuse a stale holder."""
        return self._async.fencing_token  # type: ignore[attr-defined, no-any-return]

    @property
    def path(self) -> str:
        """The node held: the lock, the candidate or the lease."""
        return self._async.path  # type: ignore[attr-defined, no-any-return]

    def is_valid(self) -> bool:
        """Whether the hold can be relied on (false once given up, or once the session is in
        jeopardy or has ended)."""
        return self._async.is_valid()  # type: ignore[attr-defined, no-any-return]


class Client:
    """A blocking connection to a Warden cluster through its routers: the methods of
    :class:`AsyncClient`, each waiting for its answer. Connects at construction (see
    :meth:`AsyncClient.connect` for the arguments); close it with :meth:`close` (or
    `with`). Thread-safe."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        tls: Optional[TlsConfig] = None,
        token: Optional[str] = None,
        consistency: Consistency = Consistency.LINEARIZABLE,
    ) -> None:
        runner = _Runner()
        try:
            inner = runner.run(
                AsyncClient._connect(
                    endpoints,
                    request_timeout_s=request_timeout_s,
                    connect_timeout_s=connect_timeout_s,
                    tls=tls,
                    token=token,
                    consistency=consistency,
                )
            )
        except BaseException:
            runner.stop()
            raise
        self._runner = runner
        self._async = inner
        self._owner = True

    @classmethod
    def _sharing(cls, runner: _Runner, inner: AsyncClient) -> "Client":
        client = cls.__new__(cls)
        client._runner = runner
        client._async = inner
        client._owner = False
        return client

    def with_consistency(self, consistency: Consistency) -> "Client":
        """The same client (same connections and loop) whose reads use `consistency` by
        default. Closing it closes nothing: close the client it came from."""
        return Client._sharing(self._runner, self._async.with_consistency(consistency))

    def with_request_timeout(self, request_timeout_s: float) -> "Client":
        """The same client whose calls each have `request_timeout_s` as their deadline (see
        :meth:`AsyncClient.with_request_timeout`). Closing it closes nothing."""
        return Client._sharing(self._runner, self._async.with_request_timeout(request_timeout_s))

    @property
    def async_client(self) -> AsyncClient:
        """The asyncio client underneath (usable only on this client's loop thread)."""
        return self._async

    @property
    def request_timeout_s(self) -> float:
        """The deadline of one call, retries included."""
        return self._async.request_timeout_s

    @property
    def endpoints(self) -> List[str]:
        """The routers, in failover order."""
        return self._async.endpoints

    @property
    def current_endpoint(self) -> str:
        """The router calls go to now."""
        return self._async.current_endpoint

    def close(self) -> None:
        """Closes the client (see :meth:`AsyncClient.close`) and stops its threads."""
        if not self._owner:
            return
        self._owner = False
        try:
            self._runner.run(self._async.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def create(
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
        """Creates a node (see :meth:`AsyncClient.create`)."""
        session = session._async if isinstance(session, Session) else session
        return self._runner.run(
            self._async.create(
                path, data, kind=kind, session=session, sequential=sequential, create_parents=create_parents, ttl_s=ttl_s
            )
        )

    def get(self, path: str, *, consistency: Optional[Consistency] = None) -> Node:
        """A node's data and stat (see :meth:`AsyncClient.get`)."""
        return self._runner.run(self._async.get(path, consistency=consistency))

    def exists(self, path: str, *, consistency: Optional[Consistency] = None) -> Optional[Stat]:
        """A node's stat, or None (see :meth:`AsyncClient.exists`)."""
        return self._runner.run(self._async.exists(path, consistency=consistency))

    def set(self, path: str, data: Data, *, expected_version: Optional[int] = None) -> Stat:
        """Replaces a node's data (see :meth:`AsyncClient.set`)."""
        return self._runner.run(self._async.set(path, data, expected_version=expected_version))

    def delete(self, path: str, *, expected_version: Optional[int] = None, recursive: bool = False) -> int:
        """Deletes a node (see :meth:`AsyncClient.delete`)."""
        return self._runner.run(self._async.delete(path, expected_version=expected_version, recursive=recursive))

    def children_page(
        self,
        path: str,
        *,
        start_after: str = "",
        limit: int = 0,
        with_stats: bool = False,
        consistency: Optional[Consistency] = None,
    ) -> ChildrenPage:
        """One page of children (see :meth:`AsyncClient.children_page`)."""
        return self._runner.run(
            self._async.children_page(path, start_after=start_after, limit=limit, with_stats=with_stats, consistency=consistency)
        )

    def children(
        self, path: str, *, with_stats: bool = False, page_size: int = 0, consistency: Optional[Consistency] = None
    ) -> List[Child]:
        """Every child of a node (see :meth:`AsyncClient.children`)."""
        return self._runner.run(self._async.children(path, with_stats=with_stats, page_size=page_size, consistency=consistency))

    def txn(self, txn: Txn) -> TxnResult:
        """Runs a transaction (see :meth:`AsyncClient.txn`)."""
        return self._runner.run(self._async.txn(txn))

    def sync(self, group_id: int = 0) -> int:
        """Waits until the replica answering has applied everything committed (see
        :meth:`AsyncClient.sync`)."""
        return self._runner.run(self._async.sync(group_id))

    def session(
        self,
        ttl_s: float = 10.0,
        *,
        grace_period_s: float = 45.0,
        path_hint: Optional[str] = None,
        on_jeopardy: Optional[StateListener] = None,
        on_safe: Optional[StateListener] = None,
        on_expired: Optional[StateListener] = None,
    ) -> "Session":
        """Opens a session and keeps it alive (see :meth:`AsyncClient.session`); use it in
        `with` to close it on exit. The callbacks run on the client's callback thread."""
        def wrap(callback: Optional[StateListener]) -> Optional[StateListener]:
            return None if callback is None else self._runner.callbacks.wrap(callback)

        opened = self._runner.run(
            AsyncSession._open(
                self._async,
                ttl_s,
                grace_period_s=grace_period_s,
                path_hint=path_hint,
                on_jeopardy=wrap(on_jeopardy),
                on_safe=wrap(on_safe),
                on_expired=wrap(on_expired),
            )
        )
        return Session(self, opened)

    def keep_alive(self, session_id: int, timeout_s: Optional[float] = None) -> SessionLease:
        """Renews a session's lease (see :meth:`AsyncClient.keep_alive`)."""
        return self._runner.run(self._async.keep_alive(session_id, timeout_s))

    def close_session(self, session_id: int) -> int:
        """Ends a session now (see :meth:`AsyncClient.close_session`)."""
        return self._runner.run(self._async.close_session(session_id))

    def session_info(self, session_id: int) -> SessionInfo:
        """A session's lease as its leader sees it (see :meth:`AsyncClient.session_info`)."""
        return self._runner.run(self._async.session_info(session_id))

    def unlock(self, sequencer: Sequencer) -> None:
        """Releases a lock hold by its sequencer (see :meth:`AsyncClient.unlock`)."""
        self._runner.run(self._async.unlock(sequencer))

    def check_sequencer(self, sequencer: Sequencer) -> bool:
        """Whether a sequencer still holds its lock (see :meth:`AsyncClient.check_sequencer`)."""
        return self._runner.run(self._async.check_sequencer(sequencer))

    def lock_info(self, path: str) -> LockInfo:
        """The holders and waiters of a lock (see :meth:`AsyncClient.lock_info`)."""
        return self._runner.run(self._async.lock_info(path))

    def watch(
        self,
        path: str,
        *,
        recursive: bool = False,
        start_revision: int = 0,
        kinds: Optional[Iterable[EventKind]] = None,
        prev_data: bool = False,
    ) -> "Watcher":
        """Starts a watch (see :meth:`AsyncClient.watch`); iterate the result, and close it
        (or use it in `with`)."""
        options = WatchOptions.of(path, recursive=recursive, start_revision=start_revision, kinds=kinds, prev_data=prev_data)
        return Watcher(self._runner, self._runner.run(AsyncWatcher._open(self._async, options)))

    def watch_once(self, path: str, kind: OneShotKind, *, consistency: Optional[Consistency] = None) -> "OneShotWatch":
        """A one-shot watch set with a read (see :meth:`AsyncClient.watch_once`)."""
        level = _convert.consistency(consistency, self._async._consistency)
        return OneShotWatch(self._runner, self._runner.run(AsyncOneShotWatch._open(self._async, _convert.path_of(path), kind, level)))


class Session:
    """A blocking handle on an :class:`AsyncSession` (see there for the states): opened by
    :meth:`Client.session`, closed by :meth:`close` or on leaving `with`."""

    def __init__(self, client: Client, inner: AsyncSession) -> None:
        self._client = client
        self._runner = client._runner
        self._async = inner

    @property
    def async_session(self) -> AsyncSession:
        """The asyncio session underneath (usable only on the client's loop thread)."""
        return self._async

    @property
    def client(self) -> Client:
        """The client the session lives on."""
        return self._client

    @property
    def id(self) -> int:
        """The session's id (what ephemeral nodes are created with)."""
        return self._async.id

    @property
    def ttl_s(self) -> float:
        """The TTL the server granted."""
        return self._async.ttl_s

    @property
    def state(self) -> SessionState:
        """The session's state now."""
        return self._async.state

    @property
    def lease_until(self) -> float:
        """When the local lease lapses, on `time.monotonic()`'s clock (see
        :attr:`AsyncSession.lease_until`)."""
        return self._async.lease_until

    def add_listener(self, listener: StateListener) -> None:
        """Calls `listener(state)` on the client's callback thread on every state change."""
        wrapped = self._runner.callbacks.wrap(listener)
        self._runner.call(lambda: self._async.add_listener(wrapped))

    def wait_for(self, *states: SessionState, timeout_s: Optional[float] = None) -> SessionState:
        """Waits until the state is one of `states` (see :meth:`AsyncSession.wait_for`)."""
        return self._runner.run(self._async.wait_for(*states, timeout_s=timeout_s))

    def info(self) -> SessionInfo:
        """The session's lease and ephemerals as the server sees them."""
        return self._runner.run(self._async.info())

    def lock(self, path: str, *, mode: LockMode = LockMode.EXCLUSIVE, lock_delay_s: float = 0.0) -> "LockGuard":
        """Acquires the lock on `path`, waiting in its FIFO place as long as the session
        lives (see :meth:`AsyncSession.lock`); use the guard in `with` to unlock on exit."""
        return LockGuard(self._runner, self._runner.run(self._async._lock(path, mode, lock_delay_s)))

    def try_lock(
        self, path: str, *, mode: LockMode = LockMode.EXCLUSIVE, lock_delay_s: float = 0.0, wait_s: float = 0.0
    ) -> "Optional[LockGuard]":
        """Acquires the lock if free now, or within `wait_s`; None otherwise (see
        :meth:`AsyncSession.try_lock`)."""
        guard = self._runner.run(self._async.try_lock(path, mode=mode, lock_delay_s=lock_delay_s, wait_s=wait_s))
        return None if guard is None else LockGuard(self._runner, guard)

    def close(self) -> None:
        """Closes the session now (see :meth:`AsyncSession.close`)."""
        self._runner.run(self._async.close())

    def abandon(self) -> None:
        """Stops the keepalives without closing the session, as a crashed process would
        (see :meth:`AsyncSession.abandon`)."""
        self._runner.call(self._async.abandon)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        except SessionExpiredError:
            pass  # what the block held is gone already; the callbacks said so


class LockGuard(_Fenced[AsyncLockGuard]):
    """A held lock (see :class:`AsyncLockGuard`); unlocked by :meth:`unlock` or on leaving
    `with`."""

    @property
    def sequencer(self) -> Sequencer:
        """The hold's sequencer."""
        return self._async.sequencer

    def check(self) -> bool:
        """Whether the server says the hold still holds."""
        return self._runner.run(self._async.check())

    def unlock(self) -> None:
        """Releases the lock (no lock-delay applies)."""
        self._runner.run(self._async.unlock())

    _release = unlock

    def __repr__(self) -> str:
        return f"<LockGuard {self.path}>"


class Watcher(_Facade[AsyncWatcher]):
    """A running watch (see :class:`AsyncWatcher`): iterate it (`for event in watcher`) or
    call :meth:`next`; close it (or use it in `with`)."""

    @property
    def options(self) -> WatchOptions:
        """What the watch reports."""
        return self._async.options

    @property
    def resume_revisions(self) -> Dict[int, int]:
        """Per group: the revision the watch would resume from."""
        return self._runner.call(lambda: self._async.resume_revisions)

    def next(self, timeout_s: Optional[float] = None) -> Optional[WatchEvent]:
        """The next event; None once the watch ended (see :meth:`AsyncWatcher.next`)."""
        return self._runner.run(self._async.next(timeout_s))

    def close(self) -> None:
        """Cancels the watch."""
        self._runner.run(self._async.close())

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        event = self.next()
        if event is None:
            raise StopIteration
        return event

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class OneShotWatch(_Facade[AsyncOneShotWatch]):
    """A one-shot watch set with a read (see :class:`AsyncOneShotWatch`)."""

    @property
    def kind(self) -> OneShotKind:
        """What fires the watch."""
        return self._async.kind

    @property
    def read(self) -> OneShotRead:
        """What was read when the watch was set."""
        return self._async.read

    @property
    def revision(self) -> int:
        """The revision of the read."""
        return self._async.revision

    def wait(self, timeout_s: Optional[float] = None) -> Optional[WatchEvent]:
        """The event that fired the watch (see :meth:`AsyncOneShotWatch.wait`)."""
        return self._runner.run(self._async.wait(timeout_s))

    def close(self) -> None:
        """Cancels the watch."""
        self._runner.run(self._async.close())

    def __enter__(self) -> "OneShotWatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
