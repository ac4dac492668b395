//! etcd's `KV` service on Warden's namespace: a key is the node at its path
//! ([`super::keys`]), its version counts writes from 1 at creation (`Stat.version` + 1), its
//! lease is the session owning it. Range and DeleteRange over a key range ask every group
//! serving part of it ([`super::plan`]); a Txn runs as one Warden transaction, so its keys
//! must lie in one group.

use tonic::metadata::MetadataMap;
use tonic::{Extensions, Request, Response, Status};
use warden_proto::etcd::etcdserverpb as pb;
use warden_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use warden_proto::etcd::etcdserverpb::range_request::{SortOrder, SortTarget};
use warden_proto::etcd::etcdserverpb::{request_op, response_op};
use warden_proto::etcd::mvccpb::KeyValue;
use warden_proto::v1 as w;
use warden_proto::v1::warden_server::Warden;

use super::keys::{self, KeyInterval, RangeSpec};
use super::{etcd_revision, etcd_status, inner, invalid, plan, EtcdService};

/// Times a range is planned again when the routing table changed under it.
const RANGE_PLANS_MAX: usize = 4;
/// Rounds of a linearizable range across groups (each: the groups not at the round's
/// revision read there in one transaction that raises them to it) before it is answered
/// UNAVAILABLE instead.
const ALIGN_ROUNDS_MAX: usize = 6;

/// A node as an etcd key-value (`key` is the node's key).
pub(super) fn key_value(key: Vec<u8>, node: w::Node) -> KeyValue {
    let stat = node.stat.unwrap_or_default();
    KeyValue {
        key,
        create_revision: etcd_revision(stat.create_revision),
        mod_revision: etcd_revision(stat.mod_revision),
        version: etcd_revision(stat.version.saturating_add(1)),
        value: node.data,
        lease: i64::try_from(stat.ephemeral_owner).unwrap_or(i64::MAX),
    }
}

/// The path of an etcd key, or etcd's refusal.
pub(super) fn path_of(key: &[u8]) -> Result<String, Status> {
    keys::key_to_path(key).map_err(|error| match error {
        keys::KeyError::Empty => invalid("key is not provided"),
        too_long @ keys::KeyError::TooLong { .. } => invalid(too_long.to_string()),
    })
}

/// The one-path range of the node at `path`: `[path, path + "\0")` inside its own subtree.
fn single(path: String) -> plan::Part {
    let mut to = path.clone().into_bytes();
    to.push(0);
    plan::Part { from: path.clone().into_bytes(), scope: path, to }
}

/// The group parts of the keys `key`..`range_end` names (etcd's conventions), by the
/// router's current table.
fn parts_of(table: &warden_proto::routing::Table, key: &[u8], range_end: &[u8]) -> Result<Vec<plan::Part>, Status> {
    Ok(match keys::etcd_range(key, range_end) {
        RangeSpec::Single(key) => vec![single(path_of(&key)?)],
        RangeSpec::Interval(interval) => intervals_parts(table, &interval),
    })
}

fn intervals_parts(table: &warden_proto::routing::Table, interval: &KeyInterval) -> Vec<plan::Part> {
    keys::path_intervals(interval).iter().flat_map(|paths| plan::parts(table, paths)).collect()
}

/// What a range asks beyond its keys, read from an etcd range request.
struct Shape {
    limit: usize,
    /// Sorted other than by key ascending, or filtered by revisions: every key of the range
    /// is needed before the limit applies.
    whole: bool,
}

impl Shape {
    fn of(request: &pb::RangeRequest) -> Result<Shape, Status> {
        let limit = usize::try_from(request.limit).map_err(|_| invalid("limit must not be negative"))?;
        let sorted = request.sort_target != SortTarget::Key as i32 || request.sort_order == SortOrder::Descend as i32;
        let filtered =
            request.min_mod_revision > 0 || request.max_mod_revision > 0 || request.min_create_revision > 0 || request.max_create_revision > 0;
        Ok(Shape { limit, whole: sorted || filtered })
    }

    /// The page each group is asked for (0: the largest a group answers).
    fn page(&self) -> u32 {
        if self.whole {
            0
        } else {
            u32::try_from(self.limit).unwrap_or(0)
        }
    }
}

