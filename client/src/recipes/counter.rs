//! A distributed counter (Curator `DistributedAtomicLong`): a signed 64-bit integer stored
//! as decimal text in one node, changed by compare-and-swap on the node's version.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::node::CreateOptions;
use crate::retry::Backoff;

/// The counter at one path. A missing node counts as 0.
pub struct Counter {
    client: Client,
    path: String,
}

impl Counter {
    /// The counter at `path`.
    pub fn new(client: &Client, path: impl Into<String>) -> Counter {
        Counter { client: client.clone(), path: path.into() }
    }

    /// The value now (linearizable read; 0 if the node does not exist).
    pub async fn get(&self) -> Result<i64> {
        match self.client.get(&self.path).await {
            Ok(node) => self.parse(&node.data),
            Err(Error::NoNode { .. }) => Ok(0),
            Err(error) => Err(error),
        }
    }

    /// Adds `delta` atomically and returns the new value: reads the value and its version,
    /// then sets the sum at that version, again (after a short backoff) whenever another
    /// writer got in between, for at most the client's request timeout. An overflow is
    /// [`Error::InvalidArgument`]; a write whose outcome is unknown is
    /// [`Error::OutcomeUnknown`] (the delta may or may not have been added).
    pub async fn add(&self, delta: i64) -> Result<i64> {
        let deadline = tokio::time::Instant::now() + self.client.request_timeout();
        let mut backoff = Backoff::new();
        loop {
            let written = match self.client.get(&self.path).await {
                Ok(node) => {
                    let value = self.sum(self.parse(&node.data)?, delta)?;
                    self.client.set(&self.path, value.to_string(), Some(node.stat.version)).await.map(|_| value)
                }
                Err(Error::NoNode { .. }) => {
                    let value = self.sum(0, delta)?;
                    self.client.create(&self.path, value.to_string(), &CreateOptions::persistent().create_parents()).await.map(|_| value)
                }
                Err(error) => Err(error),
            };
            match written {
                Err(Error::BadVersion { .. } | Error::NodeExists { .. } | Error::NoNode { .. }) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(backoff.next_pause()).await;
                }
                written => return written,
            }
        }
    }

    fn sum(&self, value: i64, delta: i64) -> Result<i64> {
        value.checked_add(delta).ok_or_else(|| Error::InvalidArgument { message: format!("{value} + {delta} overflows the counter {}", self.path) })
    }

    fn parse(&self, data: &[u8]) -> Result<i64> {
        std::str::from_utf8(data)
            .ok()
            .and_then(|text| if text.is_empty() { Some(0) } else { text.parse().ok() })
            .ok_or_else(|| Error::InvalidArgument { message: format!("{} does not hold a decimal integer", self.path) })
    }
}
