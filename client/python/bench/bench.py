#!/usr/bin/env python3
"""Put, get and lock+unlock throughput of Warden, etcd and ZooKeeper through the Python client
each is usually used with: `warden` (this repository's client/python), python-etcd3 (`etcd3`)
and kazoo. scripts/bench-python (`make compare-python`) starts each system alone and runs this
against it; docs/python.md ("Benchmark") says what the numbers are.

Run mode, one system per process (one client shared by every thread, as programs use them):

    bench.py --system warden --endpoints 127.0.0.1:7100 --server-pids 123,124 >> warden.jsonl
    bench.py --system warden --asyncio ...     # Warden's AsyncClient, tasks instead of threads
    bench.py --system etcd --endpoints 127.0.0.1:2379,...
    bench.py --system zookeeper --endpoints 127.0.0.1:2181,...

prints one JSON object per (workload, threads) run on stdout, progress on stderr. Table mode,

    bench.py --table warden.jsonl etcd.jsonl zookeeper.jsonl

prints the runs as a markdown table, each row's throughput also as a ratio to etcd3's in the
same workload at the same thread count.

Each run: every thread prepares (a Warden session for the lock workload), all start together
(a barrier), run --warmup-s unmeasured, then --duration-s measured; the server processes' CPU
time (/proc/<pid>/stat of --server-pids and their descendants) and this process's are read at
the window's two ends. An operation counts when it completes inside the window. Workloads:

  put   replace the value of an existing key (Warden `set`, etcd `put`, ZooKeeper `set`) with
        --value-bytes of data; the keys /bench/p{i}/k{j} (i < --prefixes, j < --keys-per-prefix)
        are created before the first run, each operation picks one at random
  get   read one of those keys (each client's default read: linearizable for Warden and etcd;
        ZooKeeper's reads are answered by the server the client is connected to)
  lock  acquire an exclusive lock and release it: one lock name per thread,
        /bench/p{t mod prefixes}/lock-t{t}, so no two threads contend (Warden: the thread's own
        session, `session.try_lock(name, wait_s=deadline)` then `unlock()`; etcd3:
        `client.lock(name, ttl)` made once per thread, `acquire(timeout=deadline)` then
        `release()`; kazoo: `kazoo.recipe.lock.Lock(client, name)` made once per thread,
        `acquire(timeout=deadline)` then `release()`)

Every call has a deadline (--deadline-s): Warden's `request_timeout_s` and lock `wait_s`,
etcd3's client `timeout` and lock `acquire(timeout=...)`, kazoo's `*_async(...).get(timeout=...)`
and lock `acquire(timeout=...)`; kazoo's `Lock.release` takes none, and is bounded by the
session timeout. A thread still inside a call --deadline-s + 5 s after the window ended is
reported as stuck. Every failure is counted (`errors`, by kind in `error_kinds`), never retried
by this program nor hidden; a failed `get` includes a missing or wrong-sized value, a failed
lock one that was not acquired in time.
"""

import argparse
import asyncio
import importlib.metadata
import json
import math
import os
import platform
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

WORKLOADS = ("put", "get", "lock")
SYSTEMS = ("warden", "etcd", "zookeeper")
#: Warden's session TTL, etcd3's lock lease TTL and ZooKeeper's session timeout, in seconds.
SESSION_TTL_S = 10
#: How long a thread may still be in a call after the window ended (beyond --deadline-s).
STUCK_GRACE_S = 5.0
#: Characters of an error message kept in `error_kinds`.
ERROR_MESSAGE_CHARS = 160
CLOCK = time.perf_counter


class BenchError(Exception):
    """A result that is wrong although the call succeeded (a missing value, a lock not
    acquired in time, a release that found the lock gone)."""


# ---------------------------------------------------------------------------------------------
# The systems: each through its usual client, with the same operations


def key_path(prefix: int, key: int) -> str:
    return f"/bench/p{prefix}/k{key}"


def lock_path(thread: int, prefixes: int) -> str:
    return f"/bench/p{thread % prefixes}/lock-t{thread}"


