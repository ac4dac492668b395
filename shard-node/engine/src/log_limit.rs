//! Rate limits for operator log lines. A node hosting thousands of groups can produce the same
//! event thousands of times a second (every group electing a leader at start-up, every fsync of
//! a stalled disk being slow); each kind of event gets its own [`LogLimit`], so a burst of one
//! kind neither floods the log nor hides the other kinds. What is held back is counted and
//! reported with the next line that passes.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The length of one rate window.
const WINDOW: Duration = Duration::from_secs(1);

/// Admits at most `lines_per_window_max` log lines of one kind per second.
pub struct LogLimit {
    lines_per_window_max: u32,
    state: Mutex<Window>,
}

struct Window {
    started: Option<Instant>,
    admitted: u32,
    suppressed: u64,
}

impl LogLimit {
    /// A limit of `lines_per_window_max` lines per second (a `static` per event kind).
    pub const fn new(lines_per_window_max: u32) -> LogLimit {
        LogLimit { lines_per_window_max, state: Mutex::new(Window { started: None, admitted: 0, suppressed: 0 }) }
    }

    /// Whether a line may be logged now: `Some(n)` with the number of lines held back since
    /// the last one admitted (to log beside it), or `None` when this one is held back.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        // A poisoned lock only means another thread panicked while logging: keep counting.
        let mut window = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if window.started.is_none_or(|started| now.saturating_duration_since(started) >= WINDOW) {
            window.started = Some(now);
            window.admitted = 0;
        }
        if window.admitted >= self.lines_per_window_max {
            window.suppressed = window.suppressed.saturating_add(1);
            return None;
        }
        window.admitted += 1;
        Some(std::mem::take(&mut window.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_the_limit_per_window_and_reports_what_it_held_back() {
        let limit = LogLimit::new(2);
        let start = Instant::now();
        assert_eq!(limit.admit_at(start), Some(0));
        assert_eq!(limit.admit_at(start), Some(0));
        assert_eq!(limit.admit_at(start), None, "the third line of the window is held back");
        assert_eq!(limit.admit_at(start + Duration::from_millis(999)), None);
        assert_eq!(limit.admit_at(start + WINDOW), Some(2), "the next window reports the two held back");
        assert_eq!(limit.admit_at(start + WINDOW), Some(0));
    }
}
