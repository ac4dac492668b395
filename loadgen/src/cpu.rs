//! Server CPU per operation: the CPU time (user + system) the server processes used over the
//! measured window, from `/proc/PID/stat`, divided by the operations acknowledged in it; and
//! each process's share, in cores, which shows which process bounds a run. With
//! [`Threads::Named`] only some threads of a process count (read from `/proc/PID/task/*/stat`):
//! how a benchmark that runs servers and clients in one process counts the servers alone.

use std::time::{Duration, Instant};

/// CPU time used so far by each process of a set, and when that was read.
#[derive(Clone, Debug)]
pub struct CpuSample {
    per_pid: Vec<(u32, Duration)>,
    taken: Instant,
}

/// The CPU a set of processes used between two samples.
#[derive(Clone, Debug)]
pub struct CpuUsed {
    /// Each process, in the order the pids were given.
    pub per_process: Vec<ProcessCpu>,
    /// Wall-clock time between the samples.
    pub window: Duration,
}

/// One process's CPU over a window.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ProcessCpu {
    /// The process.
    pub pid: u32,
    /// CPU time (user + system, all threads) used in the window, seconds.
    pub cpu_s: f64,
    /// `cpu_s` over the window's seconds: the cores it kept busy on average.
    pub cores: f64,
}

impl CpuUsed {
    /// CPU time of all the processes together.
    pub fn total(&self) -> Duration {
        Duration::from_secs_f64(self.per_process.iter().map(|process| process.cpu_s).sum::<f64>())
    }
}

/// Which threads of a process count.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Threads {
    /// All of them (the process's own counters, which keep the CPU of exited threads).
    #[default]
    All,
    /// Those whose name (`comm`, at most 15 bytes) starts with one of these prefixes. A thread
    /// that exits inside the window takes its CPU with it: what it used since the first
    /// sample is not counted, so short-lived threads (snapshot builders) are undercounted.
    Named(Vec<String>),
}

/// Why the CPU time of a process could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// `/proc/PID/stat` could not be read (no such process, or not Linux).
    #[error("reading /proc/{pid}/stat: {source}")]
    Read {
        /// The process.
        pid: u32,
        /// The read's failure.
        source: std::io::Error,
    },
    /// The file did not have the expected fields.
    #[error("/proc/{pid}/stat is not in the expected format")]
    Format {
        /// The process.
        pid: u32,
    },
}

/// Clock ticks per second of `/proc`'s CPU times.
fn ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&ticks| ticks > 0).unwrap_or(100)
}

/// The command (thread) name in the text of a `/proc/PID/stat`: between the first `(` and
/// the last `)`, as it may hold either.
fn name_of(stat: &str) -> Option<&str> {
    let start = stat.find('(')? + 1;
    let end = stat.rfind(')')?;
    stat.get(start..end)
}

/// User + system CPU time of `pid` so far, from the text of its `/proc/PID/stat` (or of one
/// of its threads' `/proc/PID/task/TID/stat`, which has the same format).
fn cpu_of(pid: u32, stat: &str) -> Result<Duration, CpuError> {
    // The command name (field 2) is in parentheses and may hold spaces: fields are counted
    // after its closing parenthesis. utime and stime are fields 14 and 15.
    let after_name = stat.rfind(')').map(|end| &stat[end + 1..]).ok_or(CpuError::Format { pid })?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|text| text.parse::<u64>().ok()).ok_or(CpuError::Format { pid });
    let ticks = field(14)?.saturating_add(field(15)?);
    Ok(Duration::from_secs_f64(ticks as f64 / ticks_per_sec() as f64))
}

/// CPU time so far of the threads of `pid` whose names start with one of `prefixes`.
fn named_threads_cpu(pid: u32, prefixes: &[String]) -> Result<Duration, CpuError> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|source| CpuError::Read { pid, source })?;
    let mut total = Duration::ZERO;
    for task in tasks {
        let task = task.map_err(|source| CpuError::Read { pid, source })?;
        // A thread that exited since the listing has no stat left to read: it is skipped.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        if name_of(&stat).is_some_and(|name| prefixes.iter().any(|prefix| name.starts_with(prefix.as_str()))) {
            total += cpu_of(pid, &stat)?;
        }
    }
    Ok(total)
}

impl CpuSample {
    /// The CPU time each of `pids` has used so far (all their threads).
    pub fn take(pids: &[u32]) -> Result<CpuSample, CpuError> {
        CpuSample::take_threads(pids, &Threads::All)
    }

