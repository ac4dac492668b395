"""A distributed counter (the Rust client's `recipes/counter.rs`; Curator
`DistributedAtomicLong`): a signed 64-bit integer stored as decimal text in one node,
changed by compare-and-swap on the node's version."""

import asyncio

from warden import _convert
from warden._retry import Backoff
from warden.client import AsyncClient
from warden.errors import BadVersionError, InvalidArgumentError, NodeExistsError, NoNodeError
from warden.sync import Client, _Runner

__all__ = ["AsyncCounter", "Counter"]

I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1


class AsyncCounter:
    """The counter at one path. A missing node counts as 0."""

    def __init__(self, client: AsyncClient, path: str) -> None:
        self._client = client
        self._path = _convert.path_of(path)

    def _parse(self, data: bytes) -> int:
        try:
            value = int(data.decode("ascii")) if data else 0
        except (UnicodeDecodeError, ValueError):
            raise InvalidArgumentError(f"{self._path} does not hold a decimal integer") from None
        if not I64_MIN <= value <= I64_MAX:
            raise InvalidArgumentError(f"{self._path} holds {value}, outside a 64-bit counter")
        return value

    def _sum(self, value: int, delta: int) -> int:
        total = value + delta
        if not I64_MIN <= total <= I64_MAX:
            raise InvalidArgumentError(f"{value} + {delta} overflows the counter {self._path}")
        return total

    async def get(self) -> int:
        """The value now (linearizable read; 0 if the node does not exist)."""
        try:
            return self._parse((await self._client.get(self._path)).data)
        except NoNodeError:
            return 0

    async def add(self, delta: int) -> int:
        """Adds `delta` atomically and returns the new value: reads the value and its
        version, then sets the sum at that version, again (after a short backoff) whenever
        another writer got in between, for at most the client's request timeout. An overflow
        is :class:`InvalidArgumentError`; a write whose outcome is unknown is
        :class:`OutcomeUnknownError` (the delta may or may not have been added)."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise InvalidArgumentError(f"a counter's delta is an int, not {delta!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._client.request_timeout_s
        backoff = Backoff()
        while True:
            try:
                try:
                    node = await self._client.get(self._path)
                except NoNodeError:
                    value = self._sum(0, delta)
                    await self._client.create(self._path, str(value), create_parents=True)
                    return value
                value = self._sum(self._parse(node.data), delta)
                await self._client.set(self._path, str(value), expected_version=node.stat.version)
                return value
            except (BadVersionError, NodeExistsError, NoNodeError):
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(backoff.next_pause_s())


class Counter:
    """The blocking facade of :class:`AsyncCounter`."""

    def __init__(self, client: Client, path: str) -> None:
        self._runner: _Runner = client._runner
        self._async = AsyncCounter(client._async, path)

    def get(self) -> int:
        """The value now (0 if the node does not exist)."""
        return self._runner.run(self._async.get())

    def add(self, delta: int) -> int:
        """Adds `delta` atomically and returns the new value."""
        return self._runner.run(self._async.add(delta))
