//! Group membership: run it in several terminals; each joins `/examples/members` as its
//! process id and prints the member list whenever it changes, for 30 s. Kill one with
//! Ctrl-C: it leaves the list once its session expires.
//!
//! `make dev`, then `cargo run --release --example membership` (several times).

mod common;

use std::time::Duration;

use warden_client::recipes::{Member, MembersWatch, Membership};

const PATH: &str = "/examples/members";

fn names(members: &[Member]) -> Vec<String> {
    members.iter().map(|m| format!("{}={}", m.id, String::from_utf8_lossy(&m.data))).collect()
}

/// Prints the member list after every change (until the watch fails).
async fn print_changes(members: &mut MembersWatch) -> warden_client::Result<()> {
    loop {
        println!("members: {:?}", names(&members.next().await?));
    }
}

#[tokio::main]
async fn main() -> warden_client::Result<()> {
    let client = common::connect().await?;
    let session = common::session(&client, PATH).await?;
    let id = format!("pid-{}", std::process::id());
    let membership = Membership::join(&session, PATH, &id, b"ready".to_vec()).await?;
    let mut members = membership.watch().await?;
    println!("joined as {id}; members: {:?}", names(&members.members()));
    if let Ok(Err(error)) = tokio::time::timeout(Duration::from_secs(30), print_changes(&mut members)).await {
        return Err(error);
    }
    membership.leave().await?;
    session.close().await
}
