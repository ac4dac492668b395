"""Group membership (the Rust client's `recipes/membership.rs`; Curator `GroupMember`): each
member is an ephemeral node `path/{member_id}` holding the member's data, so a member that
crashes leaves the group when its session expires, and one that leaves cleanly leaves at
once. :class:`AsyncMembersWatch` keeps a live member list: a read at a revision, then every
event after it, in order."""

from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Tuple

from warden import _convert
from warden._retry import within
from warden._util import AsyncHeld, Pending
from warden.client import AsyncClient
from warden.errors import NoNodeError
from warden.recipes._common import check_name, delete_if_present, ensure_node, join, parent_of, watch_ended
from warden.session import AsyncSession
from warden.sync import Client, Session, _Facade, _Held
from warden.types import Data, EventKind, Node
from warden.watch import AsyncWatcher

__all__ = ["Member", "AsyncMembership", "AsyncMembersWatch", "Membership", "MembersWatch"]


@dataclass(frozen=True)
class Member:
    """One member of a group."""

    #: Its id (its node's name).
    id: str
    #: The data it joined with (or set since).
    data: bytes


async def _read(client: AsyncClient, path: str) -> Tuple[Dict[str, Node], int]:
    """The members of the group at `path` (at most one page of the server's listing, 10,000
    members) by id, and the revision of the listing (0: the group does not exist). A member
    that left between the listing and the read of its data is left out (a watch from the
    revision after the listing reports its leaving)."""
    try:
        page = await client.children_page(path)
    except NoNodeError:
        return {}, 0
    members: Dict[str, Node] = {}
    for child in page.children:
        try:
            members[child.name] = await client.get(join(path, child.name))
        except NoNodeError:
            pass
    return members, page.revision


def _listed(members: Dict[str, Node]) -> List[Member]:
    return [Member(member_id, node.data) for member_id, node in sorted(members.items())]


class AsyncMembership(AsyncHeld):
    """This session's membership of a group. It ends with :meth:`leave` (or on leaving
    `async with`), or when the session ends; in jeopardy it may already have ended
    (:meth:`is_valid`)."""

    def __init__(self, session: AsyncSession, group: str, node: str) -> None:
        self._session = session
        self._group = group
        self._node = node
        self._left = False

    @staticmethod
    def join(session: AsyncSession, path: str, member_id: str, data: Data = b"") -> "Pending[AsyncMembership]":
        """Joins the group at `path` as `member_id` with `data` (the group node is created if
        missing). Fails with :class:`NodeExistsError` if a live member already has that id.
        Await the result, or use it in `async with` (leaves on exit)."""
        return Pending(AsyncMembership._join(session, path, member_id, data))

    @staticmethod
    async def _join(session: AsyncSession, path: str, member_id: str, data: Data) -> "AsyncMembership":
        group = _convert.path_of(path)
        node = join(group, check_name(member_id, "member_id"))
        await session.client.create(node, data, session=session, create_parents=True)
        return AsyncMembership(session, group, node)

    @property
    def path(self) -> str:
        """This member's node."""
        return self._node

    def is_valid(self) -> bool:
        """Whether the membership can be relied on (the session is alive and it did not
        leave)."""
        return not self._left and self._session.state.is_live

    async def members(self) -> List[Member]:
        """The group's members now."""
        members, _ = await _read(self._session.client, self._group)
        return _listed(members)

    async def watch(self) -> "AsyncMembersWatch":
        """A live view of the group's members."""
        return await AsyncMembersWatch.open(self._session.client, self._group)

    async def leave(self) -> None:
        """Leaves the group now. Idempotent."""
        if self._left:
            return
        self._left = True
        if not self._session.state.has_ended:
            await delete_if_present(self._session.client, self._node)

    async def _give_up(self) -> None:
        await self.leave()