def version_of(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def protobuf_implementation() -> Optional[str]:
    try:
        from google.protobuf.internal import api_implementation

        return api_implementation.Type()
    except ImportError:
        return None


class Warden:
    """Warden through `warden.Client` (one client: every call goes through its event-loop
    thread, as in any program using the blocking client)."""

    system = "warden"
    library = "warden"
    distribution = "warden-client"
    get_consistency = "linearizable (the client's default)"

    def __init__(self, endpoints: Sequence[str], deadline_s: float) -> None:
        import warden

        self.warden = warden
        self.deadline_s = deadline_s
        self.client = warden.Client(list(endpoints), request_timeout_s=deadline_s, connect_timeout_s=deadline_s)

    def create_or_set(self, path: str, value: bytes) -> None:
        try:
            self.client.create(path, value, create_parents=True)
        except self.warden.NodeExistsError:
            self.client.set(path, value)

    def put(self, path: str, value: bytes) -> None:
        self.client.set(path, value)

    def get(self, path: str) -> Optional[bytes]:
        return self.client.get(path).data

    def lock_open(self, name: str) -> Any:
        return self.client.session(ttl_s=SESSION_TTL_S)

    def lock_once(self, session: Any, name: str) -> None:
        guard = session.try_lock(name, wait_s=self.deadline_s)
        if guard is None:
            raise BenchError(f"lock {name} not acquired within {self.deadline_s}s")
        guard.unlock()

    def lock_close(self, session: Any) -> None:
        session.close()

    def close(self) -> None:
        self.client.close()


class AcquireRelease:
    """The lock cycle of libraries whose lock objects acquire with a timeout and release
    (python-etcd3's `Lock`, kazoo's `Lock`, which raises `LockTimeout` past the deadline);
    the lock object is kept between cycles and needs no closing."""

    deadline_s: float

    def lock_once(self, lock: Any, name: str) -> None:
        if not lock.acquire(timeout=self.deadline_s):
            raise BenchError(f"lock {name} not acquired within {self.deadline_s}s")
        if not lock.release():
            raise BenchError(f"lock {name} was no longer held at its release")

    def lock_close(self, lock: Any) -> None:
        pass


class Etcd(AcquireRelease):
    """etcd through python-etcd3 (`etcd3.client`): 0.12 talks to one endpoint, the first of
    --endpoints (its members forward what needs the leader)."""

    system = "etcd"
    library = "etcd3"
    distribution = "etcd3"
    get_consistency = "linearizable (the client's default)"

    def __init__(self, endpoints: Sequence[str], deadline_s: float) -> None:
        # etcd3 0.12's generated modules need pure-Python protobuf (scripts/setup.sh).
        os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
        import etcd3

        host, _, port = endpoints[0].rpartition(":")
        self.deadline_s = deadline_s
        self.client = etcd3.client(host=host, port=int(port), timeout=deadline_s)

    def create_or_set(self, path: str, value: bytes) -> None:
        self.client.put(path, value)

    def put(self, path: str, value: bytes) -> None:
        self.client.put(path, value)

    def get(self, path: str) -> Optional[bytes]:
        value, _meta = self.client.get(path)
        return value

    def lock_open(self, name: str) -> Any:
        # etcd3's Lock keys are /locks/<name>.
        return self.client.lock(name.lstrip("/"), ttl=SESSION_TTL_S)

    def close(self) -> None:
        self.client.close()


class ZooKeeper(AcquireRelease):
    """ZooKeeper through kazoo (`KazooClient` with every server of --endpoints; it connects to
    one of them, chosen at random)."""

    system = "zookeeper"
    library = "kazoo"
    distribution = "kazoo"
    get_consistency = "the connected server's (ZooKeeper's reads are not linearizable)"

    def __init__(self, endpoints: Sequence[str], deadline_s: float) -> None:
        from kazoo.client import KazooClient
        from kazoo.exceptions import NodeExistsError
        from kazoo.recipe.lock import Lock

        self.node_exists = NodeExistsError
        self.lock_class = Lock
        self.deadline_s = deadline_s
        self.client = KazooClient(hosts=",".join(endpoints), timeout=SESSION_TTL_S)
        self.client.start(timeout=deadline_s)

    def create_or_set(self, path: str, value: bytes) -> None:
        try:
            self.client.create_async(path, value, makepath=True).get(timeout=self.deadline_s)
        except self.node_exists:
            self.put(path, value)

    def put(self, path: str, value: bytes) -> None:
        self.client.set_async(path, value).get(timeout=self.deadline_s)

    def get(self, path: str) -> Optional[bytes]:
        data, _stat = self.client.get_async(path).get(timeout=self.deadline_s)
        return data

    def lock_open(self, name: str) -> Any:
        return self.lock_class(self.client, name)

    def close(self) -> None:
        self.client.stop()
        self.client.close()


class AsyncWarden:
    """Warden through `warden.AsyncClient`: the same operations as coroutines, run as tasks
    on one event loop (a "thread" is a task)."""

    system = "warden"
    library = "warden"
    distribution = "warden-client"
    get_consistency = Warden.get_consistency

    def __init__(self, client: Any, deadline_s: float) -> None:
        import warden

        self.warden = warden
        self.client = client
        self.deadline_s = deadline_s

    @classmethod
    async def connect(cls, endpoints: Sequence[str], deadline_s: float) -> "AsyncWarden":
        from warden import AsyncClient

        client = await AsyncClient.connect(list(endpoints), request_timeout_s=deadline_s, connect_timeout_s=deadline_s)
        return cls(client, deadline_s)

    async def create_or_set(self, path: str, value: bytes) -> None:
        try:
            await self.client.create(path, value, create_parents=True)
        except self.warden.NodeExistsError:
            await self.client.set(path, value)

    async def put(self, path: str, value: bytes) -> None:
        await self.client.set(path, value)

    async def get(self, path: str) -> Optional[bytes]:
        return (await self.client.get(path)).data

    async def lock_open(self, name: str) -> Any:
        return await self.client.session(ttl_s=SESSION_TTL_S)

    async def lock_once(self, session: Any, name: str) -> None:
        guard = await session.try_lock(name, wait_s=self.deadline_s)
        if guard is None:
            raise BenchError(f"lock {name} not acquired within {self.deadline_s}s")
        await guard.unlock()

    async def lock_close(self, session: Any) -> None:
        await session.close()

    async def close(self) -> None:
        await self.client.close()


SYNC_SYSTEMS = {"warden": Warden, "etcd": Etcd, "zookeeper": ZooKeeper}


# ---------------------------------------------------------------------------------------------
# Measuring


class Worker:
    """What one thread (or task) did: completion times and latencies of its successful
    operations, and its failures."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.done: List[float] = []
        self.latency: List[float] = []
        self.errors: List[Tuple[float, str]] = []
        self.samples: Dict[str, str] = {}
        self.setup_error: Optional[str] = None
        self.loop_done = False

    def failed(self, error: BaseException) -> None:
        kind = type(error).__name__
        self.errors.append((CLOCK(), kind))
        if kind not in self.samples:
            self.samples[kind] = describe(error)


def describe(error: BaseException) -> str:
    kind = type(error).__name__
    text = " ".join(str(error).split()) or repr(error)
    if not text.startswith(kind):
        text = f"{kind}: {text}"
    return text[: len(kind) + 2 + ERROR_MESSAGE_CHARS]


class Operation:
    """One workload's operation for one worker: `state` is what the worker keeps (its random
    generator and value; its lock handle)."""

    def __init__(self, system: Any, workload: str, args: argparse.Namespace) -> None:
        self.system = system
        self.workload = workload
        self.keys = [key_path(i, j) for i in range(args.prefixes) for j in range(args.keys_per_prefix)]
        self.value_bytes = args.value_bytes
        self.prefixes = args.prefixes

    def state(self, index: int) -> SimpleNamespace:
        rng = random.Random(index)
        return SimpleNamespace(rng=rng, value=rng.randbytes(self.value_bytes), lock_name=lock_path(index, self.prefixes), handle=None)

    def check(self, path: str, data: Optional[bytes]) -> None:
        if data is None or len(data) != self.value_bytes:
            raise BenchError(f"get {path}: {'no value' if data is None else f'{len(data)} bytes'}, not {self.value_bytes} bytes")


def server_processes(pids: Sequence[int]) -> List[int]:
    """The given pids and all their descendants alive now."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = read_stat(int(entry))
        if stat is not None:
            children.setdefault(int(stat[1]), []).append(int(entry))
    found: List[int] = []
    pending = list(pids)
    while pending:
        pid = pending.pop()
        if pid in found:
            continue
        found.append(pid)
        pending.extend(children.get(pid, []))
    return sorted(found)


