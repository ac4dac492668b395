"""Leader election (the Rust client's `recipes/election.rs`; etcd `concurrency.Election`,
Curator `LeaderLatch`).

Each campaign is an ephemeral-sequential candidate node `path/c-…` holding the candidate's
value; candidates are ordered by creation (create revision) and the first leads. A
candidate that does not lead watches only the candidate just before it, so when the leader
goes exactly one candidate (the next) is notified — no herd.

The fencing token of a leadership is its candidate's create revision: each new leader's is
higher than every earlier leader's, so a resource that remembers the highest token
(:class:`warden.FenceGuard`) refuses a deposed leader that has not noticed yet. Leadership
ends when the candidate node goes: by `resign`, or when the session ends (expires or
closes); in jeopardy it may already have ended, so `is_valid()` is false.
"""

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator, Optional

from warden import _convert
from warden._retry import within
from warden._util import AsyncHeld, Pending
from warden.client import AsyncClient
from warden.errors import NoNodeError, SessionExpiredError, UnavailableError, WardenError
from warden.recipes._common import await_existence, create_sequential, delete_if_present, queue, watch_ended, while_alive
from warden.session import AsyncSession
from warden.sync import Session, _Facade, _Fenced, _Runner
from warden.types import Data
from warden.watch import AsyncWatcher

__all__ = ["Leader", "AsyncElection", "AsyncLeadership", "AsyncLeaderObserver", "Election", "Leadership", "LeaderObserver"]

LOG = logging.getLogger("warden")

#: Name prefix of candidate nodes.
CANDIDATE_PREFIX = "c-"
#: Times `leader()` reads again when the leader it found went before its value was read.
LEADER_READS_MAX = 16


@dataclass(frozen=True)
class Leader:
    """The leader of an election as others see it."""

    #: The value it campaigned with, or proclaimed since.
    value: bytes
    #: Its fencing token (its candidate node's create revision).
    fencing_token: int
    #: Its candidate node.
    path: str


async def _leader(client: AsyncClient, path: str) -> Optional[Leader]:
    """The first candidate of the election at `path` and its value."""
    for _ in range(LEADER_READS_MAX):
        candidates = await queue(client, path, CANDIDATE_PREFIX)
        if not candidates:
            return None
        first, token = candidates[0]
        try:
            node = await client.get(first)
        except NoNodeError:
            continue
        return Leader(value=node.data, fencing_token=token, path=first)
    raise UnavailableError(f"the leader of {path} changed {LEADER_READS_MAX} times while being read")


class AsyncElection:
    """An election at one path (its candidates are its children), for the candidates of
    one session."""

    def __init__(self, session: AsyncSession, path: str) -> None:
        self._session = session
        self._path = _convert.path_of(path)
        self._notifications = [0]

    @property
    def path(self) -> str:
        """The election's node."""
        return self._path

    def campaign(self, value: Data = b"") -> "Pending[AsyncLeadership]":
        """Enters the election with `value` and waits until this candidate leads. Fails with
        :class:`SessionExpiredError` if the session ends first or the candidate node
        vanishes; the candidate node is removed when the campaign fails or is cancelled.
        Await the result for the leadership, or use it in `async with` (resigned on exit)."""
        return Pending(self._campaign(_convert.data_bytes(value)))

    async def _campaign(self, value: bytes) -> "AsyncLeadership":
        me = await create_sequential(self._session, self._path, CANDIDATE_PREFIX, value)
        try:
            await while_alive(self._session, self._wait_to_lead(me.path))
        except BaseException:
            try:
                await asyncio.shield(delete_if_present(self._session.client, me.path))
            except (WardenError, asyncio.CancelledError) as cleanup:
                LOG.debug("removing the candidate %s of a failed campaign: %s", me.path, cleanup)
            raise
        return AsyncLeadership(self._session, me.path, me.stat.create_revision, me.stat.version)

    async def _wait_to_lead(self, me: str) -> None:
        """Waits until the candidate `me` is the first, watching only its predecessor."""
        client = self._session.client
        while True:
            candidates = await queue(client, self._path, CANDIDATE_PREFIX)
            paths = [path for path, _ in candidates]
            if me not in paths:
                raise SessionExpiredError(f"the candidate {me} is gone")
            place = paths.index(me)
            if place == 0:
                return
            await await_existence(client, paths[place - 1], False, self._notifications)

    async def leader(self) -> Optional[Leader]:
        """The current leader, None when there are no candidates."""
        return await _leader(self._session.client, self._path)

    async def observe(self) -> "AsyncLeaderObserver":
        """A stream of the leader, reporting each change (:meth:`AsyncLeaderObserver.next`)."""
        watcher = await self._session.client.watch(self._path, recursive=True)
        return AsyncLeaderObserver(self._session.client, self._path, watcher)

    @property
    def watch_notifications(self) -> int:
        """Watch events this handle's campaigns received while waiting (one per predecessor
        that went, without other changes): shows a leader change wakes one candidate."""
        return self._notifications[0]


