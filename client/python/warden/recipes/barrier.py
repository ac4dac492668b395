"""Barriers (the Rust client's `recipes/barrier.rs`; Curator `DistributedBarrier` and
`DistributedDoubleBarrier`)."""

import asyncio
from typing import Any, Optional

from warden import _convert
from warden.client import AsyncClient
from warden.recipes._common import (
    await_existence,
    create_sequential,
    delete_if_present,
    ensure_node,
    join,
    queue,
    watch_ended,
    while_alive,
)
from warden.session import AsyncSession
from warden.sync import Client, Session, _Runner
from warden.types import EventKind

__all__ = ["AsyncBarrier", "AsyncDoubleBarrier", "Barrier", "DoubleBarrier"]

#: Name prefix of participant nodes.
PARTICIPANT_PREFIX = "p-"


class AsyncBarrier:
    """A barrier that holds processes back while its node exists: :meth:`set` raises it,
    :meth:`remove` lowers it, :meth:`wait` returns once it is down. The node is persistent:
    a barrier outlives the session of whoever set it."""

    def __init__(self, client: AsyncClient, path: str) -> None:
        self._client = client
        self._path = _convert.path_of(path)

    async def set(self) -> None:
        """Raises the barrier (creates its node; already raised is fine)."""
        await ensure_node(self._client, self._path)

    async def remove(self) -> None:
        """Lowers the barrier: every waiter proceeds."""
        await delete_if_present(self._client, self._path)

    async def wait(self, timeout_s: Optional[float] = None) -> None:
        """Waits until the barrier is down (returns at once if it is not raised); every
        waiter watches the one barrier node: lowering it wakes them all, which is the point.
        :class:`DeadlineExceededError` after `timeout_s`."""
        from warden._retry import within

        await within(lambda: await_existence(self._client, self._path, False), timeout_s)


class AsyncDoubleBarrier:
    """A double barrier: `participants` processes :meth:`enter` (each waits until all have
    entered), compute, then :meth:`leave` (each waits until all have left).

    Participants are ephemeral nodes `path/p-…` of their sessions; the last to enter creates
    `path/ready`, which everyone entering waits for; the last to leave deletes it. A
    participant whose session ends leaves (its node goes). One round at a time per path."""

    def __init__(self, session: AsyncSession, path: str, participants: int) -> None:
        from warden.errors import InvalidArgumentError

        if isinstance(participants, bool) or not isinstance(participants, int) or participants < 1:
            raise InvalidArgumentError(f"a double barrier has at least one participant, not {participants!r}")
        self._session = session
        self._path = _convert.path_of(path)
        self._participants = participants
        #: This participant's node, while entered.
        self._node: Optional[str] = None
        self._entering = asyncio.Lock()

    def _ready(self) -> str:
        return join(self._path, "ready")

    async def enter(self) -> None:
        """Enters, and waits until `participants` processes have entered (or the session
        ends: :class:`SessionExpiredError`)."""
        client = self._session.client
        async with self._entering:
            if self._node is None:
                self._node = (await create_sequential(self._session, self._path, PARTICIPANT_PREFIX, b"")).path
        if len(await queue(client, self._path, PARTICIPANT_PREFIX)) >= self._participants:
            await ensure_node(client, self._ready())
            return
        await while_alive(self._session, await_existence(client, self._ready(), True))

    async def leave(self) -> None:
        """Leaves, and waits until every participant has left. Each departure makes every
        waiting participant count again (O(participants²) reads in all: for small groups)."""
        client = self._session.client
        if self._node is not None:
            node, self._node = self._node, None
            await delete_if_present(client, node)
        async with client.watch(self._path, recursive=True, kinds={EventKind.DELETED}) as departures:
            while await queue(client, self._path, PARTICIPANT_PREFIX):
                if await departures.next() is None:
                    raise watch_ended(self._path)
        await delete_if_present(client, self._ready())


class Barrier:
    """The blocking facade of :class:`AsyncBarrier`."""

    def __init__(self, client: Client, path: str) -> None:
        self._runner: _Runner = client._runner
        self._async = AsyncBarrier(client._async, path)

    def set(self) -> None:
        """Raises the barrier."""
        self._runner.run(self._async.set())

    def remove(self) -> None:
        """Lowers the barrier: every waiter proceeds."""
        self._runner.run(self._async.remove())

    def wait(self, timeout_s: Optional[float] = None) -> None:
        """Waits until the barrier is down."""
        self._runner.run(self._async.wait(timeout_s))


class DoubleBarrier:
    """The blocking facade of :class:`AsyncDoubleBarrier`; also a context manager (enter on
    entry, leave on exit)."""

    def __init__(self, session: Session, path: str, participants: int) -> None:
        self._runner: _Runner = session._runner
        self._async = self._runner.call(lambda: AsyncDoubleBarrier(session._async, path, participants))

    def enter(self) -> None:
        """Enters, and waits until every participant has entered."""
        self._runner.run(self._async.enter())

    def leave(self) -> None:
        """Leaves, and waits until every participant has left."""
        self._runner.run(self._async.leave())

    def __enter__(self) -> "DoubleBarrier":
        self.enter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.leave()