def read_stat(pid: int) -> Optional[List[str]]:
    """/proc/<pid>/stat's fields after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Sequence[int]) -> Tuple[float, List[int]]:
    """The processes' user + system CPU seconds, and those of them that are gone."""
    total = 0.0
    gone: List[int] = []
    for pid in pids:
        stat = read_stat(pid)
        if stat is None:
            gone.append(pid)
            continue
        total += (int(stat[11]) + int(stat[12])) / TICKS_PER_S  # utime, stime (fields 14, 15)
    return total, gone


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def percentile(sorted_values: Sequence[float], fraction: float) -> Optional[float]:
    """The nearest-rank percentile."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class Window:
    """The measured window's ends and the CPU readings there."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = pids
        self.start = self.end = 0.0
        self.server_cpu = [0.0, 0.0]
        self.own_cpu = [0.0, 0.0]
        self.gone: List[int] = []

    def open(self) -> None:
        self.server_cpu[0], self.gone = cpu_seconds(self.pids)
        self.own_cpu[0] = own_cpu_seconds()
        self.start = CLOCK()

    def close(self) -> None:
        self.end = CLOCK()
        self.server_cpu[1], gone = cpu_seconds(self.pids)
        self.own_cpu[1] = own_cpu_seconds()
        self.gone = sorted(set(self.gone) | set(gone))


