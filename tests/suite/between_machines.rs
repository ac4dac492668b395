//! Faults between machines: five real `warden node` processes, each on a test host of its own
//! (a network namespace with its own address, `warden_torture`), the router and the client on
//! this machine, and the network between them cut by the kernel — packets dropped silently,
//! as a failed switch or a firewall would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::processes::{placement_leader_among, ClusterOptions, ProcessCluster, PLACEMENT_NODES, STEP_TIMEOUT};
use crate::support::routed::group_serving;
use warden_client::{Client, ClientConfig, CreateOptions};
use warden_proto::placement::{CreateGroupRequest, GetRoutingTableRequest};
use warden_testkit::wait_until;
use warden_torture::{End, TestNet};

/// A write's deadline: as long as users give theirs (the router's own is 5 s), so a write
/// stuck at a silent node until a deadline shows in the failover time.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How soon after a group's leader is cut off a write through the router must succeed: the
/// router notices the silence by its pings (`NODE_PINGS`: within 3 s, while the majority
/// elects within an election timeout of 1–2 s), then one retry.
const FAILOVER_MAX: Duration = Duration::from_millis(4_500);

/// How soon after a group's leader is left in a minority the router still reaches, a write
/// through the router must succeed: the old leader steps down after an election timeout and
/// answers what it held; the majority has elected another by then or soon after.
const MINORITY_FAILOVER_MAX: Duration = Duration::from_secs(6);

/// The router's deadline for a forwarded call: a call the minority leader kept unanswered
/// would end only then.
const ROUTER_DEADLINE: Duration = Duration::from_secs(5);

/// How soon after a cut between the router and a leader heals a write must succeed: at
/// once, well within the router's 5 s suspicion of the silent node.
const HEALED_RECOVERY_MAX: Duration = Duration::from_secs(2);

/// The test host node `id` runs on.
fn host_of(node: u64) -> usize {
    node as usize - 1
}

/// Writes `value` to `path` until one write is acknowledged (each attempt bounded by
/// [`WRITE_TIMEOUT`]); returns the version it made and how many attempts it took. An attempt
/// whose outcome is unknown may have been applied too: the caller only relies on the
/// acknowledged one.
async fn write_until_acknowledged(client: &Client, path: &str, value: &str) -> (u64, u32) {
    let mut attempts = 0;
    let version = wait_until(&format!("an acknowledged write of {value} to {path}"), STEP_TIMEOUT, async || {
        attempts += 1;
        match tokio::time::timeout(WRITE_TIMEOUT, client.set(path, value.as_bytes().to_vec(), None)).await {
            Ok(Ok(stat)) => Some(stat.version),
            _ => None,
        }
    })
    .await;
    (version, attempts)
}

