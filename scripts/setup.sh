#!/usr/bin/env bash
# Installs the system packages the build and the tests need, and only those that are missing.
# librocksdb-sys needs libclang (bindgen); proto/ needs protoc (tonic-prost-build); the
# etcd-client crate's build needs protoc's well-known types (google/protobuf/*.proto); the
# tests need promtool, iproute2's `ip` (the fault harness's test hosts, tests/torture), and
# nftables' `nft` and iptables' `iptables` (its impaired links: loss rules, and the NFQUEUE
# rule that hands packets to its delay handler), and Debian's etcdctl (package `etcd-client`),
# which the tests drive the router's etcd API with. Last, with pip, the Python etcd client
# `etcd3` 0.12.0 (python-etcd3, with grpcio and protobuf), which tests/etcd3/scenarios.py
# drives the etcd API with (tests/suite/etcd_python.rs), and tenacity 6.3.1 for it: its lock
# retries with a wait function of tenacity's old signature, which tenacity 7 stopped adapting
# (with 7 or later a contended `acquire` raises TypeError, "wait() missing 1 required
# positional argument"), and etcd3 0.12 asks only for tenacity >= 6.1. Its generated protobuf
# modules are older than protobuf 4's C implementation accepts (importing them fails,
# "Descriptors cannot be created directly"): the check below and the test run python with
# PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python (pure-Python protobuf, which still takes them)
# rather than pin protobuf 3.20 for every other python program here.
set -euo pipefail
missing=()
dpkg -s libclang-dev >/dev/null 2>&1 || missing+=(libclang-dev)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
dpkg -s libprotobuf-dev >/dev/null 2>&1 || missing+=(libprotobuf-dev)
# promtool checks deploy/alerts.yml in the tests (Debian ships it in `prometheus`).
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
# A real etcd (Debian's, package `etcd-server`): tests/suite/etcdctl_vs_etcd.rs compares
# etcdctl's output from the router's etcd API with its output from etcd.
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
if [ ${#missing[@]} -ne 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
etcd3_ready='import etcd3, importlib.metadata as m; assert m.version("tenacity") == "6.3.1"'
if ! PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python python3 -c "$etcd3_ready" >/dev/null 2>&1; then
  echo "setup: installing the python packages etcd3==0.12.0 tenacity==6.3.1"
  python3 -m pip install --quiet etcd3==0.12.0 tenacity==6.3.1
fi
# The Python client (client/python, tests/suite/python_client.rs): grpcio, grpcio-status and
# its googleapis-common-protos at run time; grpcio-tools, setuptools and wheel to build it
# (its stubs are generated at build time, and the test installs it with
# --no-build-isolation, so they must be here); pytest for its suite. Pinned for Python 3.11:
# grpcio-tools 1.85 needs protobuf >= 7.35.1 and setuptools >= 77, and protobuf stays at the
# 7.36.2 that etcd3's pure-Python protobuf use above is tested with.
client_pins="grpcio==1.85.3 grpcio-tools==1.85.1 grpcio-status==1.85.3 googleapis-common-protos==1.76.0 protobuf==7.36.2 pytest==8.4.2 setuptools==80.9.0 wheel==0.45.1"
client_ready="import importlib.metadata as m, sys; sys.exit(any(m.version(n) != v for n, v in (p.split('==') for p in sys.argv[1:])))"
# shellcheck disable=SC2086
if ! python3 -c "$client_ready" $client_pins >/dev/null 2>&1; then
  echo "setup: installing the python packages $client_pins"
  # shellcheck disable=SC2086
  python3 -m pip install --quiet $client_pins
fi
