"""Sessions, in Chubby's model (the Rust client's `session.rs`). A session is a lease the
server keeps while the client renews it; its ephemeral nodes and lock holds end with it.

Each :class:`AsyncSession` renews its lease from its own task, every third of the TTL, so
application work never delays a keepalive. The client keeps a *local lease*: the instant a
successful keepalive was sent plus the time the server said it still gives the session — an
under-estimate of the server's own lease, since the server started counting later (when the
keepalive reached it); a leader answers only once a quorum confirmed it still leads, and a
new leader gives every session a full TTL. The state (:class:`SessionState`) follows:

- CONNECTED while keepalives succeed;
- JEOPARDY once the local lease lapses without a successful keepalive: the server may
  already have ended the session, so what it protects (a lock guard, an ephemeral node)
  must not be relied on; keepalives go on;
- SAFE when a keepalive succeeds during jeopardy: the session survived;
- EXPIRED when the server says the session has ended, or the grace period (45 s by
  default) passes in jeopardy; CLOSED once closed or abandoned. Both are final.

A keepalive may take until the local lease lapses (at least a third of the TTL): one
queued behind a busy node's work still renews the lease when it gets there.

Callbacks (`on_jeopardy`, `on_safe`, `on_expired`, :meth:`AsyncSession.add_listener`) run on
the event loop: plain functions are called, coroutine functions scheduled; an exception in
one is logged and does not stop the session. With the synchronous :class:`warden.Client`
they run on a callback thread of their own, so they may call the client.
"""

import asyncio
import inspect
import itertools
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, Optional, Tuple

from warden import _convert
from warden._retry import Backoff, is_transient
from warden._util import Pending
from warden.errors import InvalidArgumentError, SessionExpiredError, WardenError
from warden.types import LockMode, SessionInfo, SessionState

if TYPE_CHECKING:
    from warden.client import AsyncClient
    from warden.lock import AsyncLockGuard

__all__ = ["AsyncSession", "DEFAULT_GRACE_PERIOD_S", "StateListener"]

LOG = logging.getLogger("warden")

#: How long a session in jeopardy keeps trying before it is given up (Chubby's 45 s).
DEFAULT_GRACE_PERIOD_S = 45.0

#: A callback of session state changes: given the new state.
StateListener = Callable[[SessionState], Any]


