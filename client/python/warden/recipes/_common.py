"""What the recipes share (the Rust client's `recipes/mod.rs`): uniquely named
ephemeral-sequential nodes, queues ordered by creation, waits on a node's existence, and
work bounded by a session's life."""

import asyncio
import itertools
import os
from typing import Any, Awaitable, List, Optional, Tuple, TypeVar

from warden.client import AsyncClient
from warden.errors import NodeExistsError, NoNodeError, OutcomeUnknownError, SessionExpiredError, UnavailableError
from warden.session import AsyncSession
from warden.types import Child, Created, EventKind, SessionState

T = TypeVar("T")

#: Distinguishes the nodes one process creates within one session (with the session id, it
#: names a node so that a create whose outcome is unknown can be found again).
_NONCE = itertools.count()


def join(parent: str, name: str) -> str:
    """`parent/name` (`/name` under the root)."""
    return f"{parent.rstrip('/')}/{name}"


def parent_of(path: str) -> str:
    """The parent of `path` (`/` for top-level nodes)."""
    parent = path.rsplit("/", 1)[0]
    return parent or "/"


def check_name(name: Any, what: str) -> str:
    """A node name given by a caller: non-empty, without `/`."""
    from warden.errors import InvalidArgumentError

    if not isinstance(name, str) or not name or "/" in name:
        raise InvalidArgumentError(f"{what} is a non-empty name without '/', not {name!r}")
    return name


def watch_ended(path: str) -> UnavailableError:
    """The error of a watch the server ended while a recipe relied on it."""
    return UnavailableError(f"the watch of {path} ended")


async def children(client: AsyncClient, directory: str) -> List[Child]:
    """The children of `directory` with their stats, in name order; none when it does not
    exist."""
    try:
        return await client.children(directory, with_stats=True)
    except NoNodeError:
        return []


async def queue(client: AsyncClient, directory: str, prefix: str) -> List[Tuple[str, int]]:
    """The children of `directory` named `prefix…`, oldest (lowest create revision) first,
    as (path, create revision)."""
    found = [
        (join(directory, child.name), child.stat.create_revision)
        for child in await children(client, directory)
        if child.name.startswith(prefix) and child.stat is not None
    ]
    return sorted(found, key=lambda item: item[1])


async def create_sequential(session: AsyncSession, directory: str, prefix: str, data: bytes) -> Created:
    """Creates an ephemeral-sequential node `directory/{prefix}{session}-{pid}-{nonce}-{counter}`.
    If the outcome of the create is unknown, looks for it by its unique name before giving
    up."""
    name = f"{prefix}{session.id:016x}-{os.getpid()}-{next(_NONCE)}-"
    client = session.client
    try:
        return await client.create(join(directory, name), data, session=session, sequential=True, create_parents=True)
    except OutcomeUnknownError:
        for child in await children(client, directory):
            if child.name.startswith(name) and child.stat is not None:
                return Created(join(directory, child.name), child.stat)
        raise


async def ensure_node(client: AsyncClient, path: str) -> None:
    """Creates `path` as a persistent node (and its ancestors) unless it exists."""
    try:
        await client.create(path, b"", create_parents=True)
    except NodeExistsError:
        pass


async def delete_if_present(client: AsyncClient, path: str) -> None:
    """Deletes `path`; a node already gone is no error."""
    try:
        await client.delete(path)
    except NoNodeError:
        pass


async def await_existence(client: AsyncClient, path: str, exists: bool, notifications: Optional[List[int]] = None) -> None:
    """Waits until `path` exists (`exists` True) or does not: watches it first, then checks,
    so no change between the two is missed. Only this node is watched; each event received
    is counted in `notifications[0]`."""
    wanted = EventKind.CREATED if exists else EventKind.DELETED
    async with client.watch(path, kinds={wanted}) as watcher:
        if (await client.exists(path) is not None) == exists:
            return
        while True:
            event = await watcher.next()
            if event is None:
                raise watch_ended(path)
            if notifications is not None:
                notifications[0] += 1
            if event.kind == wanted:
                return


async def while_alive(session: AsyncSession, work: Awaitable[T]) -> T:
    """Runs `work` unless the session ends first (:class:`SessionExpiredError` then; the
    work is cancelled)."""
    task = asyncio.ensure_future(work)
    ended = asyncio.ensure_future(session.wait_for(SessionState.EXPIRED, SessionState.CLOSED))
    try:
        done, _ = await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise SessionExpiredError(f"session {session.id:#x} ended ({session.state.value})")
    finally:
        pending = [future for future in (task, ended) if not future.done()]
        for future in pending:
            future.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
