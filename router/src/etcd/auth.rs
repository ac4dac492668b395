//! etcd's `Auth` service on Warden's own security (docs/etcd.md, row `Auth`): an etcd user
//! `NAME` is the Warden principal `etcd:NAME`, a role `ROLE` the ACL group `etcd:ROLE`, and
//! a role's permission on a key or a key prefix a grant to that group on a path prefix
//! ([`record::grant_prefix`]). Users (with password hashes), roles and the enabled flag are
//! one record placement keeps replicated and opaque (`GetEtcdAuth`, `SetEtcdAuth`, a change
//! made from a version); the ACL changes go to placement as the caller's own `ChangeAcl` and
//! `ChangeAclGroup`, so only an administrator of `/` changes etcd's users and roles.
//!
//! Every etcd service runs behind [`EtcdAuth::guard`]: a call whose `token` metadata is a token of
//! `Authenticate` (auth enabled) is served as its user's principal, so Warden's ACL judges
//! it at the router and at every node, as any principal's call. Auth needs TLS on the
//! router: without it Warden checks no permission at all, and `AuthEnable` is refused.

mod record;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use warden_placement::acl;
use warden_proto::etcd::authpb::Permission;
use warden_proto::etcd::etcdserverpb::auth_server::Auth;
use warden_proto::etcd::etcdserverpb::*;
use warden_proto::follow::{CallKind, Fault, Follow};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::{ChangeAclGroupRequest, ChangeAclRequest, GetEtcdAuthRequest, SetEtcdAuthRequest};
use warden_proto::tls::{Caller, Identity, PeerInfo};
use warden_proto::v1::warden_error::Code;

use self::record::{AuthRecord, Role, User};
use super::{etcd_status, invalid, CLUSTER_ID};
use crate::principal::{Authenticate, WithPrincipal};
use crate::Upstreams;

/// The metadata key etcd clients send their token in.
pub const TOKEN_HEADER: &str = "token";
/// How stale a router's copy of the record may be when it judges a token: a password
/// change, a deletion or `AuthDisable` at another router ends tokens here within it.
const RECORD_MAX_AGE: Duration = Duration::from_secs(1);
/// Attempts of a change that lost the race to another router's change (each reads again).
const CHANGE_ATTEMPTS_MAX: usize = 8;

/// The `Auth` service of one router, and the token check of every etcd call.
#[derive(Clone)]
pub struct EtcdAuth {
    inner: Arc<Inner>,
}

struct Inner {
    upstreams: Arc<Upstreams>,
    timeout: Duration,
    /// The router has TLS (Warden's security is on).
    secure: bool,
    member_id: u64,
    /// The record as last read, its version, and when it was read.
    cached: tokio::sync::Mutex<Option<(Arc<AuthRecord>, u64, Instant)>>,
}

impl EtcdAuth {
    /// The service over `upstreams` (calls within `timeout`), for a router with TLS when
    /// `secure`, answering as `member_id`.
    pub fn new(upstreams: Arc<Upstreams>, timeout: Duration, secure: bool, member_id: u64) -> EtcdAuth {
        EtcdAuth { inner: Arc::new(Inner { upstreams, timeout, secure, member_id, cached: tokio::sync::Mutex::new(None) }) }
    }

    /// `service`, each call's principal named by its token (if any) or its connection.
    pub fn guard<S>(&self, service: S) -> WithPrincipal<S, EtcdAuth> {
        WithPrincipal::authenticated(service, self.clone())
    }

    fn header(&self, version: u64) -> Option<ResponseHeader> {
        let revision = i64::try_from(version).unwrap_or(i64::MAX);
        Some(ResponseHeader { cluster_id: CLUSTER_ID, member_id: self.inner.member_id, revision, raft_term: 0 })
    }

    /// The record, read again from placement if the copy held is older than `max_age`.
    async fn record(&self, max_age: Duration) -> Result<(Arc<AuthRecord>, u64), Status> {
        let mut cached = self.inner.cached.lock().await;
        if let Some((record, version, read)) = cached.as_ref() {
            if read.elapsed() < max_age {
                return Ok((record.clone(), *version));
            }
        }
        let answer = self.at_placement(|mut placement| async move { placement.get_etcd_auth(GetEtcdAuthRequest {}).await }).await?;
        let record = Arc::new(AuthRecord::decode(&answer.encoded).map_err(|error| Status::internal(error.to_string()))?);
        *cached = Some((record.clone(), answer.version, Instant::now()));
        Ok((record, answer.version))
    }

