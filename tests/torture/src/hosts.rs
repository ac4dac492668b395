//! Test hosts: network namespaces, each with its own address, joined by veth pairs to a
//! bridge of their own — machines on one LAN, on one real machine. The test process stays in
//! the machine's own namespace and reaches the hosts through the bridge's address.
//!
//! A network claims its index (its /24 under 10.77.0.0/16, and the prefix of every name it
//! makes) with a claim file naming its owner's pid, created before anything else. Dropping a
//! [`TestNet`] removes all it made; a run that died without dropping it (SIGKILL, a crash)
//! leaves its claim behind, and the next [`TestNet::create`] sweeps every network whose owner
//! is gone ([`sweep_stale`]).
//!
//! Names (at most 15 bytes, the kernel's limit for links): bridge `wt{net}br`, host namespace
//! `wt{net}h{host}`, the veth end on the bridge `wt{net}v{host}` and the one inside the host
//! `eth0`. Needs root (namespaces, links and routes) and iproute2's `ip`.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::impair::Impairments;
use crate::links::LOCAL_TABLE_PRIORITY;

/// Prefix of every name this harness gives a bridge, namespace or link.
pub const NAME_PREFIX: &str = "wt";
/// Networks one machine holds at once (their indexes 1 ..= this).
pub const NETS_MAX: u8 = 200;
/// Hosts in one network at most (addresses `.1` ..= this; the machine is `.254`).
pub const HOSTS_MAX: usize = 32;
/// Where claims live (a tmpfs: a reboot, which also ends every namespace, clears them).
const CLAIMS_DIR: &str = "/run/warden-torture";

/// Why the test network could not be made or changed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A command could not be started (is iproute2 installed?).
    #[error("could not run `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// Every network index is claimed by a live run.
    #[error("all {NETS_MAX} test networks are in use")]
    NoFreeNet,
    /// More hosts than a network holds.
    #[error("a test network holds at most {HOSTS_MAX} hosts, not {0}")]
    TooManyHosts(usize),
    /// No host with this index.
    #[error("no host {0} in this network")]
    NoHost(usize),
    /// A claim file or namespace handle could not be used, or a link's delay handler failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// An impairment would lose more than every packet.
    #[error("a loss of {0} % is more than 100 %")]
    LossAbove100(u8),
    /// An impairment would hold packets longer than [`DELAY_MAX_MS`](crate::impair::DELAY_MAX_MS).
    #[error("a delay of {delay_ms} ms with a jitter of {jitter_ms} ms exceeds {} ms", crate::impair::DELAY_MAX_MS)]
    DelayTooLong {
        /// The delay asked for.
        delay_ms: u64,
        /// The jitter asked for.
        jitter_ms: u64,
    },
    /// A link from a host to itself (its packets never cross the network).
    #[error("host {0} has no link to itself")]
    SelfLink(usize),
}

/// One test host: a network namespace with one address on its network.
#[derive(Debug, Clone)]
pub struct Host {
    /// The namespace's name (`ip netns exec NAME …` runs a program on the host).
    pub namespace: String,
    /// The host's address.
    pub addr: Ipv4Addr,
}