class AsyncSession:
    """An open session. Close it with :meth:`close` (or `async with`): its ephemerals and
    locks go at once."""

    def __init__(self, client: "AsyncClient", session_id: int, ttl_s: float, grace_period_s: float, sent_at: float) -> None:
        self._client = client
        self._id = session_id
        self._ttl_s = ttl_s
        self._grace_period_s = grace_period_s
        self._state = SessionState.CONNECTED
        #: The local lease's end, on the loop's (monotonic) clock.
        self._lease_deadline = sent_at + ttl_s
        self._listeners: List[StateListener] = []
        self._changed = asyncio.Event()
        self._request_ids = itertools.count(1)
        self._task: Optional["asyncio.Task[None]"] = None

    @staticmethod
    async def _open(
        client: "AsyncClient",
        ttl_s: float,
        *,
        grace_period_s: float,
        path_hint: Optional[str],
        on_jeopardy: Optional[StateListener],
        on_safe: Optional[StateListener],
        on_expired: Optional[StateListener],
    ) -> "AsyncSession":
        ttl_s = _convert.seconds(ttl_s, "ttl_s", allow_zero=False)
        grace_period_s = _convert.seconds(grace_period_s, "grace_period_s")
        if path_hint is not None:
            _convert.path_of(path_hint, "path_hint")
        for name, callback in (("on_jeopardy", on_jeopardy), ("on_safe", on_safe), ("on_expired", on_expired)):
            if callback is not None and not callable(callback):
                raise InvalidArgumentError(f"{name} is a callable, not {callback!r}")
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        session_id, granted_s = await client._create_session(ttl_s, path_hint)
        if granted_s <= 0:
            raise WardenError(f"session {session_id:#x} was granted no TTL")
        session = AsyncSession(client, session_id, granted_s, grace_period_s, sent_at)
        for state, callback in (
            (SessionState.JEOPARDY, on_jeopardy),
            (SessionState.SAFE, on_safe),
            (SessionState.EXPIRED, on_expired),
        ):
            if callback is not None:
                session.add_listener(_only(state, callback))
        client._sessions[session_id] = session
        session._task = client._tasks.spawn(session._keep_alive(), f"the keepalives of session {session_id:#x}")
        return session

    @property
    def id(self) -> int:
        """The session's id (what ephemeral nodes are created with; its home group is in
        the high 24 bits)."""
        return self._id

    @property
    def ttl_s(self) -> float:
        """The TTL the server granted."""
        return self._ttl_s

    @property
    def state(self) -> SessionState:
        """The session's state now."""
        return self._state

    @property
    def lease_until(self) -> float:
        """When the local lease lapses, on `time.monotonic()`'s clock (the event loop's), as
        of the last acknowledged keepalive: until then the server certainly keeps the
        session, its ephemeral nodes and its locks. Only moves forward."""
        return self._lease_deadline

    @property
    def client(self) -> "AsyncClient":
        """The client the session lives on."""
        return self._client

    def add_listener(self, listener: StateListener) -> None:
        """Calls `listener(state)` on every state change from now on."""
        if not callable(listener):
            raise InvalidArgumentError(f"a listener is a callable, not {listener!r}")
        self._listeners.append(listener)

    async def wait_for(self, *states: SessionState, timeout_s: Optional[float] = None) -> SessionState:
        """Waits until the state is one of `states` (or, with none given, until it changes);
        returns it. :class:`DeadlineExceededError` after `timeout_s`."""
        from warden._retry import within

        start = self._state

        def reached() -> bool:
            return self._state in states if states else self._state != start

        async def wait() -> SessionState:
            while not reached():
                self._changed.clear()
                await self._changed.wait()
            return self._state

        return await within(wait, timeout_s)

    async def info(self) -> SessionInfo:
        """The session's lease and ephemerals as the server sees them."""
        return await self._client.session_info(self._id)

    def lock(self, path: str, *, mode: LockMode = LockMode.EXCLUSIVE, lock_delay_s: float = 0.0) -> "Pending[AsyncLockGuard]":
        """Acquires the lock on `path`, waiting as long as it takes (for as long as the
        session lives) in its FIFO place in the queue; raises :class:`SessionExpiredError` if
        the session ends first. `mode` SHARED shares it with other shared holders.
        `lock_delay_s` (at most the cluster's `lock_delay_ms_max`, 60 s by default) is
        Chubby's lock-delay: if this session expires while holding (rather than unlocking),
        nobody new gets the lock for that long.

        Await the result for the guard, or use it in `async with` (unlocked on exit)."""
        return Pending(self._lock(path, mode, lock_delay_s))

    async def _lock(self, path: str, mode: LockMode, lock_delay_s: float) -> "AsyncLockGuard":
        from warden.lock import acquire

        guard = await acquire(self, path, mode=mode, lock_delay_s=lock_delay_s, wait_s=None)
        assert guard is not None, "a wait without deadline returned without the lock"
        return guard

    async def try_lock(
        self, path: str, *, mode: LockMode = LockMode.EXCLUSIVE, lock_delay_s: float = 0.0, wait_s: float = 0.0
    ) -> "Optional[AsyncLockGuard]":
        """Acquires the lock on `path` if it is free now (`wait_s` 0: a try-lock, which
        changes nothing when the lock is held), or within `wait_s`; None when not acquired."""
        from warden.lock import acquire

        return await acquire(self, path, mode=mode, lock_delay_s=lock_delay_s, wait_s=_convert.seconds(wait_s, "wait_s"))

    async def close(self) -> None:
        """Closes the session now: its ephemerals and locks go at once (no lock-delay).
        Closing a closed session does nothing; closing one that expired raises
        :class:`SessionExpiredError`."""
        self._stop()
        left = self._end(SessionState.CLOSED)
        if left is None:
            if self._state == SessionState.EXPIRED:
                raise SessionExpiredError(f"session {self._id:#x} has expired")
            return
        await self._client.close_session(self._id)

    def abandon(self) -> None:
        """Stops the keepalives and lets the session go without closing it, as a process that
        died would: the server expires it once its lease lapses, deleting its ephemerals, and
        the locks it held enter their lock-delay (a close frees them at once). For tests of
        what a client's crash does."""
        self._stop()
        self._end(SessionState.CLOSED)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.close()
        except SessionExpiredError:
            pass  # what the body held is gone already; the listeners said so

    async def _close_quietly(self) -> None:
        try:
            await self.close()
        except (WardenError, asyncio.CancelledError) as error:
            LOG.debug("closing session %#x: %s", self._id, error)

    def _next_request_id(self) -> int:
        """A request id not used before by this session (locks are deduplicated by session
        and request id)."""
        return next(self._request_ids)

    def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._client._sessions.pop(self._id, None)

    # -- the state machine ------------------------------------------------------------------

    def _set(self, state: SessionState) -> None:
        if state == self._state:
            return
        self._state = state
        self._changed.set()
        for listener in list(self._listeners):
            try:
                outcome = listener(state)
                if inspect.isawaitable(outcome):
                    self._client._tasks.spawn(_awaited(outcome), "a session listener")
            except Exception:  # a listener's failure must not stop the keepalives
                LOG.exception("a listener of session %#x failed", self._id)

    def _end(self, last: SessionState) -> Optional[SessionState]:
        """Moves the state to `last` unless it has ended already; returns the state left."""
        if self._state.has_ended:
            return None
        left = self._state
        self._set(last)
        return left

    def _next_change(self) -> Optional[float]:
        """The next instant the state changes by time alone (None: it has ended)."""
        if self._state.is_live:
            return self._lease_deadline
        if self._state == SessionState.JEOPARDY:
            return self._lease_deadline + self._grace_period_s
        return None

    def _lapse(self, now: float) -> None:
        """Applies the passing of time: a lapsed lease is jeopardy; jeopardy past the grace
        period is expiry."""
        if self._state.is_live and now >= self._lease_deadline:
            self._set(SessionState.JEOPARDY)
        elif self._state == SessionState.JEOPARDY and now >= self._lease_deadline + self._grace_period_s:
            self._set(SessionState.EXPIRED)

    def _renewed(self, sent_at: float, remaining_s: float, now: float) -> None:
        """A keepalive sent at `sent_at` was answered: the server gives `remaining_s` from
        then on."""
        self._lease_deadline = max(self._lease_deadline, sent_at + remaining_s)
        if self._lease_deadline > now and self._state == SessionState.JEOPARDY:
            self._set(SessionState.SAFE)

    async def _during(self, awaitable: Awaitable[Any]) -> Tuple[bool, Optional["asyncio.Future[Any]"]]:
        """Runs `awaitable` while keeping the state current; (False, None) if the session
        ended first (the awaitable is then cancelled), else (True, its finished future)."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                change = self._next_change()
                if change is None:
                    task.cancel()
                    return False, None
                done, _ = await asyncio.wait({task}, timeout=max(0.0, change - loop.time()))
                if task in done:
                    return True, task
                self._lapse(loop.time())
        except asyncio.CancelledError:
            task.cancel()
            raise

    async def _keep_alive(self) -> None:
        """Renews every third of the TTL (sooner after failures) until the session ends;
        cancelled when the session is closed or abandoned."""
        loop = asyncio.get_running_loop()
        interval_s = self._ttl_s / 3
        backoff = Backoff()
        next_send = loop.time() + interval_s
        while True:
            alive, _ = await self._during(asyncio.sleep(max(0.0, next_send - loop.time())))
            if not alive:
                return
            sent_at = loop.time()
            timeout_s = max(self._lease_deadline - sent_at, interval_s)
            alive, answered = await self._during(self._client.keep_alive(self._id, timeout_s))
            if not alive or answered is None:
                return
            try:
                lease = answered.result()
            except SessionExpiredError:
                self._end(SessionState.EXPIRED)
                return
            except WardenError as error:
                LOG.debug("keepalive of session %#x failed (%s): %s", self._id, "transient" if is_transient(error) else "refused", error)
                next_send = loop.time() + backoff.next_pause_s()
                continue
            if not lease.alive:
                self._end(SessionState.EXPIRED)
                return
            self._renewed(sent_at, lease.remaining_ms / 1000.0, loop.time())
            backoff = Backoff()
            next_send = sent_at + interval_s


def _only(state: SessionState, callback: StateListener) -> StateListener:
    """A listener calling `callback(state)` when the session enters `state`."""

    def listener(entered: SessionState) -> Any:
        if entered == state:
            return callback(entered)
        return None

    return listener


async def _awaited(outcome: Awaitable[Any]) -> None:
    await outcome
