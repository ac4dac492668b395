//! Server CPU per operation: the CPU time (user + system) the server processes used over the
//! measured window, from `/proc/PID/stat`, divided by the operations acknowledged in it; and
//! each process's share, in cores, which shows which process bounds a run.

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

/// User + system CPU time of `pid` so far, from the text of its `/proc/PID/stat`.
fn cpu_of(pid: u32, stat: &str) -> Result<Duration, CpuError> {
    // The command name (field 2) is in parentheses and may hold spaces: fields are counted
    // after its closing parenthesis. utime and stime are fields 14 and 15.
    let after_name = stat.rfind(')').map(|end| &stat[end + 1..]).ok_or(CpuError::Format { pid })?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|text| text.parse::<u64>().ok()).ok_or(CpuError::Format { pid });
    let ticks = field(14)?.saturating_add(field(15)?);
    Ok(Duration::from_secs_f64(ticks as f64 / ticks_per_sec() as f64))
}

impl CpuSample {
    /// The CPU time each of `pids` has used so far.
    pub fn take(pids: &[u32]) -> Result<CpuSample, CpuError> {
        let mut per_pid = Vec::with_capacity(pids.len());
        for &pid in pids {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|source| CpuError::Read { pid, source })?;
            per_pid.push((pid, cpu_of(pid, &stat)?));
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
}