class AsyncMembersWatch:
    """The members of a group, kept current by a watch: read at a revision, then updated by
    every event after it, in order, so the view is never older than the events received.
    Anyone may open one (no session needed)."""

    def __init__(self, group: str, members: Dict[str, Node], watcher: AsyncWatcher) -> None:
        self._group = group
        self._members = members
        self._watcher = watcher

    @staticmethod
    async def open(client: AsyncClient, path: str) -> "AsyncMembersWatch":
        """Reads the members of the group at `path` and watches it from the revision after
        the read (the group node is created if missing: the read needs its revision)."""
        group = _convert.path_of(path)
        await ensure_node(client, group)
        members, revision = await _read(client, group)
        watcher = await client.watch(group, recursive=True, start_revision=revision + 1)
        return AsyncMembersWatch(group, members, watcher)

    @property
    def members(self) -> List[Member]:
        """The members as of the last change received."""
        return _listed(self._members)

    async def next(self, timeout_s: Optional[float] = None) -> List[Member]:
        """Waits for the next change of the member list (a join, a leave, a member's new
        data) and returns the list after it. :class:`DeadlineExceededError` after
        `timeout_s` (no change is lost)."""
        return await within(self._next, timeout_s)

    async def _next(self) -> List[Member]:
        while True:
            event = await self._watcher.next()
            if event is None:
                raise watch_ended(self._group)
            path = event.node.path
            if path == self._group or parent_of(path) != self._group:
                continue
            member_id = path.rsplit("/", 1)[1]
            known = self._members.get(member_id)
            # A member read after the event (its stat is newer) already shows it.
            newer = known is None or event.revision > known.stat.mod_revision
            changed = False
            if event.kind == EventKind.CREATED and newer:
                self._members[member_id] = event.node
                changed = True
            elif event.kind == EventKind.CHANGED and newer and member_id in self._members:
                self._members[member_id] = event.node
                changed = True
            elif event.kind == EventKind.DELETED and newer:
                changed = self._members.pop(member_id, None) is not None
            if changed:
                return self.members

    async def close(self) -> None:
        """Stops watching."""
        await self._watcher.close()

    def __aiter__(self) -> AsyncIterator[List[Member]]:
        return self

    async def __anext__(self) -> List[Member]:
        return await self.next()

    async def __aenter__(self) -> "AsyncMembersWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class Membership(_Held[AsyncMembership]):
    """The blocking facade of :class:`AsyncMembership`: join with :meth:`Membership.join`."""

    @staticmethod
    def join(session: Session, path: str, member_id: str, data: Data = b"") -> "Membership":
        """Joins the group at `path` as `member_id` (see :meth:`AsyncMembership.join`); use
        the result in `with` to leave on exit."""
        runner = session._runner
        return Membership(runner, runner.run(AsyncMembership._join(session._async, path, member_id, data)))

    @property
    def path(self) -> str:
        """This member's node."""
        return self._async.path

    def is_valid(self) -> bool:
        """Whether the membership can be relied on."""
        return self._async.is_valid()

    def members(self) -> List[Member]:
        """The group's members now."""
        return self._runner.run(self._async.members())

    def watch(self) -> "MembersWatch":
        """A live view of the group's members."""
        return MembersWatch(self._runner, self._runner.run(self._async.watch()))

    def leave(self) -> None:
        """Leaves the group now."""
        self._runner.run(self._async.leave())

    _release = leave


class MembersWatch(_Facade[AsyncMembersWatch]):
    """The blocking facade of :class:`AsyncMembersWatch`."""

    @staticmethod
    def open(client: Client, path: str) -> "MembersWatch":
        """A live view of the members of the group at `path` (no session needed)."""
        return MembersWatch(client._runner, client._runner.run(AsyncMembersWatch.open(client._async, path)))

    @property
    def members(self) -> List[Member]:
        """The members as of the last change received."""
        return self._async.members

    def next(self, timeout_s: Optional[float] = None) -> List[Member]:
        """Waits for the next change of the member list; returns the list after it."""
        return self._runner.run(self._async.next(timeout_s))

    def close(self) -> None:
        """Stops watching."""
        self._runner.run(self._async.close())

    def __iter__(self) -> Iterator[List[Member]]:
        return self

    def __next__(self) -> List[Member]:
        return self.next()

    def __enter__(self) -> "MembersWatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