    /// The CPU time the `threads` of each of `pids` have used so far.
    pub fn take_threads(pids: &[u32], threads: &Threads) -> Result<CpuSample, CpuError> {
        let mut per_pid = Vec::with_capacity(pids.len());
        for &pid in pids {
            let used = match threads {
                Threads::All => {
                    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|source| CpuError::Read { pid, source })?;
                    cpu_of(pid, &stat)?
                }
                Threads::Named(prefixes) => named_threads_cpu(pid, prefixes)?,
            };
            per_pid.push((pid, used));
        }
        Ok(CpuSample { per_pid, taken: Instant::now() })
    }

    /// CPU used by each process between `earlier` and this sample (a process `earlier` did
    /// not cover counts from zero).
    pub fn since(&self, earlier: &CpuSample) -> CpuUsed {
        let window = self.taken.saturating_duration_since(earlier.taken);
        let per_process = self
            .per_pid
            .iter()
            .map(|&(pid, now)| {
                let before = earlier.per_pid.iter().find(|(earlier_pid, _)| *earlier_pid == pid).map_or(Duration::ZERO, |(_, before)| *before);
                let cpu_s = now.saturating_sub(before).as_secs_f64();
                ProcessCpu { pid, cpu_s, cores: cpu_s / window.as_secs_f64().max(f64::MIN_POSITIVE) }
            })
            .collect();
        CpuUsed { per_process, window }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_utime_and_stime_after_a_command_name_with_spaces_and_parentheses() {
        let ticks = ticks_per_sec();
        let stat = format!("4242 (my (odd) server) S 1 4242 4242 0 -1 4194560 100 0 0 0 {} {} 0 0 20 0 8 0 123 456 789", ticks * 3, ticks * 2);
        assert_eq!(cpu_of(4242, &stat).ok(), Some(Duration::from_secs(5)));
        assert!(matches!(cpu_of(4242, "4242 (truncated) S 1 2"), Err(CpuError::Format { pid: 4242 })));
        assert!(matches!(cpu_of(4242, "no parenthesis at all"), Err(CpuError::Format { .. })));
        assert_eq!(name_of(&stat), Some("my (odd) server"));
    }

    #[test]
    fn measures_this_process_burning_cpu() {
        let pid = std::process::id();
        let before = CpuSample::take(&[pid]).expect("this process has a /proc entry");
        // Spin until the process's own clock shows CPU used (bounded by a deadline).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut spins = 0u64;
        loop {
            for _ in 0..1_000_000 {
                spins = std::hint::black_box(spins.wrapping_add(1));
            }
            let used = CpuSample::take(&[pid]).expect("still there").since(&before);
            assert_eq!(used.per_process.len(), 1);
            assert!(used.per_process[0].cores >= 0.0 && used.per_process[0].cores.is_finite());
            if used.total() >= Duration::from_millis(50) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "50 ms of CPU never showed in /proc");
        }
        assert!(matches!(CpuSample::take(&[u32::MAX]), Err(CpuError::Read { .. })), "no such process");
    }

    /// Burns CPU on a thread named `name` until `stop` is set.
    fn burner(name: &str, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<()> {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut spins = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    spins = std::hint::black_box(spins.wrapping_add(1));
                }
            })
            .expect("spawn a thread")
    }

    #[test]
    fn counts_only_the_threads_with_the_named_prefixes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let pid = std::process::id();
        let server = Threads::Named(vec!["cpu-test-srv".into()]);
        let other = Threads::Named(vec!["cpu-test-oth".into()]);
        let take = |threads: &Threads| CpuSample::take_threads(&[pid], threads).expect("this process's threads");
        // The whole process's baseline first and its end sample last, so its window covers
        // both named ones.
        let process_before = CpuSample::take(&[pid]).expect("this process");
        let (server_before, other_before) = (take(&server), take(&other));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let burning = [burner("cpu-test-srv-1", stop.clone()), burner("cpu-test-oth-1", stop.clone())];
        // This thread (named after the test) spins too: counted by neither prefix.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut spins = 0u64;
        let (server_used, other_used) = loop {
            for _ in 0..1_000_000 {
                spins = std::hint::black_box(spins.wrapping_add(1));
            }
            let used = (take(&server).since(&server_before).total(), take(&other).since(&other_before).total());
            if used.0 >= Duration::from_millis(50) && used.1 >= Duration::from_millis(50) {
                break used;
            }
            assert!(Instant::now() < deadline, "50 ms of the named threads' CPU never showed in /proc");
        };
        let process_used = CpuSample::take(&[pid]).expect("this process").since(&process_before).total();
        stop.store(true, Ordering::Relaxed);
        for thread in burning {
            thread.join().expect("the burner ends");
        }
        // Were the filter to count every thread, each named sum would be about the whole
        // process's, and the two together well above it (a tick of slack for rounding).
        assert!(server_used + other_used <= process_used + Duration::from_millis(20), "{server_used:?} + {other_used:?} > {process_used:?}");
        assert_eq!(take(&Threads::Named(vec!["no-such-thread".into()])).per_pid, vec![(pid, Duration::ZERO)]);
        assert!(matches!(CpuSample::take_threads(&[u32::MAX], &server), Err(CpuError::Read { .. })), "no such process");
    }
}
