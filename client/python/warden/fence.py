"""Fencing (Kleppmann; Chubby's sequencers): a lock alone cannot stop a holder that paused
(GC, network) past its lease from writing after someone else took the lock. So every write
to the protected resource carries the writer's fencing token — the `token` of its
sequencer, which for a lock path only grows — and the resource refuses any token lower than
the highest it has seen. Keep one :class:`FenceGuard` per protected resource, inside the
resource, and check it atomically with the write it protects.

    fence = FenceGuard()
    fence.admit(7)   # holder with token 7 writes
    fence.admit(9)   # the lock passed on: token 9 writes
    fence.admit(7)   # the old holder woke up late: StaleTokenError

Tokens of different lock paths are not comparable: guard a resource with one lock path. A
guard must be durable with the resource (persist `highest`) if the resource can restart.
"""

import threading
from typing import Callable, TypeVar

__all__ = ["FenceGuard", "StaleTokenError"]

T = TypeVar("T")


class StaleTokenError(Exception):
    """A write carried a token lower than one already admitted."""

    def __init__(self, token: int, highest: int) -> None:
        super().__init__(f"fencing token {token} is stale: {highest} was already admitted")
        #: The refused token.
        self.token = token
        #: The highest token admitted so far.
        self.highest = highest


class FenceGuard:
    """The highest fencing token a resource has admitted (thread-safe)."""

    def __init__(self, highest: int = 0) -> None:
        self._highest = highest
        self._lock = threading.Lock()

    def admit(self, token: int) -> None:
        """Admits a write carrying `token` if no higher token was admitted before; raises the
        mark. Equal tokens are admitted: one holder may write many times."""
        self.admit_then(token, lambda: None)

    def admit_then(self, token: int, write: Callable[[], T]) -> T:
        """Runs `write` only if `token` is admitted, under the guard's lock, so no higher
        token can be admitted between the check and the write; raises
        :class:`StaleTokenError` otherwise."""
        with self._lock:
            if token < self._highest:
                raise StaleTokenError(token, self._highest)
            self._highest = token
            return write()

    @property
    def highest(self) -> int:
        """The highest token admitted so far (0: none)."""
        with self._lock:
            return self._highest
