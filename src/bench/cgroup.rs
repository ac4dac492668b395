//! CPU quotas for benchmark processes: each process in a cgroup of its own with a fixed share
//! of a core, so that N processes on one host behave like N machines of that size (the cgroup
//! v1 `cpu` controller's `cpu.cfs_quota_us` / `cpu.cfs_period_us`, or cgroup v2's `cpu.max`).
//!
//! The cgroups are made under a parent of their own ([`CpuQuotas::create`]) and removed when
//! the [`CpuQuotas`] is dropped; whoever put processes in them stops those first (a cgroup
//! with a live process cannot be removed: what is left over is moved out and logged).

use std::path::{Path, PathBuf};

/// Where the cgroup v1 `cpu` controller is usually mounted.
const V1_CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
/// The cgroup v2 unified hierarchy: the mount point itself, or `unified` on hybrid systems.
const V2_ROOTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];
/// The scheduling period set on v2 cgroups (v1 keeps its own), µs: the kernel's default.
const PERIOD_US_DEFAULT: u64 = 100_000;
/// The smallest quota the kernel accepts, µs.
const QUOTA_US_MIN: u64 = 1_000;

/// Why CPU quotas could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No cgroup hierarchy with a CPU controller was found.
    #[error(
        "no cgroup CPU controller: neither {V1_CPU_ROOT}/cpu.cfs_quota_us (cgroup v1) nor a cgroup v2 hierarchy with the cpu controller at {} \
         (CPU quotas need Linux cgroups; run with --cpu-per-process 0 for uncapped processes)",
        V2_ROOTS.join(" or ")
    )]
    NoCpuController,
    /// The hierarchy exists but may not be changed (not root, or a read-only mount).
    #[error("{}: {source} (CPU quotas need root and a writable cgroup hierarchy; run as root, or with --cpu-per-process 0)", path.display())]
    NotPermitted {
        /// What could not be written.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Another file-system failure.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A quota that is not a positive number of cores.
    #[error("a CPU quota must be a positive number of cores, not {0}")]
    InvalidQuota(f64),
}

/// Which cgroup interface a hierarchy has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    /// `cpu.cfs_quota_us` and `cpu.cfs_period_us`.
    V1,
    /// `cpu.max` (`"quota period"`), with the controller enabled in the parent's
    /// `cgroup.subtree_control`.
    V2,
}

/// The hierarchy's root directory and interface, of the first usable one.
fn detect() -> Result<(PathBuf, Version), CgroupError> {
    if Path::new(V1_CPU_ROOT).join("cpu.cfs_quota_us").is_file() {
        return Ok((PathBuf::from(V1_CPU_ROOT), Version::V1));
    }
    for root in V2_ROOTS {
        let controllers = std::fs::read_to_string(Path::new(root).join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|controller| controller == "cpu") {
            return Ok((PathBuf::from(root), Version::V2));
        }
    }
    Err(CgroupError::NoCpuController)
}

/// A write error, as [`CgroupError::NotPermitted`] when that is what it is.
fn io_error(path: &Path, source: std::io::Error) -> CgroupError {
    let path = path.to_path_buf();
    match source.kind() {
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => CgroupError::NotPermitted { path, source },
        _ => CgroupError::Io { path, source },
    }
}

fn write(path: &Path, text: &str) -> Result<(), CgroupError> {
    std::fs::write(path, text).map_err(|source| io_error(path, source))
}

fn make_dir(path: &Path) -> Result<(), CgroupError> {
    std::fs::create_dir(path).map_err(|source| io_error(path, source))
}

/// A parent cgroup and the per-process cgroups made under it; all removed on drop.
#[derive(Debug)]
pub struct CpuQuotas {
    root: PathBuf,
    version: Version,
    parent: PathBuf,
    children: Vec<PathBuf>,
}

impl CpuQuotas {
    /// Makes the parent cgroup `name` at the root of the CPU hierarchy.
    pub fn create(name: &str) -> Result<CpuQuotas, CgroupError> {
        let (root, version) = detect()?;
        let parent = root.join(name);
        make_dir(&parent)?;
        let quotas = CpuQuotas { root, version, parent, children: Vec::new() };
        if version == Version::V2 {
            // Children get a `cpu.max` only where their parent delegates the controller (the
            // root usually does already; writing it again is harmless).
            write(&quotas.root.join("cgroup.subtree_control"), "+cpu")?;
            write(&quotas.parent.join("cgroup.subtree_control"), "+cpu")?;
        }
        Ok(quotas)
    }

