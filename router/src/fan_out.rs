//! Recursive deletes of subtrees that several groups serve parts of. The group serving the
//! path and each ready group below it are cleared one at a time, deepest prefix first: every
//! child subtree that leads to no other group's prefix is deleted with one recursive delete
//! in its group; a child on the way to another group's prefix stays and is cleared in turn.
//! So the path, the nodes leading to other groups and those groups' roots (their prefixes,
//! which only placement removes) remain. Not atomic: a failure part-way leaves the rest
//! (repeat the delete). The response carries each group's revision after its part.

use tokio::time::Instant;
use tonic::Status;
use warden_paths::{is_at_or_below, join};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{DeleteRequest, DeleteResponse, GetChildrenRequest, ResponseHeader, Routing};

use crate::upstream::Upstreams;
use warden_proto::routing::Target;

/// A recursive delete of `request.path` where `below` (other groups' prefixes under it) is
/// not empty.
pub async fn delete_across_groups(
    upstreams: &Upstreams,
    request: &DeleteRequest,
    owner: u64,
    below: Vec<(u64, String)>,
    deadline: Instant,
) -> Result<DeleteResponse, Status> {
    if request.expected_version.is_some() {
        let message = format!("{} has other groups' subtrees below it: a conditional delete cannot span groups", request.path);
        return Err(warden_proto::status(warden_proto::warden_error(Code::InvalidArgument, &request.path, message)));
    }
    let carve_outs: Vec<String> = below.iter().map(|(_, prefix)| prefix.clone()).collect();
    let mut parts: Vec<(u64, String)> = below;
    // Deepest first, then the group serving the path.
    parts.sort_by_key(|(_, prefix)| std::cmp::Reverse(prefix.matches('/').count()));
    parts.push((owner, request.path.clone()));
    let mut response = DeleteResponse::default();
    for (group, root) in parts {
        let (deleted, header) = clear(upstreams, group, &root, &carve_outs, deadline).await?;
        response.deleted += deleted;
        if let Some(header) = header {
            response.group_revisions.insert(group, header.revision);
            if group == owner {
                response.header = Some(header);
            }
        }
    }
    Ok(response)
}

/// Deletes everything below `root` in `group` except the nodes leading to `carve_outs`.
/// Returns the nodes deleted and the header of the group's last answer.
async fn clear(
    upstreams: &Upstreams,
    group: u64,
    root: &str,
    carve_outs: &[String],
    deadline: Instant,
) -> Result<(u64, Option<ResponseHeader>), Status> {
    let mut deleted = 0;
    let mut last_header = None;
    let mut pending = vec![root.to_string()];
    while let Some(parent) = pending.pop() {
        let mut start_after = String::new();
        loop {
            let list = GetChildrenRequest { path: parent.clone(), start_after: start_after.clone(), ..GetChildrenRequest::default() };
            let page = upstreams
                .call(Target::Group(group), true, deadline, |upstream, routing| {
                    let list = GetChildrenRequest { routing: Some(routing), ..list.clone() };
                    upstream.forward(list, deadline, |mut client, list| async move { client.get_children(list).await })
                })
                .await?;
            last_header = page.header.or(last_header);
            for name in &page.names {
                let child = join(&parent, name);
                if carve_outs.iter().any(|prefix| is_at_or_below(prefix, &child)) {
                    // On the way to another group (or its root): keep it, clear below it.
                    if !carve_outs.contains(&child) {
                        pending.push(child);
                    }
                    continue;
                }
                let delete = DeleteRequest { path: child, recursive: true, expected_version: None, routing: None };
                let done = upstreams
                    .call(Target::Group(group), false, deadline, |upstream, routing: Routing| {
                        let delete = DeleteRequest { routing: Some(routing), ..delete.clone() };
                        upstream.forward(delete, deadline, |mut client, delete| async move { client.delete(delete).await })
                    })
                    .await?;
                deleted += done.deleted;
                last_header = done.header.or(last_header);
            }
            match page.names.last() {
                Some(last) if page.more => start_after = last.clone(),
                _ => break,
            }
        }
    }
    Ok((deleted, last_header))
}
