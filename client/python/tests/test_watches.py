"""Watches against real processes: persistent watches (a node, a subtree, filters, previous
data, a replay from a past revision) read with the blocking iterator and the async one;
waits that time out lose no event; ZooKeeper's one-shot watches set with a read; and a
watch whose router is SIGKILLed mid-stream resuming through the other router without losing
or repeating an event."""

import asyncio
import time
from typing import List, Tuple

import pytest

import warden
from cluster import ProcessCluster, admin
from conftest import WATCH_PREFIX
from warden import AsyncClient, Client, EventKind, OneShotKind


def test_persistent_watch_blocking_iterator(endpoint: str, prefix: str) -> None:
    """Every change of a node in order with its revision and data; `prev_data` carries the
    node before; a watch from a past revision replays history; a recursive watch with a
    filter reports only the kinds asked for, below the path too."""
    path = f"{prefix}/node"
    with Client([endpoint]) as client:
        client.create(prefix, create_parents=True)
        with client.watch(path, prev_data=True) as watcher:
            created = client.create(path, b"v1")
            changed = client.set(path, b"v2")
            deleted_revision = client.txn(warden.Txn().then(warden.TxnOp.delete(path))).revision
            events = [next(watcher) for _ in range(3)]
            assert [e.kind for e in events] == [EventKind.CREATED, EventKind.CHANGED, EventKind.DELETED]
            assert [e.revision for e in events] == [created.stat.create_revision, changed.mod_revision, deleted_revision]
            assert [e.node.data for e in events] == [b"v1", b"v2", b""]
            assert events[0].prev is None and events[1].prev is not None and events[1].prev.data == b"v1"
            assert events[2].prev is not None and events[2].prev.data == b"v2"
            assert all(e.node.path == path and e.group_id > 0 for e in events)
            assert watcher.resume_revisions[events[0].group_id] == deleted_revision + 1
        with client.watch(path, start_revision=created.stat.create_revision) as replay:
            assert [replay.next(timeout_s=10).revision for _ in range(3)] == [e.revision for e in events]
        with client.watch(prefix, recursive=True, kinds={EventKind.CREATED, EventKind.DELETED}) as subtree:
            client.create(f"{prefix}/a", b"1")
            client.set(f"{prefix}/a", b"2")
            client.create(f"{prefix}/a/b", b"3")
            client.delete(f"{prefix}/a/b")
            seen = [(e.kind, e.node.path) for e in (subtree.next(timeout_s=10) for _ in range(3))]
            assert seen == [(EventKind.CREATED, f"{prefix}/a"), (EventKind.CREATED, f"{prefix}/a/b"), (EventKind.DELETED, f"{prefix}/a/b")]


def test_async_iterator_and_timeouts_lose_nothing(endpoint: str, prefix: str) -> None:
    """Waits cut short by a timeout (DeadlineExceededError) lose no event: taken by waits
    of a fraction of a millisecond, again and again, the events all arrive, in order, once
    each; then `async for` takes the next ones."""

    async def body() -> None:
        async with AsyncClient.connect([endpoint]) as client:
            await client.create(prefix, create_parents=True)
            async with client.watch(prefix, recursive=True) as watcher:
                with pytest.raises(warden.DeadlineExceededError):
                    await watcher.next(timeout_s=0.2)
                # The writes go on while the waits keep timing out around them.
                writing = asyncio.ensure_future(asyncio.gather(*[client.create(f"{prefix}/n{index}", str(index)) for index in range(20)]))
                got: List[int] = []
                timeouts = 0
                deadline = time.monotonic() + 20
                while len(got) < 20:
                    assert time.monotonic() < deadline, f"only {got} arrived"
                    try:
                        event = await watcher.next(timeout_s=0.0005)
                    except warden.DeadlineExceededError:
                        timeouts += 1
                        continue
                    assert event is not None
                    got.append(event.revision)
                writes = await writing
                assert timeouts > 0
                assert got == sorted(w.stat.create_revision for w in writes)
                more = [await client.create(f"{prefix}/m{index}") for index in range(2)]
                async for event in watcher:
                    got.append(event.revision)
                    if len(got) == 22:
                        break
                assert got[20:] == [m.stat.create_revision for m in more]

    asyncio.run(body())


