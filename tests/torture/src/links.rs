//! Faults on the links of a [`TestNet`]: partitions. A cut from A to host B is a
//! policy-routing rule in B's namespace (ahead of its local table, see `hosts`) that
//! blackholes what arrives from A's address: every packet A sends to B is dropped on arrival,
//! silently, on new and established connections alike, as a failed switch port or firewall
//! would — the sender gets no error and TCP retransmits until its timeouts. (A blackhole
//! *route* at the sender would not do: the kernel fails a program's own send to one at once,
//! which no real partition does. Netfilter would do too — this machine's kernel has nf_tables
//! and xtables, though neither tc's netem nor its drop action — but a routing rule needs
//! nothing beyond iproute2, and netfilter is left to the impairments of [`impair`](crate::impair).)
//! Cuts are one-way, so an asymmetric link is one cut and a partition is a cut each way between
//! its sides.
//!
//! The machine's own namespace (where the test process and its clients run) is an end too
//! ([`End::Machine`]), and it is never changed: a cut from a host to the machine is a
//! blackhole route for the machine's address in the host. Hosts only answer the machine's
//! connections, and what the host's kernel sends on them (handshake answers, data) is dropped
//! without anyone being told, so the machine sees the same silence.

use crate::hosts::{ip, NetError, TestNet};

/// The priority of cut rules: ahead of the local table, which `hosts` moves to
/// [`LOCAL_TABLE_PRIORITY`] in every host (at 0 it would deliver every packet first).
pub(crate) const CUT_PRIORITY: &str = "10";
/// Where each host looks up its local table (after the cuts).
pub(crate) const LOCAL_TABLE_PRIORITY: &str = "100";
/// Identical rules one link may have gathered at most (each `cut` heals first, so one).
const RULES_PER_LINK_MAX: usize = 16;

/// One end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    /// Host `i` of the network.
    Host(usize),
    /// The machine itself (the test process).
    Machine,
}

impl TestNet {
    /// Drops every packet `from` sends to `to` (one way). Cutting a cut link changes nothing.
    pub fn cut(&self, from: End, to: End) -> Result<(), NetError> {
        self.heal(from, to)?;
        match (from, to) {
            (_, End::Host(host)) => {
                let source = self.addr_of(from)?.to_string();
                ip(&["-n", &self.host(host)?.namespace, "rule", "add", "pref", CUT_PRIORITY, "from", &source, "blackhole"])?;
            }
            (End::Host(host), End::Machine) => {
                let route = format!("{}/32", self.machine_addr());
                ip(&["-n", &self.host(host)?.namespace, "route", "replace", "blackhole", &route])?;
            }
            (End::Machine, End::Machine) => {}
        }
        Ok(())
    }

    /// Lets `from` reach `to` again (one way). Healing a working link changes nothing.
    pub fn heal(&self, from: End, to: End) -> Result<(), NetError> {
        match (from, to) {
            (_, End::Host(host)) => {
                let source = self.addr_of(from)?.to_string();
                let namespace = &self.host(host)?.namespace;
                // Until none is left (`del` removes one rule per call).
                for _ in 0..RULES_PER_LINK_MAX {
                    match ip(&["-n", namespace, "rule", "del", "pref", CUT_PRIORITY, "from", &source, "blackhole"]) {
                        Ok(_) => continue,
                        Err(NetError::Command { stderr, .. }) if stderr.contains("No such file or directory") => return Ok(()),
                        Err(error) => return Err(error),
                    }
                }
                Ok(())
            }
            (End::Host(host), End::Machine) => {
                let route = format!("{}/32", self.machine_addr());
                match ip(&["-n", &self.host(host)?.namespace, "route", "del", "blackhole", &route]) {
                    Ok(_) => Ok(()),
                    Err(NetError::Command { stderr, .. }) if stderr.contains("No such process") => Ok(()),
                    Err(error) => Err(error),
                }
            }
            (End::Machine, End::Machine) => Ok(()),
        }
    }

    /// Cuts both ways between every end of `left` and every end of `right`.
    pub fn partition(&self, left: &[End], right: &[End]) -> Result<(), NetError> {
        for a in left {
            for b in right {
                self.cut(*a, *b)?;
                self.cut(*b, *a)?;
            }
        }
        Ok(())
    }

    /// Cuts host `host` off from every other host and from the machine, both ways.
    pub fn isolate(&self, host: usize) -> Result<(), NetError> {
        let others: Vec<End> = (0..self.hosts().len()).filter(|other| *other != host).map(End::Host).chain([End::Machine]).collect();
        self.partition(&[End::Host(host)], &others)
    }

    /// Heals every cut of this network, and removes every impairment
    /// ([`TestNet::unimpair_all`]: no rule and no delay handler is left).
    pub fn heal_all(&self) -> Result<(), NetError> {
        self.unimpair_all()?;
        for from in (0..self.hosts().len()).map(End::Host).chain([End::Machine]) {
            for to in (0..self.hosts().len()).map(End::Host).chain([End::Machine]) {
                if from != to {
                    self.heal(from, to)?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn addr_of(&self, end: End) -> Result<std::net::Ipv4Addr, NetError> {
        match end {
            End::Host(index) => Ok(self.host(index)?.addr),
            End::Machine => Ok(self.machine_addr()),
        }
    }
}
