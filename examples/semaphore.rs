//! A semaphore of 2 permits shared by 5 sessions: never more than 2 hold one at a time.
//!
//! `make dev`, then `cargo run --release --example semaphore`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use warden_client::recipes::Semaphore;

const PATH: &str = "/examples/semaphore";
const PERMITS: usize = 2;

#[tokio::main]
async fn main() -> warden_client::Result<()> {
    let client = common::connect().await?;
    let holders = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for worker in 0..5 {
        let (client, holders) = (client.clone(), holders.clone());
        tasks.push(tokio::spawn(async move {
            let session = common::session(&client, PATH).await?;
            let permit = Semaphore::new(&session, PATH, PERMITS).acquire().await?;
            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
            println!("worker {worker} has a permit (token {}); {now} of {PERMITS} in use", permit.fencing_token());
            tokio::time::sleep(Duration::from_millis(300)).await;
            holders.fetch_sub(1, Ordering::SeqCst);
            permit.release().await?;
            session.close().await
        }));
    }
    for task in tasks {
        task.await.map_err(|e| warden_client::Error::Protocol { message: e.to_string() })??;
    }
    Ok(())
}
