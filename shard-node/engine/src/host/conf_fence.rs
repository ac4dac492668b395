//! The fence of a group's configuration changes: what a change's proposer says it expects,
//! carried in the `ConfChangeV2.context` of the change's entry and checked by every replica
//! when the entry applies (`command.rs`).
//!
//! A replica move is run by the placement leader, step by step (`placement/scheduler.rs`).
//! A placement leader deposed in the middle of a move may still send its later steps after
//! its successor settled the move, so the group itself refuses them: each change carries the
//! placement term its sender leads placement at, and the voters it expects the group to have.
//! The group keeps the highest term of the changes it applied (its fence, replicated state:
//! `StateKey::ConfFence`, carried in snapshots) and refuses a change of a lower term, or one
//! expecting other voters. A refused change is left unapplied as a configuration change on
//! every replica alike (raft-rs allows that: its pending-change check compares indexes
//! only), and its proposer hears `ConfChangeRefused`.
//!
//! Encoding: `MAGIC | term u64 | voter count u32 | voter u64 *` (big-endian). An empty context
//! is a change without a fence: entries written by an earlier release, which apply as they
//! did (unchecked, the fence unchanged).

use thiserror::Error;

const MAGIC: &[u8; 4] = b"WCF1";

/// Voters a fence may expect at most (a group has a handful; this bounds the decoding).
pub const EXPECT_VOTERS_MAX: usize = 1_024;

/// What the proposer of a configuration change expects of the group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfChangeFence {
    /// The placement term the proposer leads placement at (0: a sender that names none, as
    /// an earlier release's placement leader; refused by a group fenced above 0).
    pub term: u64,
    /// The voters the group must have before the change; empty: not checked.
    pub expect_voters: Vec<u64>,
}

/// Why a change's context is not a fence.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FenceDecodeError {
    #[error("the context does not start with the fence's magic")]
    BadMagic,
    #[error("the fence is truncated")]
    Truncated,
    #[error("the fence expects {0} voters, more than {EXPECT_VOTERS_MAX}")]
    TooManyVoters(u64),
    #[error("the fence has {0} trailing bytes")]
    TrailingBytes(usize),
}

impl ConfChangeFence {
    /// The context bytes of a change fenced by `self`.
    ///
    /// # Panics
    /// If it expects more than [`EXPECT_VOTERS_MAX`] voters (the caller checks its input).
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.expect_voters.len() <= EXPECT_VOTERS_MAX, "a fence expects at most {EXPECT_VOTERS_MAX} voters");
        let mut out = Vec::with_capacity(16 + 8 * self.expect_voters.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.term.to_be_bytes());
        out.extend_from_slice(&(self.expect_voters.len() as u32).to_be_bytes());
        for voter in &self.expect_voters {
            out.extend_from_slice(&voter.to_be_bytes());
        }
        out
    }

    /// The fence in a change's context: `None` for an empty context (no fence).
    pub fn decode(context: &[u8]) -> Result<Option<ConfChangeFence>, FenceDecodeError> {
        if context.is_empty() {
            return Ok(None);
        }
        let (magic, rest) = context.split_first_chunk::<4>().ok_or(FenceDecodeError::Truncated)?;
        if magic != MAGIC {
            return Err(FenceDecodeError::BadMagic);
        }
        let (term, rest) = rest.split_first_chunk::<8>().ok_or(FenceDecodeError::Truncated)?;
        let (count, mut rest) = rest.split_first_chunk::<4>().ok_or(FenceDecodeError::Truncated)?;
        let count = u32::from_be_bytes(*count) as usize;
        if count > EXPECT_VOTERS_MAX {
            return Err(FenceDecodeError::TooManyVoters(count as u64));
        }
        let mut expect_voters = Vec::with_capacity(count);
        for _ in 0..count {
            let (voter, tail) = rest.split_first_chunk::<8>().ok_or(FenceDecodeError::Truncated)?;
            expect_voters.push(u64::from_be_bytes(*voter));
            rest = tail;
        }
        if !rest.is_empty() {
            return Err(FenceDecodeError::TrailingBytes(rest.len()));
        }
        Ok(Some(ConfChangeFence { term: u64::from_be_bytes(*term), expect_voters }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_and_an_empty_context_is_no_fence() {
        for fence in [ConfChangeFence::default(), ConfChangeFence { term: 7, expect_voters: vec![3, 1, 2] }] {
            assert_eq!(ConfChangeFence::decode(&fence.encode()), Ok(Some(fence)));
        }
        assert_eq!(ConfChangeFence::decode(&[]), Ok(None));
    }

    #[test]
    fn malformed_contexts_are_typed_errors() {
        let bytes = ConfChangeFence { term: 7, expect_voters: vec![1, 2] }.encode();
        assert_eq!(ConfChangeFence::decode(&bytes[..bytes.len() - 1]), Err(FenceDecodeError::Truncated));
        assert_eq!(ConfChangeFence::decode(b"WCF"), Err(FenceDecodeError::Truncated));
        assert_eq!(ConfChangeFence::decode(b"XXXX"), Err(FenceDecodeError::BadMagic));
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(ConfChangeFence::decode(&trailing), Err(FenceDecodeError::TrailingBytes(1)));
        let mut lying = bytes;
        lying[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(ConfChangeFence::decode(&lying), Err(FenceDecodeError::TooManyVoters(u64::from(u32::MAX))));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = ConfChangeFence::decode(&bytes);
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&bytes);
            let _ = ConfChangeFence::decode(&framed);
        }
    }
}
