"""Failover and retries against real routers: the client starts at the first reachable
endpoint; a silent (paused) router costs a call its deadline — a read then fails with
DeadlineExceededError, a write with OutcomeUnknownError, each within its deadline; when the
router dies with calls in flight, a read is retried on the next router and succeeds, while
a write that had been sent is not resent (OutcomeUnknownError) and was indeed not applied;
a write refused a connection is sent to the next router."""

import asyncio
import time

import pytest

import warden
from cluster import ProcessCluster, free_port
from warden import AsyncClient


def bytes_waiting(port: int) -> int:
    """Bytes received but not read yet by the process listening on loopback `port`, over its
    established connections (from /proc/net/tcp): what a paused router has been sent."""
    waiting = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if state == "01" and int(local.split(":")[1], 16) == port:
                waiting += int(queues.split(":")[1], 16)
    return waiting


async def until(what: str, condition, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Polls `condition()` on the loop until true; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_connect_skips_an_unreachable_endpoint(endpoint: str, prefix: str) -> None:
    """A client given a dead endpoint first starts at the live one."""

    async def body() -> None:
        dead = f"127.0.0.1:{free_port()}"
        async with AsyncClient.connect([dead, endpoint], connect_timeout_s=1) as client:
            assert client.current_endpoint == endpoint
            await client.create(f"{prefix}/x", create_parents=True)
        with pytest.raises(warden.TransportError):
            await AsyncClient.connect([dead], connect_timeout_s=0.5)

    asyncio.run(body())


def test_deadlines_unknown_outcomes_and_failover(cluster: ProcessCluster, endpoint: str, prefix: str) -> None:
    """A paused router, then killed with a write and a read in flight (see the module)."""
    extra = cluster.start_router()
    port = int(extra.addr.rsplit(":", 1)[1])

    async def body() -> None:
        short = await AsyncClient.connect([extra.addr, endpoint], request_timeout_s=1.5)
        patient = await AsyncClient.connect([extra.addr, endpoint], request_timeout_s=20)
        try:
            await patient.create(f"{prefix}/base", b"base", create_parents=True)
            assert short.current_endpoint == extra.addr and patient.current_endpoint == extra.addr
            extra.pause()

            started = time.monotonic()
            with pytest.raises(warden.DeadlineExceededError):
                # A per-call deadline: the same connections, 1.5 s for this call.
                await patient.with_request_timeout(1.5).get(f"{prefix}/base")
            read_s = time.monotonic() - started
            started = time.monotonic()
            with pytest.raises(warden.OutcomeUnknownError):
                await short.create(f"{prefix}/timed-out")
            write_s = time.monotonic() - started
            assert 1.4 <= read_s < 3.5 and 1.4 <= write_s < 3.5, (read_s, write_s)

            # A write and a read reach the paused router (its socket holds their bytes)...
            before = bytes_waiting(port)
            write = asyncio.ensure_future(patient.create(f"{prefix}/lost"))
            await until("the write reaches the paused router", lambda: bytes_waiting(port) > before)
            before = bytes_waiting(port)
            read = asyncio.ensure_future(patient.get(f"{prefix}/base"))
            await until("the read reaches the paused router", lambda: bytes_waiting(port) > before)
            # ... which dies without reading them.
            started = time.monotonic()
            extra.kill()
            with pytest.raises(warden.OutcomeUnknownError) as unknown:
                await write
            assert "after the write was sent" in unknown.value.message
            node = await read
            assert node.data == b"base", "the read was retried on the next router"
            assert time.monotonic() - started < 10, "both ended long before their deadline"
            assert patient.current_endpoint == endpoint

            # The write sent to the dead router was never applied (it never read it).
            assert await patient.exists(f"{prefix}/lost") is None
            assert await patient.exists(f"{prefix}/timed-out") is None
            # A write whose connection is refused is safe to send elsewhere: it is.
            assert short.current_endpoint == extra.addr
            created = await short.create(f"{prefix}/after")
            assert created.path == f"{prefix}/after" and short.current_endpoint == endpoint
        finally:
            await short.close()
            await patient.close()

    asyncio.run(body())
