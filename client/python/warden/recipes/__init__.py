"""Coordination recipes built on sessions, ephemeral-sequential nodes, locks, watches and
compare-and-swap — the Rust client's `warden_client::recipes`, which mirror etcd's
`clientv3/concurrency` and Apache Curator's recipes.

| recipe | built on |
|---|---|
| :class:`Election` | ephemeral-sequential candidates, each watching its predecessor |
| :class:`Membership` | ephemeral member nodes + a watch of the group |
| :class:`Semaphore` | an internal lock + ephemeral lease nodes |
| :class:`Barrier`, :class:`DoubleBarrier` | a barrier node; ephemeral participants + a `ready` node |
| :class:`Counter` | compare-and-swap on a node's version |

Each comes as an asyncio class (`AsyncElection`, ...) and a blocking facade over it
(`Election`, ...) for the blocking :class:`warden.Client`. Every recipe that belongs to a
session holds ephemeral nodes or locks of it, so what it grants (leadership, membership, a
permit, a place in a barrier) ends when the session ends; in jeopardy the grant may already
be gone, so `is_valid()` turns false. None of the waiting recipes herds: a waiter watches
at most one node whose change concerns it.
"""

from warden.recipes.barrier import AsyncBarrier, AsyncDoubleBarrier, Barrier, DoubleBarrier
from warden.recipes.counter import AsyncCounter, Counter
from warden.recipes.election import (
    AsyncElection,
    AsyncLeaderObserver,
    AsyncLeadership,
    Election,
    Leader,
    LeaderObserver,
    Leadership,
)
from warden.recipes.membership import AsyncMembersWatch, AsyncMembership, Member, MembersWatch, Membership
from warden.recipes.semaphore import AsyncPermit, AsyncSemaphore, Permit, Semaphore

__all__ = [
    "AsyncBarrier",
    "AsyncCounter",
    "AsyncDoubleBarrier",
    "AsyncElection",
    "AsyncLeaderObserver",
    "AsyncLeadership",
    "AsyncMembersWatch",
    "AsyncMembership",
    "AsyncPermit",
    "AsyncSemaphore",
    "Barrier",
    "Counter",
    "DoubleBarrier",
    "Election",
    "Leader",
    "LeaderObserver",
    "Leadership",
    "Member",
    "MembersWatch",
    "Membership",
    "Permit",
    "Semaphore",
]