class AsyncLeadership(AsyncHeld):
    """Leadership of an election, won by :meth:`AsyncElection.campaign`."""

    def __init__(self, session: AsyncSession, path: str, token: int, version: int) -> None:
        self._session = session
        self._path = path
        self._token = token
        self._version = version
        self._resigned = False
        self._writing = asyncio.Lock()

    @property
    def fencing_token(self) -> int:
        """The fencing token to send with every action taken as leader."""
        return self._token

    @property
    def path(self) -> str:
        """The candidate node."""
        return self._path

    def is_valid(self) -> bool:
        """Whether the leadership can be relied on: false once resigned, or once the session
        is in jeopardy or has ended."""
        return not self._resigned and self._session.state.is_live

    async def proclaim(self, value: Data) -> None:
        """Publishes a new value as leader: a compare-and-swap of the candidate node's data,
        so it fails (:class:`NoNodeError`) once the leadership is gone, or
        (:class:`BadVersionError`) if someone else wrote the node."""
        async with self._writing:
            stat = await self._session.client.set(self._path, value, expected_version=self._version)
            self._version = stat.version

    async def resign(self) -> None:
        """Gives the leadership up: the candidate node is deleted and the next candidate
        leads. Idempotent."""
        if self._resigned:
            return
        self._resigned = True
        if not self._session.state.has_ended:
            await delete_if_present(self._session.client, self._path)

    async def _give_up(self) -> None:
        await self.resign()


class AsyncLeaderObserver:
    """The leader of an election as it changes: one watch of the election's subtree; each
    change there reads the leader again, and :meth:`next` returns when it differs."""

    def __init__(self, client: AsyncClient, path: str, watcher: AsyncWatcher) -> None:
        self._client = client
        self._path = path
        self._watcher = watcher
        self._last: Optional[Any] = ()  # () : nothing returned yet

    async def next(self, timeout_s: Optional[float] = None) -> Optional[Leader]:
        """The leader the first time, then the next different one (a new candidate, or a new
        value proclaimed); None when the election has no candidates.
        :class:`DeadlineExceededError` after `timeout_s`."""
        return await within(self._next, timeout_s)

    async def _next(self) -> Optional[Leader]:
        while True:
            current = await _leader(self._client, self._path)
            if self._last == () or self._last != current:
                self._last = current
                return current
            if await self._watcher.next() is None:
                raise watch_ended(self._path)

    async def close(self) -> None:
        """Stops observing."""
        await self._watcher.close()

    def __aiter__(self) -> AsyncIterator[Optional[Leader]]:
        return self

    async def __anext__(self) -> Optional[Leader]:
        return await self.next()

    async def __aenter__(self) -> "AsyncLeaderObserver":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class Election:
    """The blocking facade of :class:`AsyncElection`, for a :class:`warden.Session`."""

    def __init__(self, session: Session, path: str) -> None:
        self._runner: _Runner = session._runner
        self._async = self._runner.call(lambda: AsyncElection(session._async, path))

    @property
    def path(self) -> str:
        """The election's node."""
        return self._async.path

    def campaign(self, value: Data = b"") -> "Leadership":
        """Enters the election and waits until this candidate leads (see
        :meth:`AsyncElection.campaign`); use the result in `with` to resign on exit."""
        return Leadership(self._runner, self._runner.run(self._async._campaign(_convert.data_bytes(value))))

    def leader(self) -> Optional[Leader]:
        """The current leader, None when there are no candidates."""
        return self._runner.run(self._async.leader())

    def observe(self) -> "LeaderObserver":
        """A stream of the leader, reporting each change."""
        return LeaderObserver(self._runner, self._runner.run(self._async.observe()))

    @property
    def watch_notifications(self) -> int:
        """Watch events this handle's campaigns received while waiting."""
        return self._async.watch_notifications


class Leadership(_Fenced[AsyncLeadership]):
    """The blocking facade of :class:`AsyncLeadership`."""

    def proclaim(self, value: Data) -> None:
        """Publishes a new value as leader (see :meth:`AsyncLeadership.proclaim`)."""
        self._runner.run(self._async.proclaim(value))

    def resign(self) -> None:
        """Gives the leadership up."""
        self._runner.run(self._async.resign())

    _release = resign


class LeaderObserver(_Facade[AsyncLeaderObserver]):
    """The blocking facade of :class:`AsyncLeaderObserver`: iterate it, or call :meth:`next`."""

    def next(self, timeout_s: Optional[float] = None) -> Optional[Leader]:
        """The leader the first time, then the next different one."""
        return self._runner.run(self._async.next(timeout_s))

    def close(self) -> None:
        """Stops observing."""
        self._runner.run(self._async.close())

    def __iter__(self) -> Iterator[Optional[Leader]]:
        return self

    def __next__(self) -> Optional[Leader]:
        return self.next()

    def __enter__(self) -> "LeaderObserver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