/// A group's leader cut off from every other machine (its peers, the router, the clients):
/// the majority elects another and writes go on through the same router; once the network
/// heals, the old leader follows and every acknowledged write is there. Then a partition
/// into halves: the side with a majority keeps writing, the minority catches up after; the
/// same with the router reaching both sides; and a cut between the router and the leader
/// alone, healed; last, a group created while one of its nodes is cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_every_machine_is_replaced_and_no_acknowledged_write_is_lost() {
    let net = Arc::new(TestNet::create(5).expect("five test hosts (needs root and iproute2)"));
    let options = ClusterOptions { hosts: Some(net.clone()), ..ClusterOptions::default() };
    let mut cluster = ProcessCluster::start_with(options, &["/t"]).await;
    let config = ClientConfig { request_timeout: WRITE_TIMEOUT, ..ClientConfig::new([cluster.router_addr().to_string()]) };
    let client = Client::connect(config).await.expect("a client of the router");
    client.create("/t/x", b"0".to_vec(), &CreateOptions::persistent()).await.expect("create /t/x");
    let group = group_serving(&mut cluster.router(), "/t/x").await;
    let leader = wait_until("a leader of /t", STEP_TIMEOUT, async || cluster.group_leader(group, None).await).await;
    assert_eq!(write_until_acknowledged(&client, "/t/x", "before").await.0, 1);

    // The leader's host drops everything from anyone, and sends nothing anyone gets.
    net.isolate(host_of(leader)).expect("isolate the leader's host");
    let cut_at = Instant::now();
    let (version, attempts) = write_until_acknowledged(&client, "/t/x", "during").await;
    let failover = cut_at.elapsed();
    eprintln!("group {group}: first acknowledged write {failover:?} (attempt {attempts}) after its leader (node {leader}) was isolated");
    assert!(version >= 2, "a new version after the isolation, not {version}");
    // The router's pings to the silent leader go unanswered, so within 3 s it fails the
    // write it had sent there (it used to wait out its 5 s deadline) and passes over that
    // node; by then the majority has elected a leader (an election timeout, at most 2 s),
    // which the next attempt finds. 1.5 s more for the retry on a loaded machine.
    assert!(failover <= FAILOVER_MAX, "the first write was acknowledged {failover:?} (attempt {attempts}) after the leader's isolation");
    let replaced = wait_until("the majority's leader", STEP_TIMEOUT, async || cluster.group_leader(group, Some(leader)).await).await;
    assert_ne!(replaced, leader, "the isolated node no longer leads for the others");

    // Healed: the old leader follows the new one and has every acknowledged write.
    net.heal_all().expect("heal");
    cluster.wait_caught_up(leader, &[group]).await;
    let read = client.get("/t/x").await.expect("read after healing");
    assert_eq!((read.data.as_slice(), read.stat.version >= version), (b"during".as_slice(), true));

    // Halves: the current leader and one follower against the other three, who hold a
    // majority and elect a leader among themselves; the router sits with the majority.
    let leader = wait_until("a leader of /t", STEP_TIMEOUT, async || cluster.group_leader(group, None).await).await;
    let minority: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id == leader || *id == leader % 5 + 1).collect();
    let majority: Vec<u64> = cluster.node_ids().into_iter().filter(|id| !minority.contains(id)).collect();
    let ends = |ids: &[u64]| ids.iter().map(|id| End::Host(host_of(*id))).collect::<Vec<_>>();
    net.partition(&ends(&minority), &[ends(&majority), vec![End::Machine]].concat()).expect("partition");
    let (version, _) = write_until_acknowledged(&client, "/t/x", "halves").await;
    let majority_leader = wait_until("the majority's leader", STEP_TIMEOUT, async || cluster.group_leader(group, Some(leader)).await).await;
    assert!(majority.contains(&majority_leader), "the leader is on the majority side, not node {majority_leader}");
    net.heal_all().expect("heal");
    for id in minority {
        cluster.wait_caught_up(id, &[group]).await;
    }
    let read = client.get("/t/x").await.expect("read after healing");
    assert_eq!((read.data.as_slice(), read.stat.version >= version), (b"halves".as_slice(), true));

    // Halves again, but the router reaches both sides: the writes it already sent to the
    // leader, now in the minority, are answered as soon as that leader steps down (it used
    // to keep them until the router's 5 s deadline), so the next attempt finds the
    // majority's leader.
    let leader = wait_until("a leader of /t", STEP_TIMEOUT, async || cluster.group_leader(group, None).await).await;
    let minority: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id == leader || *id == leader % 5 + 1).collect();
    let majority: Vec<u64> = cluster.node_ids().into_iter().filter(|id| !minority.contains(id)).collect();
    net.partition(&ends(&minority), &ends(&majority)).expect("partition");
    let cut_at = Instant::now();
    let first = tokio::time::timeout(WRITE_TIMEOUT, client.set("/t/x", b"minority leader".to_vec(), None)).await;
    let first_answered = cut_at.elapsed();
    let (version, attempts) = write_until_acknowledged(&client, "/t/x", "minority leader").await;
    let failover = cut_at.elapsed();
    eprintln!(
        "group {group}: the write pending at its leader (node {leader}), left in a minority, answered {first_answered:?} after the cut \
         ({first:?}); first acknowledged write {failover:?} (attempt {})",
        attempts + 1
    );
    // Check-quorum steps the old leader down within two election timeouts (1 s each)
    // without a majority, and it answers the write it held then; it used to keep it until
    // the router's 5 s deadline, never sooner.
    assert!(first_answered < ROUTER_DEADLINE, "the write pending at the minority leader was answered {first_answered:?} after the cut");
    // The majority elects another meanwhile: 1.5 s typically, up to 4.4 s seen under CI's load.
    assert!(failover <= MINORITY_FAILOVER_MAX, "the first write was acknowledged {failover:?} after the leader was left in a minority");
    net.heal_all().expect("heal");
    for id in minority {
        cluster.wait_caught_up(id, &[group]).await;
    }
    let read = client.get("/t/x").await.expect("read after healing");
    assert_eq!((read.data.as_slice(), read.stat.version >= version), (b"minority leader".as_slice(), true));

    // The router alone cut from the leader, then healed: the router passed over the silent
    // leader, but once the cut heals and the followers name it, the next write reaches it
    // at once, not after the router's suspicion of it lapsed (5 s).
    let leader = wait_until("a leader of /t", STEP_TIMEOUT, async || cluster.group_leader(group, None).await).await;
    net.cut(End::Machine, End::Host(host_of(leader))).expect("cut the router from the leader");
    let during = tokio::time::timeout(WRITE_TIMEOUT, client.set("/t/x", b"router cut".to_vec(), None)).await;
    eprintln!("group {group}: a write while the router was cut from its leader (node {leader}): {during:?}");
    net.heal_all().expect("heal");
    let healed_at = Instant::now();
    let (_, attempts) = write_until_acknowledged(&client, "/t/x", "healed").await;
    let recovery = healed_at.elapsed();
    eprintln!("group {group}: first acknowledged write {recovery:?} (attempt {attempts}) after the router's cut healed");
    assert!(recovery <= HEALED_RECOVERY_MAX, "the first write after the cut healed took {recovery:?}");

    // A group created while one of the nodes it is placed on is cut off: the creation goes
    // on with the others (it used to wait for the cut node's answer until the cut healed),
    // and the cut node creates its replica once it hears from placement again.
    let cut = 5;
    assert!(!PLACEMENT_NODES.contains(&cut), "placement keeps its majority and leader");
    // Placement marked the far side of the halves down while they were cut off, and places
    // a new group's replicas on up nodes only: the creation needs all five up again first
    // (a node marked down registers anew on its next heartbeat).
    let clients = cluster.placement_clients(WRITE_TIMEOUT);
    wait_until("every node up at placement", STEP_TIMEOUT, async || {
        let leader = placement_leader_among(&clients, None).await?;
        let (_, placement) = clients.iter().find(|(id, _)| *id == leader)?;
        let table = placement.clone().get_routing_table(GetRoutingTableRequest {}).await.ok()?.into_inner();
        (table.nodes.len() == cluster.node_ids().len() && table.nodes.iter().all(|node| node.up)).then_some(())
    })
    .await;
    net.isolate(host_of(cut)).expect("isolate a node");
    let cut_at = Instant::now();
    let created = create_group_at_placement_leader(&cluster, "/u").await;
    let creation = cut_at.elapsed();
    eprintln!("group {created} for /u created {creation:?} after node {cut} was cut off");
    assert!(creation <= CREATION_WITH_A_NODE_CUT_MAX, "the creation took {creation:?} with node {cut} cut off");
    let (version, _) = {
        client.create("/u/x", b"0".to_vec(), &CreateOptions::persistent()).await.expect("create /u/x in the new group");
        write_until_acknowledged(&client, "/u/x", "while cut").await
    };
    assert_eq!(version, 1, "the write after the create");
    net.heal_all().expect("heal");
    cluster.wait_caught_up(cut, &[created]).await;
}

