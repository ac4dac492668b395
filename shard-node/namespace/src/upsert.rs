//! Put: create the node or replace its data, the write etcd's Put is (docs/etcd.md). In
//! etcd's flat key space a key's parents need not exist: a put creates missing ancestors as
//! containers, which go again with their last child and which ranges do not list; a put on
//! a container makes it a node of its own.

use warden_proto::namespace::NodeRecord;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{CreateRequest, Node, NodeKind, PutRequest, PutResponse, Stat};

use super::error::{error, invalid, no_node, Failure};
use super::locks;
use super::txn::{TtlChange, Txn};

impl Txn<'_, '_> {
    /// Applies a put.
    pub(super) fn put(&mut self, request: &PutRequest) -> Result<PutResponse, Failure> {
        let path = request.path.as_str();
        if self.view.lock_meta(path)?.is_some() {
            return Err(invalid(path, format!("{path} is a lock: only the lock operations change it")).into());
        }
        let existing = self.node(path)?;
        let container = existing.as_ref().and_then(|node| node.stat).is_some_and(|stat| stat.kind == NodeKind::Container as i32);
        match existing {
            Some(node) if node.lock_waiter.is_some() => Err(locks::waiters_only_by_lock_operations(path)),
            Some(node) if !container => self.replace(request, node),
            existing => {
                if request.keep_data || request.keep_owner {
                    return Err(no_node(path).into());
                }
                let stat = match existing {
                    Some(container) => self.fill_container(request, container)?,
                    None => self.create_with_containers(request)?,
                };
                Ok(PutResponse { header: None, stat: Some(stat), previous: None })
            }
        }
    }

    /// A put on a node: its data (unless kept) and owner (unless kept) change, as a set does.
    fn replace(&mut self, request: &PutRequest, mut node: NodeRecord) -> Result<PutResponse, Failure> {
        let path = request.path.as_str();
        let previous = request.return_previous.then(|| Node { path: path.to_string(), data: node.data.clone(), stat: node.stat });
        let mut stat = node.stat.unwrap_or_default();
        let owner = if request.keep_owner { stat.ephemeral_owner } else { request.session_id };
        if owner != stat.ephemeral_owner {
            if owner != 0 {
                self.check_may_own(path, &stat)?;
                self.attach_ephemeral(owner, path)?;
            }
            if stat.ephemeral_owner != 0 {
                self.detach_ephemeral(stat.ephemeral_owner, path)?;
            }
            stat.ephemeral_owner = owner;
        }
        if !request.keep_data {
            node.data = request.data.clone();
        }
        stat.version += 1;
        stat.mod_revision = self.revision;
        stat.mtime_ms = self.now_ms;
        stat.data_length = node.data.len() as u64;
        node.stat = Some(stat);
        self.view.put_node(path, &node);
        if stat.kind == NodeKind::Ttl as i32 {
            self.ttl_changes.push(TtlChange::Upsert(path.to_string(), stat));
        }
        Ok(PutResponse { header: None, stat: Some(stat), previous })
    }

    /// A put on a container: it becomes a persistent node (or the session's ephemeral),
    /// created now; its children stay.
    fn fill_container(&mut self, request: &PutRequest, mut node: NodeRecord) -> Result<Stat, Failure> {
        let path = request.path.as_str();
        let old = node.stat.unwrap_or_default();
        if request.session_id != 0 {
            self.check_may_own(path, &old)?;
            self.attach_ephemeral(request.session_id, path)?;
        }
        let stat = Stat {
            create_revision: self.revision,
            mod_revision: self.revision,
            ctime_ms: self.now_ms,
            mtime_ms: self.now_ms,
            data_length: request.data.len() as u64,
            ephemeral_owner: request.session_id,
            num_children: old.num_children,
            cversion: old.cversion,
            kind: NodeKind::Persistent as i32,
            ..Stat::default()
        };
        node.data = request.data.clone();
        node.stat = Some(stat);
        self.view.put_node(path, &node);
        Ok(stat)
    }

    /// A put where nothing is: the node, under containers made for missing ancestors.
    fn create_with_containers(&mut self, request: &PutRequest) -> Result<Stat, Failure> {
        if let Some(parent) = super::path::parent(&request.path) {
            if self.node(parent)?.is_none() {
                self.create_ancestors(parent, NodeKind::Container)?;
            }
        }
        let create =
            CreateRequest { path: request.path.clone(), data: request.data.clone(), session_id: request.session_id, ..CreateRequest::default() };
        Ok(self.create(&create)?.stat.unwrap_or_default())
    }

    /// Refuses making the node at `path` (with `stat`) an ephemeral: ephemerals have no
    /// children and no TTL.
    fn check_may_own(&self, path: &str, stat: &Stat) -> Result<(), Failure> {
        if stat.num_children > 0 {
            return Err(error(Code::NoChildrenForEphemerals, path, format!("{path} has children: it cannot be a session's ephemeral node")).into());
        }
        if stat.kind == NodeKind::Ttl as i32 {
            return Err(invalid(path, format!("{path} is a TTL node: it cannot be a session's ephemeral node")).into());
        }
        Ok(())
    }
}
