//! Warden's Rust client library. Today it holds the piece a *resource* needs to be safe with
//! Warden locks: [`FenceGuard`]. Sessions, lock guards and recipes come with the client issue.

mod fence;

pub use fence::{FenceGuard, StaleToken};
