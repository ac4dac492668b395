//! A distributed counter: ten tasks add 1 concurrently (compare-and-swap, retried on
//! conflicts); every task sees a distinct new value.
//!
//! `make dev`, then `cargo run --release --example counter`.

mod common;

use warden_client::recipes::Counter;

const PATH: &str = "/examples/counter";

#[tokio::main]
async fn main() -> warden_client::Result<()> {
    let client = common::connect().await?;
    let start = Counter::new(&client, PATH).get().await?;
    let mut adders = Vec::new();
    for _ in 0..10 {
        let counter = Counter::new(&client, PATH);
        adders.push(tokio::spawn(async move { counter.add(1).await }));
    }
    for adder in adders {
        let value = adder.await.map_err(|e| warden_client::Error::Protocol { message: e.to_string() })??;
        println!("added 1: now {value}");
    }
    println!("{start} → {}", Counter::new(&client, PATH).get().await?);
    Ok(())
}
