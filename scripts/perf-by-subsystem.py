#!/usr/bin/env python3
"""A perf profile's samples grouped by crate or kernel subsystem: where a node's CPU goes.

    scripts/perf-by-subsystem.py PERF_DATA

Reads `perf report --no-children --sort dso,sym` of PERF_DATA (a `perf record` of node
processes) and prints each group's share of the samples; a symbol counts in the first group
whose pattern it matches. docs/benchmarks.md ("Groups on 5 nodes") shows how it was used.
"""
import subprocess, sys, re, collections
f = sys.argv[1]
out = subprocess.run(["perf","report","-i",f,"--no-children","--sort","dso,sym","-g","none","--stdio"],capture_output=True,text=True).stdout
cats = collections.OrderedDict([
 ("rocksdb memtable/write", r"rocksdb::(InlineSkipList|MemTable|WriteBatch|DBImpl::Write|WriteThread|crc32|log::Writer)"),
 ("rocksdb other", r"rocksdb::"),
 ("raft-rs", r"raft::|raft_proto|protobuf::"),
 ("allocation", r"_mi_|mi_|malloc|free|Arc<.*>::drop_slow"),
 ("memcpy/memcmp", r"memmove|memcpy|memcmp|memset"),
 ("gRPC/HTTP2 (tonic/hyper/h2)", r"tonic|hyper|h2::|http::|http_body|tower"),
 ("prost encode/decode", r"prost::|merge_field|encode_raw|encoded_len"),
 ("tokio runtime", r"tokio::"),
 ("warden engine", r"warden_engine"),
 ("warden namespace", r"warden_namespace"),
 ("warden service/other", r"warden"),
 ("kernel: scheduling", r"\[k\] (finish_task_switch|schedule|__schedule|_raw_spin|pick_next|enqueue|dequeue|try_to_wake|futex)"),
 ("kernel: network", r"\[k\] .*(tcp|ip_|skb|net_|sock|loopback|napi|softirq)"),
 ("kernel: disk/fs", r"\[k\] .*(ext4|jbd2|blk|bio|iowrite|virtio|folio|filemap|fsync|page_cache)"),
 ("kernel: other", r"\[k\]"),
])
tot = collections.Counter(); total = 0.0
for line in out.splitlines():
    m = re.match(r"\s+([0-9.]+)%\s+(\S+)\s+(.*)", line)
    if not m: continue
    pct = float(m.group(1)); rest = m.group(2)+" "+m.group(3); total += pct
    for name, pat in cats.items():
        if re.search(pat, rest):
            tot[name] += pct; break
    else:
        tot["other user"] += pct
for name in list(cats)+["other user"]:
    print(f"{name:32s} {tot[name]:5.1f}%")
print("total", round(total,1))
