//! Barriers: three workers wait at a barrier until it is removed; then a double barrier of
//! three participants, which enter together and leave together.
//!
//! `make dev`, then `cargo run --release --example barrier`.

mod common;

use std::time::Duration;

use warden_client::recipes::{Barrier, DoubleBarrier};

const PATH: &str = "/examples/barrier";
const DOUBLE_PATH: &str = "/examples/double-barrier";
const PARTIES: usize = 3;

fn joined<T>(joined: Result<warden_client::Result<T>, tokio::task::JoinError>) -> warden_client::Result<T> {
    joined.map_err(|e| warden_client::Error::Protocol { message: e.to_string() })?
}

#[tokio::main]
async fn main() -> warden_client::Result<()> {
    let client = common::connect().await?;
    let barrier = Barrier::new(&client, PATH);
    barrier.set().await?;
    let mut waiters = Vec::new();
    for worker in 0..PARTIES {
        let barrier = Barrier::new(&client, PATH);
        waiters.push(tokio::spawn(async move {
            barrier.wait().await?;
            println!("worker {worker} passed the barrier");
            warden_client::Result::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("removing the barrier");
    barrier.remove().await?;
    for waiter in waiters {
        joined(waiter.await)?;
    }

    let mut participants = Vec::new();
    for worker in 0..PARTIES {
        let client = client.clone();
        participants.push(tokio::spawn(async move {
            let session = common::session(&client, DOUBLE_PATH).await?;
            let barrier = DoubleBarrier::new(&session, DOUBLE_PATH, PARTIES);
            tokio::time::sleep(Duration::from_millis(200 * worker as u64)).await;
            barrier.enter().await?;
            println!("worker {worker} entered (all {PARTIES} are in)");
            tokio::time::sleep(Duration::from_millis(100 * worker as u64)).await;
            barrier.leave().await?;
            println!("worker {worker} left (all {PARTIES} are out)");
            session.close().await
        }));
    }
    for participant in participants {
        joined(participant.await)?;
    }
    Ok(())
}