/// The parts' answers, gathered.
#[derive(Default)]
struct Gathered {
    kvs: Vec<KeyValue>,
    count: u64,
    more: bool,
    /// The highest revision of every part: after [`EtcdService::align`], every group's.
    revision: u64,
}

impl Gathered {
    /// Adds the answer of a part.
    fn add(&mut self, answer: w::RangeResponse) {
        self.revision = self.revision.max(answer.header.map_or(0, |h| h.revision));
        self.count += answer.count;
        self.more |= answer.more;
        self.kvs.extend(answer.nodes.into_iter().filter_map(|node| Some(key_value(keys::path_to_key(&node.path)?, node))));
    }

    /// The etcd answer to `request`: filtered, sorted, cut to its limit.
    fn answer(mut self, request: &pb::RangeRequest, shape: &Shape) -> Result<pb::RangeResponse, Status> {
        if shape.whole && self.more {
            return Err(invalid("the range holds more keys than can be sorted or filtered in one request: narrow it"));
        }
        let within = |value: i64, min: i64, max: i64| (min <= 0 || value >= min) && (max <= 0 || value <= max);
        self.kvs.retain(|kv| {
            within(kv.mod_revision, request.min_mod_revision, request.max_mod_revision)
                && within(kv.create_revision, request.min_create_revision, request.max_create_revision)
        });
        self.kvs.sort_by(|a, b| a.key.cmp(&b.key));
        let target = SortTarget::try_from(request.sort_target).unwrap_or(SortTarget::Key);
        match target {
            SortTarget::Key => {}
            SortTarget::Version => self.kvs.sort_by_key(|kv| kv.version),
            SortTarget::Create => self.kvs.sort_by_key(|kv| kv.create_revision),
            SortTarget::Mod => self.kvs.sort_by_key(|kv| kv.mod_revision),
            SortTarget::Value => self.kvs.sort_by(|a, b| a.value.cmp(&b.value)),
        }
        if request.sort_order == SortOrder::Descend as i32 {
            self.kvs.reverse();
        }
        if shape.limit > 0 && self.kvs.len() > shape.limit {
            self.kvs.truncate(shape.limit);
            self.more = true;
        }
        if request.keys_only {
            self.kvs.iter_mut().for_each(|kv| kv.value.clear());
        }
        if request.count_only {
            self.kvs.clear();
        }
        check_revision(request.revision, self.revision)?;
        Ok(pb::RangeResponse { header: None, kvs: self.kvs, more: self.more, count: i64::try_from(self.count).unwrap_or(i64::MAX) })
    }
}

/// etcd's answer to a read at `asked` when the groups answered at `answered`: Warden keeps
/// no older versions, so only the current revision can be read.
fn check_revision(asked: i64, answered: u64) -> Result<(), Status> {
    let answered = etcd_revision(answered);
    if asked <= 0 || asked == answered {
        Ok(())
    } else if asked > answered {
        Err(Status::out_of_range("etcdserver: mvcc: required revision is a future revision"))
    } else {
        Err(Status::out_of_range("etcdserver: mvcc: required revision has been compacted"))
    }
}

impl EtcdService {
    /// The router's table, read from placement first if it has no group yet.
    pub(super) async fn table(&self) -> Result<std::sync::Arc<warden_proto::routing::Table>, Status> {
        let table = self.router.upstreams().table();
        if table.route("/").is_some() {
            return Ok(table);
        }
        self.router.upstreams().refresh().await
    }

