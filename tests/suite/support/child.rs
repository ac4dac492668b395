//! Child processes in process groups of their own: whatever a child starts (a shell's
//! commands, a test suite's servers) is killed with it, and every one of them dies with the
//! test process even if that is killed without unwinding.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How often [`run_within`] looks whether its child has exited.
const POLL: Duration = Duration::from_millis(20);

/// A child process leading its own process group, the group killed (SIGKILL) when this is
/// dropped.
pub struct Group(pub Child);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the process group this test created (the child's pid).
        unsafe { libc::kill(-(self.0.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Spawns `command` in a process group of its own that dies with this test process.
pub fn spawn_group(command: &mut Command) -> std::io::Result<Group> {
    // SAFETY: prctl in the forked child before exec: it dies with this test process even if
    // that is killed without unwinding.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    command.process_group(0).spawn().map(Group)
}

/// What a command run by [`run_within`] did.
pub struct Ran {
    /// How it exited; `None` when it ran past its deadline and was killed.
    pub status: Option<ExitStatus>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl Ran {
    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|status| status.success())
    }

    /// Its exit code: `None` when it was killed by a signal or ran past its deadline.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|status| status.code())
    }

    /// Its standard output and error under headings, for a failure message.
    pub fn report(&self) -> String {
        format!("--- stdout ---\n{}\n--- stderr ---\n{}", self.stdout, self.stderr)
    }
}

/// Runs `command` (no standard input; its output read by threads) in a process group of its
/// own until it exits or `deadline` passes; then its group is killed, so nothing it started
/// outlives it, and what it printed until then is returned.
pub fn run_within(command: &mut Command, deadline: Duration) -> std::io::Result<Ran> {
    let mut child = spawn_group(command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()))?;
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = reader(child.0.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = reader(child.0.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let end = Instant::now() + deadline;
    let status = loop {
        if let Some(status) = child.0.try_wait()? {
            break Some(status);
        }
        if Instant::now() > end {
            break None;
        }
        std::thread::sleep(POLL);
    };
    // Kills what the command left behind (or everything, past the deadline), closing the pipes.
    drop(child);
    Ok(Ran { status, stdout: stdout.join().expect("stdout reader"), stderr: stderr.join().expect("stderr reader") })
}
