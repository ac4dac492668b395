//! The placement group hosted on shard-nodes (DESIGN.md: "Runs placement replicas through the
//! same engine using the placement crate's state machine"): [`state_machine`] puts
//! `warden_placement::Placement` behind the engine's `StateMachine` trait; [`service`] is the
//! `warden.placement.Placement` gRPC service every node serves; [`heartbeat`] tells the
//! placement group a node is alive (and which groups it leads); [`scheduler`] is the placement
//! leader carrying out repair, drain and balance operators; [`split`] moves a live subtree
//! into a new group, [`merge`] gives a group's subtree back to its parent path's group,
//! [`auto_split`] proposes (or performs) the split of a hot one; [`quota`] shares each
//! subtree quota out among the groups serving it; [`gauges`] reports placement's view as
//! metrics; [`limits`] brings the apply limits placement records to every group; [`backup`]
//! streams a group's backup and applies a restored page; [`factory`] gives each group its
//! state machine (the placement group's, or a namespace).
//!
//! Architecture invariant: the routing table changes only through commands applied by the
//! placement group; nodes and routers hold copies read from it.

pub mod auto_split;
pub mod backup;
pub mod factory;
pub mod gauges;
pub mod heartbeat;
pub mod limits;
pub mod merge;
pub mod quota;
pub mod scheduler;
pub mod service;
pub mod split;
pub mod state_machine;

pub use factory::ShardNodeFactory;
pub use state_machine::PlacementStateMachine;