def test_one_shot_watches_set_with_a_read(endpoint: str, prefix: str) -> None:
    """DATA reads the node and fires on its next change; EXISTS reads nothing for a missing
    node and fires on its creation; CHILDREN reads the children and fires on a new one. Each
    fires once, with the first change after its read."""
    with Client([endpoint]) as client:
        client.create(f"{prefix}/d", b"before", create_parents=True)
        data = client.watch_once(f"{prefix}/d", OneShotKind.DATA)
        exists = client.watch_once(f"{prefix}/e", OneShotKind.EXISTS)
        kids = client.watch_once(prefix, OneShotKind.CHILDREN)
        assert isinstance(data.read, warden.Node) and data.read.data == b"before"
        assert exists.read is None
        assert isinstance(kids.read, warden.ChildrenPage) and [c.name for c in kids.read.children] == ["d"]
        assert data.revision >= data.read.stat.mod_revision
        with pytest.raises(warden.DeadlineExceededError):
            data.wait(timeout_s=0.2)
        stat = client.set(f"{prefix}/d", b"after")
        client.set(f"{prefix}/d", b"later")
        fired = data.wait(timeout_s=10)
        assert fired is not None and fired.kind == EventKind.CHANGED and fired.revision == stat.mod_revision
        assert data.wait(timeout_s=1) == fired, "one-shot: the same event, once fired"
        created = client.create(f"{prefix}/e", b"here")
        fired = exists.wait(timeout_s=10)
        assert fired is not None and (fired.kind, fired.revision) == (EventKind.CREATED, created.stat.create_revision)
        fired = kids.wait(timeout_s=10)
        assert fired is not None and fired.kind == EventKind.CREATED and fired.node.path == f"{prefix}/e"
        for watch in (data, exists, kids):
            watch.close()
        with pytest.raises(warden.NoNodeError):
            client.watch_once(f"{prefix}/missing", OneShotKind.DATA)


def test_a_watch_resumes_through_another_router_when_its_router_is_killed(cluster: ProcessCluster, endpoint: str, prefix: str) -> None:
    """A recursive watch through a second router, which is SIGKILLed half-way through a run
    of writes: the watcher reopens through the other endpoint from the revision after its
    last event, and receives every write exactly once, in order."""
    extra = cluster.start_router()
    path = f"{WATCH_PREFIX}/{prefix.rsplit('/', 1)[1]}"
    with Client([endpoint]) as writer, Client([extra.addr, endpoint]) as client:
        writer.create(path, create_parents=True)
        with client.watch(path, recursive=True) as watcher:
            written: List[Tuple[str, int]] = []
            for index in range(10):
                created = writer.create(f"{path}/k{index:02d}", str(index))
                written.append((created.path, created.stat.create_revision))
            seen = [(e.node.path, e.revision) for e in (watcher.next(timeout_s=10) for _ in range(5))]
            extra.kill()
            for index in range(10, 20):
                created = writer.create(f"{path}/k{index:02d}", str(index))
                written.append((created.path, created.stat.create_revision))
            seen += [(e.node.path, e.revision) for e in (watcher.next(timeout_s=20) for _ in range(15))]
            assert seen == written
            assert client.current_endpoint == endpoint
            with pytest.raises(warden.DeadlineExceededError):
                watcher.next(timeout_s=0.3)


def test_a_watch_follows_its_subtree_when_it_moves_to_a_new_group(cluster: ProcessCluster, endpoint: str, prefix: str) -> None:
    """`warden admin split` gives the watched subtree to a new shard group while the watch
    runs: the server cancels the watch as MOVED with the revision to resume from, and the
    watcher resumes in the new group; every write before and after the move arrives once,
    in order, the later ones from the new group."""
    path = f"{prefix}/moving"
    with Client([endpoint]) as writer, Client([endpoint]) as client:
        writer.create(path, create_parents=True)
        with client.watch(path, recursive=True) as watcher:
            written: List[Tuple[str, int]] = []
            for index in range(5):
                created = writer.create(f"{path}/k{index}")
                written.append((created.path, created.stat.create_revision))
            first = [watcher.next(timeout_s=10) for _ in range(3)]
            old_group = first[0].group_id  # type: ignore[union-attr]
            admin(["split", path, "--seeds", cluster.seeds])
            for index in range(5, 10):
                created = writer.create(f"{path}/k{index}")
                written.append((created.path, created.stat.create_revision))
            rest = [watcher.next(timeout_s=20) for _ in range(7)]
            events = [event for event in first + rest if event is not None]
            assert [(e.node.path, e.revision) for e in events] == written
            new_group = events[-1].group_id
            assert new_group != old_group and all(e.group_id == new_group for e in events[5:])
            assert set(watcher.resume_revisions) == {old_group, new_group}