    /// The user a call's `token` names: `None` while auth is disabled (tokens are ignored,
    /// as etcd does), refused UNAUTHENTICATED when it names nobody now.
    async fn user_of(&self, token: &str) -> Result<Option<String>, Status> {
        let (record, _) = self.record(RECORD_MAX_AGE).await?;
        if !record.enabled {
            return Ok(None);
        }
        match record.verify(token, now_s()) {
            Some(user) => Ok(Some(user.to_string())),
            None => Err(Status::unauthenticated("etcdserver: invalid auth token")),
        }
    }

    /// Calls placement through the node `call` is given, following NOT_LEADER to its
    /// leader and trying other nodes (those without a placement replica answer WRONG_GROUP),
    /// until answered or the router's timeout passes. Every call made is idempotent.
    async fn at_placement<T, F, Fut>(&self, mut call: F) -> Result<T, Status>
    where
        F: FnMut(PlacementClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let deadline = Instant::now() + self.inner.timeout;
        let mut follow = Follow::new(CallKind::Idempotent, deadline);
        loop {
            let turn = follow.turn();
            let mut table = self.inner.upstreams.table();
            if table.addrs().is_empty() {
                table = self.inner.upstreams.refresh().await?;
            }
            let addrs = table.addrs();
            let hinted = turn.hint.and_then(|node| table.addr(node)).map(str::to_string);
            let Some(addr) = hinted.or_else(|| addrs.get(turn.attempt % addrs.len().max(1)).cloned()) else {
                return Err(Status::unavailable("etcdserver: no node known to reach placement at"));
            };
            let client = PlacementClient::new(self.inner.upstreams.channel(&addr)?);
            let status = match tokio::time::timeout_at(deadline, call(client)).await {
                Ok(Ok(response)) => return Ok(response.into_inner()),
                Ok(Err(status)) => status,
                Err(_) => return Err(Status::unavailable("etcdserver: placement did not answer in time")),
            };
            match Fault::of(&status) {
                Fault::Answer { code: Some(Code::WrongGroup) } => follow.retry_anyway(status).await?,
                _ => follow.retry_after(status).await?,
            }
        }
    }

    /// A placement request for the call's principal, carrying the time left.
    fn for_caller<T>(message: T, timeout: Duration) -> Request<T> {
        let mut request = Request::new(message);
        crate::principal::name_in(&mut request);
        request.set_timeout(timeout);
        request
    }

    /// Applies `changes` to the ACL as the caller (placement judges its rights), then has
    /// the router read the table again so its own checks see them at once.
    async fn change_acl(&self, changes: Vec<AclChange>) -> Result<(), Status> {
        let timeout = self.inner.timeout;
        for change in &changes {
            match change.clone() {
                AclChange::Grant(grant) => {
                    self.at_placement(|mut placement| {
                        let request = EtcdAuth::for_caller(grant.clone(), timeout);
                        async move { placement.change_acl(request).await }
                    })
                    .await?;
                }
                AclChange::Member(member) => {
                    self.at_placement(|mut placement| {
                        let request = EtcdAuth::for_caller(member.clone(), timeout);
                        async move { placement.change_acl_group(request).await }
                    })
                    .await?;
                }
            }
        }
        if !changes.is_empty() {
            if let Err(status) = self.inner.upstreams.refresh().await {
                tracing::debug!(%status, "routing table refresh after an etcd auth change");
            }
        }
        Ok(())
    }