    /// Reads a range: each part from its group, planned again if the routing table
    /// changed meanwhile (a part planned on the old table might miss a group). With
    /// `owner`, only the keys of that lease (its session's ephemerals). A linearizable range
    /// across groups answers one revision valid for each of them ([`EtcdService::align`]).
    pub(super) async fn read_range(
        &self,
        metadata: &MetadataMap,
        extensions: &Extensions,
        request: &pb::RangeRequest,
        owner: u64,
    ) -> Result<pb::RangeResponse, Status> {
        if request.key.is_empty() {
            return Err(invalid("key is not provided"));
        }
        let shape = Shape::of(request)?;
        let consistency = if request.serializable { w::Consistency::Stale } else { w::Consistency::Linearizable };
        for _ in 0..RANGE_PLANS_MAX {
            let table = self.table().await?;
            let ranges: Vec<w::RangeRequest> = parts_of(&table, &request.key, &request.range_end)?
                .into_iter()
                .map(|part| w::RangeRequest {
                    path: part.scope,
                    from: part.from,
                    to: part.to,
                    limit: shape.page(),
                    keys_only: request.keys_only,
                    count_only: request.count_only,
                    consistency: consistency as i32,
                    owner,
                    routing: None,
                })
                .collect();
            // A lease's keys (`owner`) are listed for `TimeToLive`, whose revision is the lease's.
            let answers = self.align(metadata, extensions, &ranges, !request.serializable && owner == 0).await?;
            if self.router.upstreams().table().version != table.version {
                continue;
            }
            let mut gathered = Gathered::default();
            answers.into_iter().for_each(|answer| gathered.add(answer));
            let revision = gathered.revision;
            let mut answer = gathered.answer(request, &shape)?;
            answer.header = self.header(revision);
            return Ok(answer);
        }
        Err(Status::unavailable("etcdserver: the range's groups kept changing: retry"))
    }

    /// Reads every part of `ranges`, each from the group serving it; with `aligned` (a
    /// linearizable range) at one revision R valid for every group read. etcd clients list,
    /// then watch from the list's revision + 1 (Kubernetes' informers, clientv3's recipes):
    /// every group must have been read as of R exactly, and take no later write at or below
    /// R. In rounds, at most [`ALIGN_ROUNDS_MAX`]:
    ///
    /// 1. every part read on its own; R is the highest revision read. Parts read at R are
    ///    done (their groups' later writes take revisions above it);
    /// 2. each group with a part read below R reads all its parts again in one read-only
    ///    transaction with `raise_to` R: a group still below R is raised to R and read
    ///    there, in one step;
    /// 3. a group that had meanwhile moved past R answers its own revision: R becomes the
    ///    highest answer plus twice the overshoot (a busy group's writes during a round), and
    ///    every group not read at it goes through step 2 again.
    ///
    /// A range of one group read at one revision, and a serializable one (no point of a
    /// group's history to hold to), take step 1 only.
    async fn align(
        &self,
        metadata: &MetadataMap,
        extensions: &Extensions,
        ranges: &[w::RangeRequest],
        aligned: bool,
    ) -> Result<Vec<w::RangeResponse>, Status> {
        // 1. Every part on its own.
        let reads = ranges.iter().map(|range| Warden::range(&self.router, inner(metadata, extensions, range.clone())));
        let mut answers = Vec::with_capacity(ranges.len());
        for answer in futures::future::join_all(reads).await {
            answers.push(answer.map_err(etcd_status)?.into_inner());
        }
        let at = |answer: &w::RangeResponse| answer.header.as_ref().map_or((0, 0), |h| (h.group_id, h.revision));
        let mut target = answers.iter().map(|answer| at(answer).1).max().unwrap_or(0);
        let mut parts_of_group: std::collections::BTreeMap<u64, Vec<usize>> = std::collections::BTreeMap::new();
        for (index, answer) in answers.iter().enumerate() {
            parts_of_group.entry(at(answer).0).or_default().push(index);
        }
        for round in 0..=ALIGN_ROUNDS_MAX {
            if !aligned || answers.iter().all(|answer| at(answer).1 == target) {
                return Ok(answers);
            }
            if round == ALIGN_ROUNDS_MAX {
                break;
            }
            // 2. The groups not read at the target, each read there in one transaction.
            let behind = parts_of_group.values().filter(|parts| parts.iter().any(|index| at(&answers[*index]).1 != target));
            let txns = behind.map(|parts| {
                let then = parts.iter().map(|index| w::TxnOp { op: Some(w::txn_op::Op::Range(ranges[*index].clone())) }).collect();
                let txn = w::TxnRequest { then, raise_to: target, ..w::TxnRequest::default() };
                async move { (parts, Warden::txn(&self.router, inner(metadata, extensions, txn)).await) }
            });
            for (parts, answer) in futures::future::join_all(txns).await {
                let answer = answer.map_err(etcd_status)?.into_inner();
                if answer.results.len() != parts.len() {
                    return Err(Status::internal("a group's transaction answered another number of ranges than it was asked"));
                }
                for (index, result) in parts.iter().zip(answer.results) {
                    let Some(w::txn_op_result::Result::Range(range)) = result.result else {
                        return Err(Status::internal("a group's transaction answered a range with something else"));
                    };
                    answers[*index] = w::RangeResponse { header: answer.header, ..range };
                }
            }
            // 3. A group past the target: a higher one, with room for what moves meanwhile.
            let highest = answers.iter().map(|answer| at(answer).1).max().unwrap_or(0);
            if highest > target {
                target = highest.saturating_add(2 * (highest - target));
            }
        }
        Err(Status::unavailable("etcdserver: the range's groups kept taking writes while it was read: retry"))
    }

