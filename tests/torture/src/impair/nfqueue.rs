//! A netfilter queue (NFQUEUE) client over netlink, as small as the delay handler needs: bind
//! one queue, receive its packets' ids (metadata only, never their bytes), accept them.
//!
//! Written here rather than taken from a crate: the one pure-Rust client (`nfq` 0.2) hides its
//! socket, so a handler could not wait on it with poll(2) together with a stop signal and a
//! release time, and it asserts (panics) on malformed messages. Messages are built and parsed
//! as bytes, with bounds checked; the only unsafe code is the socket calls themselves.
//!
//! The protocol (linux/netfilter/nfnetlink_queue.h): every message is a netlink header, an
//! `nfgenmsg` naming the queue, then attributes. Configuration (bind, copy mode, queue length,
//! flags) is acknowledged; a packet message carries its id in `NFQA_PACKET_HDR`; a verdict
//! names that id.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd as _, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Netfilter's subsystem number of queues (`NFNL_SUBSYS_QUEUE`).
const SUBSYS_QUEUE: u16 = 3;
/// Message kinds within it.
const MSG_PACKET: u16 = 0;
const MSG_VERDICT: u16 = 1;
const MSG_CONFIG: u16 = 2;
/// Attributes of a packet and of a verdict.
const ATTR_PACKET_HDR: u16 = 1;
const ATTR_VERDICT_HDR: u16 = 2;
/// Attributes of a configuration.
const ATTR_CFG_CMD: u16 = 1;
const ATTR_CFG_PARAMS: u16 = 2;
const ATTR_CFG_QUEUE_MAXLEN: u16 = 3;
const ATTR_CFG_MASK: u16 = 4;
const ATTR_CFG_FLAGS: u16 = 5;
/// Binds the socket to the queue.
const CMD_BIND: u8 = 1;
/// Copy only the packet's metadata (its id) to user space.
const COPY_META: u8 = 1;
/// When the queue is full (or the socket cannot take a packet), accept the packet rather than
/// drop it.
const FLAG_FAIL_OPEN: u32 = 1;
/// Queue segmentation-offloaded packets whole (the handler never looks inside them).
const FLAG_GSO: u32 = 4;
/// Netfilter's verdict that lets a packet go on.
const NF_ACCEPT: u32 = 1;
/// An attribute's type without its two flag bits.
const ATTR_TYPE_MASK: u16 = 0x3fff;
/// Netlink and nfgenmsg headers.
const NLMSG_HEADER_LEN: usize = 16;
const NFGEN_HEADER_LEN: usize = 4;
/// What one receive reads at most (a datagram holds one packet's metadata, ~100 bytes).
const RECEIVE_BUFFER_LEN: usize = 64 * 1024;
/// The socket's receive buffer: packet notices waiting for the handler (beyond it the kernel
/// accepts them at once, as the queue fails open).
const SOCKET_BUFFER_BYTES: libc::c_int = 4 << 20;
/// How long the kernel is given to acknowledge a configuration.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// A socket bound to one netfilter queue of the namespace it was opened in.
#[derive(Debug)]
pub(super) struct Queue {
    socket: OwnedFd,
    number: u16,
    sequence: u32,
    buffer: Vec<u8>,
}

