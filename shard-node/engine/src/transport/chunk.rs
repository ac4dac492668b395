//! Splitting large messages (snapshots) into chunks and putting them back together.

use std::collections::HashMap;

use warden_proto::transport::MessageChunk;

/// Splits `bytes` into chunks of at most `chunk_bytes` (at least one chunk).
pub fn split(message_id: u64, bytes: &[u8], chunk_bytes: usize) -> Vec<MessageChunk> {
    let chunk_bytes = chunk_bytes.max(1);
    let count = bytes.len().div_ceil(chunk_bytes).max(1);
    (0..count)
        .map(|seq| {
            let from = seq * chunk_bytes;
            let to = (from + chunk_bytes).min(bytes.len());
            MessageChunk { message_id, seq: seq as u32, last: seq + 1 == count, data: bytes[from..to].to_vec() }
        })
        .collect()
}

/// Reassembles chunked messages of one stream, with a limit on bytes held.
pub struct Assembler {
    partial: HashMap<u64, (u32, Vec<u8>)>,
    bytes_max: usize,
}

/// Why a chunk was refused (the partial message is discarded; raft resends).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// A chunk arrived out of order.
    #[error("chunk {got} of message {message_id} arrived, expected {expected}")]
    OutOfOrder { message_id: u64, expected: u32, got: u32 },
    /// The message grew past the limit.
    #[error("message {message_id} exceeds {bytes_max} bytes")]
    TooLarge { message_id: u64, bytes_max: usize },
}

impl Assembler {
    /// An assembler holding at most `bytes_max` bytes of partial messages.
    pub fn new(bytes_max: usize) -> Assembler {
        Assembler { partial: HashMap::new(), bytes_max }
    }

    /// Adds a chunk; returns the whole message when `chunk` was its last.
    pub fn push(&mut self, chunk: MessageChunk) -> Result<Option<Vec<u8>>, ChunkError> {
        let held: usize = self.partial.values().map(|(_, data)| data.len()).sum();
        let (expected, data) = self.partial.remove(&chunk.message_id).unwrap_or_default();
        if chunk.seq != expected {
            return Err(ChunkError::OutOfOrder { message_id: chunk.message_id, expected, got: chunk.seq });
        }
        if held + chunk.data.len() > self.bytes_max {
            return Err(ChunkError::TooLarge { message_id: chunk.message_id, bytes_max: self.bytes_max });
        }
        let mut data = data;
        data.extend_from_slice(&chunk.data);
        if chunk.last {
            return Ok(Some(data));
        }
        self.partial.insert(chunk.message_id, (expected + 1, data));
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_then_assemble_round_trips() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let chunks = split(7, &bytes, 3000);
        assert_eq!(chunks.len(), 4);
        let mut assembler = Assembler::new(1 << 20);
        let mut whole = None;
        for chunk in chunks {
            whole = assembler.push(chunk).ok().flatten();
        }
        assert_eq!(whole, Some(bytes));
        assert_eq!(split(1, &[], 10).len(), 1, "an empty message is one chunk");
    }

    #[test]
    fn refuses_gaps_and_oversize() {
        let chunks = split(1, &[0; 100], 10);
        let mut assembler = Assembler::new(1 << 20);
        assert_eq!(assembler.push(chunks[0].clone()), Ok(None));
        assert!(matches!(assembler.push(chunks[2].clone()), Err(ChunkError::OutOfOrder { .. })));
        let mut small = Assembler::new(15);
        assert_eq!(small.push(chunks[0].clone()), Ok(None));
        assert!(matches!(small.push(chunks[1].clone()), Err(ChunkError::TooLarge { .. })));
    }
}
