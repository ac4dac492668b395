"""python-etcd3 (PyPI `etcd3` 0.12.0) holding a lock through the SIGKILL of its group's leader.

Usage: python3 leader_kill.py HOST:PORT

Run by tests/suite/etcd_python.rs against a router of real `warden` processes, whose only
group (the root group) holds the lock, its lease and the watched key. The test and this
script talk in lines, the script's standard output one way and its standard input the other:

  1. script: `held REVISION` once `client.lock("leader-kill", ttl=5)` is held and refreshed
     every second from a thread (`lock.refresh()`), and a watch of `/leader-kill/w` has seen
     the put made there before the kill. REVISION is the lock key's mod revision (its fencing
     token). Nothing else is printed before this line.
  2. test: `killed` once it has SIGKILLed the group's leader, seen a new leader elected and
     let more than a TTL pass after that.
  3. script: checks that the lock is still held and its lease alive through refreshes, that a
     second client cannot acquire it, that puts and gets are served, that the watch (resumed
     from the revision after its last event if its stream ended) sees every put exactly once
     in order, as does a watch from a revision after the kill; then releases the lock and
     checks that a second client acquires it with a greater revision. It prints `ok: ...` per
     check and exits 0, or exits 1 naming what failed.

Every wait has a deadline: nothing sleeps to synchronise. Needs
PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python with protobuf >= 4 (scripts/setup.sh).
"""

import queue
import select
import sys
import threading
import time
import traceback

import etcd3
from etcd3.events import PutEvent

from common import DEADLINE, Failed, check, connect, described_failure, equal, grpc_code, take

# How long the test may take to kill the leader, see a new one and let a TTL pass.
KILLED_DEADLINE = 300.0

# The lock's name (its key is `/locks/` + name) and its lease's TTL.
LOCK = "leader-kill"
LOCK_KEY = "/locks/" + LOCK
LOCK_TTL_S = 5

# How often the holder refreshes its lock's lease.
REFRESH_EVERY_S = 1.0

# The key watched through the kill.
WATCHED = "/leader-kill/w"


def ok(what):
    print("ok: %s" % what, flush=True)


class Refresher(threading.Thread):
    """Refreshes a lock's lease every second, as a holder keeps its lock, and records each
    answer. A refresh may fail while the router finds the group's new leader; the next one
    is tried a second later."""

    def __init__(self, lock):
        super().__init__(daemon=True)
        self.lock = lock
        self.stopped = threading.Event()
        self.changed = threading.Condition()
        # (when the refresh was sent, the TTL answered) of each answered refresh.
        self.answers = []
        # (when the refresh was sent, what went wrong) of each failed one.
        self.failures = []

    def run(self):
        while not self.stopped.is_set():
            sent = time.monotonic()
            try:
                answers = self.lock.refresh()
                outcome = ("answer", answers[0].TTL) if answers else ("failure", "no answer")
            except Exception as error:  # recorded: the checks judge them
                outcome = ("failure", "%r %r" % (error, grpc_code(error)))
            with self.changed:
                (self.answers if outcome[0] == "answer" else self.failures).append((sent, outcome[1]))
                self.changed.notify_all()
            self.stopped.wait(REFRESH_EVERY_S)

    def answered_after(self, after):
        """The TTL answered to the first refresh sent after `after`, waiting for it."""
        end = time.monotonic() + DEADLINE
        with self.changed:
            while True:
                answered = [ttl for sent, ttl in self.answers if sent > after]
                if answered:
                    return answered[0]
                remaining = end - time.monotonic()
                check(remaining > 0, "no refresh of the lock's lease was answered within %.0f s; failures: %r" % (DEADLINE, self.failures[-3:]))
                self.changed.wait(remaining)

    def stop(self):
        self.stopped.set()
        self.join(DEADLINE)
        check(not self.is_alive(), "the refreshing thread ended")


class ResumedWatch:
    """A watch of one key whose events go to a queue; when its stream ends with an error (the
    router may end it when it loses the group's replica), it is created again from the
    revision after the last event seen, as etcd's clients resume a watch."""

    def __init__(self, client, key):
        self.client, self.key = client, key
        self.items = queue.Queue()
        self.last_revision = None
        self.resumed_from = []
        # The reasons of the server's cancels of this client's watches, for failure messages
        # only: python-etcd3 0.12 passes no cancel on to a watch's callback (the watch just
        # goes quiet), so a watch the server cancels can be neither seen nor resumed.
        self.cancels = []
        handle_response = client.watcher._handle_response

        def observed(response):
            if response.canceled:
                self.cancels.append(response.cancel_reason)
            return handle_response(response)

        client.watcher._handle_response = observed
        self.watch_id = client.add_watch_callback(key, self.callback)

    def callback(self, response):
        if isinstance(response, Exception):
            self.items.put(response)
            return
        for event in response.events:
            self.items.put(event)

    def next(self, what):
        """The next event, within the deadline, resuming the watch if its stream ended."""
        end = time.monotonic() + DEADLINE
        while True:
            try:
                item = self.items.get(timeout=max(end - time.monotonic(), 0))
            except queue.Empty:
                raise Failed("nothing came within %.0f s: %s (the server's cancels of the watch: %r)" % (DEADLINE, what, self.cancels))
            if isinstance(item, Exception):
                check(self.last_revision is not None, "%s: the watch failed before its first event: %r" % (what, item))
                check(not isinstance(item, etcd3.exceptions.RevisionCompactedError), "%s: the watch cannot resume: %r" % (what, item))
                self.resumed_from.append(self.last_revision + 1)
                self.watch_id = self.client.add_watch_callback(self.key, self.callback, start_revision=self.last_revision + 1)
                continue
            self.last_revision = item.mod_revision
            return item

    def cancel(self):
        self.client.cancel_watch(self.watch_id)