    /// One change of the record: `change` edits a fresh copy and names the ACL changes that
    /// go with it; those are made first, then the record is written if no other change came
    /// in between (else all again, from the newer record). Answers the new version.
    async fn change<F>(&self, mut change: F) -> Result<u64, Status>
    where
        F: FnMut(&mut AuthRecord) -> Result<Vec<AclChange>, Status>,
    {
        for _ in 0..CHANGE_ATTEMPTS_MAX {
            let (current, version) = self.record(Duration::ZERO).await?;
            let mut next = AuthRecord::clone(&current);
            let acl_changes = change(&mut next)?;
            self.change_acl(acl_changes).await?;
            let encoded = next.encode();
            let timeout = self.inner.timeout;
            let written = self
                .at_placement(|mut placement| {
                    let request = EtcdAuth::for_caller(SetEtcdAuthRequest { expected_version: version, encoded: encoded.clone() }, timeout);
                    async move { placement.set_etcd_auth(request).await }
                })
                .await;
            match written {
                Ok(record) => {
                    *self.inner.cached.lock().await = Some((Arc::new(next), record.version, Instant::now()));
                    return Ok(record.version);
                }
                Err(status) if warden_proto::error_of(&status).is_some_and(|e| e.code == Code::BadVersion as i32) => continue,
                Err(status) => return Err(etcd_status(status)),
            }
        }
        Err(Status::unavailable("etcdserver: too many concurrent auth changes; try again"))
    }

    /// Refuses a caller who may not administer `/` (with TLS; without it everyone may).
    /// An administrator's read of the record (the newest): `answer` makes the reply from it
    /// and the header naming its version.
    async fn read<T, R>(
        &self,
        request: &Request<T>,
        answer: impl FnOnce(&AuthRecord, Option<ResponseHeader>) -> Result<R, Status>,
    ) -> Result<Response<R>, Status> {
        self.require_admin(request)?;
        let (record, version) = self.record(Duration::ZERO).await?;
        answer(&record, self.header(version)).map(Response::new)
    }

    fn require_admin<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match warden_proto::tls::caller(request).map_err(etcd_status)? {
            Caller::Principal(principal) if !self.inner.upstreams.acl().get().allows(&principal, "/", acl::ADMIN) => {
                Err(Status::permission_denied("etcdserver: permission denied"))
            }
            _ => Ok(()),
        }
    }
}

/// An ACL change that goes with a record change.
#[derive(Clone)]
enum AclChange {
    Grant(ChangeAclRequest),
    Member(ChangeAclGroupRequest),
}

fn member(role: &str, user: &str, remove: bool) -> AclChange {
    AclChange::Member(ChangeAclGroupRequest { group: record::group(role), principal: record::principal(user), remove })
}

/// The grants role `name` must hold at `prefix` after a change (everything it held there
/// revoked first): the bits of its permissions that map there, `admin` on `/` for `root`.
fn grants_at(record: &AuthRecord, name: &str, prefix: &str) -> Vec<AclChange> {
    let mut bits: u32 = record
        .roles
        .get(name)
        .map(|role| {
            role.permissions
                .iter()
                .filter(|((key, end), _)| record::grant_prefix(key, end).as_deref() == Ok(prefix))
                .fold(0, |bits, (_, kind)| bits | record::warden_bits(*kind))
        })
        .unwrap_or(0);
    if name == record::ROOT && prefix == "/" && record.roles.contains_key(name) {
        bits = acl::ALL;
    }
    let grantee = format!("{}{}", acl::GROUP_MARK, record::group(name));
    let change =
        |permissions, revoke| AclChange::Grant(ChangeAclRequest { prefix: prefix.to_string(), principal: grantee.clone(), permissions, revoke });
    let mut changes = Vec::new();
    if acl::ALL & !bits != 0 {
        changes.push(change(acl::ALL & !bits, true));
    }
    if bits != 0 {
        changes.push(change(bits, false));
    }
    changes
}

fn failed(message: &str) -> Status {
    Status::failed_precondition(format!("etcdserver: {message}"))
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

/// Checks a user's name as etcd and Warden's principal names allow.
fn check_user_name(name: &str) -> Result<(), Status> {
    if name.is_empty() {
        return Err(invalid("user name is empty"));
    }
    if !record::valid_name(name) {
        return Err(invalid("user name must be letters, digits and -_.@: (at most 123 bytes): it names a Warden principal"));
    }
    Ok(())
}

/// Checks a role's name likewise.
fn check_role_name(name: &str) -> Result<(), Status> {
    if name.is_empty() {
        return Err(invalid("role name is empty"));
    }
    if !record::valid_name(name) {
        return Err(invalid("role name must be letters, digits and -_.@: (at most 123 bytes): it names a Warden ACL group"));
    }
    Ok(())
}

/// The hash of `password`, computed off the async threads.
async fn hash(password: String) -> Result<String, Status> {
    if password.is_empty() || password.len() > record::PASSWORD_BYTES_MAX {
        return Err(invalid(format!("a password is 1 to {} bytes", record::PASSWORD_BYTES_MAX)));
    }
    tokio::task::spawn_blocking(move || record::hash_password(&password))
        .await
        .ok()
        .flatten()
        .ok_or_else(|| Status::internal("etcdserver: no randomness for a password's salt"))
}

fn user_mut<'a>(record: &'a mut AuthRecord, name: &str) -> Result<&'a mut User, Status> {
    record.users.get_mut(name).ok_or_else(|| failed("user name not found"))
}

