#!/usr/bin/env bash
# Installs the system packages the build needs, and only those that are missing.
# librocksdb-sys needs libclang (bindgen); proto/ needs protoc (tonic-prost-build); the
# etcd-client crate's build needs protoc's well-known types (google/protobuf/*.proto); the
# tests need promtool, iproute2's `ip` (the fault harness's test hosts, tests/torture), and
# nftables' `nft` and iptables' `iptables` (its impaired links: loss rules, and the NFQUEUE
# rule that hands packets to its delay handler), and Debian's etcdctl (package `etcd-client`),
# which the tests drive the router's etcd API with.
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
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
