"""Locks against real processes: exclusive holds with try-lock and a FIFO queue, fencing
tokens growing with every holder (and a FenceGuard refusing a stale one), shared holds,
Chubby's lock-delay after a holder's session expires, a wait longer than the server's
per-call limit keeping its place (`keep_queued`), and a held lock through the SIGKILL of its
group's leader."""

import asyncio
import time
from typing import Awaitable, Callable

import pytest

import warden
from cluster import ProcessCluster, wait_until
from conftest import LOCK_PREFIX
from warden import AsyncClient, Client, FenceGuard, LockMode, SessionState


async def until(what: str, condition: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Polls the async `condition` until true; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_exclusive_lock_try_lock_fifo_and_fencing(endpoint: str, prefix: str) -> None:
    """One holder at a time; a refused try-lock (waiting or not) leaves no waiter behind;
    waiters are granted in arrival order; each holder's fencing token is greater than the
    last, a released sequencer no longer holds, and a FenceGuard refuses the older token."""
    path = f"{prefix}/lock"

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client:
            a, b, c = [await client.session(ttl_s=10) for _ in range(3)]

            async def waiting_sessions() -> list:
                return [waiter.session_id for waiter in (await client.lock_info(path)).waiters]

            async with a.lock(path) as held:
                assert held.is_valid() and held.path == path and held.sequencer.waiter.startswith(path + "/")
                assert await b.try_lock(path) is None
                assert await b.try_lock(path, wait_s=0.3) is None
                info = await client.lock_info(path)
                assert [h.session_id for h in info.holders] == [a.id] and info.waiters == ()
                assert info.holders[0].token == held.fencing_token and info.blocked_until_ms is None
                assert await held.check() and await client.check_sequencer(held.sequencer)
                b_wait = asyncio.ensure_future(b.lock(path))
                await until("b queues", lambda: _equal(waiting_sessions(), [b.id]))
                c_wait = asyncio.ensure_future(c.lock(path))
                await until("c queues behind b", lambda: _equal(waiting_sessions(), [b.id, c.id]))
                first = held.sequencer
            assert not held.is_valid()
            b_guard = await asyncio.wait_for(b_wait, 10)
            assert b_guard.fencing_token > first.token
            assert not c_wait.done()
            assert not await client.check_sequencer(first)
            fence = FenceGuard()
            fence.admit(b_guard.fencing_token)
            with pytest.raises(warden.StaleTokenError):
                fence.admit(first.token)
            await b_guard.unlock()
            c_guard = await asyncio.wait_for(c_wait, 10)
            assert c_guard.fencing_token > b_guard.fencing_token
            assert fence.admit_then(c_guard.fencing_token, lambda: "written") == "written"
            await c_guard.unlock()
            await c_guard.unlock()  # twice: nothing
            for session in (a, b, c):
                await session.close()

    asyncio.run(body())


async def _equal(value: Awaitable[list], expected: list) -> bool:
    return await value == expected


def test_shared_holders_exclude_an_exclusive_one(endpoint: str, prefix: str) -> None:
    """Shared holds coexist; an exclusive try-lock fails while any is held and succeeds once
    all are released (blocking API)."""
    path = f"{prefix}/rw"
    with Client([endpoint]) as client, client.session(ttl_s=10) as a, client.session(ttl_s=10) as b:
        with a.lock(path, mode=LockMode.SHARED) as reader_a:
            reader_b = b.try_lock(path, mode=LockMode.SHARED)
            assert reader_b is not None and reader_b.sequencer.mode == LockMode.SHARED
            info = client.lock_info(path)
            assert sorted(h.session_id for h in info.holders) == sorted([a.id, b.id])
            assert all(h.mode == LockMode.SHARED for h in info.holders)
            assert b.try_lock(path, mode=LockMode.EXCLUSIVE) is None
            reader_b.unlock()
            assert b.try_lock(path) is None, "one shared holder is enough to keep a writer out"
            assert reader_a.fencing_token != reader_b.fencing_token
        writer = b.try_lock(path)
        assert writer is not None and writer.fencing_token > reader_b.fencing_token
        writer.unlock()


def test_lock_delay_after_the_holder_expires(endpoint: str, prefix: str) -> None:
    """A holder whose session expires (not unlocks) leaves its lock-delay behind: nobody new
    holds the lock until it passes (try-lock fails, a waiter is granted only after it)."""
    path = f"{prefix}/delayed"
    with Client([endpoint]) as client:
        holder = client.session(ttl_s=3)
        first = holder.lock(path, lock_delay_s=3)
        holder.abandon()
        blocked_until_ms = wait_until(
            "the holder's expiry starts its lock-delay", lambda: client.lock_info(path).blocked_until_ms, timeout_s=20
        )
        assert client.lock_info(path).holders == ()
        with client.session(ttl_s=10) as next_session:
            assert next_session.try_lock(path) is None, "refused during the lock-delay"
            with next_session.lock(path) as second:
                acquired_ms = time.time() * 1000
                assert acquired_ms >= blocked_until_ms - 250, "granted before the lock-delay passed"
                assert second.fencing_token > first.fencing_token
                assert client.lock_info(path).blocked_until_ms is None


def test_a_long_wait_keeps_its_place(endpoint: str, prefix: str) -> None:
    """A wait longer than the server's limit for one call (5 s) goes on through calls that
    re-attach to the same waiter (`keep_queued`): it keeps its FIFO place ahead of a later
    waiter and its waiter node stays the same."""
    path = f"{prefix}/long"

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client:
            holder, first, second = [await client.session(ttl_s=10) for _ in range(3)]
            held = await holder.lock(path)
            first_wait = asyncio.ensure_future(first.lock(path))
            await until("the first waiter queues", lambda: _queued(client, path, 1))
            (queued,) = (await client.lock_info(path)).waiters
            second_wait = asyncio.ensure_future(second.lock(path))
            await until("the second waiter queues", lambda: _queued(client, path, 2))
            # The scenario's hold time, past the server's 5 s cut of one Lock call's wait.
            await asyncio.sleep(6.5)
            waiters = (await client.lock_info(path)).waiters
            assert [w.waiter for w in waiters][0] == queued.waiter, "the first waiter kept its node and place"
            assert [w.session_id for w in waiters] == [first.id, second.id]
            await held.unlock()
            first_guard = await asyncio.wait_for(first_wait, 10)
            assert first_guard.sequencer.waiter == queued.waiter
            assert not second_wait.done()
            await first_guard.unlock()
            second_guard = await asyncio.wait_for(second_wait, 10)
            assert second_guard.fencing_token > first_guard.fencing_token
            await second_guard.unlock()
            for session in (holder, first, second):
                await session.close()

    asyncio.run(body())


async def _queued(client: AsyncClient, path: str, count: int) -> bool:
    return len((await client.lock_info(path)).waiters) == count


def test_a_held_lock_through_the_kill_of_its_groups_leader(cluster: ProcessCluster, endpoint: str, prefix: str) -> None:
    """SIGKILL of the lock group's leader while a lock is held: once a new leader serves,
    the guard still holds (the server confirms its sequencer) or reports the loss (its
    session is no longer live); the next holder's fencing token is greater either way. The
    killed node restarts on its data directory and catches up."""
    path = f"{LOCK_PREFIX}/{prefix.rsplit('/', 1)[1]}"
    with Client([endpoint]) as client:
        holder = client.session(ttl_s=10, path_hint=LOCK_PREFIX)
        guard = holder.lock(path)
        group = guard.sequencer.group_id
        leader = wait_until("the lock group's leader", lambda: cluster.group_leader(group))
        cluster.kill(leader)
        try:
            wait_until("a new leader of the lock group", lambda: cluster.group_leader(group, except_id=leader))
            # The client rides the election out: this write waits inside its deadline.
            client.create(f"{path}-after-kill", b"")
            if guard.is_valid():
                assert guard.check(), "a guard that says it holds is confirmed by the server"
                kept = True
            else:
                assert holder.state in (SessionState.JEOPARDY, SessionState.EXPIRED)
                kept = False
            token = guard.fencing_token
            if kept:
                guard.unlock()
            with client.session(ttl_s=10) as successor:
                with successor.lock(path) as next_guard:
                    assert next_guard.fencing_token > token
                    fence = FenceGuard()
                    fence.admit(next_guard.fencing_token)
                    with pytest.raises(warden.StaleTokenError):
                        fence.admit(token)
            if kept:
                assert holder.state.is_live
                holder.close()
        finally:
            cluster.restart(leader)
            cluster.wait_caught_up(leader, [group])
