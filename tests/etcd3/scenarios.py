"""python-etcd3 (PyPI `etcd3` 0.12.0) against Warden's etcd API, unchanged.

Usage: python3 scenarios.py HOST:PORT

Run by tests/suite/etcd_python.rs against an in-process cluster whose keys live in two
groups: the root group and one for `/py/g`. Each scenario checks what a user of the library
depends on; the script exits 1 naming every scenario that failed and why, 0 when all passed.
Every wait has a deadline: nothing sleeps to synchronise. Needs
PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python with protobuf >= 4 (scripts/setup.sh).
"""

import queue
import sys
import threading
import traceback

import grpc

import etcd3
from etcd3.events import DeleteEvent, PutEvent

from common import DEADLINE, Failed, check, connect, described_failure, equal, grpc_code, take


def event_queue(client, key, **kwargs):
    """A watch of `key` (or a prefix, with range_end) whose events go to a queue, one by one."""
    events = queue.Queue()

    def callback(response):
        if isinstance(response, Exception):
            events.put(response)
            return
        for event in response.events:
            events.put(event)

    watch_id = client.add_watch_callback(key, callback, **kwargs)
    return watch_id, events


def described(event):
    """An event as (PUT or DELETE, key, value)."""
    kind = "PUT" if isinstance(event, PutEvent) else "DELETE" if isinstance(event, DeleteEvent) else type(event).__name__
    return (kind, event.key.decode(), event.value.decode())


def kv(client, endpoint):
    """Puts, gets, prefix reads across both groups, deletes, prev_kv, replace, transactions."""
    keys = ["/py/a", "/py/b", "/py/g/x", "/py/g/y", "/py/z"]
    for key in ["/py/z", "/py/g/y", "/py/a", "/py/g/x", "/py/b"]:
        put = client.put(key, "v" + key)
        check(put.header.revision > 0, "a put's header has its revision: %r" % put.header)

    value, meta = client.get("/py/a")
    equal(value, b"v/py/a", "get /py/a")
    equal(meta.key, b"/py/a", "its key")
    equal((meta.version, meta.lease_id), (1, 0), "a new key's version and lease")
    equal(meta.mod_revision, meta.create_revision, "a new key's mod revision")
    equal(client.get("/py/missing"), (None, None), "get of a missing key")
    equal(client.get("/py/g"), (None, None), "get of a parent made for keys (no key)")

    listed = [(meta.key.decode(), value.decode()) for value, meta in client.get_prefix("/py/")]
    equal(listed, [(key, "v" + key) for key in keys], "get_prefix /py/ (two groups, in key order)")
    equal([meta.key for _, meta in client.get_prefix("/py/g/")], [b"/py/g/x", b"/py/g/y"], "get_prefix /py/g/")
    equal([meta.key for _, meta in client.get_prefix("/py/", keys_only=True)], [key.encode() for key in keys], "get_prefix keys_only")

    put = client.put("/py/a", "second", prev_kv=True)
    equal((put.prev_kv.key, put.prev_kv.value, put.prev_kv.version), (b"/py/a", b"v/py/a", 1), "put with prev_kv answers the key as it was")
    value, again = client.get("/py/a")
    equal((value, again.version, again.create_revision), (b"second", 2, meta.create_revision), "the key after a second put")
    check(again.mod_revision > meta.mod_revision, "a put moves the mod revision: %d then %d" % (meta.mod_revision, again.mod_revision))
    equal(client.put("/py/new", "x", prev_kv=True).HasField("prev_kv"), False, "put with prev_kv of a new key answers no previous key")

    # replace: a transaction comparing the value, in each group.
    equal(client.replace("/py/a", "second", "third"), True, "replace with the right value")
    equal(client.replace("/py/a", "second", "fourth"), False, "replace with a stale value")
    equal(client.get("/py/a")[0], b"third", "the value after the replaces")
    equal(client.replace("/py/g/x", "v/py/g/x", "gx"), True, "replace in the other group")
    equal(client.get("/py/g/x")[0], b"gx", "the other group's key after replace")
    equal(client.replace("/py/absent", "", "x"), False, "replace of a missing key")
    equal(client.get("/py/absent"), (None, None), "a failed replace writes nothing")

    txn = client.transactions
    succeeded, responses = client.transaction(
        compare=[txn.value("/py/b") == "v/py/b", txn.version("/py/b") > 0],
        success=[txn.put("/py/b", "b2"), txn.get("/py/b")],
        failure=[txn.put("/py/b", "failed")],
    )
    equal(succeeded, True, "a transaction whose compares hold")
    equal(len(responses), 2, "its responses (a put, a get)")
    check(responses[0].HasField("response_put"), "the first response is the put's: %r" % responses[0])
    equal([value for value, _ in responses[1]], [b"b2"], "the get after the put in the same transaction")
    succeeded, responses = client.transaction(
        compare=[txn.value("/py/b") == "v/py/b"],
        success=[txn.put("/py/b", "wrong")],
        failure=[txn.get("/py/b"), txn.put("/py/b", "b3")],
    )
    equal(succeeded, False, "a transaction whose compare fails")
    equal([value for value, _ in responses[0]], [b"b2"], "the failure branch's get")
    equal(client.get("/py/b")[0], b"b3", "the failure branch's put")
    # Create-if-absent, as python-etcd3's put_if_not_exists writes it.
    equal(client.put_if_not_exists("/py/g/once", "first"), True, "put_if_not_exists of a missing key")
    equal(client.put_if_not_exists("/py/g/once", "second"), False, "put_if_not_exists of a present key")
    equal(client.get("/py/g/once")[0], b"first", "the key put_if_not_exists created")
    succeeded, _ = client.transaction(
        compare=[txn.create("/py/g/once") > 0, txn.mod("/py/g/once") > 0],
        success=[txn.delete("/py/g/once")],
        failure=[],
    )
    equal(succeeded, True, "a transaction comparing create and mod revisions, deleting")
    equal(client.get("/py/g/once"), (None, None), "the key the transaction deleted")

    equal(client.delete("/py/z"), True, "delete of a key")
    equal(client.delete("/py/z"), False, "delete of a key deleted already")
    equal(client.get("/py/z"), (None, None), "a deleted key")
    deleted = client.delete("/py/new", prev_kv=True, return_response=True)
    equal((deleted.deleted, [kv.value for kv in deleted.prev_kvs]), (1, [b"x"]), "delete with prev_kv")
    deleted = client.delete_prefix("/py/")
    equal(deleted.deleted, 4, "delete_prefix /py/ (/py/a, /py/b, /py/g/x, /py/g/y)")
    equal(list(client.get_prefix("/py/")), [], "what delete_prefix left")


