//! Impaired links delay, reorder and lose what crosses them, one way, on new connections and
//! open ones; healing removes every rule and handler; impairments out of bounds are refused.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use common::{serve_echo, PORT};
use warden_torture::impair::DELAY_MAX_MS;
use warden_torture::{End, Impairment, NetError, TestNet};

/// Long enough for a connection on a working (or merely slow) link of one loaded machine.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a link that loses every packet is given to answer.
const LOST_TIMEOUT: Duration = Duration::from_secs(1);
/// Far above a round trip between two hosts of one machine (well under a millisecond), far
/// below the delay tested.
const FAST_ROUND_TRIP: Duration = Duration::from_millis(150);
const DELAY_MS: u64 = 200;

/// A connection from host `from` to `addr` (its socket is host `from`'s, whichever thread
/// uses it).
fn connect(net: &TestNet, from: usize, addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    net.host(from).expect("host").run(move || TcpStream::connect_timeout(&addr, timeout)).expect("enter the host")
}

/// How long one small message takes to come back on `stream`.
fn echo(stream: &mut TcpStream, timeout: Duration) -> std::io::Result<Duration> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let start = Instant::now();
    stream.write_all(b"ping")?;
    let mut answer = [0u8; 4];
    stream.read_exact(&mut answer)?;
    assert_eq!(&answer, b"ping");
    Ok(start.elapsed())
}

/// From host `from` to `addr`: how long connecting took, and then one echo.
fn round_trip(net: &TestNet, from: usize, addr: SocketAddr, timeout: Duration) -> std::io::Result<(Duration, Duration)> {
    let start = Instant::now();
    let mut stream = connect(net, from, addr, timeout)?;
    let connected = start.elapsed();
    Ok((connected, echo(&mut stream, timeout)?))
}

/// The fastest of five connections and echoes from host `from` to `addr`.
fn fastest_round_trip(net: &TestNet, from: usize, addr: SocketAddr) -> Duration {
    (0..5)
        .map(|_| {
            let (connected, echoed) = round_trip(net, from, addr, CONNECT_TIMEOUT).expect("a round trip");
            connected + echoed
        })
        .min()
        .expect("five tries")
}