impl Host {
    /// A command that runs `program` on this host (`ip netns exec`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace]).arg(program);
        command
    }

    /// Runs `work` on a thread that lives in this host's namespace: sockets it opens are the
    /// host's (a listener there is reached at [`Host::addr`]; its connections leave from it).
    pub fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, NetError> {
        let path = format!("/run/netns/{}", self.namespace);
        let handle = File::open(&path).map_err(|source| NetError::Io { what: format!("opening {path}"), source })?;
        let thread = std::thread::spawn(move || {
            // SAFETY: `setns` moves only the calling thread, which this closure owns, into the
            // namespace `handle` names; the handle stays open for the call.
            if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(work())
        });
        match thread.join() {
            Ok(result) => result.map_err(|source| NetError::Io { what: format!("entering {path}"), source }),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// A network of test hosts on a bridge; dropped, it removes everything it made.
#[derive(Debug)]
pub struct TestNet {
    index: u8,
    hosts: Vec<Host>,
    /// The links' impairments (see `impair`), with their delay handlers.
    pub(crate) impairments: Impairments,
}

impl TestNet {
    /// A network of `hosts` hosts (after sweeping away what dead runs left).
    pub fn create(hosts: usize) -> Result<TestNet, NetError> {
        if hosts > HOSTS_MAX {
            return Err(NetError::TooManyHosts(hosts));
        }
        let index = {
            // One registry change at a time (see `RegistryLock`): the sweep and the claim.
            let _registry = RegistryLock::take()?;
            sweep_unlocked()?;
            claim(std::process::id())?
        };
        // From here on, dropping `net` undoes whatever was made, also on an error below.
        let mut net = TestNet { index, hosts: Vec::with_capacity(hosts), impairments: Impairments::default() };
        let bridge = net.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}/24", net.machine_addr()), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for host in 1..=hosts {
            net.add_host(host)?;
        }
        Ok(net)
    }

    /// The hosts, in order (host `i` has address `.{i + 1}`).
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Host `index`.
    pub fn host(&self, index: usize) -> Result<&Host, NetError> {
        self.hosts.get(index).ok_or(NetError::NoHost(index))
    }

    /// The machine's own address on this network (the test process is reached there).
    pub fn machine_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.index, 254)
    }

    fn bridge(&self) -> String {
        format!("{NAME_PREFIX}{}br", self.index)
    }

    fn add_host(&mut self, number: usize) -> Result<(), NetError> {
        let namespace = format!("{NAME_PREFIX}{}h{number}", self.index);
        let link = format!("{NAME_PREFIX}{}v{number}", self.index);
        let inner = format!("{NAME_PREFIX}{}p{number}", self.index);
        let addr = Ipv4Addr::new(10, 77, self.index, number as u8);
        ip(&["netns", "add", &namespace])?;
        self.hosts.push(Host { namespace: namespace.clone(), addr });
        ip(&["link", "add", &link, "type", "veth", "peer", "name", &inner])?;
        ip(&["link", "set", &inner, "netns", &namespace])?;
        ip(&["link", "set", &link, "master", &self.bridge()])?;
        ip(&["link", "set", &link, "up"])?;
        // Cuts are rules that must come before the local table (see `links`).
        ip(&["-n", &namespace, "rule", "add", "pref", LOCAL_TABLE_PRIORITY, "lookup", "local"])?;
        ip(&["-n", &namespace, "rule", "del", "pref", "0", "lookup", "local"])?;
        ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
        ip(&["-n", &namespace, "link", "set", &inner, "name", "eth0"])?;
        ip(&["-n", &namespace, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
        ip(&["-n", &namespace, "link", "set", "eth0", "up"])?;
        Ok(())
    }

    /// This network's index (its /24 is `10.77.{index}.0`).
    pub fn index(&self) -> u8 {
        self.index
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Handler threads first: they hold sockets in the namespaces (best effort: each stops
        // when its handle is dropped anyway).
        let _ = self.unimpair_all();
        remove_net(self.index);
    }
}

/// Removes every network whose owner is no longer running (and every harness namespace or
/// link with no claim at all); returns how many networks it removed.
pub fn sweep_stale() -> Result<usize, NetError> {
    let _registry = RegistryLock::take()?;
    sweep_unlocked()
}

/// [`sweep_stale`] for a caller holding the [`RegistryLock`].
fn sweep_unlocked() -> Result<usize, NetError> {
    fs::create_dir_all(CLAIMS_DIR).map_err(|source| NetError::Io { what: format!("creating {CLAIMS_DIR}"), source })?;
    let mut removed = 0;
    for index in 1..=NETS_MAX {
        // A claim is written whole before it appears (see `claim`), so it always names its owner.
        match fs::read_to_string(claim_path(index)) {
            Ok(owner) if owner.trim().parse::<u32>().is_ok_and(is_running) => {}
            Ok(_) => {
                remove_net(index);
                removed += 1;
            }
            Err(_) => {}
        }
    }
    // Leftovers without a claim: a run claims before it makes anything, so these outlived
    // theirs. (Checked at the moment of removal: a run may have claimed since the scan.)
    let mut names = list(&["netns", "list"])?;
    names.extend(list(&["-o", "link", "show"])?);
    for index in names.iter().filter_map(|name| net_of(name)) {
        if !claim_path(index).exists() {
            remove_net(index);
        }
    }
    Ok(removed)
}

/// The machine-wide lock on the claims, held (`flock`, also between threads of one process)
/// while a sweep looks and removes and while a run claims. Without it a sweep could remove a
/// network claimed between its look and its removal, and two sweeps of one dead run's network
/// could each remove it, the second taking the network a third run had claimed in between.
/// A run's own drop needs no lock: its claim, removed last, keeps every sweep away.
struct RegistryLock {
    /// Closing it releases the lock.
    _file: File,
}

impl RegistryLock {
    fn take() -> Result<RegistryLock, NetError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |source| NetError::Io { what, source }
        };
        fs::create_dir_all(CLAIMS_DIR).map_err(io("creating the claims' folder"))?;
        let path = Path::new(CLAIMS_DIR).join("lock");
        let file = OpenOptions::new().write(true).create(true).truncate(false).open(&path).map_err(io("opening the claims' lock"))?;
        // SAFETY: `flock` on a descriptor this function owns; the lock goes with the file.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(NetError::Io { what: "locking the claims".into(), source: std::io::Error::last_os_error() });
        }
        Ok(RegistryLock { _file: file })
    }
}