    /// Deletes a range, group by group (not atomic across groups). When the routing table
    /// changed meanwhile (a group refused a part planned on an older descriptor), the range
    /// is planned and deleted again: a group split off since the plan holds keys of it too.
    async fn delete_range_parts(
        &self,
        metadata: &MetadataMap,
        extensions: &Extensions,
        request: &pb::DeleteRangeRequest,
    ) -> Result<pb::DeleteRangeResponse, Status> {
        let mut deleted = 0u64;
        let mut revision = 0u64;
        let mut prev_kvs = Vec::new();
        for _ in 0..RANGE_PLANS_MAX {
            let table = self.table().await?;
            let deletes: Vec<w::DeleteRangeRequest> = parts_of(&table, &request.key, &request.range_end)?
                .into_iter()
                .map(|part| w::DeleteRangeRequest { path: part.scope, from: part.from, to: part.to, return_previous: request.prev_kv, routing: None })
                .collect();
            // Judged whole before any part runs: a part the caller may not delete must not
            // leave the others deleted and the whole reported as refused.
            for delete in &deletes {
                self.router.admit(&inner(metadata, extensions, delete.clone())).map_err(etcd_status)?;
            }
            for delete in deletes {
                let answer = Warden::delete_range(&self.router, inner(metadata, extensions, delete)).await.map_err(etcd_status)?.into_inner();
                deleted += answer.deleted;
                revision = revision.max(answer.header.map_or(0, |h| h.revision));
                prev_kvs.extend(answer.previous.into_iter().filter_map(|node| Some(key_value(keys::path_to_key(&node.path)?, node))));
            }
            if self.router.upstreams().table().version == table.version {
                prev_kvs.sort_by(|a, b| a.key.cmp(&b.key));
                return Ok(pb::DeleteRangeResponse { header: self.header(revision), deleted: i64::try_from(deleted).unwrap_or(i64::MAX), prev_kvs });
            }
        }
        Err(Status::unavailable("etcdserver: the range's groups kept changing: retry"))
    }
}

/// A Warden put for an etcd put.
fn put_of(request: &pb::PutRequest) -> Result<w::PutRequest, Status> {
    if request.ignore_value && !request.value.is_empty() {
        return Err(invalid("value is provided"));
    }
    if request.ignore_lease && request.lease != 0 {
        return Err(invalid("lease is provided"));
    }
    Ok(w::PutRequest {
        path: path_of(&request.key)?,
        data: request.value.clone(),
        keep_data: request.ignore_value,
        session_id: u64::try_from(request.lease).map_err(|_| invalid("lease id must not be negative"))?,
        keep_owner: request.ignore_lease,
        return_previous: request.prev_kv,
        routing: None,
    })
}

/// The etcd answer to a put.
fn put_answer(request: &pb::PutRequest, answer: w::PutResponse) -> pb::PutResponse {
    pb::PutResponse { header: None, prev_kv: answer.previous.map(|node| key_value(request.key.clone(), node)) }
}

/// The group parts of a transaction's range: those in the group of its first part, which
/// the transaction reads, and those in other groups, which must hold no key (checked
/// before it runs: the transaction runs in one group). A prefix like `/locks/web/` has its
/// plain keys in the group serving `/locks` and its escaped ones (`/locks/web/` itself,
/// `/locks/web//x`) under `/_etcd`, where etcd's recipes put none.
fn txn_parts(table: &warden_proto::routing::Table, key: &[u8], range_end: &[u8]) -> Result<(Vec<plan::Part>, Vec<plan::Part>), Status> {
    let parts = parts_of(table, key, range_end)?;
    let Some(first) = parts.first() else { return Ok((vec![single(path_of(key)?)], Vec::new())) };
    let group_of = |part: &plan::Part| table.route(&part.scope).map(|group| group.id());
    let group = group_of(first);
    Ok(parts.into_iter().partition(|part| group_of(part) == group))
}