def sleep_until(moment: float) -> None:
    """Waits for a point of the run's timeline (the window's ends), not for another thread."""
    while True:
        left = moment - CLOCK()
        if left <= 0:
            return
        time.sleep(left)


def result(
    system: Any,
    mode: str,
    workload: str,
    threads: int,
    workers: Sequence[Worker],
    window: Window,
    stuck: Sequence[int],
    args: argparse.Namespace,
    endpoints: Sequence[str],
) -> Dict[str, Any]:
    """The run's JSON object."""
    latencies: List[float] = []
    errors: Counter = Counter()
    outside = 0
    samples: Dict[str, str] = {}
    for worker in workers:
        for done, latency in zip(worker.done, worker.latency):
            if window.start <= done <= window.end:
                latencies.append(latency)
        for at, kind in worker.errors:
            if window.start <= at <= window.end:
                errors[kind] += 1
            else:
                outside += 1
        for kind, sample in worker.samples.items():
            samples.setdefault(kind, sample)
        if worker.setup_error is not None:
            errors["setup"] += 1
            samples.setdefault("setup", worker.setup_error)
    for index in stuck:
        errors["stuck"] += 1
        samples.setdefault("stuck", f"worker {index} was still in a call {args.deadline_s + STUCK_GRACE_S}s after the window ended")
    latencies.sort()
    ops = len(latencies)
    duration = window.end - window.start
    server_cpu = window.server_cpu[1] - window.server_cpu[0]
    own_cpu = window.own_cpu[1] - window.own_cpu[0]
    p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
    return {
        "system": system.system,
        "client": system.library,
        "client_version": version_of(system.distribution),
        "mode": mode,
        "workload": workload,
        "threads": threads,
        "ops": ops,
        "ops_per_sec": round(ops / duration, 1) if duration > 0 else None,
        "p50_ms": round(p50 * 1000, 3) if p50 is not None else None,
        "p99_ms": round(p99 * 1000, 3) if p99 is not None else None,
        "errors": sum(errors.values()),
        "error_kinds": {kind: {"count": count, "sample": samples.get(kind, "")} for kind, count in sorted(errors.items())},
        "errors_outside_window": outside,
        "duration_s": round(duration, 3),
        "warmup_s": args.warmup_s,
        "deadline_s": args.deadline_s,
        "value_bytes": args.value_bytes,
        "keys": args.prefixes * args.keys_per_prefix,
        "lock_names": "one per thread, uncontended: /bench/p{t mod %d}/lock-t{t}" % args.prefixes,
        "get_consistency": system.get_consistency,
        "server_pids": list(window.pids),
        "server_pids_gone": window.gone,
        "server_cpu_s": round(server_cpu, 3),
        "server_cpu_us_per_op": round(server_cpu / ops * 1e6, 1) if ops and window.pids else None,
        "client_cpu_us_per_op": round(own_cpu / ops * 1e6, 1) if ops else None,
        "endpoints": list(endpoints),
        "python": platform.python_version(),
        "protobuf": protobuf_implementation(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_threads(system: Any, workload: str, threads: int, args: argparse.Namespace, pids: Sequence[int]) -> Tuple[List[Worker], Window, List[int]]:
    """One run with `threads` threads sharing `system`'s client."""
    operation = Operation(system, workload, args)
    workers = [Worker(i) for i in range(threads)]
    window = Window(pids)
    timeline = SimpleNamespace(start=0.0, end=0.0, stop=False)

    def plan() -> None:  # run by the barrier once every thread is ready, before any goes on
        timeline.start = CLOCK() + args.warmup_s
        timeline.end = timeline.start + args.duration_s

    barrier = threading.Barrier(threads + 1, action=plan, timeout=args.deadline_s + STUCK_GRACE_S)

    def work(worker: Worker) -> None:
        state = operation.state(worker.index)
        try:
            if workload == "lock":
                state.handle = system.lock_open(state.lock_name)
        except Exception as error:  # counted in the run's errors
            worker.setup_error = describe(error)
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        if worker.setup_error is None:
            loop(worker, state)
        worker.loop_done = True
        if state.handle is not None:
            try:
                system.lock_close(state.handle)
            except Exception as error:
                print(f"bench: closing worker {worker.index}'s lock handle failed: {describe(error)}", file=sys.stderr)

    def loop(worker: Worker, state: SimpleNamespace) -> None:
        keys, count, rng, value = operation.keys, len(operation.keys), state.rng, state.value
        done, latency = worker.done, worker.latency
        while not timeline.stop:
            started = CLOCK()
            try:
                if workload == "put":
                    system.put(keys[rng.randrange(count)], value)
                elif workload == "get":
                    path = keys[rng.randrange(count)]
                    operation.check(path, system.get(path))
                else:
                    system.lock_once(state.handle, state.lock_name)
            except Exception as error:
                worker.failed(error)
                continue
            finished = CLOCK()
            done.append(finished)
            latency.append(finished - started)

    pool = [threading.Thread(target=work, args=(w,), name=f"bench-{w.index}", daemon=True) for w in workers]
    for thread in pool:
        thread.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        timeline.stop = True
        raise RuntimeError(f"the {threads} threads were not ready within {barrier.timeout}s (setup calls hung)")
    sleep_until(timeline.start)
    window.open()
    sleep_until(timeline.end)
    window.close()
    timeline.stop = True
    give_up = CLOCK() + args.deadline_s + STUCK_GRACE_S
    for thread in pool:
        thread.join(max(0.0, give_up - CLOCK()))
    stuck = [w.index for w in workers if not w.loop_done]
    return workers, window, stuck


async def run_tasks(system: AsyncWarden, workload: str, tasks: int, args: argparse.Namespace, pids: Sequence[int]) -> Tuple[List[Worker], Window, List[int]]:
    """One run with `tasks` asyncio tasks sharing `system`'s client."""
    operation = Operation(system, workload, args)
    workers = [Worker(i) for i in range(tasks)]
    window = Window(pids)
    states = [operation.state(i) for i in range(tasks)]
    stop = asyncio.Event()

    async def prepare(worker: Worker, state: SimpleNamespace) -> None:
        try:
            if workload == "lock":
                state.handle = await system.lock_open(state.lock_name)
        except Exception as error:
            worker.setup_error = describe(error)

    async def work(worker: Worker, state: SimpleNamespace) -> None:
        keys, count, rng, value = operation.keys, len(operation.keys), state.rng, state.value
        while not stop.is_set():
            started = CLOCK()
            try:
                if workload == "put":
                    await system.put(keys[rng.randrange(count)], value)
                elif workload == "get":
                    path = keys[rng.randrange(count)]
                    operation.check(path, await system.get(path))
                else:
                    await system.lock_once(state.handle, state.lock_name)
            except Exception as error:
                worker.failed(error)
                continue
            finished = CLOCK()
            worker.done.append(finished)
            worker.latency.append(finished - started)
        worker.loop_done = True

    await asyncio.wait_for(asyncio.gather(*(prepare(w, s) for w, s in zip(workers, states))), args.deadline_s + STUCK_GRACE_S)
    start = CLOCK() + args.warmup_s
    running = [asyncio.ensure_future(work(w, s)) for w, s in zip(workers, states) if w.setup_error is None]
    await asyncio.sleep(max(0.0, start - CLOCK()))
    window.open()
    await asyncio.sleep(max(0.0, window.start + args.duration_s - CLOCK()))
    window.close()
    stop.set()
    stuck: List[int] = []
    if running:
        _done, pending = await asyncio.wait(running, timeout=args.deadline_s + STUCK_GRACE_S)
        for task in pending:
            task.cancel()
        stuck = [w.index for w in workers if w.setup_error is None and not w.loop_done]
    for state in states:
        if state.handle is not None:
            try:
                await asyncio.wait_for(system.lock_close(state.handle), args.deadline_s)
            except Exception as error:
                print(f"bench: closing a session failed: {describe(error)}", file=sys.stderr)
    return workers, window, stuck


# ---------------------------------------------------------------------------------------------
# Run mode


def parse_list(text: str, kind: Callable[[str], Any]) -> List[Any]:
    return [kind(part) for part in text.split(",") if part.strip()]


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def emit(line: Dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)
    if line.get("status"):
        progress(f"  -> {line['status']}: {line.get('message')}")
    else:
        progress(
            f"  -> {line['ops_per_sec']} ops/s, p50 {line['p50_ms']} ms, p99 {line['p99_ms']} ms, "
            f"{line['errors']} errors, server {line['server_cpu_us_per_op']} us/op"
        )
        for kind, what in line["error_kinds"].items():
            progress(f"     {what['count']} x {kind}: {what['sample']}")


def failed_line(system: str, library: str, mode: str, workload: str, threads: int, message: str) -> Dict[str, Any]:
    return {"system": system, "client": library, "mode": mode, "workload": workload, "threads": threads, "status": "failed", "message": message}


def create_keys(system: Any, args: argparse.Namespace) -> None:
    """Creates (or overwrites) every key of the put and get workloads, 16 at a time."""
    value = random.Random(0).randbytes(args.value_bytes)
    paths = [key_path(i, j) for i in range(args.prefixes) for j in range(args.keys_per_prefix)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda path: system.create_or_set(path, value), paths))


async def create_keys_async(system: AsyncWarden, args: argparse.Namespace) -> None:
    value = random.Random(0).randbytes(args.value_bytes)
    paths = [key_path(i, j) for i in range(args.prefixes) for j in range(args.keys_per_prefix)]
    for first in range(0, len(paths), 16):
        await asyncio.gather(*(system.create_or_set(path, value) for path in paths[first : first + 16]))


def run_sync(args: argparse.Namespace, endpoints: List[str], pids: List[int]) -> int:
    kind = SYNC_SYSTEMS[args.system]
    try:
        system = kind(endpoints, args.deadline_s)
    except Exception as error:
        for workload in args.workloads:
            for threads in args.threads:
                emit(failed_line(kind.system, kind.library, "threads", workload, threads, f"connecting: {describe(error)}"))
        return 1
    status = 0
    try:
        progress(f"{kind.system} through {kind.library} {version_of(kind.distribution)}: creating {args.prefixes * args.keys_per_prefix} keys")
        try:
            create_keys(system, args)
        except Exception as error:
            for workload in args.workloads:
                for threads in args.threads:
                    emit(failed_line(kind.system, kind.library, "threads", workload, threads, f"creating the keys: {describe(error)}"))
            return 1
        for workload in args.workloads:
            for threads in args.threads:
                progress(f"{kind.system} {workload}, {threads} threads: {args.warmup_s}s warm-up, {args.duration_s}s measured")
                try:
                    workers, window, stuck = run_threads(system, workload, threads, args, server_processes(pids))
                except Exception as error:
                    emit(failed_line(kind.system, kind.library, "threads", workload, threads, describe(error)))
                    status = 1
                    continue
                emit(result(system, "threads", workload, threads, workers, window, stuck, args, endpoints))
    except Exception as error:
        progress(f"{kind.system}: {describe(error)}")
        status = 1
    finally:
        try:
            system.close()
        except Exception as error:
            progress(f"closing the {kind.library} client failed: {describe(error)}")
    return status


async def run_async(args: argparse.Namespace, endpoints: List[str], pids: List[int]) -> int:
    try:
        system = await AsyncWarden.connect(endpoints, args.deadline_s)
    except Exception as error:
        for workload in args.workloads:
            for threads in args.threads:
                emit(failed_line("warden", "warden", "asyncio", workload, threads, f"connecting: {describe(error)}"))
        return 1
    status = 0
    try:
        progress(f"warden through warden {version_of('warden-client')} (asyncio): creating {args.prefixes * args.keys_per_prefix} keys")
        try:
            await create_keys_async(system, args)
        except Exception as error:
            for workload in args.workloads:
                for tasks in args.threads:
                    emit(failed_line("warden", "warden", "asyncio", workload, tasks, f"creating the keys: {describe(error)}"))
            return 1
        for workload in args.workloads:
            for tasks in args.threads:
                progress(f"warden (asyncio) {workload}, {tasks} tasks: {args.warmup_s}s warm-up, {args.duration_s}s measured")
                try:
                    workers, window, stuck = await run_tasks(system, workload, tasks, args, server_processes(pids))
                except Exception as error:
                    emit(failed_line("warden", "warden", "asyncio", workload, tasks, describe(error)))
                    status = 1
                    continue
                emit(result(system, "asyncio", workload, tasks, workers, window, stuck, args, endpoints))
    except Exception as error:
        progress(f"warden (asyncio): {describe(error)}")
        status = 1
    finally:
        try:
            await asyncio.wait_for(system.close(), args.deadline_s)
        except Exception as error:
            progress(f"closing the warden client failed: {describe(error)}")
    return status


# ---------------------------------------------------------------------------------------------
# Table mode

SYSTEM_ORDER = {("etcd", "threads"): 0, ("zookeeper", "threads"): 1, ("warden", "threads"): 2, ("warden", "asyncio"): 3}


def read_runs(paths: Iterable[str]) -> List[Dict[str, Any]]:
    runs: List[Dict[str, Any]] = []
    for path in paths:
        with (sys.stdin if path == "-" else open(path)) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    run = json.loads(line)
                except json.JSONDecodeError as error:
                    raise SystemExit(f"bench: {path}:{number} is not JSON: {error}")
                if isinstance(run, dict) and "workload" in run:
                    runs.append(run)
    return runs


def number(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def table(runs: List[Dict[str, Any]]) -> str:
    def order(run: Dict[str, Any]) -> Tuple[Any, ...]:
        workload = run.get("workload")
        return (
            WORKLOADS.index(workload) if workload in WORKLOADS else len(WORKLOADS),
            int(run.get("threads") or 0),
            SYSTEM_ORDER.get((run.get("system"), run.get("mode", "threads")), 9),
        )

    etcd = {
        (r["workload"], r["threads"]): r.get("ops_per_sec")
        for r in runs
        if r.get("system") == "etcd" and r.get("mode", "threads") == "threads" and not r.get("status")
    }
    lines = [
        "| system | client | workload | threads | ops/s | vs etcd3 | p50 ms | p99 ms | errors | server CPU µs/op | client CPU µs/op |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for run in sorted(runs, key=order):
        system = run.get("system", "?")
        client = run.get("client", "?")
        if run.get("client_version"):
            client += " " + run["client_version"]
        if run.get("mode") == "asyncio":
            client += " (asyncio)"
        threads = run.get("threads", "?")
        if run.get("status"):
            message = str(run.get("message", "")).replace("|", "\\|")
            lines.append(f"| {system} | {client} | {run['workload']} | {threads} | {run['status']}: {message} | | | | | | |")
            continue
        reference = etcd.get((run["workload"], run["threads"]))
        ops = run.get("ops_per_sec")
        ratio = f"{ops / reference:.2f}×" if ops is not None and reference else "–"
        errors = str(run.get("errors", 0))
        if run.get("errors_outside_window"):
            errors += f" (+{run['errors_outside_window']} outside the window)"
        lines.append(
            f"| {system} | {client} | {run['workload']} | {threads} | {number(ops)} | {ratio} | {number(run.get('p50_ms'), 2)} "
            f"| {number(run.get('p99_ms'), 2)} | {errors} | {number(run.get('server_cpu_us_per_op'))} | {number(run.get('client_cpu_us_per_op'))} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", nargs="+", metavar="JSONL", help="print the runs of these JSON-lines files (- for stdin) as a markdown table")
    parser.add_argument("--system", choices=SYSTEMS)
    parser.add_argument("--endpoints", help="comma-separated host:port list of the system's client endpoints")
    parser.add_argument("--asyncio", action="store_true", help="warden only: the AsyncClient, with asyncio tasks in place of threads")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, of put,get,lock (default all)")
    parser.add_argument("--threads", default="1,16,64", help="comma-separated thread counts (default 1,16,64)")
    parser.add_argument("--duration-s", type=float, default=10.0, help="measured seconds per run (default 10)")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="unmeasured seconds before each run's window (default 2)")
    parser.add_argument("--deadline-s", type=float, default=5.0, help="deadline of every call (default 5)")
    parser.add_argument("--value-bytes", type=int, default=256)
    parser.add_argument("--prefixes", type=int, default=16, help="keys and locks spread over /bench/p0 … (default 16)")
    parser.add_argument("--keys-per-prefix", type=int, default=64)
    parser.add_argument("--server-pids", default="", help="comma-separated pids of the server processes (their descendants count too)")
    args = parser.parse_args()

    if args.table:
        sys.stdout.write(table(read_runs(args.table)))
        return 0
    if not args.system or not args.endpoints:
        parser.error("--system and --endpoints are needed (or --table)")
    if args.asyncio and args.system != "warden":
        parser.error("--asyncio is for --system warden only")
    args.workloads = parse_list(args.workloads, str)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads: {','.join(unknown)}")
    args.threads = parse_list(args.threads, int)
    if not args.threads or min(args.threads) < 1:
        parser.error("--threads needs positive counts")
    endpoints = parse_list(args.endpoints, str)
    pids = parse_list(args.server_pids, int)
    missing = [pid for pid in pids if read_stat(pid) is None]
    if missing:
        parser.error(f"no such server processes: {missing}")
    if args.asyncio:
        return asyncio.run(run_async(args, endpoints, pids))
    return run_sync(args, endpoints, pids)


if __name__ == "__main__":
    sys.exit(main())
