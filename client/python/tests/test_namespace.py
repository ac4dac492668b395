"""The namespace calls through a real router, in both APIs: create (persistent, sequential,
container, TTL, with parents), get, exists, children (paged, with stats), set with CAS,
delete (versioned, recursive), transactions, sync, and the consistency options."""

import asyncio

import pytest

import warden
from cluster import wait_until
from warden import (
    AsyncClient,
    Client,
    Compare,
    CompareOp,
    Consistency,
    NodeKind,
    Txn,
    TxnOp,
)


def test_create_get_set_delete_with_versions(endpoint: str, prefix: str) -> None:
    """A node's life through the blocking client: its stat at each step, compare-and-swap
    by version, a versioned delete; a missing node is None for `exists`, NoNodeError for
    `get`."""
    with Client([endpoint]) as client:
        created = client.create(f"{prefix}/a", b"one", create_parents=True)
        assert created.path == f"{prefix}/a"
        assert created.stat.version == 0 and created.stat.create_revision > 0
        assert created.stat.kind == NodeKind.PERSISTENT and created.stat.ephemeral_owner is None
        node = client.get(f"{prefix}/a")
        assert (node.path, node.data, node.stat.data_length) == (f"{prefix}/a", b"one", 3)
        stat = client.set(f"{prefix}/a", "two", expected_version=0)
        assert stat.version == 1 and stat.mod_revision > created.stat.create_revision
        with pytest.raises(warden.BadVersionError) as failed:
            client.set(f"{prefix}/a", b"three", expected_version=0)
        assert failed.value.code == warden.ErrorCode.BAD_VERSION and failed.value.path == f"{prefix}/a"
        assert client.get(f"{prefix}/a").data == b"two"
        assert client.set(f"{prefix}/a", b"three").version == 2
        with pytest.raises(warden.BadVersionError):
            client.delete(f"{prefix}/a", expected_version=1)
        assert client.delete(f"{prefix}/a", expected_version=2) == 1
        assert client.exists(f"{prefix}/a") is None
        with pytest.raises(warden.NoNodeError) as missing:
            client.get(f"{prefix}/a")
        assert missing.value.path == f"{prefix}/a"


def test_sequential_container_and_ttl_nodes(endpoint: str, prefix: str) -> None:
    """Sequential creates get 10-digit increasing suffixes; a container goes with its last
    child; a TTL node carries its TTL in its stat."""
    with Client([endpoint]) as client:
        client.create(prefix, create_parents=True)
        first = client.create(f"{prefix}/job-", b"x", sequential=True)
        second = client.create(f"{prefix}/job-", b"y", sequential=True)
        suffixes = [created.path.rsplit("-", 1)[1] for created in (first, second)]
        assert all(len(suffix) == 10 and suffix.isdigit() for suffix in suffixes)
        assert int(suffixes[1]) > int(suffixes[0])
        client.create(f"{prefix}/box", kind=NodeKind.CONTAINER)
        client.create(f"{prefix}/box/item")
        assert client.exists(f"{prefix}/box").kind == NodeKind.CONTAINER
        client.delete(f"{prefix}/box/item")
        wait_until("the emptied container goes", lambda: client.exists(f"{prefix}/box") is None, timeout_s=10)
        ttl = client.create(f"{prefix}/ttl", kind=NodeKind.TTL, ttl_s=30)
        assert ttl.stat.kind == NodeKind.TTL and ttl.stat.ttl_ms == 30_000


def test_children_paged_with_stats_and_recursive_delete(endpoint: str, prefix: str) -> None:
    """Children come sorted, a page at a time, with stats when asked; the parent's stat
    counts them; a node with children refuses a plain delete and goes recursively."""
    with Client([endpoint]) as client:
        client.create(prefix, create_parents=True)
        names = [f"c{index:02d}" for index in range(7)]
        for name in reversed(names):
            client.create(f"{prefix}/{name}", name)
        page = client.children_page(prefix, limit=3, with_stats=True)
        assert [child.name for child in page.children] == names[:3] and page.more
        assert page.parent.num_children == 7 and page.revision > 0
        assert all(child.stat is not None and child.stat.data_length == 3 for child in page.children)
        rest = client.children_page(prefix, start_after=names[2])
        assert [child.name for child in rest.children] == names[3:] and not rest.more
        assert [child.name for child in client.children(prefix, page_size=2)] == names
        with pytest.raises(warden.NotEmptyError):
            client.delete(prefix)
        assert client.delete(prefix, recursive=True) == 8
        with pytest.raises(warden.NoNodeError):
            client.children(prefix)


def test_transactions_compare_then_else(endpoint: str, prefix: str) -> None:
    """A transaction runs `then` when every compare holds, else `or_else`, atomically at one
    revision, answering each operation's result."""
    with Client([endpoint]) as client:
        client.create(f"{prefix}/a", b"v0", create_parents=True)
        txn = (
            Txn()
            .when(Compare.version(f"{prefix}/a", CompareOp.EQUAL, 0))
            .when(Compare.value(f"{prefix}/a", CompareOp.EQUAL, b"v0"))
            .when(Compare.exists(f"{prefix}/b", False))
            .then(TxnOp.set(f"{prefix}/a", b"v1", expected_version=0))
            .then(TxnOp.create(f"{prefix}/b", b"new"))
            .then(TxnOp.get(f"{prefix}/a"))
            .then(TxnOp.get(f"{prefix}/missing"))
            .or_else(TxnOp.get(f"{prefix}/a"))
        )
        done = client.txn(txn)
        assert done.succeeded
        stat, created, got, missing = done.results
        assert isinstance(stat, warden.Stat) and stat.version == 1 and stat.mod_revision == done.revision
        assert isinstance(created, warden.Created) and created.stat.create_revision == done.revision
        assert isinstance(got, warden.Node) and got.data == b"v1"
        assert missing is None
        again = client.txn(txn)
        assert not again.succeeded
        (got,) = again.results
        assert isinstance(got, warden.Node) and got.data == b"v1"
        deleted = client.txn(Txn().when(Compare.mod_revision(f"{prefix}/b", CompareOp.LESS, 2**62)).then(TxnOp.delete(f"{prefix}/b")))
        assert deleted.succeeded and deleted.results == (1,)


def test_async_client_and_consistency_options(endpoint: str, prefix: str) -> None:
    """The asyncio client does the same calls; STALE reads (per call or per client) are
    served from a replica's applied state, after `sync` they see every earlier write."""

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client:
            await client.create(f"{prefix}/x", b"1", create_parents=True)
            stale = client.with_consistency(Consistency.STALE)
            revision = await stale.sync()
            assert revision > 0
            assert (await client.get(f"{prefix}/x", consistency=Consistency.STALE)).data in (b"1",)
            calls = [client.set(f"{prefix}/x", str(n)) for n in range(5)]
            versions = sorted(stat.version for stat in await asyncio.gather(*calls))
            assert versions == [1, 2, 3, 4, 5]
            assert (await client.get(f"{prefix}/x")).stat.version == 5
            exists = await stale.exists(f"{prefix}/x")
            assert exists is not None and exists.version <= 5
            assert [c.name for c in await stale.children(prefix)] == ["x"]

    asyncio.run(body())