/// The routing of a transaction's range part: the descriptor version of the group the
/// router planned it on, which that group checks (a group that split since refuses
/// WRONG_GROUP rather than answer without the part that moved).
fn planned_on(table: &warden_proto::routing::Table, part: &plan::Part) -> Option<w::Routing> {
    table.route(&part.scope).map(|group| w::Routing { group_id: group.id(), conf_ver: 0, version: group.descriptor.version })
}

/// The Warden compares for an etcd compare, and the parts of its key range in other
/// groups than its first part's (the transaction refuses a compare with any). A compare of one key is one
/// compare, and before a value compare one that the key exists, since etcd fails every value
/// compare of a missing key (its value is no empty value: `replace(key, "", new)` of a
/// missing key fails), where Warden compares a missing node's value as empty. Containers
/// compare as missing: they are no keys. A compare over a key range (`range_end`) is one
/// compare over the range's parts in the transaction's group, which fails a value compare
/// of a range without keys itself.
fn compares_of(table: &warden_proto::routing::Table, compare: &pb::Compare) -> Result<(Vec<w::Compare>, Vec<plan::Part>), Status> {
    use w::compare::{Op, Target};
    let op = match CompareResult::try_from(compare.result).map_err(|_| invalid("unknown compare result"))? {
        CompareResult::Equal => Op::Equal,
        CompareResult::Greater => Op::Greater,
        CompareResult::Less => Op::Less,
        CompareResult::NotEqual => Op::NotEqual,
    };
    let number = |n: i64| u64::try_from(n).map_err(|_| invalid("compared numbers must not be negative"));
    let (target, number, value) =
        match (CompareTarget::try_from(compare.target).map_err(|_| invalid("unknown compare target"))?, &compare.target_union) {
            (CompareTarget::Version, Some(TargetUnion::Version(n))) => (Target::Writes, number(*n)?, Vec::new()),
            (CompareTarget::Create, Some(TargetUnion::CreateRevision(n))) => (Target::CreateRevision, number(*n)?, Vec::new()),
            (CompareTarget::Mod, Some(TargetUnion::ModRevision(n))) => (Target::ModRevision, number(*n)?, Vec::new()),
            (CompareTarget::Lease, Some(TargetUnion::Lease(n))) => (Target::Owner, number(*n)?, Vec::new()),
            (CompareTarget::Value, Some(TargetUnion::Value(value))) => (Target::Value, 0, value.clone()),
            // etcd compares a missing union as its zero value.
            (CompareTarget::Value, None) => (Target::Value, 0, Vec::new()),
            (CompareTarget::Version, None) => (Target::Writes, 0, Vec::new()),
            (CompareTarget::Create, None) => (Target::CreateRevision, 0, Vec::new()),
            (CompareTarget::Mod, None) => (Target::ModRevision, 0, Vec::new()),
            (CompareTarget::Lease, None) => (Target::Owner, 0, Vec::new()),
            _ => return Err(invalid("the compare's target and value disagree")),
        };
    let compare_of = |path: String, ranges: Vec<w::RangeRequest>| w::Compare {
        path,
        target: target as i32,
        op: op as i32,
        number,
        value: value.clone(),
        exists: false,
        containers_absent: true,
        ranges,
    };
    if compare.range_end.is_empty() {
        let path = path_of(&compare.key)?;
        let exists = (target == Target::Value).then(|| w::Compare {
            path: path.clone(),
            target: Target::Exists as i32,
            exists: true,
            containers_absent: true,
            ..w::Compare::default()
        });
        return Ok((exists.into_iter().chain([compare_of(path, Vec::new())]).collect(), Vec::new()));
    }
    let (parts, elsewhere) = txn_parts(table, &compare.key, &compare.range_end)?;
    let ranges: Vec<w::RangeRequest> = parts
        .into_iter()
        .map(|part| w::RangeRequest {
            routing: planned_on(table, &part),
            path: part.scope,
            from: part.from,
            to: part.to,
            ..w::RangeRequest::default()
        })
        .collect();
    let Some(first) = ranges.first() else {
        // A range no path lies in: one empty range at the key's path, so it compares as a
        // range without keys.
        let path = path_of(&compare.key)?;
        let empty = [path.as_bytes(), b"\0"].concat();
        let range = w::RangeRequest { path: path.clone(), from: empty.clone(), to: empty, ..w::RangeRequest::default() };
        return Ok((vec![compare_of(path, vec![range])], elsewhere));
    };
    Ok((vec![compare_of(first.path.clone(), ranges)], elsewhere))
}