def lease(client, endpoint):
    """A lease owns keys in both groups until revoked; refresh keeps it."""
    granted = client.lease(30)
    check(granted.id > 0, "a lease id: %r" % granted.id)
    equal(granted.ttl, 30, "the granted TTL")
    owned = ["/py/lease/a", "/py/g/lease"]
    client.put(owned[0], "a", lease=granted)
    client.put(owned[1], "b", lease=granted.id)
    client.put("/py/lease/plain", "c")
    for key in owned:
        equal(client.get(key)[1].lease_id, granted.id, "the lease of %s" % key)
    equal(client.get("/py/lease/plain")[1].lease_id, 0, "the lease of a key put without one")
    equal(sorted(granted.keys), sorted(key.encode() for key in owned), "lease.keys: the lease's keys in both groups")

    refreshed = granted.refresh()
    equal([(answer.ID, answer.TTL) for answer in refreshed], [(granted.id, 30)], "lease.refresh() answers")
    check(0 < granted.remaining_ttl <= 30, "remaining_ttl after a refresh: %r" % granted.remaining_ttl)
    equal(granted.granted_ttl, 30, "granted_ttl")

    # Revoking deletes the lease's keys (in the other group at its next check of the
    # session): each key's watch sees its DELETE.
    watches = [event_queue(client, key) for key in owned]
    granted.revoke()
    for key, (watch_id, events) in zip(owned, watches):
        equal(described(take(events, "the DELETE of %s" % key))[:2], ("DELETE", key), "the event of a revoked lease's key")
        client.cancel_watch(watch_id)
        equal(client.get(key), (None, None), "%s after its lease was revoked" % key)
    equal(client.get("/py/lease/plain")[0], b"c", "a key without the lease stays")
    equal(granted.remaining_ttl, -1, "remaining_ttl of a revoked lease")
    equal([answer.TTL for answer in granted.refresh()], [0], "refreshing a revoked lease answers TTL 0")
    try:
        client.put("/py/lease/late", "x", lease=granted)
        raise Failed("a put with a revoked lease succeeded")
    except Failed:
        raise
    except Exception as error:
        code, details = grpc_code(error)
        equal(code, grpc.StatusCode.NOT_FOUND, "a put with a revoked lease is refused (%s)" % details)
    try:
        granted.revoke()
        raise Failed("revoking a revoked lease succeeded")
    except Failed:
        raise
    except Exception as error:
        code, details = grpc_code(error)
        equal((code, "requested lease not found" in (details or "")), (grpc.StatusCode.NOT_FOUND, True), "revoking twice (%s)" % details)
    client.delete_prefix("/py/lease/")