/// How long a group creation may take while one of its five nodes is cut off: each node's
/// replica is created at once, the cut one's call given up after 2 s, then an election.
const CREATION_WITH_A_NODE_CUT_MAX: Duration = Duration::from_secs(6);

/// Creates a group serving `prefix` through the placement leader (retrying while there is
/// none or it changes); answers the new group's id. A creation whose answer was lost may
/// have taken effect: the routing table then lists the group, which a retry would be
/// refused for.
async fn create_group_at_placement_leader(cluster: &ProcessCluster, prefix: &str) -> u64 {
    let clients = cluster.placement_clients(WRITE_TIMEOUT);
    wait_until(&format!("a group for {prefix}"), STEP_TIMEOUT, async || {
        let leader = placement_leader_among(&clients, None).await?;
        let (_, placement) = clients.iter().find(|(id, _)| *id == leader)?;
        match placement.clone().create_group(CreateGroupRequest { prefix: prefix.into() }).await {
            Ok(created) => created.into_inner().group.and_then(|g| g.descriptor).map(|d| d.group_id),
            Err(_) => {
                let table = placement.clone().get_routing_table(GetRoutingTableRequest {}).await.ok()?.into_inner();
                let mut groups = table.groups.into_iter().filter_map(|entry| entry.descriptor);
                groups.find(|descriptor| descriptor.prefix == prefix).map(|descriptor| descriptor.group_id)
            }
        }
    })
    .await
}
