"""Sessions against real processes: the granted TTL, keepalives moving the local lease,
ephemeral nodes owned by a session and deleted when it closes or expires, and Chubby's
states with their callbacks when the session's only router stops answering: jeopardy once
the local lease lapses, expiry by the server (heard once the router answers again) or by
the grace period (without hearing anything)."""

import asyncio
import queue
import time
from typing import List, Tuple

import pytest

import warden
from cluster import ProcessCluster, wait_until
from warden import AsyncClient, Client, SessionState


def test_ttl_keepalives_ephemerals_and_close(endpoint: str, prefix: str) -> None:
    """A session asking for less than the minimum TTL gets the minimum (3 s); keepalives
    every third of it move the local lease forward, so it outlives its TTL; its ephemeral
    node names it as owner; closing it deletes the node at once. (Homed with a path hint in
    the group of its ephemeral: `SessionInfo.ephemerals` counts the home group's only.)"""
    with Client([endpoint]) as client:
        session = client.session(ttl_s=1, path_hint=prefix)
        assert session.ttl_s >= 3.0 and session.state == SessionState.CONNECTED
        created = client.create(f"{prefix}/member", b"me", session=session, create_parents=True)
        assert created.stat.ephemeral_owner == session.id
        info = session.info()
        assert info.lease.alive and info.ephemerals == 1 and info.lease.granted_ttl_ms == int(session.ttl_s * 1000)
        opened = time.monotonic()
        first_lease = session.lease_until
        # Two keepalives later the lease reaches past the TTL counted from the start.
        wait_until(
            "keepalives to renew the lease past the first TTL", lambda: session.lease_until > first_lease + session.ttl_s / 2, timeout_s=15
        )
        wait_until("the session to outlive its TTL", lambda: time.monotonic() > opened + session.ttl_s, timeout_s=15)
        assert session.state == SessionState.CONNECTED
        assert client.exists(f"{prefix}/member") is not None
        assert client.session_info(session.id).lease.alive
        session.close()
        assert session.state == SessionState.CLOSED
        assert client.exists(f"{prefix}/member") is None
        session.close()  # closing a closed session does nothing
        with pytest.raises(warden.SessionExpiredError):
            client.create(f"{prefix}/late", session=session)


def test_expiry_deletes_ephemerals(endpoint: str, prefix: str) -> None:
    """A session whose client stops renewing it (as a crashed process) expires on the server
    after its TTL, and its ephemeral nodes and lock waiters go with it."""
    with Client([endpoint]) as client:
        session = client.session(ttl_s=3, path_hint=prefix)
        client.create(f"{prefix}/a", session=session, create_parents=True)
        client.create(f"{prefix}/b", session=session)
        guard = session.lock(f"{prefix}/lock")
        assert client.lock_info(f"{prefix}/lock").holders[0].session_id == session.id
        abandoned_at = time.monotonic()
        session.abandon()
        wait_until(
            "the expired session's ephemerals go",
            lambda: not [child for child in client.children(prefix) if child.name in ("a", "b")],
            timeout_s=session.ttl_s + 15,
        )
        assert time.monotonic() - abandoned_at >= session.ttl_s * 0.9, "a TTL is a minimum"
        assert client.lock_info(f"{prefix}/lock").holders == ()
        assert not guard.is_valid()
        with pytest.raises(warden.SessionExpiredError):
            client.create(f"{prefix}/c", session=session.id)


