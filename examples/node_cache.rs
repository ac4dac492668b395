//! A node cache: `/examples/config` is read from a local copy that a watch keeps current.
//! The example changes the node and shows the cache following (after the watch's delay).
//!
//! `make dev`, then `cargo run --release --example node_cache`.

mod common;

use std::time::Duration;

use warden_client::recipes::NodeCache;
use warden_client::CreateOptions;

const PATH: &str = "/examples/config";

#[tokio::main]
async fn main() -> warden_client::Result<()> {
    let client = common::connect().await?;
    let cache = NodeCache::new(&client, PATH);
    cache.ready().await?;
    let show = |node: Option<warden_client::Node>| node.map(|n| String::from_utf8_lossy(&n.data).into_owned());
    println!("cached: {:?}", show(cache.get().await?));
    if client.exists(PATH).await?.is_none() {
        client.create(PATH, b"v0".to_vec(), &CreateOptions::persistent().create_parents()).await?;
    }
    for version in 1..=3 {
        client.set(PATH, format!("v{version}").into_bytes(), None).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        println!("after setting v{version}, cached: {:?}", show(cache.get().await?));
    }
    Ok(())
}
