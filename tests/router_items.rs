//! Issue 12, "Placement, router and watches" and "Found by a client written from the .proto
//! files alone": the router's `GetChildren` paging, keepalives of sessions homed in several
//! groups, deadlines, bounded error quotes, and unknown session ids, each through a router
//! and (where a node answers on its own) through a node directly.

mod support;

use support::routed::{client, cluster_with_groups, create_group, start_router, start_stale_router, TIMEOUT};

use std::time::Duration;

use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_shard_node::cluster::Cluster;

/// The Warden error code of a refusal (`Unknown` when it carries none).
fn code_of(status: &tonic::Status) -> Code {
    warden_proto::error_of(status).and_then(|e| Code::try_from(e.code).ok()).unwrap_or(Code::Unknown)
}

/// A client of node `id` directly.
fn node_client(cluster: &Cluster, id: u64) -> WardenClient<Channel> {
    let addr = cluster.addr(id).expect("addr");
    WardenClient::new(Channel::from_shared(format!("http://{addr}")).expect("uri").timeout(TIMEOUT).connect_lazy())
}

/// A refusal quotes a bounded prefix of its input: a `Create` of a 5,000-byte and of a
/// 100 KiB path is a typed INVALID_ARGUMENT (INVALID_PATH) through the router and from a
/// node directly, not a transport failure of oversized headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_18_a_refusal_of_a_huge_path_is_a_typed_invalid_argument() {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_router(&cluster, 0);
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("root leader");
    for (via, mut api) in [("router", client(router_process.addr)), ("node", node_client(&cluster, leader))] {
        for bytes in [5_000, 100 << 10] {
            let path = format!("/{}", "a".repeat(bytes - 1));
            let refused = api.create(CreateRequest { path: path.clone(), ..CreateRequest::default() }).await.expect_err("too long");
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{via}, {bytes} bytes: {refused:?}");
            let error = warden_proto::error_of(&refused).expect("a typed detail");
            assert_eq!(error.code, Code::InvalidPath as i32, "{via}, {bytes} bytes");
            assert!(error.path.len() < 1_024 && refused.message().len() < 2_048, "{via}: the error quotes a bounded prefix");
            assert!(error.path.contains(&format!("{bytes} bytes")), "{via}: and the input's length: {}", error.path);
        }
    }
}