def put_value(event):
    """A put event as (value, mod revision); anything else fails."""
    check(isinstance(event, PutEvent), "a put event, not %r" % event)
    return (event.value.decode(), event.mod_revision)


def wait_for_killed():
    """Reads the test's `killed` line, within KILLED_DEADLINE."""
    readable, _, _ = select.select([sys.stdin], [], [], KILLED_DEADLINE)
    check(readable, "the test wrote nothing within %.0f s" % KILLED_DEADLINE)
    equal(sys.stdin.readline().strip(), "killed", "the test's line")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: leader_kill.py HOST:PORT")
    endpoint = sys.argv[1]
    holder, contender, watcher = connect(endpoint), connect(endpoint), connect(endpoint)
    # A clean slate, for runs against a cluster that outlives one run (`warden dev`).
    holder.delete(LOCK_KEY)
    holder.delete_prefix("/leader-kill/")

    # Before the kill: the lock held and refreshed, the watch seeing a put.
    lock = holder.lock(LOCK, ttl=LOCK_TTL_S)
    equal(lock.acquire(timeout=DEADLINE), True, "the first acquire")
    refresher = Refresher(lock)
    refresher.start()
    _, held = holder.get(LOCK_KEY)
    watch = ResumedWatch(watcher, WATCHED)
    before = holder.put(WATCHED, "before").header.revision
    equal(put_value(watch.next("the put before the kill")), ("before", before), "the watch's event before the kill")
    print("held %d" % held.mod_revision, flush=True)

    wait_for_killed()
    killed_at = time.monotonic()

    # The new leader gave the lease a whole TTL when it was elected, more than a TTL ago: a
    # refresh answering the granted TTL now shows the refreshes themselves kept it.
    equal(refresher.answered_after(killed_at), LOCK_TTL_S, "a refresh of the lock's lease after the failover (0: the lease ended)")
    lost = [(sent, ttl) for sent, ttl in refresher.answers if ttl <= 0]
    equal(lost, [], "refreshes that found the lease ended")
    ok("the lease lives through the failover (%d refreshes failed while the group had no leader)" % len(refresher.failures))
    equal(lock.is_acquired(), True, "the holder's lock after the failover")
    value, still = holder.get(LOCK_KEY)
    equal((value, still.lease_id, still.mod_revision), (lock.uuid, lock.lease.id, held.mod_revision), "the lock key after the failover")
    ok("the lock is still held")
    second = contender.lock(LOCK, ttl=LOCK_TTL_S)
    equal(second.acquire(timeout=1), False, "a second client's acquire while the first holds the lock")
    ok("a second client's acquire is refused")

    # Puts and gets after the failover; the watch made before it sees each put once, in order.
    revisions = [holder.put(WATCHED, "after-%d" % n).header.revision for n in (1, 2, 3)]
    check(revisions[0] > before and revisions == sorted(set(revisions)), "the puts' revisions grow: %d, then %r" % (before, revisions))
    value, meta = holder.get(WATCHED)
    equal((value, meta.version, meta.mod_revision), (b"after-3", 4, revisions[2]), "the watched key after the puts")
    holder.put("/leader-kill/other", "x")
    equal(holder.get("/leader-kill/other")[0], b"x", "another key put after the failover")
    ok("puts and gets are served")
    seen = [put_value(watch.next("put %d after the kill" % n)) for n in (1, 2, 3)]
    equal(seen, [("after-%d" % n, revision) for n, revision in zip((1, 2, 3), revisions)], "the watch's events after the kill")
    ok("the watch made before the kill sees every put once, in order (resumed from %r)" % watch.resumed_from)

    # A watch from a revision after the kill: exactly the puts from it on.
    iterator, cancel = watcher.watch(WATCHED, start_revision=revisions[0])
    resumed = queue.Queue()

    def drain():
        try:
            for event in iterator:
                resumed.put(event)
        except Exception as error:  # reported by the checks below
            resumed.put(error)

    threading.Thread(target=drain, daemon=True).start()

    from_revision = [put_value(take(resumed, "event %d of the watch from a revision" % n)) for n in (1, 2, 3)]
    equal(from_revision, seen, "the watch from the first put after the kill")
    last = holder.put(WATCHED, "last").header.revision
    equal(put_value(take(resumed, "the put after the watch from a revision started")), ("last", last), "its next event (no repeat)")
    equal(put_value(watch.next("the last put")), ("last", last), "the watch made before the kill: its next event (no repeat)")
    cancel()
    watch.cancel()
    ok("a watch from a revision after the kill sees every put from it once, in order")

    # The hand-over: a greater revision for the next holder.
    refresher.stop()
    equal(lock.release(), True, "the holder's release")
    equal(second.acquire(timeout=DEADLINE), True, "the second client's acquire after the release")
    value, next_held = holder.get(LOCK_KEY)
    equal(value, second.uuid, "the lock key's value for the second holder")
    check(
        next_held.mod_revision > held.mod_revision and next_held.create_revision > held.create_revision,
        "the second hold's revisions (%d, %d) exceed the first's (%d, %d)"
        % (next_held.create_revision, next_held.mod_revision, held.create_revision, held.mod_revision),
    )
    ok("the lock passes to the second client with a greater revision (%d after %d)" % (next_held.mod_revision, held.mod_revision))
    equal(second.release(), True, "the second release")
    lock.lease.revoke()
    second.lease.revoke()
    holder.delete_prefix("/leader-kill/")


if __name__ == "__main__":
    try:
        main()
    except Exception as error:
        traceback.print_exc()
        sys.exit("FAILED: %s" % described_failure(error))
