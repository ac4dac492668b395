//! Impairments of the links of a [`TestNet`]: delay, jitter — and with it reordering — and
//! loss, as a slow, uneven or lossy network has them, where [`links`](crate::links) only has
//! working and cut links.
//!
//! Like a cut, an impairment of the link from A to host B is made in B's namespace, on what
//! arrives from A's address: new and established connections alike are affected, and A is
//! never told (its kernel sent the packet; the network was slow or lost it). It is one-way,
//! so a slow link both ways is two impairments.
//!
//! - Loss is an nf_tables rule in B's own table `inet warden_impair` (hook prerouting,
//!   priority -350, ahead of everything below): `ip saddr A numgen random mod 100 < LOSS drop`,
//!   each packet drawn on its own (at 100 %, `ip saddr A drop`).
//! - Delay and jitter are made in user space, because this machine's kernel has no netem
//!   (`sch_netem`, tc's delay qdisc) and nf_tables has no `queue` expression here
//!   (`CONFIG_NFT_QUEUE` is unset); xtables' NFQUEUE target is there (through nf_tables'
//!   compat layer, `iptables` from the Debian package of that name). A rule in B's `raw`
//!   table (priority -300, after the loss rule) hands what arrives from A to a netfilter
//!   queue numbered after A (so unique per link in B: host `i` is queue `i`, the machine is
//!   queue [`HOSTS_MAX`]), with `--queue-bypass`: while no handler listens, packets pass.
//!   A handler thread entered into B's namespace binds that queue (metadata only, never the
//!   packets' bytes) and holds each packet's id in a heap ordered by its release time, the
//!   arrival plus `delay_ms` plus a uniform draw from 0 ..= `jitter_ms`; at that time it tells
//!   the kernel to accept the packet, which then goes on up the stack. Packets drawn far apart
//!   pass each other: jitter reorders. The thread sleeps in poll(2) until the next release,
//!   the next packet or its stop signal; it never spins.
//!
//! Everything is bounded: a delay plus jitter of at most [`DELAY_MAX_MS`], at most
//! [`HELD_PACKETS_MAX`] packets held per link (the next ones pass at once and are counted,
//! [`DelayCounts::passed_over_limit`]; the kernel's queue has the same length and fails open,
//! so a packet the handler cannot take passes rather than vanishes). Removing an impairment
//! removes its rules first, then stops its handler, which accepts every packet it still held
//! or had waiting. [`TestNet::heal_all`] and dropping the [`TestNet`] remove every impairment.
//!
//! Needs root, nftables' `nft` and iptables' `iptables` (scripts/setup.sh installs them).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::io::{self, Write as _};
use std::net::{Ipv4Addr, Shutdown};
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::net::UnixStream;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::hosts::{Host, NetError, TestNet, HOSTS_MAX};
use crate::links::End;

mod nfqueue;

/// The longest a packet is held: a link's delay plus its jitter, in milliseconds.
pub const DELAY_MAX_MS: u64 = 10_000;
/// Packets one link's handler holds at most; beyond it, packets pass at once.
pub const HELD_PACKETS_MAX: usize = 4096;
/// The nf_tables table of loss rules in every impaired host.
const LOSS_TABLE: &str = "warden_impair";
/// Its chain's priority: before xtables' `raw` table (-300), where packets are queued, so a
/// lost packet is never held first.
const LOSS_PRIORITY: i32 = -350;
/// The comment on queue rules (in xtables' `raw` table, `PREROUTING` chain).
const QUEUE_RULE_COMMENT: &str = "warden-impair";
/// Identical queue rules one link may have gathered at most (each impairment removes its own).
const RULES_PER_LINK_MAX: usize = 16;
/// Receives per wake of a handler before it looks at its release times again.
const RECEIVES_PER_WAKE_MAX: usize = 256;
/// Packet notices a stopping handler still takes from its socket at most.
const DRAIN_MAX: usize = 64 * 1024;

