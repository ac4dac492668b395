//! What the one host of a multi-process benchmark can give, so a run that reached a limit of
//! the host rather than of Warden says so instead of giving a figure: the disk's fsyncs per
//! second from as many writers as the run has nodes (a one-host model shares one disk, where
//! real machines each have their own), and the cores left outside the processes' CPU quotas,
//! where the load generator runs uncapped.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the fsync probe writes.
const FSYNC_PROBE: Duration = Duration::from_secs(1);
/// Bytes of each probe write (about a small raft batch).
const FSYNC_PROBE_WRITE_BYTES: usize = 4096;
/// The share of a host limit past which a run counts as having reached it: a measured rate
/// this close to the disk's or the spare cores' capacity is bounded by the host, not the
/// cluster.
pub const AT_LIMIT_SHARE: f64 = 0.85;

/// Fsyncs per second the disk under `dir` completes with `writers` threads each writing and
/// syncing a file of its own for a second (the probe's files are removed).
pub fn fsyncs_per_sec(dir: &Path, writers: usize) -> anyhow::Result<f64> {
    let writers = writers.max(1);
    let block = vec![0u8; FSYNC_PROBE_WRITE_BYTES];
    let started = Instant::now();
    let counts = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|writer| {
                let block = &block;
                scope.spawn(move || -> anyhow::Result<u64> {
                    let path = dir.join(format!("fsync-probe-{writer}"));
                    let mut file = std::fs::File::create(&path)?;
                    let mut synced = 0u64;
                    while started.elapsed() < FSYNC_PROBE {
                        file.write_all(block)?;
                        file.sync_data()?;
                        synced += 1;
                    }
                    drop(file);
                    std::fs::remove_file(&path)?;
                    Ok(synced)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().map_err(|_| anyhow::anyhow!("an fsync probe thread panicked"))?)
            .collect::<anyhow::Result<Vec<u64>>>()
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    Ok(counts.iter().sum::<u64>() as f64 / elapsed)
}

/// The host's cores (what the kernel lets this process use).
pub fn host_cores() -> f64 {
    std::thread::available_parallelism().map_or(1, usize::from) as f64
}

/// Whether `used` is at the limit `capacity` (within [`AT_LIMIT_SHARE`]); a capacity of 0 or
/// less is always reached.
pub fn at_limit(used: f64, capacity: f64) -> bool {
    capacity <= 0.0 || used >= AT_LIMIT_SHARE * capacity
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_counts_real_fsyncs() {
        let dir = tempfile::tempdir().expect("temp dir");
        let rate = fsyncs_per_sec(dir.path(), 2).expect("probe");
        assert!(rate > 0.0, "a disk completes some fsyncs in a second: {rate}");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0, "the probe's files are removed");
    }

    #[test]
    fn limits_are_reached_near_capacity() {
        assert!(at_limit(90.0, 100.0));
        assert!(!at_limit(50.0, 100.0));
        assert!(at_limit(0.0, 0.0), "no spare capacity is a limit reached");
    }
}
