//! Raft transport batches: what a sender does for each batch it puts on a peer's stream, and
//! what the receiver does for each batch it takes off.
//!
//! - `encode`: every queued raft message into envelopes (`transport::encode_message`:
//!   raft-proto encoding, chunking when large), then the `RaftBatch` prost-encoded as tonic's
//!   codec does.
//! - `decode`: the `RaftBatch` prost-decoded, then each envelope back into its group's raft
//!   message (`transport::server::decode_envelope`).
//!
//! The batch is one a leader of 64 busy groups sends a follower: per group a `MsgAppend` of
//! 4 entries (namespace commands of 256-byte values) and a `MsgHeartbeat`.

use std::hint::black_box;
use std::sync::atomic::AtomicU64;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use prost::Message as _;
use raft::eraftpb::{Entry, Message, MessageType};
use warden_engine::transport::chunk::Assembler;
use warden_engine::transport::server::decode_envelope;
use warden_engine::transport::{encode_message, TransportLimits};
use warden_proto::transport::RaftBatch;

const GROUPS: u64 = 64;
const ENTRIES_PER_APPEND: u64 = 4;
const COMMAND_BYTES: usize = 320;

/// The messages of one batch: `(group, message)`.
fn messages() -> Vec<(u64, Message)> {
    let mut messages = Vec::new();
    for group in 1..=GROUPS {
        let index = 1_000 + group;
        let entries: Vec<Entry> = (1..=ENTRIES_PER_APPEND)
            .map(|n| Entry { term: 7, index: index + n, data: vec![group as u8; COMMAND_BYTES].into(), ..Entry::default() })
            .collect();
        let append = Message {
            msg_type: MessageType::MsgAppend,
            to: 2,
            from: 1,
            term: 7,
            log_term: 7,
            index,
            entries: entries.into(),
            commit: index,
            ..Message::default()
        };
        let heartbeat = Message { msg_type: MessageType::MsgHeartbeat, to: 2, from: 1, term: 7, commit: index, ..Message::default() };
        messages.push((group, append));
        messages.push((group, heartbeat));
    }
    messages
}

/// The wire bytes of a batch of `messages`, as the sender makes them.
fn encode(messages: &[(u64, Message)], limits: &TransportLimits, next_message_id: &AtomicU64) -> Vec<u8> {
    let mut envelopes = Vec::with_capacity(messages.len());
    for (group, message) in messages {
        encode_message(*group, message, limits.chunk_bytes, next_message_id, &mut envelopes);
    }
    RaftBatch { from_node: 1, envelopes }.encode_to_vec()
}

/// The `(group, message)`s a received batch carries.
fn decode(bytes: &[u8], assembler: &mut Assembler) -> Vec<(u64, Message)> {
    let batch = RaftBatch::decode(bytes).expect("a raft batch");
    batch.envelopes.into_iter().filter_map(|envelope| decode_envelope(envelope, assembler).expect("a raft message")).collect()
}

fn batches(c: &mut Criterion) {
    let limits = TransportLimits::default();
    let next_message_id = AtomicU64::new(1);
    let messages = messages();
    let bytes = encode(&messages, &limits, &next_message_id);
    let mut assembler = Assembler::new(limits.assembly_bytes_max);
    assert_eq!(decode(&bytes, &mut assembler), messages, "a batch decodes to what was encoded");

    let mut group = c.benchmark_group("transport/batch");
    group.throughput(Throughput::Elements(messages.len() as u64));
    group.bench_function(format!("encode/{}_messages", messages.len()), |b| b.iter(|| encode(black_box(&messages), &limits, &next_message_id)));
    group.bench_function(format!("decode/{}_messages", messages.len()), |b| b.iter(|| decode(black_box(&bytes), &mut assembler)));
    group.finish();
}

criterion_group!(benches, batches);
criterion_main!(benches);
