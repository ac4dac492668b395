#!/usr/bin/env python3
"""The `make compare` section of docs/benchmarks.md from the raw results of scripts/bench-vs
(standard library only).

    bench-report.py machine --commit SHA --work-dir DIR --quick 0|1 --duration-s S --warmup-s S > run.json
    bench-report.py report RESULTS_DIR OUT.md

`report` rewrites only the text between OUT.md's two markers (SECTION_BEGIN, SECTION_END) and
keeps the hand-written rest of the document; an OUT.md that does not exist yet (a trial run's)
is written with the section alone.

`machine` records what the report needs about the run and the machine while it runs (so the
report can be regenerated later from the committed results); `report` reads RESULTS_DIR's
run.json, commands.txt and <system>.jsonl files (one warden-loadgen JSON object per line, or
a {"status": "skipped"|"failed", "message": ...} record for a run the target refused), and
warden-cluster.jsonl (`warden bench cluster`'s lines, for the isolated-nodes table).
Every figure in the report, including whether a target is met, is computed from those files.
If benchmarks/analysis.md exists beside the results (written by hand from a profile), it is
included under the targets.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

SYSTEMS = ["etcd", "zookeeper", "warden", "warden-direct", "warden-etcd"]
SYSTEM_NAMES = {"etcd": "etcd", "zookeeper": "ZooKeeper", "warden": "Warden", "warden-direct": "Warden, direct calls",
                "warden-etcd": "Warden, etcd API"}
WORKLOADS = [
    ("put", "overwrite an existing key"),
    ("get", "linearizable read of an existing key"),
    ("txn-cas", "compare-and-swap transaction on an existing key"),
    ("create-delete", "create a new key, then delete it (one op = the pair)"),
    ("lock", "acquire and release a lock (one op = one lock+unlock cycle)"),
    ("session-keepalive", "session (etcd: lease) keep-alive round trips"),
    ("watch", "watchers receiving writes' events; latency from the write's acknowledgement to the delivery"),
    ("mixed", "90% linearizable gets, 10% puts"),
    ("election", "leader failover: the leader's process is SIGKILLed; latency from the kill until another of the 3 candidates leads (session TTL 4 s; one op = one failover)"),
]
# The load generator's targets, at this many clients.
TARGET_CLIENTS = 1000
TARGET_THROUGHPUT_RATIO = 3.0
TARGET_VS_ZOOKEEPER_RATIO = 1.5
# Isolated nodes: Warden with this many groups against etcd and against Warden with 1 group.
ISOLATED_GROUPS = 16
# Through the etcd API, at least this share of Warden's own API's throughput on the same cluster.
ETCD_API_VS_NATIVE_RATIO = 0.9
ISOLATED_VS_ONE_GROUP_RATIO = 2.5


def command_output(args):
    """The first line of a command's output (stdout, else stderr), or None if it cannot run."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else None


def cpu_model():
    """lscpu's model name, or None."""
    try:
        done = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in done.stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            return value.strip()
    return None


def memory_gib():
    """MemTotal in GiB, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1024 * 1024), 1)
    except OSError:
        pass
    return None


def disk_of(path):
    """What can be known of the disk holding `path` (where the servers fsync)."""
    try:
        done = subprocess.run(["df", "--output=source,fstype", path], capture_output=True, text=True, timeout=30, check=False)
        source, fstype = done.stdout.strip().splitlines()[-1].split()[:2]
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return "unknown"
    block = "/sys/class/block/" + os.path.basename(source)
    if os.path.isdir(block) and not os.path.isdir(block + "/queue"):
        block = os.path.realpath(block + "/..")  # a partition: the queue is its disk's
    facts = [f"{source} ({fstype})"]
    driver = os.path.realpath(block + "/device/driver") if os.path.exists(block + "/device/driver") else ""
    if driver:
        facts.append("driver " + os.path.basename(driver))
    try:
        with open(block + "/queue/rotational") as f:
            rotational = f.read().strip() == "1"
        facts.append("reports rotational" if rotational else "reports non-rotational (SSD/NVMe)")
    except OSError:
        pass
    if "virtio" in " ".join(facts):
        facts.append("a virtual machine's disk: the physical medium is not visible")
    return ", ".join(facts)


def machine(args):
    """Prints run.json: the machine, the date, the commit and the run's parameters."""
    java = command_output(["java", "-version"])
    zookeeper = command_output(["dpkg-query", "-W", "-f=${Version}", "zookeeper"])
    run = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": args.commit,
        "quick": args.quick == 1,
        "duration_s": args.duration_s,
        "warmup_s": args.warmup_s,
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gib": memory_gib(),
        "disk": disk_of(args.work_dir),
        "kernel": platform.release(),
        "os": command_output(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "etcd_version": command_output(["etcd", "--version"]),
        "zookeeper_version": f"Debian package {zookeeper}" if zookeeper else None,
        "java_version": java,
    }
    json.dump(run, sys.stdout, indent=2)
    print()