def watch(client, endpoint):
    """Prefix watches see puts and deletes in order; a watch from a revision gets exactly the
    events from it on; cancel ends a watch."""
    prefix_id, events = event_queue(client, "/py/w/", range_end=etcd3.utils.increment_last_byte(b"/py/w/"), prev_kv=True)
    revisions = [
        client.put("/py/w/a", "1").header.revision,
        client.put("/py/w/b", "2").header.revision,
        client.put("/py/w/a", "3").header.revision,
        client.delete("/py/w/b", return_response=True).header.revision,
        client.put("/py/x", "outside").header.revision,
        client.delete("/py/w/a", return_response=True).header.revision,
    ]
    seen = [take(events, "event %d of the prefix watch" % n) for n in range(5)]
    equal(
        [described(event) for event in seen],
        [("PUT", "/py/w/a", "1"), ("PUT", "/py/w/b", "2"), ("PUT", "/py/w/a", "3"), ("DELETE", "/py/w/b", ""), ("DELETE", "/py/w/a", "")],
        "the prefix watch's events",
    )
    equal([event.mod_revision for event in seen], revisions[:4] + revisions[5:], "the events' revisions (those of the writes)")
    equal([event.prev_value for event in seen[2:]], [b"1", b"2", b"3"], "the events' previous values (prev_kv)")
    client.cancel_watch(prefix_id)

    # The key from the third write's revision on: that put and the delete, then what comes
    # after the watch was made, and nothing else.
    iterator, cancel = client.watch("/py/w/a", start_revision=revisions[2])
    resumed = queue.Queue()
    end = object()

    def drain():
        try:
            for event in iterator:
                resumed.put(event)
        except Exception as error:  # a failed watch is reported to the checks below
            resumed.put(error)
        resumed.put(end)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    first = [take(resumed, "event %d of the resumed watch" % n) for n in range(2)]
    equal([described(event) for event in first], [("PUT", "/py/w/a", "3"), ("DELETE", "/py/w/a", "")], "the events from the revision on")
    equal([event.mod_revision for event in first], [revisions[2], revisions[5]], "their revisions")
    marker = client.put("/py/w/a", "after").header.revision
    latest = take(resumed, "the put after the resumed watch started")
    equal((described(latest), latest.mod_revision), (("PUT", "/py/w/a", "after"), marker), "the next event of the resumed watch")
    cancel()
    check(take(resumed, "the end of the cancelled watch") is end, "a cancelled watch's iterator ends with no more events")
    reader.join(DEADLINE)
    check(not reader.is_alive(), "the cancelled watch's reader ended")
    client.delete_prefix("/py/w/")
    client.delete("/py/x")