/// How the answers of an etcd operation's Warden operations map back to it.
enum OpShape {
    /// It became this many Warden operations (one per part of a range).
    Ops(usize),
    /// A nested transaction, as one nested Warden transaction.
    Txn(Box<TxnShape>),
}

/// How the answers of an etcd transaction's branches map back to its operations.
struct TxnShape {
    then: Vec<OpShape>,
    otherwise: Vec<OpShape>,
}

/// An etcd transaction as a Warden one: the request, the shape of its answers, and the
/// parts of the ranges it reads or deletes (nested transactions' too) in other groups than
/// the transaction's, which must hold no key.
struct Translated {
    request: w::TxnRequest,
    shape: TxnShape,
    elsewhere: Vec<plan::Part>,
}

impl Translated {
    fn of(table: &warden_proto::routing::Table, txn: &pb::TxnRequest) -> Result<Translated, Status> {
        let mut elsewhere = Vec::new();
        let mut compares = Vec::new();
        for compare in &txn.compare {
            let (some, outside) = compares_of(table, compare)?;
            // A part elsewhere could gain a key between a count there and the transaction
            // here: two creators could both see "no key". A compare is one group's or none.
            if !outside.is_empty() {
                return Err(Status::failed_precondition(
                    "etcdserver: a compare over a key range spanning several Warden groups cannot be atomic: compare keys of one group (docs/etcd.md)",
                ));
            }
            compares.extend(some);
        }
        let mut branch = |ops: &[pb::RequestOp]| -> Result<(Vec<w::TxnOp>, Vec<OpShape>), Status> {
            let (mut warden_ops, mut shapes) = (Vec::new(), Vec::with_capacity(ops.len()));
            for op in ops {
                let (some, shape, outside) = ops_of(table, op)?;
                warden_ops.extend(some);
                shapes.push(shape);
                elsewhere.extend(outside);
            }
            Ok((warden_ops, shapes))
        };
        let (then, then_shape) = branch(&txn.success)?;
        let (otherwise, otherwise_shape) = branch(&txn.failure)?;
        Ok(Translated {
            request: w::TxnRequest { compares, then, r#else: otherwise, raise_to: 0, routing: None },
            shape: TxnShape { then: then_shape, otherwise: otherwise_shape },
            elsewhere,
        })
    }
}

/// The etcd answer (without its header) of transaction `txn` from its Warden answer.
fn txn_answer(txn: &pb::TxnRequest, shape: TxnShape, answer: w::TxnResponse) -> Result<pb::TxnResponse, Status> {
    let (ops, shapes) = if answer.succeeded { (&txn.success, shape.then) } else { (&txn.failure, shape.otherwise) };
    let mut results = answer.results.into_iter();
    let responses = ops
        .iter()
        .zip(shapes)
        .map(|(op, shape)| match shape {
            OpShape::Ops(count) => op_answer(op, results.by_ref().take(count).collect()),
            OpShape::Txn(nested) => nested_answer(op, *nested, results.next()),
        })
        .collect::<Result<_, _>>()?;
    Ok(pb::TxnResponse { header: None, succeeded: answer.succeeded, responses })
}

/// Gives each operation's response in a transaction (nested ones too) a header holding only
/// the transaction's revision, as etcd does (`etcdctl txn -w json` prints them).
fn stamp_op_headers(responses: &mut [pb::ResponseOp], revision: i64) {
    let header = || Some(pb::ResponseHeader { revision, ..pb::ResponseHeader::default() });
    for response in responses {
        match &mut response.response {
            Some(response_op::Response::ResponsePut(put)) => put.header = header(),
            Some(response_op::Response::ResponseRange(range)) => range.header = header(),
            Some(response_op::Response::ResponseDeleteRange(delete)) => delete.header = header(),
            Some(response_op::Response::ResponseTxn(txn)) => {
                txn.header = header();
                stamp_op_headers(&mut txn.responses, revision);
            }
            None => {}
        }
    }
}

/// The etcd answer of a nested transaction operation from its Warden result.
fn nested_answer(op: &pb::RequestOp, shape: TxnShape, result: Option<w::TxnOpResult>) -> Result<pb::ResponseOp, Status> {
    match (&op.request, result.and_then(|result| result.result)) {
        (Some(request_op::Request::RequestTxn(txn)), Some(w::txn_op_result::Result::Txn(answer))) => {
            Ok(pb::ResponseOp { response: Some(response_op::Response::ResponseTxn(txn_answer(txn, shape, answer)?)) })
        }
        _ => Err(Status::internal("a transaction answered an operation it was not asked")),
    }
}

/// The Warden transaction operations for an etcd one (one, or one per part of a range or
/// range delete in the transaction's group; a nested transaction is one), how their answers
/// map back, and the parts in other groups (which must be empty).
fn ops_of(table: &warden_proto::routing::Table, op: &pb::RequestOp) -> Result<(Vec<w::TxnOp>, OpShape, Vec<plan::Part>), Status> {
    use w::txn_op::Op;
    let mut elsewhere = Vec::new();
    let ops = match &op.request {
        Some(request_op::Request::RequestPut(put)) => vec![Op::Put(put_of(put)?)],
        Some(request_op::Request::RequestRange(range)) => {
            let shape = Shape::of(range)?;
            if range.revision > 0 {
                return Err(Status::unimplemented("etcdserver: reads at a revision inside a transaction are not served (docs/etcd.md)"));
            }
            let (parts, outside) = txn_parts(table, &range.key, &range.range_end)?;
            elsewhere = outside;
            parts
                .into_iter()
                .map(|part| {
                    Op::Range(w::RangeRequest {
                        routing: planned_on(table, &part),
                        path: part.scope,
                        from: part.from,
                        to: part.to,
                        limit: shape.page(),
                        keys_only: range.keys_only,
                        count_only: range.count_only,
                        ..w::RangeRequest::default()
                    })
                })
                .collect()
        }
        Some(request_op::Request::RequestDeleteRange(delete)) => {
            let (parts, outside) = txn_parts(table, &delete.key, &delete.range_end)?;
            elsewhere = outside;
            parts
                .into_iter()
                .map(|part| {
                    let routing = planned_on(table, &part);
                    Op::DeleteRange(w::DeleteRangeRequest {
                        path: part.scope,
                        from: part.from,
                        to: part.to,
                        return_previous: delete.prev_kv,
                        routing,
                    })
                })
                .collect()
        }
        Some(request_op::Request::RequestTxn(txn)) => {
            let nested = Translated::of(table, txn)?;
            return Ok((vec![w::TxnOp { op: Some(Op::Txn(nested.request)) }], OpShape::Txn(Box::new(nested.shape)), nested.elsewhere));
        }
        None => return Err(invalid("a transaction operation without a request")),
    };
    let count = ops.len();
    Ok((ops.into_iter().map(|op| w::TxnOp { op: Some(op) }).collect(), OpShape::Ops(count), elsewhere))
}

/// The etcd answer of one transaction operation from the results of its Warden operations.
fn op_answer(op: &pb::RequestOp, results: Vec<w::TxnOpResult>) -> Result<pb::ResponseOp, Status> {
    use w::txn_op_result::Result as Answer;
    let mismatch = || Status::internal("a transaction answered an operation it was not asked");
    let response = match &op.request {
        Some(request_op::Request::RequestPut(put)) => match results.into_iter().next().and_then(|result| result.result) {
            Some(Answer::Put(answer)) => response_op::Response::ResponsePut(put_answer(put, answer)),
            _ => return Err(mismatch()),
        },
        Some(request_op::Request::RequestRange(range)) => {
            let mut gathered = Gathered::default();
            for result in results {
                match result.result {
                    // One group answers every part of a transaction: one revision.
                    Some(Answer::Range(answer)) => gathered.add(answer),
                    _ => return Err(mismatch()),
                }
            }
            let mut answer = gathered.answer(range, &Shape::of(range)?)?;
            answer.header = None;
            response_op::Response::ResponseRange(answer)
        }
        Some(request_op::Request::RequestDeleteRange(_)) => {
            let mut deleted = 0u64;
            let mut prev_kvs = Vec::new();
            for result in results {
                let Some(Answer::DeleteRange(answer)) = result.result else { return Err(mismatch()) };
                deleted += answer.deleted;
                prev_kvs.extend(answer.previous.into_iter().filter_map(|node| Some(key_value(keys::path_to_key(&node.path)?, node))));
            }
            prev_kvs.sort_by(|a, b| a.key.cmp(&b.key));
            response_op::Response::ResponseDeleteRange(pb::DeleteRangeResponse {
                header: None,
                deleted: i64::try_from(deleted).unwrap_or(i64::MAX),
                prev_kvs,
            })
        }
        _ => return Err(mismatch()),
    };
    Ok(pb::ResponseOp { response: Some(response) })
}

#[tonic::async_trait]
impl pb::kv_server::Kv for EtcdService {
    async fn range(&self, request: Request<pb::RangeRequest>) -> Result<Response<pb::RangeResponse>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        self.read_range(&metadata, &extensions, &request, 0).await.map(Response::new)
    }

