//! What every example shares: connecting to the cluster `make dev` starts.
#![allow(dead_code)] // each example uses a subset

use std::time::Duration;

use warden_client::{Client, ClientConfig, Session, SessionConfig};

/// The router of `make dev`, unless `WARDEN_ENDPOINTS` (comma-separated `host:port`s) says
/// otherwise.
const DEFAULT_ENDPOINT: &str = "127.0.0.1:7100";

/// A client of the routers in `WARDEN_ENDPOINTS` (default: `make dev`'s router).
pub async fn connect() -> warden_client::Result<Client> {
    let endpoints = std::env::var("WARDEN_ENDPOINTS").unwrap_or_else(|_| DEFAULT_ENDPOINT.to_string());
    Client::connect(ClientConfig::new(endpoints.split(',').map(str::trim).filter(|e| !e.is_empty()))).await
}

/// A session of 10 s homed near `path`.
pub async fn session(client: &Client, path: &str) -> warden_client::Result<Session> {
    client.session(SessionConfig { path_hint: Some(path.into()), ..SessionConfig::new(Duration::from_secs(10)) }).await
}