def lock(client, endpoint):
    """client.lock: one holder at a time; a waiter gets it when the holder releases, with a
    greater revision (the fencing token)."""
    contender = connect(endpoint)
    name, key = "py-deploy", "/locks/py-deploy"
    first = client.lock(name, ttl=30)
    equal(first.acquire(timeout=DEADLINE), True, "the first acquire")
    equal(first.is_acquired(), True, "the first lock holds")
    value, held = client.get(key)
    equal((value, held.lease_id), (first.uuid, first.lease.id), "the lock key's value and lease")

    second = contender.lock(name, ttl=30)
    equal(second.acquire(timeout=1), False, "a second acquire while the first holds the lock")
    equal((first.is_acquired(), second.is_acquired()), (True, False), "who holds the lock after the refused acquire")

    # A waiting acquire: it watches the key for the holder's delete. The release comes once
    # that watch exists (python-etcd3 watches from the current revision: a delete before it
    # would be seen only when its wait ends).
    watching = threading.Event()
    watch_callback = contender.add_watch_callback

    def watched(*args, **kwargs):
        watch_id = watch_callback(*args, **kwargs)
        watching.set()
        return watch_id

    contender.add_watch_callback = watched
    outcome = queue.Queue()

    def wait_for_the_lock():
        try:
            outcome.put(second.acquire(timeout=2 * DEADLINE))
        except Exception as error:  # reported to the checks below
            outcome.put(error)

    waiter = threading.Thread(target=wait_for_the_lock, daemon=True)
    waiter.start()
    check(watching.wait(DEADLINE), "the waiting acquire watches the lock key")
    check(outcome.empty(), "the waiting acquire returned while the first held the lock: %r" % (outcome.queue,))
    equal(first.release(), True, "the first release")
    equal(take(outcome, "the waiting acquire"), True, "the waiting acquire after the release")
    waiter.join(DEADLINE)
    check(not waiter.is_alive(), "the waiter ended")
    equal((first.is_acquired(), second.is_acquired()), (False, True), "who holds the lock after the hand-over")
    value, next_held = client.get(key)
    equal(value, second.uuid, "the lock key's value for the second holder")
    check(
        next_held.create_revision > held.create_revision and next_held.mod_revision > held.mod_revision,
        "the second hold's revisions (%d, %d) exceed the first's (%d, %d)"
        % (next_held.create_revision, next_held.mod_revision, held.create_revision, held.mod_revision),
    )
    equal(first.release(), False, "a release by a former holder")
    equal(second.is_acquired(), True, "the holder after a former holder's release")
    equal(second.release(), True, "the second release")
    equal(client.get(key), (None, None), "the lock key after the last release")
    first.lease.revoke()
    second.lease.revoke()


def create_above_keys(client, endpoint):
    """A create-if-absent transaction (python-etcd3's idiom, as in `lock`) of a key whose path
    is a parent made for keys below it: that parent reads as absent, so the create holds.
    (`lock(name)` while `lock(name + "/x")` is held still fails: its key would be a leased
    key with keys below it, which Warden refuses; docs/etcd.md, `KV.Put`.)"""
    client.put("/py/jobs/1", "held")
    created, _ = client.transaction(
        compare=[client.transactions.version("/py/jobs") == 0, client.transactions.create("/py/jobs") == 0],
        success=[client.transactions.put("/py/jobs", "mine")],
        failure=[],
    )
    equal(created, True, "a create-if-absent of /py/jobs while /py/jobs/1 exists")
    value, meta = client.get("/py/jobs")
    equal((value, meta.version), (b"mine", 1), "/py/jobs after its create")
    again, _ = client.transaction(
        compare=[client.transactions.version("/py/jobs") == 0], success=[client.transactions.put("/py/jobs", "theirs")], failure=[]
    )
    equal(again, False, "a second create-if-absent of /py/jobs")
    client.delete_prefix("/py/jobs")


def status(client, endpoint):
    """client.status() and client.members answer with this endpoint as the member."""
    members = list(client.members)
    equal(len(members), 1, "the member list")
    equal(list(members[0].client_urls), ["http://" + endpoint], "the member's client URLs")
    answer = client.status()
    check(answer.version.startswith("3."), "status version: %r" % answer.version)
    check(answer.leader is not None, "status names a leader among the members")
    equal(answer.leader.id, members[0].id, "the leader")
    check(answer.raft_index > 0, "status raft_index: %r" % answer.raft_index)


SCENARIOS = [kv, lease, watch, lock, create_above_keys, status]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: scenarios.py HOST:PORT")
    endpoint = sys.argv[1]
    client = connect(endpoint)
    # A clean slate, for runs against a cluster that outlives one run (`warden dev`).
    client.delete_prefix("/py/")
    client.delete("/locks/py-deploy")
    failed = []
    for scenario in SCENARIOS:
        try:
            scenario(client, endpoint)
            print("ok: %s" % scenario.__name__)
        except Exception as error:
            failed.append(scenario.__name__)
            print("FAILED: %s: %s" % (scenario.__name__, described_failure(error)), file=sys.stderr)
            traceback.print_exc()
    if failed:
        sys.exit("failed scenarios: %s" % ", ".join(failed))


if __name__ == "__main__":
    main()