    type RangeStreamStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::RangeStreamResponse, Status>> + Send + 'static>>;

    /// The whole range as one chunk (a range is bounded by the groups' page size anyway).
    async fn range_stream(&self, request: Request<pb::RangeRequest>) -> Result<Response<Self::RangeStreamStream>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        let answer = self.read_range(&metadata, &extensions, &request, 0).await?;
        let chunk = pb::RangeStreamResponse { range_response: Some(answer) };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(chunk)]))))
    }

    async fn put(&self, request: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        let put = put_of(&request)?;
        let answer = Warden::put(&self.router, inner(&metadata, &extensions, put)).await.map_err(etcd_status)?.into_inner();
        let revision = answer.header.map_or(0, |h| h.revision);
        Ok(Response::new(pb::PutResponse { header: self.header(revision), ..put_answer(&request, answer) }))
    }

    async fn delete_range(&self, request: Request<pb::DeleteRangeRequest>) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        self.delete_range_parts(&metadata, &extensions, &request).await.map(Response::new)
    }

    async fn txn(&self, request: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        let table = self.table().await?;
        let translated = Translated::of(&table, &request)?;
        for part in &translated.elsewhere {
            let count = w::RangeRequest {
                path: part.scope.clone(),
                from: part.from.clone(),
                to: part.to.clone(),
                count_only: true,
                ..w::RangeRequest::default()
            };
            let answer = Warden::range(&self.router, inner(&metadata, &extensions, count)).await.map_err(etcd_status)?.into_inner();
            if answer.count > 0 {
                return Err(Status::failed_precondition("etcdserver: a transaction's range holds keys in more than one Warden group (docs/etcd.md)"));
            }
        }
        let answer = Warden::txn(&self.router, inner(&metadata, &extensions, translated.request)).await.map_err(etcd_status)?.into_inner();
        let revision = answer.header.map_or(0, |h| h.revision);
        let mut answer = txn_answer(&request, translated.shape, answer)?;
        stamp_op_headers(&mut answer.responses, super::etcd_revision(revision));
        Ok(Response::new(pb::TxnResponse { header: self.header(revision), ..answer }))
    }

    /// Warden keeps no older versions of a key: there is nothing to compact, and every
    /// revision below the current one reads as compacted already.
    async fn compact(&self, request: Request<pb::CompactionRequest>) -> Result<Response<pb::CompactionResponse>, Status> {
        let (metadata, extensions, _) = request.into_parts();
        let sync = Warden::sync(&self.router, inner(&metadata, &extensions, w::SyncRequest::default())).await.map_err(etcd_status)?.into_inner();
        Ok(Response::new(pb::CompactionResponse { header: self.header(sync.header.map_or(0, |h| h.revision)) }))
    }
}
