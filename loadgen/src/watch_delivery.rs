//! The watch workload: `--clients` watchers of one subtree and one writer. Each write carries
//! its sequence number; the writer records when each write was acknowledged, and each
//! watcher's latency is from that acknowledgement to the event's arrival (an event that
//! arrives before its write's acknowledgement counts as 1 µs: the watch was not the slower
//! path).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::driver::{self, ClientLoop, Measured, Progress};
use crate::options::{prefix, LoadArgs};
use crate::target::{Connection, OpError, Target, WatchEvents};
use crate::workload::value;

/// Writes whose acknowledgement time is remembered (a watcher further behind than this reads
/// a newer write's slot and its event is not timed but counted as `lagged`).
const ACKS_REMEMBERED: usize = 1 << 16;
/// Bytes of the sequence number at the start of each value.
const SEQ_DIGITS: usize = 16;
/// How long watchers may take to deliver the last writes after the writer stopped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The subtree watched and written.
fn watched() -> String {
    format!("{}/w", prefix(0))
}

/// When each write was acknowledged: slot `seq % ACKS_REMEMBERED` holds `seq + 1` and the
/// acknowledgement's offset from the run's start, µs.
struct Acks {
    start: Instant,
    seqs: Vec<AtomicU64>,
    acked_us: Vec<AtomicU64>,
    /// Highest sequence number acknowledged + 1.
    written: AtomicU64,
}

impl Acks {
    fn new(start: Instant) -> Acks {
        Acks {
            start,
            seqs: (0..ACKS_REMEMBERED).map(|_| AtomicU64::new(0)).collect(),
            acked_us: (0..ACKS_REMEMBERED).map(|_| AtomicU64::new(0)).collect(),
            written: AtomicU64::new(0),
        }
    }

    fn acknowledged(&self, seq: u64) {
        let slot = (seq % ACKS_REMEMBERED as u64) as usize;
        self.acked_us[slot].store(self.start.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.seqs[slot].store(seq + 1, Ordering::Release);
        // Release: whoever reads `written` > seq (Acquire) then finds the slot filled.
        self.written.fetch_max(seq + 1, Ordering::Release);
    }

    /// How the event of write `seq` relates to the write's acknowledgement.
    fn delivery(&self, seq: u64) -> Delivery {
        // `written` first: if it already counts `seq`, the slot was filled before (Release /
        // Acquire), so an empty or different slot can only mean it was reused by a write
        // `ACKS_REMEMBERED` later. Reading the slot first would race with the writer between
        // the two reads and call a fresh acknowledgement lagged.
        let written = self.written.load(Ordering::Acquire);
        let slot = (seq % ACKS_REMEMBERED as u64) as usize;
        if self.seqs[slot].load(Ordering::Acquire) == seq + 1 {
            return Delivery::AfterAck(self.start + Duration::from_micros(self.acked_us[slot].load(Ordering::Relaxed)));
        }
        if seq >= written {
            Delivery::BeforeAck
        } else {
            Delivery::Lagged
        }
    }
}

/// When an event arrived relative to its write's acknowledgement.
#[derive(Debug, PartialEq)]
enum Delivery {
    /// After the acknowledgement, recorded at this instant.
    AfterAck(Instant),
    /// Before the writer heard its acknowledgement.
    BeforeAck,
    /// So late that the acknowledgement's slot was reused.
    Lagged,
}

/// The one writer: overwrites the watched keys in turn.
struct Writer<C> {
    connection: C,
    keys: usize,
    value: Vec<u8>,
    acks: Arc<Acks>,
    next_seq: u64,
}

impl<C: Connection> ClientLoop for Writer<C> {
    async fn op(&mut self, _: u64) -> Result<(), OpError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let digits = format!("{seq:0width$}", width = SEQ_DIGITS);
        self.value[..SEQ_DIGITS].copy_from_slice(digits.as_bytes());
        let key = format!("{}/k{}", watched(), seq % self.keys as u64);
        self.connection.put(&key, &self.value).await?;
        self.acks.acknowledged(seq);
        Ok(())
    }
}

