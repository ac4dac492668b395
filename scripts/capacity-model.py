#!/usr/bin/env python3
"""Warden's capacity model, calibrated on `warden bench cluster` runs and checked against them.

Reads the JSON lines `warden bench cluster` prints (one or more files), takes the per-operation
costs of each workload from its smallest configuration (fewest nodes), predicts the throughput
of every other configuration, and prints the prediction beside the measurement. See
docs/capacity.md for the model and how to use it to size a fleet.

    python3 scripts/capacity-model.py RESULTS.jsonl [MORE.jsonl ...] [--json]

The model, for N nodes and R routers, each process on C cores, a workload's operations spread
evenly over the groups (2 per node here) whose leaders and replicas placement spreads evenly:

    nodes:   N * (C - idle) / node_cpu_per_op      node_cpu_per_op = leader + 4 * follower
    routers: R * C / router_cpu_per_op
    disk:    N * disk_fsyncs_per_sec / fsyncs_per_op

and the throughput is the smallest of the three. Costs are CPU seconds per acknowledged
operation (all replicas' nodes together for `node_cpu_per_op`), measured under saturation at the
calibration run's load per group; `idle` is one node's CPU doing nothing (heartbeats, ticks).
A one-group run of the same workload and quota in the input (`--groups 1`) splits a node's
cost into the leader's and a follower's share (informational: the prediction uses the sum).
"""

import json
import sys
from collections import defaultdict

# Replicas of every shard group (the default replica policy).
REPLICAS = 5


def load_runs(paths):
    """The measured runs (not idle lines, not summaries) and the idle lines, from `paths`."""
    runs, idle = [], {}
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                record = json.loads(line)
                if record.get("bench") != "cluster":
                    continue
                if record.get("run") == "idle":
                    idle[(record["nodes"], record["groups"])] = record
                elif "workload" in record and record.get("ops_per_sec"):
                    runs.append(record)
    return runs, idle


def split(record):
    """Node and router CPU (cores) of a run, by process label."""
    nodes = {k: v for k, v in record["cpu_cores"].items() if k.startswith("node-") and v is not None}
    routers = {k: v for k, v in record["cpu_cores"].items() if k.startswith("router-") and v is not None}
    return nodes, routers


def costs(record, idle_line):
    """Per-operation costs measured in `record` (a saturated run), in microseconds."""
    ops = record["ops_per_sec"]
    nodes, routers = split(record)
    idle = idle_line["node_cores_mean"] if idle_line else 0.0
    busy = sum(cores - idle for cores in nodes.values())
    result = {
        "node_cpu_us_per_op": busy / ops * 1e6,
        "router_cpu_us_per_op": sum(routers.values()) / ops * 1e6,
        "fsyncs_per_op": record["fsyncs_per_sec"] / ops,
        "idle_cores_per_node": idle,
    }
    return result


def leader_follower(record, idle_line):
    """Leader and follower CPU per operation (µs) from a one-group run: the node leading the
    group against the mean of the others (every node hosts a replica at 5 nodes)."""
    nodes, _ = split(record)
    leaders = [label for label, count in (record.get("leaders") or {}).items() if count > 0]
    if record["groups"] != 1 or len(leaders) != 1 or len(nodes) < 2:
        return None
    idle = idle_line["node_cores_mean"] if idle_line else 0.0
    ops = record["ops_per_sec"]
    followers = [cores - idle for label, cores in nodes.items() if label != leaders[0]]
    return {"leader_cpu_us_per_op": (nodes[leaders[0]] - idle) / ops * 1e6, "follower_cpu_us_per_op": sum(followers) / len(followers) / ops * 1e6}


def predict(calibration, nodes, routers, cores, disk_fsyncs_per_sec):
    """Throughput of `nodes` nodes and `routers` routers at `cores` each, and what bounds it."""
    bounds = {"nodes": nodes * (cores - calibration["idle_cores_per_node"]) / (calibration["node_cpu_us_per_op"] / 1e6)}
    if calibration["router_cpu_us_per_op"] > 0:
        bounds["routers"] = routers * cores / (calibration["router_cpu_us_per_op"] / 1e6)
    if calibration["fsyncs_per_op"] > 0 and disk_fsyncs_per_sec:
        bounds["disk"] = nodes * disk_fsyncs_per_sec / calibration["fsyncs_per_op"]
    bound = min(bounds, key=bounds.get)
    return bounds[bound], bound


