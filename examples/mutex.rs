//! A distributed mutex: four tasks (each its own session, as four processes would be) take
//! turns on one lock and write to a resource with their fencing tokens.
//!
//! `make dev`, then `cargo run --release --example mutex`.

mod common;

use warden_client::recipes::Mutex;
use warden_client::FenceGuard;

const PATH: &str = "/examples/mutex";

#[tokio::main]
async fn main() -> warden_client::Result<()> {
    let client = common::connect().await?;
    let resource = std::sync::Arc::new(FenceGuard::new());
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (client, resource) = (client.clone(), resource.clone());
        workers.push(tokio::spawn(async move {
            let session = common::session(&client, PATH).await?;
            let mutex = Mutex::new(&session, PATH);
            let guard = mutex.lock().await?;
            let admitted = resource.admit(guard.fencing_token()).is_ok();
            println!("worker {worker} holds {PATH} with fencing token {} (admitted: {admitted})", guard.fencing_token());
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            guard.unlock().await?;
            session.close().await
        }));
    }
    for worker in workers {
        worker.await.map_err(|e| warden_client::Error::Protocol { message: e.to_string() })??;
    }
    Ok(())
}
