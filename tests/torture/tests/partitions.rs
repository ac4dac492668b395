//! Test hosts reach each other over their bridge, and partitions cut exactly the links they
//! name, both for new connections and for connections already open.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::serve_echo;
use warden_torture::{End, TestNet};

/// Long enough for a connection on a working link of one machine, even a loaded one.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a cut link is given to answer: a blackhole never answers.
const CUT_TIMEOUT: Duration = Duration::from_millis(400);

/// Whether a connection from `from` to `addr` opens and echoes within `timeout`.
fn reaches(net: &TestNet, from: End, addr: SocketAddr, timeout: Duration) -> bool {
    let attempt = move || -> std::io::Result<()> {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        echo(&mut stream, timeout)
    };
    match from {
        End::Host(index) => net.host(index).expect("host").run(attempt).expect("enter the host").is_ok(),
        End::Machine => attempt().is_ok(),
    }
}

fn echo(stream: &mut TcpStream, timeout: Duration) -> std::io::Result<()> {
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"ping")?;
    let mut answer = [0u8; 4];
    stream.read_exact(&mut answer)?;
    assert_eq!(&answer, b"ping");
    Ok(())
}

#[test]
fn partitions_cut_exactly_the_links_they_name() {
    let net = TestNet::create(3).expect("a network of 3 hosts");
    let server = serve_echo(&net, 0);
    for from in [End::Host(1), End::Host(2), End::Machine] {
        assert!(reaches(&net, from, server, CONNECT_TIMEOUT), "{from:?} reaches host 0");
    }
    // A connection open before the cut stops answering once the cut is made.
    let mut open = TcpStream::connect_timeout(&server, CONNECT_TIMEOUT).expect("an open connection");
    echo(&mut open, CONNECT_TIMEOUT).expect("it answers");

    // One way: host 1 cannot send to host 0; host 2 and the machine still can.
    net.cut(End::Host(1), End::Host(0)).expect("cut 1 -> 0");
    net.cut(End::Host(1), End::Host(0)).expect("cutting a cut link changes nothing");
    assert!(!reaches(&net, End::Host(1), server, CUT_TIMEOUT), "host 1 is cut from host 0");
    assert!(reaches(&net, End::Host(2), server, CONNECT_TIMEOUT), "host 2 is not");
    net.heal(End::Host(1), End::Host(0)).expect("heal 1 -> 0");
    net.heal(End::Host(1), End::Host(0)).expect("healing a working link changes nothing");
    assert!(reaches(&net, End::Host(1), server, CONNECT_TIMEOUT), "healed");

    // Isolated: nobody reaches host 0, and the open connection goes silent.
    net.isolate(0).expect("isolate host 0");
    for from in [End::Host(1), End::Host(2), End::Machine] {
        assert!(!reaches(&net, from, server, CUT_TIMEOUT), "{from:?} cannot reach an isolated host");
    }
    assert!(echo(&mut open, CUT_TIMEOUT).is_err(), "an established connection is cut too");
    net.heal_all().expect("heal everything");
    for from in [End::Host(1), End::Host(2), End::Machine] {
        assert!(reaches(&net, from, server, CONNECT_TIMEOUT), "{from:?} reaches host 0 after healing");
    }

    // Halves: {0, 1} against {2}.
    net.partition(&[End::Host(0), End::Host(1)], &[End::Host(2)]).expect("partition");
    assert!(reaches(&net, End::Host(1), server, CONNECT_TIMEOUT), "same side");
    assert!(!reaches(&net, End::Host(2), server, CUT_TIMEOUT), "other side");
    assert!(reaches(&net, End::Machine, server, CONNECT_TIMEOUT), "the machine is on neither side");
}