impl Queue {
    /// Binds queue `number` of the calling thread's network namespace, copying metadata only,
    /// holding at most `length` packets and failing open. Fails if another socket has it.
    pub(super) fn bind(number: u16, length: u32) -> io::Result<Queue> {
        // SAFETY: plain socket(2); the descriptor it returns is owned below, by nobody else.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, libc::NETLINK_NETFILTER) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket(2) and is not owned elsewhere.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero `sockaddr_nl` is valid (port id 0: the kernel picks one).
        let mut local: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        local.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `local` is a valid `sockaddr_nl` and the length given is its size.
        let bound = unsafe { libc::bind(fd, (&raw const local).cast(), std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t) };
        if bound != 0 {
            return Err(io::Error::last_os_error());
        }
        set_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, SOCKET_BUFFER_BYTES)?;
        // An overrun socket is no error to report: those packets were accepted (fail open).
        set_option(fd, libc::SOL_NETLINK, libc::NETLINK_NO_ENOBUFS, 1)?;
        let mut queue = Queue { socket, number, sequence: 0, buffer: vec![0; RECEIVE_BUFFER_LEN] };
        queue.configure(&[(ATTR_CFG_CMD, &[CMD_BIND, 0, 0, 0])])?;
        let mut params = 0u32.to_be_bytes().to_vec();
        params.push(COPY_META);
        let flags = (FLAG_FAIL_OPEN | FLAG_GSO).to_be_bytes();
        queue.configure(&[
            (ATTR_CFG_PARAMS, &params),
            (ATTR_CFG_QUEUE_MAXLEN, &length.to_be_bytes()),
            (ATTR_CFG_FLAGS, &flags),
            (ATTR_CFG_MASK, &flags),
        ])?;
        Ok(queue)
    }

    /// Receives what is waiting, without blocking: calls `packet` with each queued packet's
    /// id. Returns how many packets it saw; `WouldBlock` when nothing was waiting.
    pub(super) fn receive(&mut self, mut packet: impl FnMut(u32)) -> io::Result<usize> {
        let length = self.receive_datagram()?;
        let mut seen = 0;
        for (kind, _, body) in messages(&self.buffer[..length]) {
            // Errors answer requests; a verdict for a packet already gone is no concern here.
            if kind == (SUBSYS_QUEUE << 8 | MSG_PACKET) {
                if let Some(id) = packet_id(body) {
                    packet(id);
                    seen += 1;
                }
            }
        }
        Ok(seen)
    }

    /// The queue's number.
    pub(super) fn number(&self) -> u16 {
        self.number
    }

    /// Lets packet `id` go on its way.
    pub(super) fn accept(&mut self, id: u32) -> io::Result<()> {
        let mut verdict = NF_ACCEPT.to_be_bytes().to_vec();
        verdict.extend_from_slice(&id.to_be_bytes());
        let message = message(MSG_VERDICT, libc::NLM_F_REQUEST as u16, 0, self.number, &[(ATTR_VERDICT_HDR, &verdict)]);
        self.send(&message)
    }

    /// Sends a configuration and waits for the kernel's acknowledgement; packets that come
    /// meanwhile are accepted.
    fn configure(&mut self, attributes: &[(u16, &[u8])]) -> io::Result<()> {
        self.sequence += 1;
        let sequence = self.sequence;
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
        self.send(&message(MSG_CONFIG, flags, sequence, self.number, attributes))?;
        let deadline = Instant::now() + ACK_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the kernel did not acknowledge a queue configuration"));
            }
            wait_readable(self.as_raw_fd(), left)?;
            let length = match self.receive_datagram() {
                Ok(length) => length,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Err(error),
            };
            let mut answer = None;
            let mut packets = Vec::new();
            for (kind, answered, body) in messages(&self.buffer[..length]) {
                if kind == libc::NLMSG_ERROR as u16 && answered == sequence {
                    let code = body.get(..4).and_then(|bytes| bytes.try_into().ok()).map(i32::from_ne_bytes);
                    answer = Some(code.unwrap_or(-libc::EBADMSG));
                } else if kind == (SUBSYS_QUEUE << 8 | MSG_PACKET) {
                    packets.extend(packet_id(body));
                }
            }
            for id in packets {
                self.accept(id)?;
            }
            match answer {
                Some(0) => return Ok(()),
                Some(code) => return Err(io::Error::from_raw_os_error(-code)),
                None => {}
            }
        }
    }

    fn receive_datagram(&mut self) -> io::Result<usize> {
        loop {
            // SAFETY: the buffer is valid for writes of its whole length for the call.
            let received = unsafe { libc::recv(self.as_raw_fd(), self.buffer.as_mut_ptr().cast(), self.buffer.len(), libc::MSG_DONTWAIT) };
            if received >= 0 {
                return Ok(received as usize);
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EINTR) => continue,
                // Notices lost to a full socket: their packets were accepted (fail open).
                Some(libc::ENOBUFS) => continue,
                _ => return Err(error),
            }
        }
    }

    fn send(&self, message: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: `message` is valid for reads of its length; unaddressed, a netlink
            // socket sends to the kernel.
            let sent = unsafe { libc::send(self.as_raw_fd(), message.as_ptr().cast(), message.len(), 0) };
            if sent >= 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EINTR) {
                return Err(error);
            }
        }
    }
}

impl AsRawFd for Queue {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// Waits until `fd` has something to read or `timeout` has passed.
fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<()> {
    let mut poll = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
    let timeout_ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `poll` is a valid array of one `pollfd` for the call.
    if unsafe { libc::poll(poll.as_mut_ptr(), 1, timeout_ms) } < 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINTR) {
            return Err(error);
        }
    }
    Ok(())
}