/// `nft list ruleset` in host `host`.
fn ruleset(net: &TestNet, host: usize) -> String {
    let output = net.host(host).expect("host").command("nft").args(["list", "ruleset"]).output().expect("run nft");
    assert!(output.status.success(), "nft list ruleset: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("text")
}

#[test]
fn a_delayed_link_holds_every_packet_one_way_until_unimpaired() {
    let net = TestNet::create(2).expect("a network of 2 hosts");
    let server = serve_echo(&net, 1);
    let mut open = connect(&net, 0, server, CONNECT_TIMEOUT).expect("a connection open before the impairment");
    echo(&mut open, CONNECT_TIMEOUT).expect("it answers");

    let delay = Duration::from_millis(DELAY_MS);
    net.impair(End::Host(0), 1, Impairment { delay_ms: DELAY_MS, ..Impairment::default() }).expect("delay 0 -> 1");
    assert_eq!(net.delay_handlers(), 1, "one handler for the delayed link");
    let (connected, echoed) = round_trip(&net, 0, server, CONNECT_TIMEOUT).expect("a slow link still works");
    assert!(connected >= delay, "the handshake's first packet is held: {connected:?}");
    assert!(echoed >= delay, "the message is held: {echoed:?}");
    let on_open = echo(&mut open, CONNECT_TIMEOUT).expect("the open connection still answers");
    assert!(on_open >= delay, "an open connection is delayed too: {on_open:?}");
    let counts = net.delay_counts(End::Host(0), 1).expect("the handler's counts");
    assert!(counts.held >= 4, "SYN, ACK and two messages at least were held: {counts:?}");
    assert_eq!(counts.passed_over_limit, 0);
    assert_eq!(net.impairment(End::Host(1), 0), None, "one way only");

    // Impairing again replaces the impairment (and its handler).
    let shorter = Impairment { delay_ms: DELAY_MS / 2, ..Impairment::default() };
    net.impair(End::Host(0), 1, shorter).expect("replace");
    assert_eq!(net.impairment(End::Host(0), 1), Some(shorter));
    assert_eq!(net.delay_handlers(), 1, "the old handler is gone");
    let (_, echoed) = round_trip(&net, 0, server, CONNECT_TIMEOUT).expect("a round trip");
    assert!(echoed >= Duration::from_millis(shorter.delay_ms), "{echoed:?}");

    net.unimpair(End::Host(0), 1).expect("unimpair");
    net.unimpair(End::Host(0), 1).expect("unimpairing a working link changes nothing");
    assert_eq!(net.delay_handlers(), 0);
    assert_eq!(net.impairment(End::Host(0), 1), None);
    let fastest = fastest_round_trip(&net, 0, server);
    assert!(fastest < FAST_ROUND_TRIP, "unimpaired, a round trip is fast again: {fastest:?}");
    let fastest_open = (0..5).map(|_| echo(&mut open, CONNECT_TIMEOUT).expect("echo")).min().expect("five tries");
    assert!(fastest_open < FAST_ROUND_TRIP, "on the open connection too: {fastest_open:?}");
}

#[test]
fn a_link_losing_everything_lets_nothing_through_until_healed() {
    let net = TestNet::create(2).expect("a network of 2 hosts");
    let server = serve_echo(&net, 1);
    // Loss and delay on one link, delay on another: rules of both kinds and two handlers.
    net.impair(End::Host(0), 1, Impairment { delay_ms: 20, jitter_ms: 0, loss_percent: 100 }).expect("lose 0 -> 1");
    net.impair(End::Machine, 1, Impairment { delay_ms: 20, ..Impairment::default() }).expect("delay machine -> 1");
    assert_eq!(net.delay_handlers(), 2);
    let rules = ruleset(&net, 1);
    let source = net.host(0).expect("host").addr;
    assert!(rules.contains("table inet warden_impair") && rules.contains(&format!("ip saddr {source} drop")), "{rules}");
    assert!(rules.contains("queue num 0 bypass") && rules.contains("queue num 32 bypass"), "{rules}");

    assert!(round_trip(&net, 0, server, LOST_TIMEOUT).is_err(), "nothing gets through");
    let from_machine = TcpStream::connect_timeout(&server, CONNECT_TIMEOUT).expect("the machine's link is only slow");
    drop(from_machine);

    net.heal_all().expect("heal everything");
    assert_eq!(net.delay_handlers(), 0, "no handler thread is left");
    assert_eq!(net.impairment(End::Host(0), 1), None);
    assert_eq!(net.impairment(End::Machine, 1), None);
    let rules = ruleset(&net, 1);
    assert!(!rules.contains("warden") && !rules.contains("queue"), "no impairment rule is left: {rules}");
    round_trip(&net, 0, server, CONNECT_TIMEOUT).expect("healed, a connection opens and answers");
}

#[test]
fn jitter_reorders_datagrams_and_loses_none() {
    const DATAGRAMS: u32 = 50;
    let net = TestNet::create(2).expect("a network of 2 hosts");
    let to = SocketAddr::new(net.host(1).expect("host").addr.into(), PORT);
    let receiver = net.host(1).expect("host").run(move || UdpSocket::bind(to)).expect("enter the host").expect("bind");
    net.impair(End::Host(0), 1, Impairment { delay_ms: 50, jitter_ms: 100, loss_percent: 0 }).expect("jitter 0 -> 1");

    net.host(0)
        .expect("host")
        .run(move || -> std::io::Result<()> {
            let sender = UdpSocket::bind("0.0.0.0:0")?;
            for number in 0..DATAGRAMS {
                sender.send_to(&number.to_be_bytes(), to)?;
            }
            Ok(())
        })
        .expect("enter the host")
        .expect("send");
    // At most 150 ms each; a second of silence means no more is coming.
    receiver.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
    let mut received = Vec::new();
    let mut buffer = [0u8; 16];
    while received.len() < DATAGRAMS as usize {
        match receiver.recv(&mut buffer) {
            Ok(4) => received.push(u32::from_be_bytes(buffer[..4].try_into().expect("4 bytes"))),
            Ok(n) => panic!("a datagram of {n} bytes"),
            Err(_) => break,
        }
    }
    let mut sorted = received.clone();
    sorted.sort();
    assert_eq!(sorted, (0..DATAGRAMS).collect::<Vec<_>>(), "every datagram arrives once");
    assert_ne!(received, sorted, "but not in the order sent");
    let counts = net.delay_counts(End::Host(0), 1).expect("counts");
    assert!(counts.held >= u64::from(DATAGRAMS), "{counts:?}");
}

#[test]
fn impairments_out_of_bounds_are_refused_and_change_nothing() {
    let net = TestNet::create(2).expect("a network of 2 hosts");
    let server = serve_echo(&net, 1);
    let kept = Impairment { delay_ms: 10, ..Impairment::default() };
    net.impair(End::Host(0), 1, kept).expect("a valid impairment");

    let refused = [
        (End::Host(0), 1, Impairment { loss_percent: 101, ..kept }),
        (End::Host(0), 1, Impairment { delay_ms: DELAY_MAX_MS + 1, ..kept }),
        (End::Host(0), 1, Impairment { delay_ms: DELAY_MAX_MS - 100, jitter_ms: 101, loss_percent: 0 }),
        (End::Machine, 1, Impairment { loss_percent: 255, ..Impairment::default() }),
    ];
    for (from, to, impairment) in refused {
        match net.impair(from, to, impairment) {
            Err(NetError::LossAbove100(_) | NetError::DelayTooLong { .. }) => {}
            other => panic!("{impairment:?} from {from:?} is refused, not {other:?}"),
        }
    }
    assert!(matches!(net.impair(End::Host(1), 1, kept), Err(NetError::SelfLink(1))));
    assert!(matches!(net.impair(End::Host(0), 2, kept), Err(NetError::NoHost(2))));
    assert!(matches!(net.impair(End::Host(7), 1, kept), Err(NetError::NoHost(7))));

    assert_eq!(net.impairment(End::Host(0), 1), Some(kept), "the link keeps its impairment");
    assert_eq!(net.impairment(End::Machine, 1), None, "and the others have none");
    assert_eq!(net.impairment(End::Host(1), 0), None);
    assert_eq!(net.delay_handlers(), 1);
    assert!(!ruleset(&net, 1).contains("warden_impair"), "no loss rule was made");
    let fastest = fastest_round_trip(&net, 0, server);
    assert!(fastest >= Duration::from_millis(kept.delay_ms), "still delayed as before: {fastest:?}");
    assert!(fastest < FAST_ROUND_TRIP, "and by no more: {fastest:?}");
}
