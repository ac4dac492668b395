"""The recipes against a real cluster: election (campaign, leader, observe, proclaim,
resign, the next leader's greater fencing token, at most one notification per leader
change),
membership (join, members, a live view, leaving by close and by session end), a semaphore
of two permits, barriers, and a counter under concurrent adds."""

import asyncio

import pytest

import warden
from warden import AsyncClient, Client
from warden.recipes import (
    AsyncBarrier,
    AsyncCounter,
    AsyncDoubleBarrier,
    AsyncElection,
    AsyncMembership,
    AsyncSemaphore,
    Counter,
    Election,
    Member,
    Membership,
    MembersWatch,
    Semaphore,
)


def test_election_async(endpoint: str, prefix: str) -> None:
    """The first candidate leads; the second waits, watching only it; the observer sees the
    leader, its proclaimed value, and the next leader after a resignation, whose fencing
    token is greater."""
    path = f"{prefix}/election"

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client:
            async with client.session(ttl_s=10) as first, client.session(ttl_s=10) as second:
                alpha, beta = AsyncElection(first, path), AsyncElection(second, path)
                assert await alpha.leader() is None
                leadership = await alpha.campaign(b"alpha")
                assert leadership.is_valid()
                observer = await beta.observe()
                leader = await observer.next(timeout_s=10)
                assert leader is not None and leader.value == b"alpha" and leader.fencing_token == leadership.fencing_token
                waiting = asyncio.ensure_future(beta.campaign(b"beta"))
                await leadership.proclaim(b"alpha-2")
                assert (await observer.next(timeout_s=10)).value == b"alpha-2"  # type: ignore[union-attr]
                assert not waiting.done()
                await leadership.resign()
                assert not leadership.is_valid()
                async with await asyncio.wait_for(waiting, 10) as next_leadership:
                    assert next_leadership.fencing_token > leadership.fencing_token
                    # Watching only its predecessor: at most one event (none if alpha went
                    # before beta's watch was set, which the check after the watch then saw).
                    assert beta.watch_notifications <= 1
                    changed = await observer.next(timeout_s=10)
                    assert changed is not None and changed.value == b"beta" and changed.path == next_leadership.path
                    with pytest.raises(warden.NoNodeError):
                        await leadership.proclaim(b"deposed")
                assert await observer.next(timeout_s=10) is None
                await observer.close()

    asyncio.run(body())


def test_election_blocking_and_session_end(endpoint: str, prefix: str) -> None:
    """The blocking facade: a leader whose session closes gives way to the next candidate."""
    path = f"{prefix}/election"
    with Client([endpoint]) as client:
        first = client.session(ttl_s=10)
        leadership = Election(first, path).campaign("one")
        with client.session(ttl_s=10) as second:
            election = Election(second, path)
            assert election.leader().value == b"one"  # type: ignore[union-attr]
            first.close()
            with election.campaign("two") as next_leadership:
                assert next_leadership.fencing_token > leadership.fencing_token
                assert election.leader().path == next_leadership.path  # type: ignore[union-attr]
            assert election.leader() is None


def test_membership(endpoint: str, prefix: str) -> None:
    """Members join with data, are listed, and the live view follows joins and leaves (by
    leaving and by the member's session closing); a taken id is NodeExistsError."""
    group = f"{prefix}/group"
    with Client([endpoint]) as client:
        view = MembersWatch.open(client, group)
        assert view.members == []
        first = client.session(ttl_s=10)
        second = client.session(ttl_s=10)
        a = Membership.join(first, group, "a", b"alpha")
        assert view.next(timeout_s=10) == [Member("a", b"alpha")]
        with Membership.join(second, group, "b", b"beta") as b:
            assert view.next(timeout_s=10) == [Member("a", b"alpha"), Member("b", b"beta")]
            assert a.members() == [Member("a", b"alpha"), Member("b", b"beta")]
            assert b.is_valid()
            with pytest.raises(warden.NodeExistsError):
                Membership.join(second, group, "a")
        assert view.next(timeout_s=10) == [Member("a", b"alpha")]
        first.close()
        assert view.next(timeout_s=10) == []
        assert not a.is_valid()
        second.close()
        view.close()
        with pytest.raises(warden.InvalidArgumentError):
            Membership.join(client.session(ttl_s=10), group, "a/b")