# ---------------------------------------------------------------------------------------------
# The report


def load_runs(results_dir):
    """Every run of every system, as dicts, in file order."""
    runs = []
    for system in SYSTEMS:
        path = os.path.join(results_dir, system + ".jsonl")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    run = json.loads(line)
                except json.JSONDecodeError as error:
                    sys.exit(f"bench-report: {path}:{number}: not JSON: {error}")
                run.setdefault("target", system)
                # The results file names the system (warden-direct: Warden's target, direct calls).
                run["system"] = system
                runs.append(run)
    return runs


def completed(run):
    """Whether the run measured something: not refused, and not a run whose every operation
    the target answered as unsupported (then it is shown as skipped)."""
    return "status" not in run and not (not run.get("ops") and (run.get("errors_by_kind") or {}).get("unsupported"))


def label(run):
    return run.get("label") or ""


def kind(run):
    """Which table a run belongs to: isolated (label capped=CORES), scaling (label groups=N),
    open-loop (a rate) or main."""
    if label(run).startswith("capped="):
        return "isolated"
    if label(run).startswith("groups="):
        return "scaling"
    if run.get("rate") is not None or label(run) == "open-loop":
        return "open-loop"
    return "main"


def find(runs, system, workload, clients, table="main"):
    for run in runs:
        if run.get("system", run.get("target")) == system and run.get("workload") == workload and run.get("clients") == clients and kind(run) == table:
            return run
    return None


def number(value, digits=0):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def ms(value):
    """Milliseconds with three significant figures (at least two decimals below 1 ms)."""
    if value is None:
        return "–"
    if value < 1:
        return f"{value:.3f}"
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def ratio(value, reference):
    if value is None or not reference:
        return "–"
    return f"{value / reference:.2f}×"


def errors(run):
    total = run.get("errors") or 0
    if not total:
        return "0"
    kinds = run.get("errors_by_kind") or {}
    detail = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    return f"{total} ({detail})" if detail else str(total)


def not_run(run):
    if "status" not in run:
        return "skipped: unsupported by this target"
    return f"{run['status']}: {run.get('message', '')}".replace("|", "\\|")


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def workload_section(runs, workload, description):
    chosen = [r for r in runs if r.get("workload") == workload and kind(r) == "main"]
    if not chosen:
        return None
    # An election run measures failover time (one op = one failover, lower is better); the
    # others measure throughput (higher is better) at a latency.
    failover = workload == "election"
    clients_list = sorted({r.get("clients") for r in chosen})
    rows = []
    for clients in clients_list:
        etcd = find(runs, "etcd", workload, clients)
        reference_field = "p50_ms" if failover else "ops_per_sec"
        reference = etcd.get(reference_field) if etcd and completed(etcd) else None
        for system in SYSTEMS:
            run = find(runs, system, workload, clients)
            if run is None:
                continue
            name = SYSTEM_NAMES[system]
            if not completed(run):
                rows.append([name, clients, not_run(run), "–", "–", "–", "–", "–"])
                continue
            first = number(run.get("ops")) if failover else number(run.get("ops_per_sec"))
            rows.append(
                [
                    name,
                    f"{clients:,}",
                    first,
                    ms(run.get("p50_ms")),
                    ms(run.get("p99_ms")),
                    number(run.get("server_cpu_us_per_op"), 1),
                    errors(run),
                    ratio(run.get(reference_field), reference),
                ]
            )
    if failover:
        header = ["System", "Candidates", "failovers", "p50 ms", "p99 ms", "server CPU µs/failover", "errors", "p50 vs etcd"]
    else:
        header = ["System", "Clients", "ops/s", "p50 ms", "p99 ms", "server CPU µs/op", "errors", "ops/s vs etcd"]
    return f"### {workload}\n\n{description[:1].upper()}{description[1:]}.\n\n" + table(header, rows)


