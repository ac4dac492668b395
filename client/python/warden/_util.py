"""Small helpers shared by the asyncio API: an operation that is both awaitable and an async
context manager, what is held until given up, and background tasks kept alive until they
end."""

import asyncio
import logging
from typing import Any, AsyncContextManager, Coroutine, Generator, Generic, Optional, Set, Type, TypeVar

LOG = logging.getLogger("warden")

T = TypeVar("T", bound=AsyncContextManager[Any])
H = TypeVar("H", bound="AsyncHeld")


class Pending(Generic[T]):
    """An operation that yields a resource: `await` it for the resource, or use it directly
    in `async with` (entered once the operation completes, released on exit). What
    `AsyncClient.connect`, `AsyncClient.session`, `AsyncSession.lock` and
    `AsyncClient.watch` return."""

    def __init__(self, operation: Coroutine[Any, Any, T]) -> None:
        self._operation = operation
        self._resource: Optional[T] = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._operation.__await__()

    async def __aenter__(self) -> T:
        self._resource = await self._operation
        await self._resource.__aenter__()  # each resource enters as itself
        return self._resource

    async def __aexit__(self, kind: Optional[Type[BaseException]], error: Optional[BaseException], trace: Any) -> Optional[bool]:
        assert self._resource is not None
        return await self._resource.__aexit__(kind, error, trace)


class AsyncHeld:
    """Something held until given up (a lock, a leadership, a membership, a permit): given
    up on leaving `async with`, where a failure to give it up is raised unless the block
    itself failed (then it is logged, and the block's error goes on)."""

    async def _give_up(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: H) -> H:
        return self

    async def __aexit__(self, kind: Optional[Type[BaseException]], error: Optional[BaseException], trace: Any) -> None:
        from warden.errors import WardenError  # errors imports the generated stubs; loaded late

        try:
            await self._give_up()
        except WardenError:
            if error is None:
                raise
            LOG.debug("giving up %r after an error in its block", self, exc_info=True)


class Tasks:
    """Background tasks of one client. asyncio keeps only weak references to tasks, so a
    task nobody holds may vanish mid-way: this set holds each until it ends."""

    def __init__(self) -> None:
        self._tasks: Set["asyncio.Task[Any]"] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, Any], what: str) -> "asyncio.Task[Any]":
        """Runs `coroutine` in the background; its failure is logged (as `what`)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)

        def done(finished: "asyncio.Task[Any]") -> None:
            self._tasks.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                LOG.debug("%s failed: %s", what, finished.exception())

        task.add_done_callback(done)
        return task

    async def cancel_all(self) -> None:
        """Cancels every task still running and waits until they end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
