//! Faults a node cannot go on after, on a real `warden node` process: it must end as a whole
//! (so that a supervisor restarts it), not linger with dead parts.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::*;
use warden_testkit::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_warden");

/// No file the node process writes may grow past this: RocksDB's write-ahead log reaches it
/// after a few MiB of writes, and the write fails for real (`EFBIG`).
const FILE_BYTES_MAX: libc::rlim_t = 4 << 20;

/// A child process killed (SIGKILL) when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A storage failure (or a panic) used to stop one worker thread and leave
/// the process running, its groups answering `Stopped` forever. Now the node aborts with a
/// clear log line. The fault is real: the process may not write a file past
/// `FILE_BYTES_MAX` (`RLIMIT_FSIZE`, with `SIGXFSZ` ignored so the write fails with `EFBIG`
/// instead of the signal killing the process), so its RocksDB fails once enough is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_storage_fails_exits_instead_of_lingering() {
    let dir = tempfile::tempdir().expect("tempdir");
    let listen = format!("127.0.0.1:{}", free_port());
    let peers = format!("1={listen}");
    let data = dir.path().join("node-1");
    let log_path = dir.path().join("node-1.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut command = Command::new(BIN);
    command
        .args(["node", "--id", "1", "--listen", &listen, "--data-dir", data.to_str().expect("utf8"), "--peers", &peers])
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (setrlimit, signal).
    unsafe {
        command.pre_exec(|| {
            let files = libc::rlimit { rlim_cur: FILE_BYTES_MAX, rlim_max: FILE_BYTES_MAX };
            let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &files) != 0 || libc::setrlimit(libc::RLIMIT_CORE, &no_core) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // An ignored signal stays ignored across exec.
            if libc::signal(libc::SIGXFSZ, libc::SIG_IGN) == libc::SIG_ERR {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut node = Process(command.spawn().expect("spawn warden node"));
    let bootstrap = Command::new(BIN).args(["admin", "bootstrap", "--nodes", &peers, "--placement", "1"]).output().expect("run warden admin");
    assert!(bootstrap.status.success(), "warden admin bootstrap: {}", String::from_utf8_lossy(&bootstrap.stderr));
    let channel = Channel::from_shared(format!("http://{listen}")).expect("uri").timeout(Duration::from_secs(10)).connect_lazy();
    let mut client = WardenClient::new(channel);

    // Write until the node ends; it must, once its storage fails.
    let value = vec![b'x'; 256 << 10];
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut written, mut n) = (0, 0);
    let status = loop {
        if let Some(status) = node.0.try_wait().expect("wait for the node") {
            break status;
        }
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        assert!(Instant::now() < deadline, "the node still runs after {written} writes and its storage failing; its log:\n{log}");
        n += 1;
        let create = CreateRequest { path: format!("/k{n}"), data: value.clone(), ..CreateRequest::default() };
        match client.create(create).await {
            Ok(_) => written += 1,
            // Refused (not ready yet, or failing): try again shortly.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(!status.success(), "the node must end with a failure, not {status}; its log:\n{log}");
    assert!(written > 0, "the node took writes before its storage failed; its log:\n{log}");
    assert!(log.contains("the node cannot go on"), "the node says why it ends; its log:\n{log}");
}
