//! The API's door: every request is authenticated before its RPC runs.
//!
//! An async service rather than tonic's interceptor, which is synchronous:
//! a JWT may wait for its issuer's keys (bounded by
//! `api.identity.keys_timeout`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower_service::Service;

use super::Authenticator;

/// `inner`, reached only by requests whose caller [`Authenticator`] knows;
/// the [`super::Caller`] goes into the request's extensions.
#[derive(Debug, Clone)]
pub(crate) struct Authenticated<S> {
    inner: S,
    auth: Authenticator,
}

impl<S> Authenticated<S> {
    pub(crate) fn new(inner: S, auth: Authenticator) -> Self {
        Self { inner, auth }
    }
}

impl<S: NamedService> NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Authenticated<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The clone that was polled ready serves this request; the fresh
        // one waits for the next `poll_ready` (tower's rule for services
        // moved into a future).
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let auth = self.auth.clone();
        Box::pin(async move {
            let certificates = request
                .extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(TlsConnectInfo::peer_certs);
            let caller = auth
                .caller(
                    request.headers(),
                    certificates.as_deref().map(Vec::as_slice),
                )
                .await;
            match caller {
                Ok(caller) => {
                    request.extensions_mut().insert(caller);
                    inner.call(request).await
                }
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}
