"""Locks held by a session (the Rust client's `lock.rs`): :class:`AsyncLockGuard`.

A lock is a node whose children are its waiters (ephemeral-sequential nodes of the waiting
sessions), granted in FIFO order. `Lock` creates the session's waiter and, when asked,
waits server-side until it holds or the wait times out. Each call carries a request id, so
resending it finds the same waiter instead of queueing a second one.

The server caps one call's wait (at its request timeout, 5 s by default, and at most 300 s),
so a longer wait is a series of calls with one request id: each asks the server to keep the
waiter queued when its wait ends (`keep_queued`), and the next re-attaches to it, so the
waiter keeps its FIFO place for as long as the session lives and the client keeps waiting.
A wait that ends without the lock removes the waiter (a last try-lock with the same id,
which takes the lock if the waiter holds by then); so does a cancelled wait, or one whose
outcome is unknown (in the background).
"""

import asyncio
import logging
from typing import TYPE_CHECKING, Optional

from warden import _convert
from warden._proto import warden_pb2 as pb
from warden._retry import is_transient
from warden._util import AsyncHeld
from warden.errors import InvalidArgumentError, WardenError
from warden.types import LockMode, Sequencer

if TYPE_CHECKING:
    from warden.client import AsyncClient
    from warden.session import AsyncSession

__all__ = ["AsyncLockGuard", "LOCK_DELAY_MAX_S"]

LOG = logging.getLogger("warden")

#: Longest wait of one `Lock` call (the server refuses longer ones).
LOCK_WAIT_PER_CALL_MAX_S = 300.0
#: Longest lock-delay (the server's limit).
LOCK_DELAY_MAX_S = 60.0


class AsyncLockGuard(AsyncHeld):
    """A held lock. Released by :meth:`unlock` (or on leaving `async with`); lost if its
    session ends. Send :attr:`fencing_token` with every write the lock protects, and have
    the resource refuse stale tokens (:class:`warden.FenceGuard`)."""

    def __init__(self, session: "AsyncSession", sequencer: Sequencer) -> None:
        self._session = session
        self._sequencer = sequencer
        self._released = False

    @property
    def fencing_token(self) -> int:
        """The fencing token to send with every write the lock protects: higher than every
        token issued for this lock path before."""
        return self._sequencer.token

    @property
    def sequencer(self) -> Sequencer:
        """The hold's sequencer (to pass to a resource that checks it with the server)."""
        return self._sequencer

    @property
    def path(self) -> str:
        """The lock's path."""
        return self._sequencer.path

    def is_valid(self) -> bool:
        """Whether the hold can be relied on: false once released, or once the session is in
        jeopardy (the server may have ended it) or has ended — the guard's report of a lost
        lock. True again if the session comes back SAFE."""
        return not self._released and self._session.state.is_live

    async def check(self) -> bool:
        """Whether the server says the hold still holds (a linearizable check with the lock
        group's leader)."""
        return await self._session.client.check_sequencer(self._sequencer)

    async def unlock(self) -> None:
        """Releases the lock (no lock-delay applies). Unlocking twice does nothing."""
        if self._released:
            return
        self._released = True
        if self._session.state.has_ended:
            return  # the hold went with the session
        await self._session.client.unlock(self._sequencer)

    async def _give_up(self) -> None:
        await self.unlock()


def _request(
    session: "AsyncSession", path: str, mode: LockMode, lock_delay_ms: int, request_id: int, wait_s: float
) -> pb.LockRequest:
    """A `Lock` call waiting up to `wait_s` (not at all when 0), leaving its waiter queued
    when the wait ends (a longer wait is a series of such calls re-attaching to it)."""
    waiting = wait_s > 0
    return pb.LockRequest(
        path=path,
        session_id=session.id,
        mode=mode.name,
        wait=waiting,
        timeout_ms=_convert.millis(wait_s) if waiting else 0,
        lock_delay_ms=lock_delay_ms,
        request_id=request_id,
        keep_queued=waiting,
    )


async def acquire(
    session: "AsyncSession", path: str, *, mode: LockMode, lock_delay_s: float, wait_s: Optional[float]
) -> Optional[AsyncLockGuard]:
    """Asks for the lock on `path` for `session` until acquired or `wait_s` (None: no limit)
    has passed; None when it was not acquired."""
    _convert.path_of(path)
    if not isinstance(mode, LockMode):
        raise InvalidArgumentError(f"mode is a warden.LockMode, not {mode!r}")
    lock_delay_s = _convert.seconds(lock_delay_s, "lock_delay_s")
    if lock_delay_s > LOCK_DELAY_MAX_S:
        raise InvalidArgumentError(f"lock_delay_s is at most {LOCK_DELAY_MAX_S:.0f} s, not {lock_delay_s}")
    lock_delay_ms = _convert.millis(lock_delay_s) if lock_delay_s else 0
    client = session.client
    loop = asyncio.get_running_loop()
    deadline = None if wait_s is None else loop.time() + wait_s
    # One request id for the whole wait: every call re-attaches to the same waiter.
    request_id = session._next_request_id()
    # From the first call on, a waiter may be queued: a wait that ends otherwise than with an
    # answer (cancelled, or an unknown outcome) abandons it in the background.
    armed = True
    try:
        while True:
            # Zero once the wait is over (or for a try-lock): a try-lock with the same request
            # id takes the lock if the waiter holds by now, and otherwise removes it.
            left_s = LOCK_WAIT_PER_CALL_MAX_S if deadline is None else max(0.0, deadline - loop.time())
            wait = min(left_s, LOCK_WAIT_PER_CALL_MAX_S)
            acquired, sequencer = await client._lock(_request(session, path, mode, lock_delay_ms, request_id, wait))
            if acquired and sequencer is not None:
                armed = False
                return AsyncLockGuard(session, sequencer)
            if wait <= 0:
                armed = False
                return None
            # This call's wait ended with the waiter still queued: wait on in its place.
    except WardenError as error:
        if not is_transient(error):
            armed = False  # refused (the session ended, bad input): no waiter is left behind
        raise
    finally:
        if armed:
            client._tasks.spawn(_abandon(client, _request(session, path, mode, lock_delay_ms, request_id, 0.0)), "abandoning a lock wait")


async def _abandon(client: "AsyncClient", request: pb.LockRequest) -> None:
    """After a `Lock` call whose outcome is unknown or whose caller gave up, makes sure its
    waiter does not stay behind: the same request without waiting finds the waiter if it
    exists, and the server removes it unless it holds, in which case it is unlocked."""
    try:
        acquired, sequencer = await client._lock(request)
        if acquired and sequencer is not None:
            await client.unlock(sequencer)
    except WardenError as error:
        LOG.debug("abandoning a lock request on %s: %s", request.path, error)