def test_jeopardy_then_expiry_by_the_server_or_by_the_grace_period(cluster: ProcessCluster, endpoint: str, prefix: str) -> None:
    """Two sessions behind one router that stops (SIGSTOP): both enter jeopardy once their
    local lease lapses (not before), and their lock guard reports the lock as lost; the one
    with a short grace period expires by it while the router is still silent; the other
    expires once the router answers again and says the server ended it (the server expired
    it meanwhile: its ephemeral went)."""
    extra = cluster.start_router()
    events: "queue.Queue[Tuple[str, SessionState, float]]" = queue.Queue()

    def recorder(name: str):  # type: ignore[no-untyped-def]
        return lambda state: events.put((name, state, time.monotonic()))

    with Client([extra.addr]) as client, Client([endpoint]) as observer:
        patient = client.session(ttl_s=3, on_jeopardy=recorder("patient"), on_expired=recorder("patient"))
        hasty = client.session(ttl_s=3, grace_period_s=0.5, on_jeopardy=recorder("hasty"), on_expired=recorder("hasty"))
        listened: List[SessionState] = []
        patient.add_listener(listened.append)
        client.create(f"{prefix}/patient", session=patient, create_parents=True)
        guard = patient.lock(f"{prefix}/lock")
        assert guard.is_valid()
        extra.pause()
        try:
            paused_at = time.monotonic()
            leases = {"patient": patient.lease_until, "hasty": hasty.lease_until}
            seen = {}
            while len(seen) < 3:
                name, state, at = events.get(timeout=20)
                seen[(name, state)] = at
            assert set(seen) == {("patient", SessionState.JEOPARDY), ("hasty", SessionState.JEOPARDY), ("hasty", SessionState.EXPIRED)}
            for name in ("patient", "hasty"):
                assert seen[(name, SessionState.JEOPARDY)] >= leases[name] - 0.05, "jeopardy not before the local lease lapses"
                assert seen[(name, SessionState.JEOPARDY)] - paused_at < 3 + 2
            grace = seen[("hasty", SessionState.EXPIRED)] - seen[("hasty", SessionState.JEOPARDY)]
            assert 0.4 <= grace < 3.0, grace
            assert hasty.state == SessionState.EXPIRED
            assert patient.state == SessionState.JEOPARDY and not guard.is_valid()
            # The server expires the session meanwhile (nothing reached it).
            wait_until("the server expires the silent session", lambda: observer.exists(f"{prefix}/patient") is None, timeout_s=20)
        finally:
            extra.resume()
        name, state, _ = events.get(timeout=20)
        assert (name, state) == ("patient", SessionState.EXPIRED)
        assert patient.wait_for(SessionState.EXPIRED, timeout_s=1) == SessionState.EXPIRED
        wait_until("the listener hears both changes", lambda: listened == [SessionState.JEOPARDY, SessionState.EXPIRED], timeout_s=5)
        with pytest.raises(warden.SessionExpiredError):
            patient.close()
    extra.kill()


def test_a_session_in_jeopardy_whose_keepalive_then_succeeds_is_safe(endpoint: str, prefix: str) -> None:
    """A session whose local lease lapsed (here made to lapse now, as a link slower than the
    TTL would) is in JEOPARDY: its lock guard reports the lock as lost. Its next keepalive
    reaches the live server, so it is SAFE: live again, its listeners told in order, the
    guard valid again; the server kept the session and its lock all along."""

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client:
            heard: List[SessionState] = []
            session = await client.session(ttl_s=3, grace_period_s=30, on_jeopardy=heard.append, on_safe=heard.append)
            await client.create(f"{prefix}/safe", b"", create_parents=True)
            guard = await session.lock(f"{prefix}/safe/lock")
            loop = asyncio.get_running_loop()
            session._lease_deadline = loop.time()  # the local lease lapses now
            session._lapse(loop.time())
            assert session.state == SessionState.JEOPARDY and not guard.is_valid()
            assert await session.wait_for(SessionState.SAFE, timeout_s=10) == SessionState.SAFE
            assert session.state.is_live and guard.is_valid()
            assert heard == [SessionState.JEOPARDY, SessionState.SAFE]
            assert session.lease_until > loop.time(), "the keepalive's answer moved the lease on"
            assert await guard.check(), "the server never let the lock go"
            await session.close()

    asyncio.run(body())