/// Claims the first free network index for `owner`. The claim is a hard link to a file
/// already holding the owner's pid: linking fails when the name exists, so two runs cannot
/// both claim an index, and no sweep ever sees a claim without its owner. Callers hold the
/// [`RegistryLock`] (tests planting a dead run's claim need not).
fn claim(owner: u32) -> Result<u8, NetError> {
    let io = |what: String| move |source| NetError::Io { what, source };
    fs::create_dir_all(CLAIMS_DIR).map_err(io(format!("creating {CLAIMS_DIR}")))?;
    // Unique per call: networks made at once by one process (tests on threads) must not
    // write, link and remove one draft between them.
    static DRAFTS: AtomicU64 = AtomicU64::new(0);
    let draft_number = DRAFTS.fetch_add(1, Ordering::Relaxed);
    let draft = Path::new(CLAIMS_DIR).join(format!("draft-{owner}-{}-{draft_number}", std::process::id()));
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).open(&draft).map_err(io("writing a claim".into()))?;
    file.write_all(owner.to_string().as_bytes()).map_err(io("writing a claim".into()))?;
    drop(file);
    let claimed = (1..=NETS_MAX).find_map(|index| match fs::hard_link(&draft, claim_path(index)) {
        Ok(()) => Some(Ok(index)),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => None,
        Err(source) => Some(Err(NetError::Io { what: format!("claiming network {index}"), source })),
    });
    let _ = fs::remove_file(&draft);
    claimed.unwrap_or(Err(NetError::NoFreeNet))
}

/// Removes network `index`: its namespaces (their veth ends go with them), its links, its
/// claim. Best effort: what is already gone is skipped.
fn remove_net(index: u8) {
    let prefix = format!("{NAME_PREFIX}{index}");
    for namespace in list(&["netns", "list"]).unwrap_or_default() {
        if net_of(&namespace) == Some(index) {
            let _ = ip(&["netns", "del", &namespace]);
        }
    }
    for link in list(&["-o", "link", "show"]).unwrap_or_default() {
        if net_of(&link) == Some(index) {
            let _ = ip(&["link", "del", &link]);
        }
    }
    let _ = ip(&["link", "del", &format!("{prefix}br")]);
    let _ = fs::remove_file(claim_path(index));
}

/// The network index a harness name belongs to (`wt12h3` → 12), if it is one.
fn net_of(name: &str) -> Option<u8> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    let kind = rest[digits..].chars().next()?;
    if !matches!(kind, 'b' | 'h' | 'v' | 'p') {
        return None;
    }
    rest[..digits].parse().ok().filter(|index| (1..=NETS_MAX).contains(index))
}

/// The names `ip ARGS` lists: namespaces (`netns list`: the first word of each line) or links
/// (`-o link show`: the second field, without `@peer` and the colon).
fn list(args: &[&str]) -> Result<Vec<String>, NetError> {
    let output = ip(args)?;
    let names = output.lines().filter_map(|line| {
        let field = if args.contains(&"link") { line.split_whitespace().nth(1)? } else { line.split_whitespace().next()? };
        Some(field.trim_end_matches(':').split('@').next()?.to_string())
    });
    Ok(names.collect())
}

