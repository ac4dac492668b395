//! The stateless router: routing-table cache, forwarding by longest path prefix, retries.
//! Not built yet: the router issue fills this crate (see ARCHITECTURE.md).