def open_loop_section(runs):
    chosen = [r for r in runs if kind(r) == "open-loop"]
    if not chosen:
        return None
    etcd = next((r for r in chosen if r.get("target") == "etcd" and completed(r)), None)
    rows = []
    for system in SYSTEMS:
        run = next((r for r in chosen if r.get("target") == system), None)
        if run is None:
            continue
        if not completed(run):
            rows.append([SYSTEM_NAMES[system], run.get("clients", "–"), not_run(run)] + ["–"] * 7)
            continue
        rows.append(
            [
                SYSTEM_NAMES[system],
                f"{run.get('clients'):,}",
                number(run.get("rate")),
                number(run.get("ops_per_sec")),
                ms(run.get("p50_ms")),
                ms(run.get("p99_ms")),
                ms(run.get("p999_ms")),
                ms(run.get("max_ms")),
                errors(run),
                ratio(run.get("p99_ms"), etcd.get("p99_ms") if etcd else None),
            ]
        )
    header = ["System", "Clients", "rate (ops/s)", "achieved ops/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "errors", "p99 vs etcd"]
    rate = chosen[0].get("rate")
    intro = (
        f"`put` at a fixed arrival rate of {number(rate)} ops/s, half of etcd's best closed-loop put rate in this run; "
        "latency counts from each operation's intended send time, so a stalled server shows up in the percentiles "
        "instead of slowing the senders down (no coordinated omission)."
    )
    return "## Open loop\n\n" + intro + "\n\n" + table(header, rows)


def scaling_section(runs):
    chosen = [r for r in runs if kind(r) == "scaling" and r.get("target") == "warden"]
    if not chosen:
        return None

    def groups(run):
        try:
            return int(label(run).split("=", 1)[1])
        except (IndexError, ValueError):
            return 0

    chosen.sort(key=groups)
    one = next((r for r in chosen if groups(r) == 1 and completed(r)), None)
    rows = []
    for run in chosen:
        if not completed(run):
            rows.append([groups(run), not_run(run), "–", "–", "–"])
            continue
        rows.append(
            [
                groups(run),
                number(run.get("ops_per_sec")),
                ms(run.get("p99_ms")),
                number(run.get("server_cpu_us_per_op"), 1),
                ratio(run.get("ops_per_sec"), one.get("ops_per_sec") if one else None),
            ]
        )
    clients = chosen[0].get("clients")
    intro = (
        f"Warden's aggregate `put` rate at {clients:,} clients with the keys spread over N prefixes "
        "(`--prefixes N`), each prefix its own shard group."
    )
    header = ["Groups", "writes/s", "p99 ms", "server CPU µs/op", "vs 1 group"]
    return "## Warden: scaling with shard groups\n\n" + intro + "\n\n" + table(header, rows)


def load_cluster_runs(results_dir):
    """`warden bench cluster`'s lines (runs and summary), or [] when there are none."""
    path = os.path.join(results_dir, "warden-cluster.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def cores_split(run, labels):
    """A run's per-process CPU in cores, as `label cores` pairs."""
    return " · ".join(f"{name} {cores:.2f}" if cores is not None else f"{name} –" for name, cores in labels(run))


def isolated_section(runs, cluster_runs):
    """etcd, ZooKeeper and `warden bench cluster` with every server process capped at the same
    CPU quota: put and lock ops/s, ratios, and the per-process CPU split."""
    capped = [r for r in runs if kind(r) == "isolated"]
    cluster = [r for r in cluster_runs if r.get("bench") == "cluster" and "workload" in r]
    if not capped and not cluster:
        return None
    quota = next((r.get("cpu_per_process") for r in cluster), None)
    if quota is None and capped:
        quota = float(label(capped[0]).split("=", 1)[1])

    def peer(target, workload):
        run = next((r for r in capped if r.get("target") == target and r.get("workload") == workload), None)
        return run if run and completed(run) else None

    def warden(groups, workload, api="native"):
        return next((r for r in cluster if r.get("groups") == groups and r.get("workload") == workload
                     and r.get("api", "native") == api), None)

    def peer_labels(prefix, first):
        return lambda run: [(f"{prefix}{i}", p.get("cores")) for i, p in enumerate(run.get("server_processes") or [], first)]

    def warden_labels(run):
        return list((run.get("cpu_cores") or {}).items())

    etcd_put, etcd_lock = peer("etcd", "put"), peer("etcd", "lock")
    one_put, one_lock = warden(1, "put"), warden(1, "lock")
    rate = lambda run: run.get("ops_per_sec") if run else None
    rows = []
    systems = [(f"etcd, {server_count(capped, 'etcd')} members", peer("etcd", "put"), peer("etcd", "lock"), peer_labels("m", 0))]
    systems.append((f"ZooKeeper, {server_count(capped, 'zookeeper')} servers", peer("zookeeper", "put"), peer("zookeeper", "lock"), peer_labels("s", 1)))
    for groups in sorted({r.get("groups") for r in cluster}):
        sample = warden(groups, "put") or warden(groups, "lock")
        name = f"Warden, {groups} group{'s' if groups != 1 else ''} ({sample.get('nodes')} nodes + {sample.get('routers')} router{'s' if sample.get('routers') != 1 else ''})"
        systems.append((name, warden(groups, "put"), warden(groups, "lock"), warden_labels))
        if warden(groups, "put", "etcd") or warden(groups, "lock", "etcd"):
            systems.append((name + ", etcd API", warden(groups, "put", "etcd"), warden(groups, "lock", "etcd"), warden_labels))
    for name, put, lock, labels in systems:
        if put is None and lock is None:
            continue
        rows.append(
            [
                name,
                number(rate(put)),
                number(rate(lock)),
                ratio(rate(put), rate(etcd_put)),
                ratio(rate(lock), rate(etcd_lock)),
                ratio(rate(put), rate(one_put)),
                ratio(rate(lock), rate(one_lock)),
                number(put.get("server_cpu_us_per_op"), 1) if put else "–",
                cores_split(put, labels) if put else "–",
                cores_split(lock, labels) if lock else "–",
            ]
        )
    clients = next((r.get("clients") for r in capped + cluster), TARGET_CLIENTS)
    intro = (
        f"Every server process — each etcd member, each ZooKeeper server, each Warden node and router — in a CPU cgroup of its own "
        f"capped at {quota:g} cores (cgroup `cpu.cfs_quota_us` / `cpu.max`), which models one small machine per process on this host; "
        f"the load generator is not capped and not counted. Closed loop, {clients:,} clients, 256-byte values; etcd and ZooKeeper clients "
        f"spread over every member, Warden's over its routers, keys over 16 prefixes (Warden: over as many prefixes as groups). "
        f"Warden runs are `warden bench cluster` (separate `warden node` and `warden router` processes, a fresh cluster per group count). "
        f"CPU per process: each process's CPU seconds over the measured window divided by the window (m0 … = etcd's members by name, s1 … = ZooKeeper's servers by id)."
    )
    header = ["System", "put/s", "lock/s", "put vs etcd", "lock vs etcd", "put vs Warden 1 group", "lock vs Warden 1 group",
              "server CPU µs/put", "CPU per process, put (cores)", "CPU per process, lock (cores)"]
    lines = []
    many_put, many_lock = warden(ISOLATED_GROUPS, "put"), warden(ISOLATED_GROUPS, "lock")
    for workload, many, etcd, one in (("put", many_put, etcd_put, one_put), ("lock", many_lock, etcd_lock, one_lock)):
        head = (f"- `{workload}`, Warden {ISOLATED_GROUPS} groups ≥ {TARGET_THROUGHPUT_RATIO:g}× etcd and "
                f"≥ {ISOLATED_VS_ONE_GROUP_RATIO:g}× Warden 1 group: ")
        if not (many and etcd and one and rate(etcd) and rate(one)):
            lines.append(head + "**not measured** in this run.")
            continue
        vs_etcd, vs_one = rate(many) / rate(etcd), rate(many) / rate(one)
        met = vs_etcd >= TARGET_THROUGHPUT_RATIO and vs_one >= ISOLATED_VS_ONE_GROUP_RATIO
        lines.append(head + f"**{'met' if met else 'not met'}** ({vs_etcd:.2f}× etcd, {vs_one:.2f}× 1 group).")
    for workload, etcd, native in (("put", etcd_put, many_put), ("lock", etcd_lock, many_lock)):
        through = warden(ISOLATED_GROUPS, workload, "etcd")
        if through is None:
            continue
        head = (f"- `{workload}` through Warden's etcd API, {ISOLATED_GROUPS} groups ≥ {TARGET_THROUGHPUT_RATIO:g}× etcd and "
                f"≥ {ETCD_API_VS_NATIVE_RATIO:g}× Warden's own API on the same cluster: ")
        if not (etcd and native and rate(etcd) and rate(native)):
            lines.append(head + "**not measured** in this run.")
            continue
        vs_etcd, vs_native = rate(through) / rate(etcd), rate(through) / rate(native)
        met = vs_etcd >= TARGET_THROUGHPUT_RATIO and vs_native >= ETCD_API_VS_NATIVE_RATIO
        lines.append(head + f"**{'met' if met else 'not met'}** ({vs_etcd:.2f}× etcd, {vs_native:.2f}× native).")
    return (f"## Isolated nodes (each process capped at {quota:g} cores)\n\n" + intro + "\n\n" + table(header, rows)
            + ("\n\n" + "\n".join(lines) if lines else ""))


def server_count(capped, target):
    """How many server processes a capped run of `target` measured (from its per-process CPU)."""
    run = next((r for r in capped if r.get("target") == target and completed(r) and r.get("server_processes")), None)
    return len(run["server_processes"]) if run else 5


def targets_section(runs):
    lines = []
    goals = (("etcd", TARGET_THROUGHPUT_RATIO), ("zookeeper", TARGET_VS_ZOOKEEPER_RATIO))
    for workload, what in (("put", "puts"), ("lock", "lock+unlock cycles")):
        for system in ("warden", "warden-direct", "warden-etcd"):
            for peer, goal in goals:
                warden = find(runs, system, workload, TARGET_CLIENTS)
                other = find(runs, peer, workload, TARGET_CLIENTS)
                name, peer_name = SYSTEM_NAMES[system], SYSTEM_NAMES[peer]
                head = f"- `{workload}` at {TARGET_CLIENTS:,} clients, {name} ≥ {goal:g}× {peer_name}'s ops/s: "
                if not (warden and other and completed(warden) and completed(other) and other.get("ops_per_sec")):
                    lines.append(head + "**not measured** in this run (a run is missing or was refused; see the tables).")
                    continue
                measured = warden["ops_per_sec"] / other["ops_per_sec"]
                figures = f"{name} {number(warden['ops_per_sec'])} {what}/s, {peer_name} {number(other['ops_per_sec'])}: {measured:.2f}×"
                if measured >= goal:
                    lines.append(head + f"**met** ({figures}).")
                else:
                    short = goal / measured if measured > 0 else float("inf")
                    lines.append(head + f"**not met** ({figures}; it would need {short:.2f}× its measured rate).")
    warden = next((r for r in runs if kind(r) == "open-loop" and r.get("target") == "warden"), None)
    etcd = next((r for r in runs if kind(r) == "open-loop" and r.get("target") == "etcd"), None)
    head = "- Open loop at 50% of etcd's peak put rate, Warden's p99 ≤ etcd's: "
    if not (warden and etcd and completed(warden) and completed(etcd) and warden.get("p99_ms") is not None and etcd.get("p99_ms")):
        lines.append(head + "**not measured** in this run (a run is missing or was refused; see the tables).")
    else:
        figures = f"Warden p99 {ms(warden['p99_ms'])} ms, etcd {ms(etcd['p99_ms'])} ms: {warden['p99_ms'] / etcd['p99_ms']:.2f}× etcd's"
        verdict = "met" if warden["p99_ms"] <= etcd["p99_ms"] else "not met"
        lines.append(head + f"**{verdict}** ({figures}).")
    return "## Targets\n\n" + "\n".join(lines)


def machine_section(run):
    facts = [
        ("CPU", f"{run.get('cpu_model') or 'unknown model'}, {run.get('nproc')} cores (`nproc`)"),
        ("Memory", f"{run.get('memory_gib')} GiB"),
        ("Disk (the servers' data directories)", run.get("disk") or "unknown"),
        ("Kernel", run.get("kernel")),
        ("OS", run.get("os")),
        ("etcd", run.get("etcd_version")),
        ("ZooKeeper", run.get("zookeeper_version")),
        ("Java (for ZooKeeper)", run.get("java_version")),
    ]
    return "## Machine\n\n" + "\n".join(f"- {name}: {value or 'unknown'}" for name, value in facts)


def setup_section(run):
    return f"""## Setup

All three systems ran on this one machine, one after the other in the same run (each started,
measured and stopped before the next, so idle servers took no CPU from the measured one), with
5 replicas each, their default durability (an fsync per commit) and the same warden-loadgen
clients:

- etcd: 5 members on loopback (Debian's `etcd-server`), default settings (fsync on).
- ZooKeeper: 5 servers on loopback (Debian's `zookeeper`), default `forceSync=yes`;
  `maxClientCnxns=0` so loopback clients are not capped at 60 connections.
- Warden: `warden dev` (5 nodes, placement, one router) with 16 shard groups `/bench/p0` …
  `/bench/p15`. The main tables use `--prefixes 16` on every system: keys `/bench/p{{i}}/k{{j}}`
  over 16 prefixes, so on Warden over 16 shard groups (spreading load over many groups is what
  Warden is built for); etcd and ZooKeeper see the same key names. "Warden, direct calls":
  the same cluster, the client given the nodes' addresses as well (`--nodes`), so each call
  one group serves goes straight to that group's leader and the router takes the rest.
- Every run: {run.get('duration_s')} s measured after {run.get('warmup_s')} s of warmup,
  256-byte values, closed loop (each client sends its next operation when the previous one is
  answered) unless stated, `--conns` = min(clients, 10) connections (ZooKeeper: sessions).
- server CPU µs/op: CPU time of the server processes over the measured window (from
  `/proc/PID/stat`) divided by the acknowledged operations.
- ops/s vs etcd: the system's ops/s over etcd's at the same workload and client count.
- How each workload maps onto each system's API (e.g. a linearizable ZooKeeper read is `sync`
  then `getData`): `warden-loadgen --help`."""


def report(results_dir, out_path):
    with open(os.path.join(results_dir, "run.json")) as f:
        run = json.load(f)
    runs = load_runs(results_dir)
    if not runs:
        sys.exit(f"bench-report: no runs in {results_dir}")
    commands_path = os.path.join(results_dir, "commands.txt")
    commands = open(commands_path).read().strip() if os.path.exists(commands_path) else ""
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shown_dir = os.path.relpath(os.path.abspath(results_dir), repo_root)
    if shown_dir.startswith(".."):
        shown_dir = os.path.abspath(results_dir)

    parts = [
        f"Generated by `make compare` (`scripts/bench-vs`, then `scripts/bench-report.py`) on {run.get('date_utc')} "
        f"at commit `{run.get('commit')}`. Raw results, one JSON object per run: `{shown_dir}/`."
        + ("\n\n**A `--quick` trial run (2-second runs): not a measurement to quote.**" if run.get("quick") else ""),
        targets_section(runs),
    ]
    analysis = os.path.join(repo_root, "benchmarks", "analysis.md")
    if os.path.exists(analysis):
        parts.append(open(analysis).read().strip())
    parts += [machine_section(run), setup_section(run), "## Closed loop, by workload"]
    parts += [s for s in (workload_section(runs, w, d) for w, d in WORKLOADS) if s]
    known = {w for w, _ in WORKLOADS}
    parts += [s for s in (workload_section(runs, w, w) for w in sorted({r.get("workload") for r in runs} - known)) if s]
    parts += [s for s in (open_loop_section(runs), scaling_section(runs), isolated_section(runs, load_cluster_runs(results_dir))) if s]
    config_path = os.path.join(results_dir, "zookeeper-s1.cfg")
    if commands and os.path.exists(config_path):
        commands += "\n\n# ZooKeeper server 1's zoo.cfg (servers 2-5 differ in clientPort and dataDir):\n"
        commands += "\n".join("#   " + line for line in open(config_path).read().strip().splitlines())
    if commands:
        parts.append("## Commands\n\nExactly as run, in order (`--server-pids` lists the server processes of that run):\n\n```sh no-run\n" + commands + "\n```")
    section = SECTION_TITLE + "\n\n" + demote_headings("\n\n".join(parts))
    write_section(out_path, section)


# The markers around what `report` writes in docs/benchmarks.md; the rest is written by hand.
SECTION_BEGIN = "<!-- From here to the end marker the text is written by `make compare` (scripts/bench-report.py): change the script, not the text. -->"
SECTION_END = "<!-- End of the text written by `make compare`. -->"
SECTION_TITLE = "## Warden beside etcd and ZooKeeper: `make compare`"


def demote_headings(text):
    """Every Markdown heading one level deeper (`## X` -> `### X`), outside fenced blocks,
    so the report's sections nest under SECTION_TITLE."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            line = "#" + line
        lines.append(line)
    return "\n".join(lines)


def write_section(out_path, section):
    """Replaces the text between the markers of `out_path` with `section`; a missing file is
    written with the section alone. A file without both markers, in order, is refused: the
    hand-written text around them must not be lost."""
    block = SECTION_BEGIN + "\n\n" + section + "\n\n" + SECTION_END
    if not os.path.exists(out_path):
        with open(out_path, "w") as f:
            f.write("# Benchmarks (a trial run)\n\n" + block + "\n")
        return
    text = open(out_path).read()
    begin, end = text.find(SECTION_BEGIN), text.find(SECTION_END)
    if begin < 0 or end < begin:
        sys.exit(f"bench-report: {out_path} lacks the markers of the `make compare` section; add them where the section goes")
    with open(out_path, "w") as f:
        f.write(text[:begin] + block + text[end + len(SECTION_END):])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    machine_args = commands.add_parser("machine", help="print run.json for the current machine and run")
    machine_args.add_argument("--commit", required=True)
    machine_args.add_argument("--work-dir", required=True)
    machine_args.add_argument("--quick", type=int, choices=(0, 1), default=0)
    machine_args.add_argument("--duration-s", type=int, required=True)
    machine_args.add_argument("--warmup-s", type=int, required=True)
    report_args = commands.add_parser("report", help="write the `make compare` section of docs/benchmarks.md from a results directory")
    report_args.add_argument("results_dir")
    report_args.add_argument("out")
    args = parser.parse_args()
    if args.command == "machine":
        machine(args)
    else:
        report(args.results_dir, args.out)


if __name__ == "__main__":
    main()