/// What an impaired link does to the packets crossing it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Impairment {
    /// How long every packet is held before it goes on, in milliseconds.
    pub delay_ms: u64,
    /// Up to how much longer each packet is held, in milliseconds: a uniform draw from
    /// 0 ..= this, for every packet on its own, so packets sent closer together than this
    /// spread may arrive out of order. `delay_ms + jitter_ms` is at most [`DELAY_MAX_MS`].
    pub jitter_ms: u64,
    /// The share of packets dropped, in percent (0 ..= 100), each packet drawn on its own.
    pub loss_percent: u8,
}

impl Impairment {
    fn check(&self) -> Result<(), NetError> {
        if self.loss_percent > 100 {
            return Err(NetError::LossAbove100(self.loss_percent));
        }
        if self.delay_ms.checked_add(self.jitter_ms).is_none_or(|held_ms| held_ms > DELAY_MAX_MS) {
            return Err(NetError::DelayTooLong { delay_ms: self.delay_ms, jitter_ms: self.jitter_ms });
        }
        Ok(())
    }

    /// Whether packets are held (a handler is needed).
    fn delays(&self) -> bool {
        self.delay_ms > 0 || self.jitter_ms > 0
    }
}

/// What a link's delay handler has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DelayCounts {
    /// Packets held until their release time.
    pub held: u64,
    /// Packets let through at once because [`HELD_PACKETS_MAX`] were held already.
    pub passed_over_limit: u64,
}

/// The live impairments of a network and their handlers (a field of [`TestNet`]).
#[derive(Debug, Default)]
pub(crate) struct Impairments {
    links: Mutex<HashMap<(End, usize), Link>>,
    /// Handler threads running (each counts itself while it runs).
    handlers: Arc<AtomicUsize>,
}

