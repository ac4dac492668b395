"""What may be retried after a failed attempt, and the pause before the next one: the rule
of `proto/src/follow.rs`, which the Rust client, the router and the nodes follow too.

- NOT_LEADER and UNAVAILABLE are retried for every call: the replica did nothing.
- A connection failure (no Warden detail, a gRPC code a failed connection gives) is retried
  for an idempotent call; for a write only when the call provably never reached a server (the
  connection was refused: :attr:`TransportError.never_sent`).
- OUTCOME_UNKNOWN is retried for an idempotent call only.
- Anything else is the answer, never retried.

So a write whose connection failed after it was sent, or that got OUTCOME_UNKNOWN, is never
sent again: the caller gets :class:`OutcomeUnknownError`. Idempotent calls are reads,
keepalives, and the calls the server deduplicates (`Lock` with a request id, `Unlock` of a
sequencer). Pauses start at 10 ms and double up to 500 ms; no retry starts when the pause
would reach the call's deadline (the last failure is then the call's).
"""

import asyncio
import enum
from typing import Awaitable, Callable, NamedTuple, Optional, TypeVar

from warden.errors import (
    DeadlineExceededError,
    NotLeaderError,
    OutcomeUnknownError,
    TransportError,
    UnavailableError,
    WardenError,
)

#: First pause before a retry; doubles up to BACKOFF_MAX_S.
BACKOFF_MIN_S = 0.010
#: Longest pause between retries.
BACKOFF_MAX_S = 0.500


class CallKind(enum.Enum):
    """Whether sending a call twice can change the outcome."""

    #: Reads, keepalives, and calls the server deduplicates: safe to send again whatever
    #: happened to the last attempt.
    IDEMPOTENT = "idempotent"
    #: Everything else: sent again only when the last attempt was provably not applied.
    WRITE = "write"


class Backoff:
    """Exponential backoff: BACKOFF_MIN_S doubling to BACKOFF_MAX_S."""

    def __init__(self) -> None:
        self._pause_s = BACKOFF_MIN_S

    def next_pause_s(self) -> float:
        """The next pause (and doubles the one after)."""
        pause_s = self._pause_s
        self._pause_s = min(self._pause_s * 2, BACKOFF_MAX_S)
        return pause_s


def retried(error: WardenError, kind: CallKind) -> bool:
    """Whether the rule retries a call of `kind` that failed with `error`."""
    if isinstance(error, (NotLeaderError, UnavailableError)):
        return True
    if isinstance(error, OutcomeUnknownError):
        return kind is CallKind.IDEMPOTENT
    if isinstance(error, TransportError):
        return error.never_sent or kind is CallKind.IDEMPOTENT
    return False


class Verdict(NamedTuple):
    """What to do after a failed attempt."""

    #: The caller's error if no retry follows.
    error: WardenError
    #: The router was unreachable: the next attempt goes to the next endpoint.
    next_endpoint: bool


def judge(error: WardenError, kind: CallKind) -> Verdict:
    """Judges a failed attempt of a call of `kind`: a write lost after it was sent has an
    unknown outcome; a router that could not be reached is moved on from."""
    if isinstance(error, TransportError):
        if kind is CallKind.WRITE and not error.never_sent:
            unknown = OutcomeUnknownError(f"the connection failed after the write was sent: {error.message}", grpc_code=error.grpc_code)
            return Verdict(unknown, True)
        return Verdict(error, True)
    return Verdict(error, False)


def timed_out(kind: CallKind, timeout_s: float) -> WardenError:
    """The error of a call that got no answer within its deadline."""
    if kind is CallKind.WRITE:
        return OutcomeUnknownError(f"no answer within {timeout_s:.3f} s")
    return DeadlineExceededError(f"no answer within {timeout_s:.3f} s")


T = TypeVar("T")


async def within(work: Callable[[], Awaitable[T]], timeout_s: Optional[float]) -> T:
    """Awaits `work()`, for at most `timeout_s` (None: no limit; a non-negative finite
    number, else :class:`InvalidArgumentError`): :class:`DeadlineExceededError` past it, the
    work cancelled. `timeout_s` is checked before the work starts."""
    from warden import _convert

    if timeout_s is None:
        return await work()
    timeout_s = _convert.seconds(timeout_s, "timeout_s")
    try:
        return await asyncio.wait_for(work(), timeout_s)
    except asyncio.TimeoutError:
        raise timed_out(CallKind.IDEMPOTENT, timeout_s) from None


def is_transient(error: WardenError) -> bool:
    """Whether an error may pass with time (the group or the connection was unavailable, or
    the outcome is unknown), as opposed to a definite refusal."""
    return isinstance(error, (TransportError, DeadlineExceededError, UnavailableError, NotLeaderError, OutcomeUnknownError))
