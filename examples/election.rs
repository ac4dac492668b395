//! Leader election: run it in several terminals. Each campaigns with its process id; the
//! leader proclaims a heartbeat value every second for 10 s, then resigns, and the next
//! takes over. Every process prints each leader change it observes. Kill the leader with
//! Ctrl-C (its session expires after its TTL) to see a failover.
//!
//! `make dev`, then `cargo run --release --example election` (several times).

mod common;

use std::time::Duration;

use warden_client::recipes::Election;

const PATH: &str = "/examples/election";

#[tokio::main]
async fn main() -> warden_client::Result<()> {
    let client = common::connect().await?;
    let session = common::session(&client, PATH).await?;
    let election = Election::new(&session, PATH);
    let mut observer = election.observe().await?;
    tokio::spawn(async move {
        while let Ok(leader) = observer.next().await {
            match leader {
                Some(leader) => println!("leader: {} (token {})", String::from_utf8_lossy(&leader.value), leader.fencing_token),
                None => println!("no leader"),
            }
        }
    });
    let me = format!("pid {}", std::process::id());
    println!("{me} campaigns");
    let leadership = election.campaign(me.clone().into_bytes()).await?;
    println!("{me} leads with fencing token {}", leadership.fencing_token());
    for beat in 1..=10 {
        if !leadership.is_valid() {
            println!("{me}: the session is in jeopardy; stop acting as leader");
            break;
        }
        leadership.proclaim(format!("{me}, beat {beat}").into_bytes()).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    leadership.resign().await?;
    println!("{me} resigned");
    session.close().await
}