impl Impairments {
    fn lock(&self) -> MutexGuard<'_, HashMap<(End, usize), Link>> {
        // A panic elsewhere while holding it leaves the map itself whole.
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One impaired link.
#[derive(Debug)]
struct Link {
    impairment: Impairment,
    handler: Option<Handler>,
}

impl TestNet {
    /// Impairs what `from` sends to host `to` (one way): delays it, spreads it (reordering)
    /// and loses part of it, as `impairment` says. Impairing an impaired link replaces its
    /// impairment (packets held under the old one are let go); an impairment that does
    /// nothing is [`TestNet::unimpair`]. An impairment out of bounds (see [`Impairment`]),
    /// or of a host's link to itself, is refused and changes nothing.
    pub fn impair(&self, from: End, to: usize, impairment: Impairment) -> Result<(), NetError> {
        impairment.check()?;
        let host = self.host(to)?;
        if from == End::Host(to) {
            return Err(NetError::SelfLink(to));
        }
        let source = self.addr_of(from)?;
        let mut links = self.impairments.lock();
        if let Some(old) = links.remove(&(from, to)) {
            self.tear_down(&links, from, to, old)?;
        }
        if impairment == Impairment::default() {
            return Ok(());
        }
        let queue = queue_number(from);
        let handler = if impairment.delays() {
            // Listening before its rule queues anything.
            let handler = Handler::start(host, queue, impairment, Arc::clone(&self.impairments.handlers))?;
            if let Err(error) = queue_rule(host, "-A", source, queue) {
                let _ = delete_queue_rules(host, source, queue);
                let _ = handler.stop();
                return Err(error);
            }
            Some(handler)
        } else {
            None
        };
        links.insert((from, to), Link { impairment, handler });
        if impairment.loss_percent > 0 {
            if let Err(error) = self.write_loss_rules(&links, to) {
                if let Some(link) = links.remove(&(from, to)) {
                    let _ = self.tear_down(&links, from, to, link);
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Lets what `from` sends to host `to` through unimpaired again, with every packet its
    /// handler still held. Unimpairing a link that is not impaired changes nothing.
    pub fn unimpair(&self, from: End, to: usize) -> Result<(), NetError> {
        self.host(to)?;
        let mut links = self.impairments.lock();
        match links.remove(&(from, to)) {
            Some(link) => self.tear_down(&links, from, to, link),
            None => Ok(()),
        }
    }

    /// Removes every impairment of this network: no rule and no handler thread is left
    /// (also part of [`TestNet::heal_all`]). Goes on past a failure; returns the first.
    pub fn unimpair_all(&self) -> Result<(), NetError> {
        let mut links = self.impairments.lock();
        let all: Vec<_> = links.drain().collect();
        let mut result = Ok(());
        for ((from, to), link) in all {
            let removed = self.tear_down(&links, from, to, link);
            result = result.and(removed);
        }
        result
    }

    /// The impairment of the link from `from` to host `to`, if it has one.
    pub fn impairment(&self, from: End, to: usize) -> Option<Impairment> {
        self.impairments.lock().get(&(from, to)).map(|link| link.impairment)
    }

    /// What the delay handler of the link from `from` to host `to` has done, if it has one.
    pub fn delay_counts(&self, from: End, to: usize) -> Option<DelayCounts> {
        let links = self.impairments.lock();
        let counters = &links.get(&(from, to))?.handler.as_ref()?.counters;
        Some(DelayCounts { held: counters.held.load(Ordering::Relaxed), passed_over_limit: counters.passed_over_limit.load(Ordering::Relaxed) })
    }

    /// Delay handler threads of this network still running (one per delayed link; none once
    /// every impairment is removed).
    pub fn delay_handlers(&self) -> usize {
        self.impairments.handlers.load(Ordering::SeqCst)
    }

    /// Removes `link` (already out of `links`): its queue rule, then its handler, then its
    /// loss rule. Goes on past a failure; returns the first.
    fn tear_down(&self, links: &HashMap<(End, usize), Link>, from: End, to: usize, link: Link) -> Result<(), NetError> {
        let host = self.host(to)?;
        let mut result = Ok(());
        if let Some(handler) = link.handler {
            let source = self.addr_of(from)?;
            let deleted = delete_queue_rules(host, source, queue_number(from));
            let stopped = handler.stop();
            result = result.and(deleted).and(stopped);
        }
        if link.impairment.loss_percent > 0 {
            result = result.and(self.write_loss_rules(links, to));
        }
        result
    }

    /// Replaces host `to`'s loss table with one rule per lossy link in `links` (no table at
    /// all when there is none), in one nf_tables transaction.
    fn write_loss_rules(&self, links: &HashMap<(End, usize), Link>, to: usize) -> Result<(), NetError> {
        let mut rules = Vec::new();
        for ((from, _), link) in links.iter().filter(|((_, host), link)| *host == to && link.impairment.loss_percent > 0) {
            rules.push((self.addr_of(*from)?, link.impairment.loss_percent));
        }
        rules.sort();
        run(self.host(to)?, "nft", &["-f", "-"], Some(&loss_script(&rules)))?;
        Ok(())
    }
}

/// The nft script that makes the loss table hold exactly `rules` (source, percent); removes
/// it when there is none (adding a table first makes deleting one that is not there no error).
fn loss_script(rules: &[(Ipv4Addr, u8)]) -> String {
    let mut script = format!("table inet {LOSS_TABLE}\ndelete table inet {LOSS_TABLE}\n");
    if !rules.is_empty() {
        script +=
            &format!("table inet {LOSS_TABLE} {{\n  chain prerouting {{\n    type filter hook prerouting priority {LOSS_PRIORITY}; policy accept;\n");
        for (source, loss_percent) in rules {
            // numgen's `mod 100` draws 0 ..= 99, and nft refuses a bound of 100 as out of range.
            match loss_percent {
                100.. => script += &format!("    ip saddr {source} drop\n"),
                _ => script += &format!("    ip saddr {source} numgen random mod 100 < {loss_percent} drop\n"),
            }
        }
        script += "  }\n}\n";
    }
    script
}

/// The netfilter queue of the link from `from` (unique among the links into one host).
fn queue_number(from: End) -> u16 {
    match from {
        End::Host(index) => index as u16,
        End::Machine => HOSTS_MAX as u16,
    }
}

/// Adds (`-A`) or deletes (`-D`) the rule that queues what `source` sends to `host`.
fn queue_rule(host: &Host, operation: &str, source: Ipv4Addr, queue: u16) -> Result<(), NetError> {
    let (source, queue) = (source.to_string(), queue.to_string());
    let args = [
        "-t",
        "raw",
        operation,
        "PREROUTING",
        "-s",
        &source,
        "-m",
        "comment",
        "--comment",
        QUEUE_RULE_COMMENT,
        "-j",
        "NFQUEUE",
        "--queue-num",
        &queue,
        "--queue-bypass",
    ];
    run(host, "iptables", &args, None).map(drop)
}

/// Deletes every rule that queues what `source` sends to `host` (none is no error).
fn delete_queue_rules(host: &Host, source: Ipv4Addr, queue: u16) -> Result<(), NetError> {
    for _ in 0..RULES_PER_LINK_MAX {
        match queue_rule(host, "-D", source, queue) {
            Ok(()) => continue,
            Err(NetError::Command { stderr, .. }) if stderr.contains("does a matching rule exist") => return Ok(()),
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Runs `program ARGS` on `host`, with `input` on its stdin; its stdout, or the failure with
/// its stderr.
fn run(host: &Host, program: &str, args: &[&str], input: Option<&str>) -> Result<String, NetError> {
    let line = format!("ip netns exec {} {program} {}", host.namespace, args.join(" "));
    let mut command = host.command(program);
    command.args(args).stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|source| NetError::Spawn { command: line.clone(), source })?;
    let written = match (input, child.stdin.take()) {
        (Some(input), Some(mut stdin)) => stdin.write_all(input.as_bytes()),
        _ => Ok(()),
    };
    let output = child.wait_with_output().map_err(|source| NetError::Io { what: format!("waiting for `{line}`"), source })?;
    if !output.status.success() {
        return Err(NetError::Command { command: line, stderr: String::from_utf8_lossy(&output.stderr).trim().to_string() });
    }
    written.map_err(|source| NetError::Io { what: format!("writing to `{line}`"), source })?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A link's delay handler: a thread in the receiving host's namespace serving its queue.
/// Dropped, it stops (as [`Handler::stop`], without the verdict).
#[derive(Debug)]
struct Handler {
    /// Shut down to stop the thread (its end then reads as closed).
    stop: UnixStream,
    thread: Option<JoinHandle<io::Result<()>>>,
    counters: Arc<Counters>,
    /// What the thread does, for its errors.
    what: String,
}

#[derive(Debug, Default)]
struct Counters {
    held: AtomicU64,
    passed_over_limit: AtomicU64,
}

impl Handler {
    /// Starts a handler for queue `queue` in `host`'s namespace; returns once it has bound
    /// the queue (so a rule added after it finds it listening).
    fn start(host: &Host, queue: u16, impairment: Impairment, running: Arc<AtomicUsize>) -> Result<Handler, NetError> {
        let what = format!("delaying packets of queue {queue} on {}", host.namespace);
        let io_error = |what: String| move |source| NetError::Io { what, source };
        let path = format!("/run/netns/{}", host.namespace);
        let namespace = File::open(&path).map_err(io_error(format!("opening {path}")))?;
        let (stop, stopped) = UnixStream::pair().map_err(io_error("making a handler's stop signal".into()))?;
        let counters = Arc::new(Counters::default());
        let (ready, bound) = mpsc::sync_channel(1);
        let thread_counters = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name(format!("impair-{}-{queue}", host.namespace))
            .spawn(move || {
                let _running = Running::count(running);
                // SAFETY: `setns` moves only the calling thread, which this closure owns, into
                // the namespace `namespace` names; the handle stays open for the call.
                if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    let _ = ready.send(Err(io::Error::last_os_error()));
                    return Ok(());
                }
                drop(namespace);
                match nfqueue::Queue::bind(queue, HELD_PACKETS_MAX as u32) {
                    Ok(queue) => {
                        let _ = ready.send(Ok(()));
                        Delayer::new(queue, impairment, thread_counters).run(&stopped)
                    }
                    Err(error) => {
                        let _ = ready.send(Err(error));
                        Ok(())
                    }
                }
            })
            .map_err(io_error("starting a delay handler".into()))?;
        let handler = Handler { stop, thread: Some(thread), counters, what };
        match bound.recv() {
            Ok(Ok(())) => Ok(handler),
            Ok(Err(source)) => {
                let _ = handler.stop();
                Err(NetError::Io { what: format!("binding netfilter queue {queue} on {}", host.namespace), source })
            }
            // The thread ended without a word: it panicked (`stop` says so).
            Err(_) => {
                let what = format!("starting the delay handler of queue {queue} on {}", host.namespace);
                let ended = NetError::Io { what, source: io::Error::other("it ended before binding its queue") };
                Err(handler.stop().err().unwrap_or(ended))
            }
        }
    }

    /// Stops the thread, which first lets every packet it holds or has waiting go; its error,
    /// if it had one.
    fn stop(mut self) -> Result<(), NetError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), NetError> {
        let Some(thread) = self.thread.take() else { return Ok(()) };
        let _ = self.stop.shutdown(Shutdown::Both);
        match thread.join() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(NetError::Io { what: self.what.clone(), source }),
            Err(_) => Err(NetError::Io { what: self.what.clone(), source: io::Error::other("the delay handler panicked") }),
        }
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Counts a running handler thread for as long as it lives (also through a panic).
struct Running(Arc<AtomicUsize>);

impl Running {
    fn count(running: Arc<AtomicUsize>) -> Running {
        running.fetch_add(1, Ordering::SeqCst);
        Running(running)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The work of a handler thread: packets held by release time, released when it comes.
struct Delayer {
    queue: nfqueue::Queue,
    impairment: Impairment,
    /// (release time, arrival number: first come first released at one time, packet id).
    held: BinaryHeap<Reverse<(Instant, u64, u32)>>,
    arrivals: u64,
    random: XorShift,
    counters: Arc<Counters>,
}

impl Delayer {
    fn new(queue: nfqueue::Queue, impairment: Impairment, counters: Arc<Counters>) -> Delayer {
        let random = XorShift::seeded(u64::from(queue.number()));
        Delayer { queue, impairment, held: BinaryHeap::new(), arrivals: 0, random, counters }
    }

    /// Serves until `stopped` reads as closed, then lets everything go.
    fn run(mut self, stopped: &UnixStream) -> io::Result<()> {
        let served = self.serve(stopped);
        let released = self.release_all();
        served.and(released)
    }

    fn serve(&mut self, stopped: &UnixStream) -> io::Result<()> {
        loop {
            let now = Instant::now();
            while let Some(&Reverse((release, _, id))) = self.held.peek() {
                if release > now {
                    break;
                }
                self.held.pop();
                self.queue.accept(id)?;
            }
            let next_release = self.held.peek().map(|Reverse((release, _, _))| release.saturating_duration_since(now));
            let (packets, stop) = wait(self.queue.as_raw_fd(), stopped.as_raw_fd(), next_release)?;
            if stop {
                return Ok(());
            }
            if packets {
                self.receive()?;
            }
        }
    }

    /// Takes the packets waiting in the socket: each is held until its release time, or let
    /// through at once when the heap is full.
    fn receive(&mut self) -> io::Result<()> {
        let Delayer { queue, impairment, held, arrivals, random, counters } = self;
        let mut at_once = Vec::new();
        for _ in 0..RECEIVES_PER_WAKE_MAX {
            let arrival = Instant::now();
            let received = queue.receive(|id| {
                if held.len() >= HELD_PACKETS_MAX {
                    counters.passed_over_limit.fetch_add(1, Ordering::Relaxed);
                    at_once.push(id);
                    return;
                }
                let held_ms = impairment.delay_ms + random.up_to(impairment.jitter_ms);
                *arrivals += 1;
                held.push(Reverse((arrival + Duration::from_millis(held_ms), *arrivals, id)));
                counters.held.fetch_add(1, Ordering::Relaxed);
            });
            for id in at_once.drain(..) {
                queue.accept(id)?;
            }
            match received {
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Accepts what is still waiting in the socket (its rule is gone, so no more comes), then
    /// everything held. Goes on past a failure; returns the first.
    fn release_all(&mut self) -> io::Result<()> {
        let mut result = Ok(());
        let mut waiting = Vec::new();
        for _ in 0..DRAIN_MAX {
            match self.queue.receive(|id| waiting.push(id)) {
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        let held = std::mem::take(&mut self.held).into_sorted_vec().into_iter().rev().map(|Reverse((_, _, id))| id);
        for id in waiting.into_iter().chain(held) {
            let accepted = self.queue.accept(id);
            result = result.and(accepted);
        }
        result
    }
}

/// Waits until the queue has packets, the stop signal came, or `timeout` (none: no limit)
/// passed: (packets waiting, stop).
fn wait(queue: RawFd, stop: RawFd, timeout: Option<Duration>) -> io::Result<(bool, bool)> {
    let mut fds = [libc::pollfd { fd: queue, events: libc::POLLIN, revents: 0 }, libc::pollfd { fd: stop, events: libc::POLLIN, revents: 0 }];
    // Rounded up: woken before the release time, the handler would only wait again.
    let timeout_ms = timeout.map_or(-1, |timeout| timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int);
    // SAFETY: `fds` is a valid array of two `pollfd` for the call.
    if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) } < 0 {
        let error = io::Error::last_os_error();
        return if error.raw_os_error() == Some(libc::EINTR) { Ok((false, false)) } else { Err(error) };
    }
    Ok((fds[0].revents != 0, fds[1].revents != 0))
}

/// xorshift64*: a handler's draws of jitter (no cryptography, no dependency).
struct XorShift(u64);

impl XorShift {
    /// Seeded from the clock and `salt` (two handlers started at once draw apart).
    fn seeded(salt: u64) -> XorShift {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64);
        // splitmix64's finalizer spreads close seeds apart; `| 1`: xorshift's state is never 0.
        let mut seed = nanos ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        seed = (seed ^ (seed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        seed = (seed ^ (seed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        XorShift((seed ^ (seed >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A draw from 0 ..= `max` (`max` ≤ [`DELAY_MAX_MS`]: the modulo's bias is nil).
    fn up_to(&mut self, max: u64) -> u64 {
        self.next() % (max + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounds: loss at most 100 %, delay plus jitter at most the maximum (without overflow).
    #[test]
    fn impairments_out_of_bounds_are_refused() {
        let ok = Impairment { delay_ms: DELAY_MAX_MS - 100, jitter_ms: 100, loss_percent: 100 };
        assert!(ok.check().is_ok());
        assert!(matches!(Impairment { loss_percent: 101, ..ok }.check(), Err(NetError::LossAbove100(101))));
        assert!(matches!(Impairment { jitter_ms: 101, ..ok }.check(), Err(NetError::DelayTooLong { .. })));
        assert!(matches!(Impairment { delay_ms: u64::MAX, jitter_ms: 2, ..ok }.check(), Err(NetError::DelayTooLong { .. })));
        assert!(!Impairment { loss_percent: 5, ..Impairment::default() }.delays(), "loss alone needs no handler");
    }

    /// The loss table holds one rule per lossy link, and is removed when there is none.
    #[test]
    fn loss_rules_are_written_whole() {
        let none = loss_script(&[]);
        assert_eq!(none, "table inet warden_impair\ndelete table inet warden_impair\n");
        let two = loss_script(&[(Ipv4Addr::new(10, 77, 1, 1), 30), (Ipv4Addr::new(10, 77, 1, 254), 100)]);
        assert!(two.starts_with(&none), "{two}");
        assert!(two.contains("type filter hook prerouting priority -350; policy accept;"), "{two}");
        assert!(two.contains("ip saddr 10.77.1.1 numgen random mod 100 < 30 drop\n"), "{two}");
        assert!(two.contains("ip saddr 10.77.1.254 drop\n"), "all of it: {two}");
    }

    /// Draws stay within bounds and spread over them.
    #[test]
    fn jitter_draws_cover_their_range() {
        let mut random = XorShift::seeded(3);
        let draws: Vec<u64> = (0..10_000).map(|_| random.up_to(100)).collect();
        assert!(draws.iter().all(|draw| *draw <= 100));
        assert!(draws.contains(&0) && draws.contains(&100), "both ends are drawn");
        assert_eq!(XorShift::seeded(1).up_to(0), 0);
    }
}