def test_membership_async(endpoint: str, prefix: str) -> None:
    """The asyncio membership, with `async with`."""
    group = f"{prefix}/group"

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client, client.session(ttl_s=10) as session:
            async with AsyncMembership.join(session, group, "m1", b"x") as member:
                view = await member.watch()
                assert view.members == [Member("m1", b"x")]
                assert [m.id for m in await member.members()] == ["m1"]
            assert await view.next(timeout_s=10) == []
            await view.close()

    asyncio.run(body())


def test_semaphore_of_two_permits(endpoint: str, prefix: str) -> None:
    """Two permits: two sessions hold one each; a third waits until one is released, and
    its permit's token is greater than both."""
    path = f"{prefix}/sem"

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client:
            sessions = [await client.session(ttl_s=10) for _ in range(3)]
            semaphores = [AsyncSemaphore(session, path, 2) for session in sessions]
            first = await semaphores[0].acquire()
            second = await semaphores[1].acquire()
            third = asyncio.ensure_future(semaphores[2].acquire())
            done, _ = await asyncio.wait({third}, timeout=0.5)
            assert not done, "a third permit while two are held"
            await first.release()
            async with await asyncio.wait_for(third, 10) as permit:
                assert permit.is_valid() and permit.fencing_token > max(first.fencing_token, second.fencing_token)
                leases = await client.children(f"{path}/leases")
                assert len(leases) == 2
            await second.release()
            assert await client.children(f"{path}/leases") == []
            for session in sessions:
                await session.close()
        with pytest.raises(warden.InvalidArgumentError):
            AsyncSemaphore(sessions[0], path, 0)

    asyncio.run(body())


def test_semaphore_blocking(endpoint: str, prefix: str) -> None:
    """The blocking semaphore as a context manager."""
    with Client([endpoint]) as client, client.session(ttl_s=10) as session:
        semaphore = Semaphore(session, f"{prefix}/sem", 1)
        with semaphore.acquire() as permit:
            assert permit.is_valid() and permit.path.startswith(f"{prefix}/sem/leases/lease-")
        assert not permit.is_valid()


def test_barriers(endpoint: str, prefix: str) -> None:
    """A barrier holds waiters until removed; a double barrier lets its participants in
    together and out together."""

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client:
            barrier = AsyncBarrier(client, f"{prefix}/barrier")
            await barrier.wait(timeout_s=5)  # not raised: no wait
            await barrier.set()
            await barrier.set()
            waiter = asyncio.ensure_future(barrier.wait())
            with pytest.raises(warden.DeadlineExceededError):
                await barrier.wait(timeout_s=0.3)
            assert not waiter.done()
            await barrier.remove()
            await asyncio.wait_for(waiter, 10)

            async with client.session(ttl_s=10) as one, client.session(ttl_s=10) as two:
                path = f"{prefix}/double"
                first, second = AsyncDoubleBarrier(one, path, 2), AsyncDoubleBarrier(two, path, 2)
                entering = asyncio.ensure_future(first.enter())
                done, _ = await asyncio.wait({entering}, timeout=0.3)
                assert not done, "entered alone"
                await second.enter()
                await asyncio.wait_for(entering, 10)
                leaving = asyncio.ensure_future(first.leave())
                done, _ = await asyncio.wait({leaving}, timeout=0.3)
                assert not done, "left while the other is in"
                await second.leave()
                await asyncio.wait_for(leaving, 10)
                assert await client.exists(f"{path}/ready") is None

    asyncio.run(body())


def test_counter_under_concurrent_adds(endpoint: str, prefix: str) -> None:
    """Concurrent adds by compare-and-swap lose no increment; the blocking facade reads the
    same counter; a non-number is InvalidArgumentError."""
    path = f"{prefix}/counter"

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client:
            counter = AsyncCounter(client, path)
            assert await counter.get() == 0
            results = await asyncio.gather(*(counter.add(1) for _ in range(10)))
            assert sorted(results) == list(range(1, 11))
            assert await counter.add(-15) == -5

    asyncio.run(body())
    with Client([endpoint]) as client:
        assert Counter(client, path).get() == -5
        client.create(f"{prefix}/text", b"ten")
        with pytest.raises(warden.InvalidArgumentError):
            Counter(client, f"{prefix}/text").add(1)