/// Runs the watch workload: returns the delivery latencies (every event at every watcher)
/// and, apart, what the writer measured.
pub async fn run<T: Target>(target: &T, args: &LoadArgs, progress: &Progress) -> Result<(Measured, Measured), OpError> {
    let keys = args.key_space.clamp(1, ACKS_REMEMBERED);
    let mut setup = target.connect(0, false).await?;
    let value = value(args.value_bytes.max(SEQ_DIGITS));
    for key in 0..keys {
        setup.upsert(&format!("{}/k{key}", watched()), &value).await?;
    }
    let start = Instant::now();
    let acks = Arc::new(Acks::new(start));
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    // Once the writer is done: how many writes were acknowledged (u64::MAX before).
    let (writes_done, writes_done_receiver) = tokio::sync::watch::channel(u64::MAX);
    let mut watchers = Vec::with_capacity(args.clients);
    for index in 0..args.clients {
        let mut connection = target.connect(index, false).await?;
        let events = connection.watch(&watched()).await?;
        watchers.push(tokio::spawn(watch(connection, events, acks.clone(), measure_from, writes_done_receiver.clone())));
    }
    let writer = Writer { connection: target.connect(args.clients, false).await?, keys, value, acks: acks.clone(), next_seq: 0 };
    let wrote = driver::run(vec![writer], args.schedule(), progress).await;
    let written = acks.written.load(Ordering::Relaxed);
    // Every watcher still running is told; it ends once it has seen the last acknowledged
    // write. The drain deadline bounds the wait for one that never will.
    let _ = writes_done.send(written);
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut delivered = Measured::empty();
    for mut watcher in watchers {
        match tokio::time::timeout_at(deadline, &mut watcher).await {
            Ok(Ok(measured)) => delivered.merge(&measured),
            Ok(Err(error)) => delivered.record_error(OpError::new("watcher_failed", format!("a watcher task failed: {error}"))),
            Err(_) => {
                watcher.abort();
                delivered.record_error(OpError::new(
                    "not_delivered",
                    format!("a watcher had not seen write {} {DRAIN_TIMEOUT:?} after the run", written.saturating_sub(1)),
                ));
            }
        }
    }
    delivered.window = wrote.window;
    Ok((delivered, wrote))
}

/// One watcher: times each event against its write's acknowledgement, until it has seen the
/// last acknowledged write (once `writes_done` says how many there were) or its watch ends.
async fn watch<C: Connection>(
    connection: C,
    mut events: WatchEvents,
    acks: Arc<Acks>,
    measure_from: Instant,
    mut writes_done: tokio::sync::watch::Receiver<u64>,
) -> Measured {
    // The connection must live as long as its watch.
    let _connection = connection;
    let mut measured = Measured::empty();
    // Writes seen: the highest sequence number + 1.
    let mut seen = 0u64;
    loop {
        if seen >= *writes_done.borrow() {
            return measured;
        }
        let event = tokio::select! {
            event = events.recv() => event,
            changed = writes_done.changed() => {
                if changed.is_err() {
                    return measured;
                }
                continue;
            }
        };
        let arrived = Instant::now();
        let event = match event {
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                measured.record_error(error);
                return measured;
            }
            None => {
                measured.record_error(OpError::new("watch_ended", "the watch ended before the run did"));
                return measured;
            }
        };
        let Some(seq) = sequence_number(&event.value) else {
            // The setup's own writes (no sequence number): not part of the run.
            continue;
        };
        seen = seen.max(seq + 1);
        if arrived < measure_from {
            continue;
        }
        let second = arrived.saturating_duration_since(measure_from).as_secs() as usize;
        match acks.delivery(seq) {
            Delivery::AfterAck(acked) => measured.record_ok(arrived.saturating_duration_since(acked), second),
            Delivery::BeforeAck => measured.record_ok(Duration::ZERO, second),
            Delivery::Lagged => {
                measured.record_error(OpError::new("lagged", format!("event of write {seq} arrived after {ACKS_REMEMBERED} newer writes")))
            }
        }
    }
}

/// The sequence number a run's write put at the start of its value.
fn sequence_number(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value.get(..SEQ_DIGITS)?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn events_are_timed_from_their_acknowledgement_and_only_reused_slots_are_lagged() {
        let acks = Acks::new(Instant::now());
        assert_eq!(acks.delivery(0), Delivery::BeforeAck, "not acknowledged yet");
        tokio::time::advance(Duration::from_millis(7)).await;
        acks.acknowledged(0);
        assert!(matches!(acks.delivery(0), Delivery::AfterAck(at) if at.duration_since(acks.start) == Duration::from_millis(7)));
        // Write `ACKS_REMEMBERED` reuses write 0's slot: write 0 is now lagged, and a write
        // between them that was acknowledged, then overwritten, too.
        acks.acknowledged(1);
        acks.acknowledged(ACKS_REMEMBERED as u64);
        assert_eq!(acks.delivery(0), Delivery::Lagged);
        assert!(matches!(acks.delivery(1), Delivery::AfterAck(_)));
        assert_eq!(acks.delivery(ACKS_REMEMBERED as u64 + 1), Delivery::BeforeAck);
    }

    #[test]
    fn a_value_carries_its_sequence_number_in_front() {
        assert_eq!(sequence_number(b"0000000000000042vvvv"), Some(42));
        assert_eq!(sequence_number(b"vvvvvvvvvvvvvvvvvvvv"), None, "the setup's values are not timed");
        assert_eq!(sequence_number(b"0042"), None, "too short");
    }
}