#[tonic::async_trait]
impl Auth for EtcdAuth {
    async fn auth_enable(&self, request: Request<AuthEnableRequest>) -> Result<Response<AuthEnableResponse>, Status> {
        self.require_admin(&request)?;
        if !self.inner.secure {
            return Err(failed("auth needs TLS on the router (Warden's security): without it Warden checks no permission"));
        }
        let version = self
            .change(|record| {
                let root = record.users.get(record::ROOT).ok_or_else(|| failed("root user does not exist"))?;
                if !root.roles.contains(record::ROOT) {
                    return Err(failed("root user does not have root role"));
                }
                if record.secret.is_empty() {
                    record.secret = record::new_secret().ok_or_else(|| Status::internal("etcdserver: no randomness for a secret"))?;
                }
                record.enabled = true;
                Ok(Vec::new())
            })
            .await?;
        Ok(Response::new(AuthEnableResponse { header: self.header(version) }))
    }

    async fn auth_disable(&self, request: Request<AuthDisableRequest>) -> Result<Response<AuthDisableResponse>, Status> {
        self.require_admin(&request)?;
        let version = self
            .change(|record| {
                record.enabled = false;
                // Every token handed out so far ends.
                record.secret = record::new_secret().ok_or_else(|| Status::internal("etcdserver: no randomness for a secret"))?;
                Ok(Vec::new())
            })
            .await?;
        Ok(Response::new(AuthDisableResponse { header: self.header(version) }))
    }

    async fn auth_status(&self, _request: Request<AuthStatusRequest>) -> Result<Response<AuthStatusResponse>, Status> {
        let (record, version) = self.record(RECORD_MAX_AGE).await?;
        Ok(Response::new(AuthStatusResponse { header: self.header(version), enabled: record.enabled, auth_revision: version }))
    }

    async fn authenticate(&self, request: Request<AuthenticateRequest>) -> Result<Response<AuthenticateResponse>, Status> {
        let AuthenticateRequest { name, password } = request.into_inner();
        let (record, version) = self.record(Duration::ZERO).await?;
        if !record.enabled {
            return Err(failed("authentication is not enabled"));
        }
        let refused = || invalid("authentication failed, invalid user ID or password");
        let hash = record.users.get(&name).map(|user| user.hash.clone()).ok_or_else(refused)?;
        if password.len() > record::PASSWORD_BYTES_MAX {
            return Err(refused());
        }
        let matches = tokio::task::spawn_blocking(move || record::password_matches(&hash, &password)).await.unwrap_or(false);
        if !matches {
            return Err(refused());
        }
        let token = record.token(&name, now_s()).ok_or_else(|| Status::internal("etcdserver: the auth record has no secret"))?;
        Ok(Response::new(AuthenticateResponse { header: self.header(version), token }))
    }

    async fn user_add(&self, request: Request<AuthUserAddRequest>) -> Result<Response<AuthUserAddResponse>, Status> {
        self.require_admin(&request)?;
        let AuthUserAddRequest { name, password, options, hashed_password } = request.into_inner();
        check_user_name(&name)?;
        if !hashed_password.is_empty() {
            return Err(invalid("hashed passwords (etcd's bcrypt) are not taken: send the password"));
        }
        let no_password = options.is_some_and(|options| options.no_password);
        let hash = if no_password { String::new() } else { hash(password).await? };
        let version = self
            .change(|record| {
                if record.users.contains_key(&name) {
                    return Err(failed("user name already exists"));
                }
                if record.users.len() >= record::USERS_MAX {
                    return Err(failed(&format!("at most {} users", record::USERS_MAX)));
                }
                let generation = record.generation();
                record.users.insert(name.clone(), User { hash: hash.clone(), generation, roles: Default::default() });
                Ok(Vec::new())
            })
            .await?;
        Ok(Response::new(AuthUserAddResponse { header: self.header(version) }))
    }

