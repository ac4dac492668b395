//! The node's wall clock: milliseconds since the Unix epoch as the system says, plus an
//! offset only a test sets. Everything in a node that reads wall time reads it here (the
//! leader's clock of leader-only calls and time-driven proposals, the time stamped on every
//! command), so a test can step or drift one node's wall clock, as an NTP step or a bad
//! oscillator would, and see what depends on it. Leases, deadlines and timers run on the
//! monotonic clock, which no offset moves (and no real clock step moves either).
//!
//! [`stepless_ms`] is the wall clock as it was when the process started, advanced by the
//! monotonic clock since: it never steps (neither with the system's clock nor with the
//! offset). Placement judges which nodes are silent by it, comparing times its own leader
//! stamped: a step of the wall clock between the stamp and the judgement would make every
//! node look silent at once (a step forward) or hide a dead one (back).
//!
//! The offset comes from the file `WARDEN_TEST_WALL_CLOCK_FILE` names, read every
//! [`POLL_INTERVAL`] once [`follow_test_offset`] started: `<offset_ms> [<drift_ppm>]`, signed
//! integers; with a drift the offset then grows by `drift_ppm` millionths of the time since
//! the file last changed. A missing or malformed file leaves the clock as it was. Without the
//! variable nothing is read and the offset stays 0.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The environment variable naming the test offset's file.
pub const TEST_OFFSET_FILE_ENV: &str = "WARDEN_TEST_WALL_CLOCK_FILE";
/// How often the file is read.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Largest offset, either way (a day): a larger one is taken as this.
const OFFSET_MS_MAX: i64 = 86_400_000;
/// Largest drift, either way (half the clock's own rate).
const DRIFT_PPM_MAX: i64 = 500_000;
/// Largest file read (two numbers).
const FILE_BYTES_MAX: u64 = 64;

/// The offset now added to the system's wall clock.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Milliseconds since the Unix epoch, by this node's wall clock (0 before the epoch).
pub fn now_ms() -> u64 {
    let system_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    u64::try_from(system_ms.saturating_add(OFFSET_MS.load(Ordering::Relaxed))).unwrap_or(0)
}

/// Milliseconds since the Unix epoch by a clock that never steps: [`now_ms`] when the
/// process first asked (at the latest when [`follow_test_offset`] starts), advanced by the
/// monotonic clock since. It drifts from the wall clock only as the monotonic clock does.
pub fn stepless_ms() -> u64 {
    static START: std::sync::OnceLock<(u64, Instant)> = std::sync::OnceLock::new();
    let (wall_ms, at) = *START.get_or_init(|| (now_ms(), Instant::now()));
    wall_ms.saturating_add(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX))
}

/// Sets the test offset directly (unit tests of what a clock step does; a node process
/// takes it from its file instead, see [`follow_test_offset`]).
#[doc(hidden)]
pub fn set_test_offset_ms(offset_ms: i64) {
    OFFSET_MS.store(offset_ms.clamp(-OFFSET_MS_MAX, OFFSET_MS_MAX), Ordering::Relaxed);
}

/// What the test offset's file says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestOffset {
    /// Added to the system's wall clock, in milliseconds.
    pub offset_ms: i64,
    /// Added to the offset per million milliseconds since the file changed.
    pub drift_ppm: i64,
}

impl TestOffset {
    /// Parses `<offset_ms> [<drift_ppm>]`, bounded by [`OFFSET_MS_MAX`] and [`DRIFT_PPM_MAX`].
    pub fn parse(text: &str) -> Option<TestOffset> {
        let mut words = text.split_whitespace();
        let offset_ms = words.next()?.parse::<i64>().ok()?.clamp(-OFFSET_MS_MAX, OFFSET_MS_MAX);
        let drift_ppm = match words.next() {
            Some(word) => word.parse::<i64>().ok()?.clamp(-DRIFT_PPM_MAX, DRIFT_PPM_MAX),
            None => 0,
        };
        words.next().is_none().then_some(TestOffset { offset_ms, drift_ppm })
    }

