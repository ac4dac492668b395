//! Whom the router forwards each call for. [`WithPrincipal`] wraps the router's
//! public service: every call runs in a task-local scope naming the principal its
//! connection's client certificate proved, and every request the router sends a node in
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

/// The router's public service, each call in the scope of its principal.
#[derive(Clone)]
pub struct WithPrincipal<S> {
    inner: S,
}

impl<S> WithPrincipal<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> WithPrincipal<S> {
        WithPrincipal { inner }
    }
}

impl<S: NamedService> NamedService for WithPrincipal<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for WithPrincipal<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        Box::pin(CURRENT.scope(principal_of(&request), self.inner.call(request)))
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