    async fn user_get(&self, request: Request<AuthUserGetRequest>) -> Result<Response<AuthUserGetResponse>, Status> {
        self.read(&request, |record, header| {
            let user = record.users.get(&request.get_ref().name).ok_or_else(|| failed("user name not found"))?;
            Ok(AuthUserGetResponse { header, roles: user.roles.iter().cloned().collect() })
        })
        .await
    }

    async fn user_list(&self, request: Request<AuthUserListRequest>) -> Result<Response<AuthUserListResponse>, Status> {
        self.read(&request, |record, header| Ok(AuthUserListResponse { header, users: record.users.keys().cloned().collect() })).await
    }

    async fn user_delete(&self, request: Request<AuthUserDeleteRequest>) -> Result<Response<AuthUserDeleteResponse>, Status> {
        self.require_admin(&request)?;
        let name = request.into_inner().name;
        let version = self
            .change(|record| {
                if record.enabled && name == record::ROOT {
                    return Err(invalid("invalid auth management"));
                }
                let user = record.users.remove(&name).ok_or_else(|| failed("user name not found"))?;
                Ok(user.roles.iter().map(|role| member(role, &name, true)).collect())
            })
            .await?;
        Ok(Response::new(AuthUserDeleteResponse { header: self.header(version) }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        self.require_admin(&request)?;
        let AuthUserChangePasswordRequest { name, password, hashed_password } = request.into_inner();
        if !hashed_password.is_empty() {
            return Err(invalid("hashed passwords (etcd's bcrypt) are not taken: send the password"));
        }
        let hash = hash(password).await?;
        let version = self
            .change(|record| {
                let generation = record.generation();
                let user = user_mut(record, &name)?;
                user.hash = hash.clone();
                // The user's tokens end with its old password.
                user.generation = generation;
                Ok(Vec::new())
            })
            .await?;
        Ok(Response::new(AuthUserChangePasswordResponse { header: self.header(version) }))
    }

    async fn user_grant_role(&self, request: Request<AuthUserGrantRoleRequest>) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        self.require_admin(&request)?;
        let AuthUserGrantRoleRequest { user, role } = request.into_inner();
        let version = self
            .change(|record| {
                if !record.roles.contains_key(&role) {
                    return Err(failed("role name not found"));
                }
                let held = user_mut(record, &user)?;
                if held.roles.len() >= record::ROLES_PER_USER_MAX && !held.roles.contains(&role) {
                    return Err(failed(&format!("a user holds at most {} roles", record::ROLES_PER_USER_MAX)));
                }
                held.roles.insert(role.clone());
                Ok(vec![member(&role, &user, false)])
            })
            .await?;
        Ok(Response::new(AuthUserGrantRoleResponse { header: self.header(version) }))
    }

    async fn user_revoke_role(&self, request: Request<AuthUserRevokeRoleRequest>) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        self.require_admin(&request)?;
        let AuthUserRevokeRoleRequest { name, role } = request.into_inner();
        let version = self
            .change(|record| {
                if record.enabled && name == record::ROOT && role == record::ROOT {
                    return Err(invalid("invalid auth management"));
                }
                if !user_mut(record, &name)?.roles.remove(&role) {
                    return Err(failed("role is not granted to the user"));
                }
                Ok(vec![member(&role, &name, true)])
            })
            .await?;
        Ok(Response::new(AuthUserRevokeRoleResponse { header: self.header(version) }))
    }

    async fn role_add(&self, request: Request<AuthRoleAddRequest>) -> Result<Response<AuthRoleAddResponse>, Status> {
        self.require_admin(&request)?;
        let name = request.into_inner().name;
        check_role_name(&name)?;
        let version = self
            .change(|record| {
                if record.roles.contains_key(&name) {
                    return Err(failed("role name already exists"));
                }
                if record.roles.len() >= record::ROLES_MAX {
                    return Err(failed(&format!("at most {} roles", record::ROLES_MAX)));
                }
                record.roles.insert(name.clone(), Role::default());
                Ok(if name == record::ROOT { grants_at(record, &name, "/") } else { Vec::new() })
            })
            .await?;
        Ok(Response::new(AuthRoleAddResponse { header: self.header(version) }))
    }