    /// The offset `since` after the file said this.
    fn at(self, since: Duration) -> i64 {
        let drifted = i64::try_from(since.as_millis()).unwrap_or(i64::MAX).saturating_mul(self.drift_ppm) / 1_000_000;
        self.offset_ms.saturating_add(drifted).clamp(-OFFSET_MS_MAX, OFFSET_MS_MAX)
    }
}

/// Starts following the test offset's file when `WARDEN_TEST_WALL_CLOCK_FILE` is set (a
/// thread reading it every [`POLL_INTERVAL`] for the life of the process); answers whether it
/// did. Only tests set the variable: the node says so in its log.
pub fn follow_test_offset() -> bool {
    // Pinned before any offset can apply.
    stepless_ms();
    let Some(path) = std::env::var_os(TEST_OFFSET_FILE_ENV) else { return false };
    let path = std::path::PathBuf::from(path);
    tracing::warn!(file = %path.display(), "the wall clock follows a test's offset ({TEST_OFFSET_FILE_ENV} is set): for tests only");
    let spawned = std::thread::Builder::new().name("test-wall-clock".into()).spawn(move || {
        let mut current: Option<(TestOffset, Instant)> = None;
        loop {
            let read = std::fs::File::open(&path).and_then(|file| {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::Read::take(file, FILE_BYTES_MAX), &mut text).map(|_| text)
            });
            if let Some(offset) = read.ok().as_deref().and_then(TestOffset::parse) {
                if current.is_none_or(|(held, _)| held != offset) {
                    tracing::warn!(offset.offset_ms, offset.drift_ppm, "test wall clock offset changed");
                    current = Some((offset, Instant::now()));
                }
            }
            if let Some((offset, since)) = current {
                OFFSET_MS.store(offset.at(since.elapsed()), Ordering::Relaxed);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    });
    if let Err(error) = spawned {
        tracing::error!(%error, "could not start following the test wall clock offset");
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_bounded_and_refuse_anything_else() {
        assert_eq!(TestOffset::parse("-60000\n"), Some(TestOffset { offset_ms: -60_000, drift_ppm: 0 }));
        assert_eq!(TestOffset::parse("0 100000"), Some(TestOffset { offset_ms: 0, drift_ppm: 100_000 }));
        assert_eq!(TestOffset::parse("999999999999 -9999999"), Some(TestOffset { offset_ms: OFFSET_MS_MAX, drift_ppm: -DRIFT_PPM_MAX }));
        for bad in ["", "soon", "1 2 3", "1.5", "1 x"] {
            assert_eq!(TestOffset::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_drift_moves_the_offset_with_the_time_since_it_was_set() {
        let offset = TestOffset { offset_ms: 1_000, drift_ppm: 100_000 };
        assert_eq!(offset.at(Duration::ZERO), 1_000);
        assert_eq!(offset.at(Duration::from_secs(10)), 2_000, "10% of 10 s");
        assert_eq!(TestOffset { offset_ms: 0, drift_ppm: -500_000 }.at(Duration::from_secs(4)), -2_000);
    }

    /// One test, so no other sets the offset meanwhile.
    #[test]
    fn an_offset_steps_the_wall_clock_and_not_the_stepless_one() {
        let system_ms = || SystemTime::now().duration_since(UNIX_EPOCH).expect("after the epoch").as_millis() as u64;
        let (before, stepless) = (system_ms(), stepless_ms());
        assert!((before..before + 60_000).contains(&now_ms()), "without an offset, the system's clock");
        assert!(stepless.abs_diff(before) < 60_000, "the stepless clock starts at the wall clock: {stepless} vs {before}");
        set_test_offset_ms(3_600_000);
        let stepped = now_ms();
        assert!(stepped >= before + 3_600_000, "an hour ahead: {stepped} vs {before}");
        assert!(stepless_ms() < before + 60_000, "the stepless clock did not step");
        set_test_offset_ms(0);
        assert!(now_ms() < before + 60_000, "put back");
        assert!(stepless_ms() >= stepless, "and the stepless clock never went back");
    }
}