fn claim_path(index: u8) -> PathBuf {
    Path::new(CLAIMS_DIR).join(index.to_string())
}

/// Whether process `pid` is running.
fn is_running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Runs `ip ARGS`; its stdout, or the failure with its stderr.
pub(crate) fn ip(args: &[&str]) -> Result<String, NetError> {
    let command = format!("ip {}", args.join(" "));
    let output = Command::new("ip").args(args).output().map_err(|source| NetError::Spawn { command: command.clone(), source })?;
    if !output.status.success() {
        return Err(NetError::Command { command, stderr: String::from_utf8_lossy(&output.stderr).trim().to_string() });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Harness names map to their network; other names do not.
    #[test]
    fn names_belong_to_their_network() {
        assert_eq!(net_of("wt12h3"), Some(12));
        assert_eq!(net_of("wt7br"), Some(7));
        assert_eq!(net_of("wt200v31"), Some(200));
        assert_eq!(net_of("wt12"), None, "no kind");
        assert_eq!(net_of("wt0h1"), None, "index 0 is never given");
        assert_eq!(net_of("wt201h1"), None, "beyond the indexes given");
        assert_eq!(net_of("wtxh1"), None);
        assert_eq!(net_of("eth0"), None);
    }

    /// Runs that create and drop networks at the same time never remove each other's: a
    /// sweep must not take a network that was claimed between its look and its removal.
    #[test]
    fn networks_made_and_dropped_at_once_never_lose_a_link() {
        // Networks a dead run left behind, for every thread's first sweep to find at once.
        let mut child = Command::new("true").spawn().expect("a short-lived process");
        let dead = child.id();
        child.wait().expect("it ends");
        for _ in 0..4 {
            let index = claim(dead).expect("a claim for the dead run");
            ip(&["link", "add", &format!("{NAME_PREFIX}{index}br"), "type", "bridge"]).expect("its bridge");
        }
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..4 {
                        let net = TestNet::create(2)?;
                        for host in net.hosts() {
                            let links = ip(&["-n", &host.namespace, "-o", "link", "show", "eth0"])?;
                            assert!(links.contains("eth0"), "each host keeps its link while its network lives");
                        }
                        drop(net);
                    }
                    Ok::<(), NetError>(())
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic").expect("every network is made whole");
        }
    }

    /// A network whose owner died (its claim names a finished process) is removed by the
    /// next sweep, namespaces, links and claim; a live run's network is left alone.
    #[test]
    fn a_network_left_by_a_dead_run_is_swept_by_the_next() {
        let live = TestNet::create(1).expect("a live network");
        let mut child = Command::new("true").spawn().expect("a short-lived process");
        let dead = child.id();
        child.wait().expect("it ends");
        // Held from the plant to the checks: no other run sweeps the dead network first or
        // claims its index again before it is checked.
        let registry = RegistryLock::take().expect("the claims' lock");
        let index = claim(dead).expect("a claim for the dead run");
        let namespace = format!("{NAME_PREFIX}{index}h1");
        ip(&["netns", "add", &namespace]).expect("its namespace");
        ip(&["link", "add", &format!("{NAME_PREFIX}{index}br"), "type", "bridge"]).expect("its bridge");
        assert!(sweep_unlocked().expect("sweep") >= 1, "the sweep removes at least the dead run's network");
        let namespaces = list(&["netns", "list"]).expect("namespaces");
        assert!(!namespaces.contains(&namespace), "the dead run's namespace is gone: {namespaces:?}");
        assert!(!list(&["-o", "link", "show"]).expect("links").contains(&format!("{NAME_PREFIX}{index}br")), "its bridge too");
        assert!(!claim_path(index).exists(), "and its claim");
        assert!(namespaces.contains(&live.host(0).expect("host").namespace), "the live network stays");
        drop(registry);
        let kept = live.index();
        drop(live);
        assert!(!claim_path(kept).exists(), "a dropped network leaves no claim");
        assert!(!list(&["netns", "list"]).expect("namespaces").iter().any(|n| net_of(n) == Some(kept)), "nor namespaces");
    }
}
