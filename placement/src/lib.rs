//! The placement state machine (nodes, groups, routes, epochs) and the scheduler policy.
//! Not built yet: the placement issue fills this crate (see ARCHITECTURE.md).