    /// Makes the cgroup `name` with a quota of `cores` and moves process `pid` (all its
    /// threads; threads it starts later are born there) into it.
    pub fn add(&mut self, name: &str, cores: f64, pid: u32) -> Result<(), CgroupError> {
        if !(cores.is_finite() && cores > 0.0) {
            return Err(CgroupError::InvalidQuota(cores));
        }
        let dir = self.parent.join(name);
        make_dir(&dir)?;
        self.children.push(dir.clone());
        match self.version {
            Version::V1 => {
                let period_path = dir.join("cpu.cfs_period_us");
                let period_us = std::fs::read_to_string(&period_path)
                    .map_err(|source| io_error(&period_path, source))?
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(PERIOD_US_DEFAULT);
                write(&dir.join("cpu.cfs_quota_us"), &quota_us(cores, period_us).to_string())?;
            }
            Version::V2 => write(&dir.join("cpu.max"), &format!("{} {PERIOD_US_DEFAULT}", quota_us(cores, PERIOD_US_DEFAULT)))?,
        }
        write(&dir.join("cgroup.procs"), &pid.to_string())
    }
}

/// The quota of `cores` per period of `period_us`, µs (at least the kernel's minimum).
fn quota_us(cores: f64, period_us: u64) -> u64 {
    ((cores * period_us as f64).round() as u64).max(QUOTA_US_MIN)
}

impl Drop for CpuQuotas {
    fn drop(&mut self) {
        for dir in self.children.iter().rev().chain(std::iter::once(&self.parent)) {
            // A process still inside (its owner failed to stop it) would keep the directory:
            // it goes back to the root cgroup, uncapped, and the directory goes.
            let leftover = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in leftover.split_whitespace() {
                tracing::warn!(cgroup = %dir.display(), pid, "a process is still in a benchmark cgroup; moving it out");
                if let Err(error) = std::fs::write(self.root.join("cgroup.procs"), pid) {
                    tracing::warn!(pid, %error, "could not move a process out of a benchmark cgroup");
                }
            }
            if let Err(error) = std::fs::remove_dir(dir) {
                tracing::warn!(cgroup = %dir.display(), %error, "could not remove a benchmark cgroup");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};
    use warden_loadgen::cpu::CpuSample;

    #[test]
    fn quotas_are_cores_times_the_period_with_the_kernels_floor() {
        assert_eq!(quota_us(0.25, 100_000), 25_000);
        assert_eq!(quota_us(2.0, 100_000), 200_000);
        assert_eq!(quota_us(0.000_1, 100_000), QUOTA_US_MIN);
    }

    /// A busy loop in a cgroup capped at a quarter of a core uses well under a core. Runs
    /// where cgroups are writable (root on Linux); elsewhere it says why it did nothing.
    #[test]
    fn a_busy_process_is_held_to_its_quota() {
        let mut quotas = match CpuQuotas::create(&format!("warden-test-{}", std::process::id())) {
            Ok(quotas) => quotas,
            Err(error @ (CgroupError::NoCpuController | CgroupError::NotPermitted { .. })) => {
                eprintln!("skipped: CPU cgroups are not available here: {error}");
                return;
            }
            Err(error) => panic!("{error}"),
        };
        assert!(matches!(quotas.add("bad", 0.0, 1), Err(CgroupError::InvalidQuota(_))));
        let mut busy = std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().expect("sh starts");
        let added = quotas.add("busy", 0.25, busy.id());
        let measured = added.map_err(|error| error.to_string()).and_then(|()| {
            let before = CpuSample::take(&[busy.id()]).map_err(|error| error.to_string())?;
            let started = Instant::now();
            // The measurement itself (not a synchronisation): ~2 s of the loop's CPU time.
            std::thread::sleep(Duration::from_secs(2));
            let used = CpuSample::take(&[busy.id()]).map_err(|error| error.to_string())?.since(&before);
            Ok(used.total().as_secs_f64() / started.elapsed().as_secs_f64())
        });
        let _ = busy.kill();
        let _ = busy.wait();
        let parent = quotas.parent.clone();
        drop(quotas);
        assert!(!parent.exists(), "the cgroups are removed on drop");
        let share = measured.expect("the busy loop was put in its cgroup and measured");
        assert!(share < 0.6, "a loop capped at 0.25 core used {share:.2} of a core");
        assert!(share > 0.0, "the loop ran");
    }
}
