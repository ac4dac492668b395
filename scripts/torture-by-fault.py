#!/usr/bin/env python3
"""Availability of a torture run by fault kind, from its histories.

Usage: scripts/torture-by-fault.py RUN_DIR

For every history (RUN_DIR/seed-*/history.jsonl) and every fault in it, the half-second
windows from 3 s after the fault began to its end are "up" when every group completed a
successful call in them (the definition of tests/suite/torture/history.rs), until the clients
stopped (the register clients' last call). Prints, per fault
kind, the faults, the windows counted and the share up, as a Markdown table, then the same
share over the quiet spells (from their second second) for comparison.
"""

import glob
import json
import os
import sys
from collections import defaultdict

WINDOW_MS = 500
ALLOWANCE_MS = 3000
PREFIXES = ["/b", "/c", "/d", "/a"]  # the groups' prefixes; "/a" is served by the root group


def group_of(path):
    for prefix in PREFIXES:
        if path.startswith(prefix):
            return prefix
    return None


def main(run_dir):
    windows = defaultdict(lambda: [0, 0])  # kind -> [windows, up]
    faults = defaultdict(int)
    quiet = [0, 0]
    for history in sorted(glob.glob(os.path.join(run_dir, "seed-*", "history.jsonl"))):
        served = defaultdict(set)
        fault_list = []
        end_ms = 0
        for line in open(history):
            record = json.loads(line)
            if record["type"] == "call":
                call = record["call"]
                completed_ms = call["completed_ns"] // 1_000_000
                # Until the clients stopped: the register clients stop at once, while a lock
                # call may still end after the stop, alone in its windows.
                if call["kind"] in ("set", "get", "cas"):
                    end_ms = max(end_ms, completed_ms)
                if call["ok"] and group_of(call["path"]):
                    served[completed_ms // WINDOW_MS].add(group_of(call["path"]))
            elif record["type"] == "fault":
                fault_list.append(record["fault"])
        groups = set().union(*served.values()) if served else set()
        is_up = lambda w: len(served.get(w, ())) == len(groups)
        start = 0
        for fault in sorted(fault_list, key=lambda f: f["start_ms"]):
            faults[fault["kind"]] += 1
            for w in range(-(-(fault["start_ms"] + ALLOWANCE_MS) // WINDOW_MS), fault["end_ms"] // WINDOW_MS):
                windows[fault["kind"]][0] += 1
                windows[fault["kind"]][1] += is_up(w)
            for w in range(-(-(start + 1000) // WINDOW_MS), fault["start_ms"] // WINDOW_MS):
                quiet[0] += 1
                quiet[1] += is_up(w)
            start = fault["end_ms"]
        for w in range(-(-(start + 1000) // WINDOW_MS), end_ms // WINDOW_MS):
            quiet[0] += 1
            quiet[1] += is_up(w)
    print("| fault | faults | windows after 3 s | up |")
    print("|---|---|---|---|")
    for kind in sorted(faults):
        counted, up = windows[kind]
        share = f"{100.0 * up / counted:.1f}%" if counted else "-"
        print(f"| {kind} | {faults[kind]} | {counted} | {share} |")
    total = [sum(w[0] for w in windows.values()), sum(w[1] for w in windows.values())]
    print(f"| all faults | {sum(faults.values())} | {total[0]} | {100.0 * total[1] / max(total[0], 1):.1f}% |")
    print(f"| no fault (quiet spells) | - | {quiet[0]} | {100.0 * quiet[1] / max(quiet[0], 1):.1f}% |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
