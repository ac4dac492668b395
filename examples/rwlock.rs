//! A read-write lock: two readers share it; a writer waits for both, then holds it alone.
//!
//! `make dev`, then `cargo run --release --example rwlock`.

mod common;

use std::time::Duration;

use warden_client::recipes::RwLock;

const PATH: &str = "/examples/rwlock";

#[tokio::main]
async fn main() -> warden_client::Result<()> {
    let client = common::connect().await?;
    let (readers, writer) = (common::session(&client, PATH).await?, common::session(&client, PATH).await?);
    let first = RwLock::new(&readers, PATH).read().await?;
    let second = RwLock::new(&readers, PATH).read().await?;
    println!("two readers hold {PATH} (tokens {} and {})", first.fencing_token(), second.fencing_token());
    let writing = tokio::spawn(async move {
        let guard = RwLock::new(&writer, PATH).write().await?;
        println!("the writer holds {PATH} alone (token {})", guard.fencing_token());
        guard.unlock().await?;
        writer.close().await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("the readers release");
    first.unlock().await?;
    second.unlock().await?;
    writing.await.map_err(|e| warden_client::Error::Protocol { message: e.to_string() })??;
    readers.close().await
}
