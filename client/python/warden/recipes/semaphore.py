"""A counting semaphore (the Rust client's `recipes/semaphore.rs`; Curator
`InterProcessSemaphoreV2`): at most `permits` sessions hold a permit of one path at a time.

- `path/lock` is a server lock that serialises acquirers: it queues them FIFO and wakes only
  the next one — waiters do not herd;
- `path/leases/lease-…` are the permits: ephemeral-sequential nodes of their holders;
- the one acquirer holding `path/lock` counts the leases; while there are `permits` or more
  it waits for a deletion below `path/leases` (it alone watches them); then it creates its
  lease in a transaction that requires its lock waiter node to still exist, so an acquirer
  whose lock was lost (its session expired while it paused) cannot add a lease beside the
  next acquirer's; then it releases `path/lock`.

So the number of leases never exceeds `permits`, and a release wakes one process.
"""

import logging

from warden import _convert
from warden._util import AsyncHeld, Pending
from warden.errors import InvalidArgumentError, ProtocolError, SessionExpiredError, WardenError
from warden.lock import AsyncLockGuard
from warden.recipes._common import children, delete_if_present, ensure_node, join, watch_ended, while_alive
from warden.session import AsyncSession
from warden.sync import Session, _Fenced, _Runner
from warden.txn import Compare, Txn, TxnOp
from warden.types import Created, EventKind

__all__ = ["AsyncSemaphore", "AsyncPermit", "Semaphore", "Permit"]

LOG = logging.getLogger("warden")

#: Name prefix of lease nodes.
LEASE_PREFIX = "lease-"


class AsyncSemaphore:
    """A semaphore of `permits` permits at `path`, acquired by one session. Every user of one
    path must give the same number."""

    def __init__(self, session: AsyncSession, path: str, permits: int) -> None:
        if isinstance(permits, bool) or not isinstance(permits, int) or permits < 1:
            raise InvalidArgumentError(f"a semaphore has at least one permit, not {permits!r}")
        self._session = session
        self._path = _convert.path_of(path)
        self._permits = permits

    @property
    def permits(self) -> int:
        """How many sessions may hold a permit at once."""
        return self._permits

    def acquire(self) -> "Pending[AsyncPermit]":
        """Waits for a permit (as long as the session lives). Await the result, or use it in
        `async with` (released on exit)."""
        return Pending(self._acquire())

    async def _acquire(self) -> "AsyncPermit":
        client = self._session.client
        leases = join(self._path, "leases")
        await ensure_node(client, leases)
        turn = await self._session.lock(join(self._path, "lock"))
        try:
            return await while_alive(self._session, self._take_lease(leases, turn))
        finally:
            try:
                await turn.unlock()
            except WardenError as error:
                LOG.debug("releasing the turn of semaphore %s: %s", self._path, error)

    async def _take_lease(self, leases: str, turn: AsyncLockGuard) -> "AsyncPermit":
        """With the turn held: waits until fewer than `permits` leases exist, then creates one."""
        client = self._session.client
        # Registered before counting: no release after the count is missed.
        async with client.watch(leases, recursive=True, kinds={EventKind.DELETED}) as released:
            while sum(1 for child in await children(client, leases) if child.name.startswith(LEASE_PREFIX)) >= self._permits:
                if await released.next() is None:
                    raise watch_ended(leases)
        txn = (
            Txn()
            .when(Compare.exists(turn.sequencer.waiter, True))
            .then(TxnOp.create(join(leases, LEASE_PREFIX), b"", session=self._session, sequential=True))
        )
        result = await client.txn(txn)
        if not result.succeeded:
            raise SessionExpiredError(f"the turn of semaphore {self._path} was lost")
        lease = result.results[0]
        if not isinstance(lease, Created):
            raise ProtocolError(f"a lease creation returned {lease!r}")
        return AsyncPermit(self._session, lease.path, lease.stat.create_revision)


class AsyncPermit(AsyncHeld):
    """A permit of a semaphore: an ephemeral lease node. Released by :meth:`release` (or on
    leaving `async with`), or when the session ends; while the session is in jeopardy it may
    already be gone (:meth:`is_valid` is false)."""

    def __init__(self, session: AsyncSession, path: str, token: int) -> None:
        self._session = session
        self._path = path
        self._token = token
        self._released = False

    @property
    def fencing_token(self) -> int:
        """The lease's create revision: grows with every permit granted at this semaphore."""
        return self._token

    @property
    def path(self) -> str:
        """The lease node."""
        return self._path

    def is_valid(self) -> bool:
        """Whether the permit can be relied on (the session is alive, not released)."""
        return not self._released and self._session.state.is_live

    async def release(self) -> None:
        """Gives the permit back. Idempotent."""
        if self._released:
            return
        self._released = True
        if not self._session.state.has_ended:
            await delete_if_present(self._session.client, self._path)

    async def _give_up(self) -> None:
        await self.release()


class Semaphore:
    """The blocking facade of :class:`AsyncSemaphore`, for a :class:`warden.Session`."""

    def __init__(self, session: Session, path: str, permits: int) -> None:
        self._runner: _Runner = session._runner
        self._async = AsyncSemaphore(session._async, path, permits)

    @property
    def permits(self) -> int:
        """How many sessions may hold a permit at once."""
        return self._async.permits

    def acquire(self) -> "Permit":
        """Waits for a permit (see :meth:`AsyncSemaphore.acquire`); use the result in `with`
        to release it on exit."""
        return Permit(self._runner, self._runner.run(self._async._acquire()))


class Permit(_Fenced[AsyncPermit]):
    """The blocking facade of :class:`AsyncPermit`."""

    def release(self) -> None:
        """Gives the permit back."""
        self._runner.run(self._async.release())

    _release = release