fn set_option(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` is a valid `c_int` and the length given is its size.
    let set = unsafe { libc::setsockopt(fd, level, name, (&raw const value).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t) };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A queue message of `kind` for queue `queue`: netlink header, nfgenmsg, then `attributes`
/// (each padded to 4 bytes).
fn message(kind: u16, flags: u16, sequence: u32, queue: u16, attributes: &[(u16, &[u8])]) -> Vec<u8> {
    let mut message = Vec::with_capacity(64);
    message.extend_from_slice(&0u32.to_ne_bytes()); // length, set below
    message.extend_from_slice(&(SUBSYS_QUEUE << 8 | kind).to_ne_bytes());
    message.extend_from_slice(&flags.to_ne_bytes());
    message.extend_from_slice(&sequence.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes()); // to the kernel
    message.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]); // family, NFNETLINK_V0
    message.extend_from_slice(&queue.to_be_bytes());
    for (kind, payload) in attributes {
        message.extend_from_slice(&(4 + payload.len() as u16).to_ne_bytes());
        message.extend_from_slice(&kind.to_ne_bytes());
        message.extend_from_slice(payload);
        message.resize(message.len().next_multiple_of(4), 0);
    }
    let length = message.len() as u32;
    message[..4].copy_from_slice(&length.to_ne_bytes());
    message
}

/// The netlink messages of a datagram: (type, sequence number, what follows the netlink
/// header). Stops at the first malformed one.
fn messages(datagram: &[u8]) -> impl Iterator<Item = (u16, u32, &[u8])> {
    let mut rest = datagram;
    std::iter::from_fn(move || {
        let length = u32::from_ne_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(rest.get(4..6)?.try_into().ok()?);
        let sequence = u32::from_ne_bytes(rest.get(8..12)?.try_into().ok()?);
        let body = rest.get(NLMSG_HEADER_LEN..length)?;
        rest = rest.get(length.next_multiple_of(4)..).unwrap_or_default();
        Some((kind, sequence, body))
    })
}

/// The id of the packet a packet message (after its netlink header) tells of.
fn packet_id(body: &[u8]) -> Option<u32> {
    let mut attributes = body.get(NFGEN_HEADER_LEN..)?;
    while attributes.len() >= 4 {
        let length = u16::from_ne_bytes(attributes[..2].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(attributes[2..4].try_into().ok()?) & ATTR_TYPE_MASK;
        let payload = attributes.get(4..length)?;
        if kind == ATTR_PACKET_HDR {
            return Some(u32::from_be_bytes(payload.get(..4)?.try_into().ok()?));
        }
        attributes = attributes.get(length.next_multiple_of(4)..).unwrap_or_default();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verdict is laid out as the kernel reads it; a packet message built the same way
    /// yields its id, and malformed messages yield nothing rather than a panic.
    #[test]
    fn messages_are_built_and_parsed_as_the_kernel_lays_them_out() {
        let verdict = message(MSG_VERDICT, 1, 7, 3, &[(ATTR_VERDICT_HDR, &[0, 0, 0, 1, 0, 0, 0, 42])]);
        assert_eq!(verdict.len(), 16 + 4 + 4 + 8);
        assert_eq!(u32::from_ne_bytes(verdict[..4].try_into().expect("4 bytes")), 32);
        assert_eq!(u16::from_ne_bytes(verdict[4..6].try_into().expect("2 bytes")), 3 << 8 | 1);
        assert_eq!(&verdict[18..20], &[0, 3], "the queue number, big-endian");

        // A packet message: header, then an unrelated attribute of 5 bytes (padded), then the id.
        let packet = message(MSG_PACKET, 0, 0, 3, &[(9, &[1, 2, 3, 4, 5]), (ATTR_PACKET_HDR, &[0, 0, 1, 2, 8, 0, 1])]);
        let mut datagram = packet.clone();
        datagram.extend_from_slice(&packet);
        let parsed: Vec<_> = messages(&datagram).map(|(kind, _, body)| (kind, packet_id(body))).collect();
        assert_eq!(parsed, vec![(3 << 8, Some(258)), (3 << 8, Some(258))]);

        assert_eq!(messages(&packet[..10]).count(), 0, "a truncated header");
        let mut short = packet.clone();
        short[..4].copy_from_slice(&200u32.to_ne_bytes());
        assert_eq!(messages(&short).count(), 0, "a length beyond the datagram");
        assert_eq!(packet_id(&[0, 0, 0, 3, 200, 0, 1, 0]), None, "an attribute longer than the message");
        assert_eq!(packet_id(&[]), None);
    }
}
