//! Helpers shared by the namespace test files (each uses a subset).
#![allow(dead_code)]

use warden_namespace::Limits;
use warden_proto::v1::warden_error::Code;
use warden_testkit::harness::{Harness, Outcome};

/// A fresh namespace with default limits, its state machine not leading.
pub fn harness() -> Harness {
    Harness::new(Limits::default()).expect("harness")
}

/// A fresh namespace whose state machine leads from time 0 (so it judges leases).
pub fn leading_harness() -> Harness {
    let mut ns = harness();
    ns.set_leading(true, 0);
    ns
}

/// The error code of an outcome that must be an error.
pub fn code<T: std::fmt::Debug>(outcome: Outcome<T>) -> Code {
    match outcome {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(error) => Code::try_from(error.code).expect("known code"),
    }
}