def main(argv):
    as_json = "--json" in argv
    paths = [a for a in argv if a != "--json"]
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    runs, idle = load_runs(paths)
    by_series = defaultdict(list)
    # One-group runs split a node's cost into leader and follower shares, per workload and quota.
    splits = {}
    for run in runs:
        if run["groups"] == 1:
            split_costs = leader_follower(run, idle.get((run["nodes"], run["groups"])))
            if split_costs:
                splits[(run["workload"], run["cpu_per_process"])] = split_costs
            continue
        # A series: one workload at one quota, its clients fixed or per node, direct or not.
        load = ("per node", run["clients_per_node"]) if run.get("clients_per_node") else ("fixed", run["clients"])
        by_series[(run["workload"], run["cpu_per_process"], load, bool(run.get("direct")))].append(run)
    report = []
    for (workload, quota, _, _), series in sorted(by_series.items()):
        series.sort(key=lambda r: (r["nodes"], r["groups"]))
        base = series[0]
        calibration = costs(base, idle.get((base["nodes"], base["groups"])))
        calibration.update(splits.get((workload, quota), {}))
        # One machine's disk: the fsyncs one writer gets (the benchmark measures as many writers
        # as nodes on the one shared disk; per node that is its share).
        disk_per_node = base["disk_fsyncs_per_sec"] / base["nodes"] if base.get("disk_fsyncs_per_sec") else None
        for run in series:
            predicted, bound = predict(calibration, run["nodes"], run["routers"], quota, disk_per_node)
            report.append(
                {
                    "workload": workload,
                    "nodes": run["nodes"],
                    "routers": run["routers"],
                    "groups": run["groups"],
                    "clients": run["clients"],
                    "cpu_per_process": quota,
                    "measured_ops_per_sec": round(run["ops_per_sec"], 1),
                    "predicted_ops_per_sec": round(predicted, 1),
                    "bound_by": bound,
                    "error": round(predicted / run["ops_per_sec"] - 1, 3),
                    "direct": bool(run.get("direct")),
                    "calibrated_on": {"nodes": base["nodes"], "groups": base["groups"], "clients": base["clients"]},
                    "costs": {k: round(v, 3) for k, v in calibration.items()},
                    "host_limited": run.get("host_limited"),
                }
            )
    if as_json:
        for line in report:
            print(json.dumps(line))
        return 0
    print("| workload | clients call | nodes | routers | clients | measured ops/s | predicted ops/s | bound by | error |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for r in report:
        print(
            f"| {r['workload']} | {'leaders' if r['direct'] else 'routers'} | {r['nodes']} | {r['routers']} | {r['clients']:,} | {r['measured_ops_per_sec']:,.0f} | "
            f"{r['predicted_ops_per_sec']:,.0f} | {r['bound_by']} | {r['error']:+.0%} |"
        )
    print()
    print("| workload | clients call | calibrated on | node CPU µs/op (all replicas) | leader µs/op | follower µs/op | router µs/op | fsyncs/op | idle cores/node |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    seen = set()
    for r in report:
        key = (r["workload"], r["cpu_per_process"], r["direct"], json.dumps(r["calibrated_on"]))
        if key in seen:
            continue
        seen.add(key)
        c = r["costs"]
        on = r["calibrated_on"]
        print(
            f"| {r['workload']} | {'leaders' if r['direct'] else 'routers'} | {on['nodes']} nodes, {on['groups']} groups, {on['clients']:,} clients | {c['node_cpu_us_per_op']:.0f} | "
            f"{c.get('leader_cpu_us_per_op', float('nan')):.0f} | {c.get('follower_cpu_us_per_op', float('nan')):.0f} | "
            f"{c['router_cpu_us_per_op']:.0f} | {c['fsyncs_per_op']:.3f} | {c['idle_cores_per_node']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
