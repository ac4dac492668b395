//! The Rust client library: sessions, lock guards with fencing tokens, recipes.
//! Not built yet: the client issue fills this crate (see ARCHITECTURE.md).
