//! Whom the router forwards each call for. [`WithPrincipal`] wraps each of the router's
//! public services: every call runs in a task-local scope naming the principal its
//! connection's client certificate or bearer token proved (or, first, an [`Authenticate`]
//! step: the etcd API's tokens name their users), and every request the router sends a node in
//! that scope ([`crate::batch::Upstream::forward`], the watch proxy) carries it in the
//! [`PRINCIPAL_HEADER`] metadata (or its batch item's `principal`). A node believes that
//! header only over a connection whose certificate is a router's. Streams the router serves
//! from tasks of their own capture [`current`] and run in [`scoped`].

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::codegen::{http, Service};
use tonic::server::NamedService;
use warden_proto::tls::{PeerInfo, Role, PRINCIPAL_HEADER};

tokio::task_local! {
    static CURRENT: Option<Arc<str>>;
}

/// The principal of the call this task serves (`None`: security off, or outside a call).
pub fn current() -> Option<Arc<str>> {
    CURRENT.try_with(Clone::clone).ok().flatten()
}

/// Runs `future` as serving a call for `principal` (a stream's task, with what the call's
/// handler saw in [`current`]).
pub async fn scoped<F: Future>(principal: Option<Arc<str>>, future: F) -> F::Output {
    CURRENT.scope(principal, future).await
}

/// Names [`current`] in `request`'s metadata, for the node it goes to.
pub fn name_in<T>(request: &mut tonic::Request<T>) {
    if let Some(value) = current().and_then(|principal| principal.parse().ok()) {
        request.metadata_mut().insert(PRINCIPAL_HEADER, value);
    }
}

/// A step that runs before a call's principal is read, and may answer the call itself:
/// the etcd API's token check names the token's user as the caller.
pub trait Authenticate: Clone + Send + Sync + 'static {
    /// Prepares `request` (e.g. replaces its [`PeerInfo`]'s identity), or refuses it with
    /// the status to answer.
    fn authenticate(&self, request: &mut http::Request<Body>) -> impl Future<Output = Result<(), tonic::Status>> + Send;
}

/// No step before: the connection's client certificate or bearer token names the caller.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByConnection;

impl Authenticate for ByConnection {
    async fn authenticate(&self, _request: &mut http::Request<Body>) -> Result<(), tonic::Status> {
        Ok(())
    }
}

/// A public service of the router, each call in the scope of its principal (found by
/// `A`, then read from the connection).
#[derive(Clone)]
pub struct WithPrincipal<S, A = ByConnection> {
    inner: S,
    authenticate: A,
}

impl<S> WithPrincipal<S> {
    /// Wraps `inner`: the connection names each call's principal.
    pub fn new(inner: S) -> WithPrincipal<S> {
        WithPrincipal { inner, authenticate: ByConnection }
    }
}

impl<S, A: Authenticate> WithPrincipal<S, A> {
    /// Wraps `inner`: `authenticate` runs first on each call.
    pub fn authenticated(inner: S, authenticate: A) -> WithPrincipal<S, A> {
        WithPrincipal { inner, authenticate }
    }
}

impl<S: NamedService, A> NamedService for WithPrincipal<S, A> {
    const NAME: &'static str = S::NAME;
}

impl<S, A> Service<http::Request<Body>> for WithPrincipal<S, A>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    A: Authenticate,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The service made ready is the one called; its clone waits for the next call.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let authenticate = self.authenticate.clone();
        Box::pin(async move {
            if let Err(status) = authenticate.authenticate(&mut request).await {
                return Ok(status.into_http());
            }
            CURRENT.scope(principal_of(&request), inner.call(request)).await
        })
    }
}

/// The principal a call to the router is for: its client certificate's name, or its bearer
/// token's (a router forwards for clients only; the handler refuses anyone else).
fn principal_of(request: &http::Request<Body>) -> Option<Arc<str>> {
    let peer = request.extensions().get::<PeerInfo>()?;
    match &peer.identity {
        Some(identity) if identity.role == Role::Client => Some(Arc::from(identity.name.as_str())),
        Some(_) => None,
        None => {
            let metadata = tonic::metadata::MetadataMap::from_headers(request.headers().clone());
            peer.tokens.as_ref()?.principal_of(&metadata).map(Arc::from)
        }
    }
}