    async fn role_get(&self, request: Request<AuthRoleGetRequest>) -> Result<Response<AuthRoleGetResponse>, Status> {
        self.read(&request, |record, header| {
            let role = record.roles.get(&request.get_ref().role).ok_or_else(|| failed("role name not found"))?;
            let perm = role
                .permissions
                .iter()
                .map(|((key, range_end), kind)| Permission { perm_type: *kind, key: key.clone(), range_end: range_end.clone() })
                .collect();
            Ok(AuthRoleGetResponse { header, perm })
        })
        .await
    }

    async fn role_list(&self, request: Request<AuthRoleListRequest>) -> Result<Response<AuthRoleListResponse>, Status> {
        self.read(&request, |record, header| Ok(AuthRoleListResponse { header, roles: record.roles.keys().cloned().collect() })).await
    }

    async fn role_delete(&self, request: Request<AuthRoleDeleteRequest>) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        self.require_admin(&request)?;
        let name = request.into_inner().role;
        let version = self
            .change(|record| {
                if record.enabled && name == record::ROOT {
                    return Err(invalid("invalid auth management"));
                }
                let role = record.roles.get(&name).ok_or_else(|| failed("role name not found"))?;
                let mut prefixes: Vec<String> = role.permissions.keys().filter_map(|(key, end)| record::grant_prefix(key, end).ok()).collect();
                if name == record::ROOT {
                    prefixes.push("/".to_string());
                }
                prefixes.sort();
                prefixes.dedup();
                record.roles.remove(&name);
                let mut changes: Vec<AclChange> = prefixes.iter().flat_map(|prefix| grants_at(record, &name, prefix)).collect();
                for (user_name, user) in record.users.iter_mut() {
                    if user.roles.remove(&name) {
                        changes.push(member(&name, user_name, true));
                    }
                }
                Ok(changes)
            })
            .await?;
        Ok(Response::new(AuthRoleDeleteResponse { header: self.header(version) }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        self.require_admin(&request)?;
        let AuthRoleGrantPermissionRequest { name, perm } = request.into_inner();
        let perm = perm.ok_or_else(|| failed("permission not given"))?;
        let prefix = record::grant_prefix(&perm.key, &perm.range_end).map_err(invalid)?;
        let version = self
            .change(|record| {
                let role = record.roles.get_mut(&name).ok_or_else(|| failed("role name not found"))?;
                let range = (perm.key.clone(), perm.range_end.clone());
                if role.permissions.len() >= record::PERMISSIONS_PER_ROLE_MAX && !role.permissions.contains_key(&range) {
                    return Err(failed(&format!("a role holds at most {} permissions", record::PERMISSIONS_PER_ROLE_MAX)));
                }
                role.permissions.insert(range, perm.perm_type);
                Ok(grants_at(record, &name, &prefix))
            })
            .await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse { header: self.header(version) }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        self.require_admin(&request)?;
        let AuthRoleRevokePermissionRequest { role: name, key, range_end } = request.into_inner();
        let version = self
            .change(|record| {
                let role = record.roles.get_mut(&name).ok_or_else(|| failed("role name not found"))?;
                if role.permissions.remove(&(key.clone(), range_end.clone())).is_none() {
                    return Err(failed("permission is not granted to the role"));
                }
                Ok(record::grant_prefix(&key, &range_end).map(|prefix| grants_at(record, &name, &prefix)).unwrap_or_default())
            })
            .await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse { header: self.header(version) }))
    }
}

/// The token check before every etcd call's principal is read: a call with a `token` of an
/// enabled record is served as its user's principal (the connection's identity replaced);
/// a token naming nobody is refused as etcd does.
impl Authenticate for EtcdAuth {
    async fn authenticate(&self, request: &mut http::Request<Body>) -> Result<(), Status> {
        let Some(token) = request.headers().get(TOKEN_HEADER).and_then(|value| value.to_str().ok()) else { return Ok(()) };
        if let Some(user) = self.user_of(token).await? {
            if let Some(peer) = request.extensions_mut().get_mut::<PeerInfo>() {
                peer.identity = Some(Identity::client(&record::principal(&user)));
            }
        }
        Ok(())
    }
}
