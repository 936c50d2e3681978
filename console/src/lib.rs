//! toolfleet's web console (decision 0050): the jobs with their
//! transcripts, for the people in the loop, served as HTML by
//! `toolfleet console`.
//!
//! A client of the public API and nothing more: every page is an
//! `AgentService` call made with the signed-in person's own credential,
//! so it can never show more than that person may see. It keeps no state
//! but sessions, in Redis (module `session`).

mod oidc;
mod pages;
mod session;
mod web;

pub use oidc::OidcOptions;
pub use session::RedisTls;

use std::time::Duration;

use anyhow::Context as _;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use tonic::transport::Channel;
use toolfleet_proto::v1;
use toolfleet_proto::v1::agent_service_client::AgentServiceClient;

use session::{Session, Sessions};

/// The page's stylesheet, embedded: the console is one binary.
const STYLESHEET: &str = include_str!("../assets/console.css");

/// The pages' one script (live updates), embedded; served from the
/// console's origin, as the Content-Security-Policy allows.
const SCRIPT: &str = include_str!("../assets/console.js");

/// How the console serves.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    /// The Redis its sessions live in (the fleet's, with the console's
    /// user: docs/console.md).
    pub redis_url: String,
    /// The password of the URL's user, when the URL does not carry it (a
    /// Secret's, through the environment: any character, no escaping).
    pub redis_password: Option<String>,
    /// TLS to that Redis beyond a `rediss://` URL and the system's roots.
    pub redis_tls: RedisTls,
    /// The prefix of its Redis keys (the fleet's `store.key_prefix`).
    pub key_prefix: String,
    /// How long a session lasts without signing in again (at most the
    /// lifetime of a provider's token).
    pub session_ttl: Duration,
    /// Sign-in with an OpenID provider, beside tokens.
    pub oidc: Option<OidcOptions>,
    /// A tracing UI's address of a trace, `{trace_id}` standing for its id
    /// (`https://jaeger.example.com/trace/{trace_id}`): a job's trace id
    /// links there.
    pub trace_url: Option<String>,
}

/// The console's state, shared by every request.
#[derive(Clone)]
struct Console {
    channel: Channel,
    sessions: Sessions,
    /// The orchestrators run without authentication (`api.auth = "none"`):
    /// no sign-in, a banner on every page.
    open: bool,
    /// The OpenID provider people sign in with, if any.
    oidc: Option<oidc::Provider>,
    /// Where a trace id links (`{trace_id}` in it).
    trace_url: Option<String>,
}

/// Serves the console of the fleet behind `channel` on `listener` until
/// `stop`, once its Redis and the orchestrator answer (it waits for them,
/// logging why).
///
/// # Errors
///
/// The Redis settings are wrong (a file named is missing), or serving
/// fails.
pub async fn serve(
    channel: Channel,
    options: ConsoleOptions,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Shared: what is waited for at start is raced with it, then the
    // server is.
    let stop = futures::FutureExt::shared(Box::pin(stop));
    let client = session::client(&options)?;
    let Some(redis) = until(stop.clone(), reach_redis(client)).await else {
        return Ok(());
    };
    let Some(open) = until(stop.clone(), api_is_open(&channel)).await else {
        return Ok(());
    };
    let console = Console {
        channel,
        oidc: options
            .oidc
            .map(|oidc| oidc::Provider::new(oidc, redis.clone(), &options.key_prefix)),
        sessions: Sessions::new(redis, &options.key_prefix, options.session_ttl),
        open,
        trace_url: options.trace_url,
    };
    let app = axum::Router::new()
        .route("/", get(|| async { Redirect::to("/jobs") }))
        .route("/sign-in", get(pages::sign_in_form).post(pages::sign_in))
        .route("/sign-out", post(pages::sign_out))
        .route("/sign-in/oidc", get(pages::oidc_start))
        .route("/oidc/callback", get(pages::oidc_callback))
        .route("/jobs", get(pages::jobs))
        .route("/jobs/live", get(pages::jobs_live))
        .route("/jobs/{id}", get(pages::job))
        .route("/jobs/{id}/cancel", post(pages::cancel))
        .route("/jobs/{id}/events", get(pages::events))
        .route("/jobs/{id}/items/{index}", get(pages::item))
        .route("/approvals", get(pages::approvals))
        .route("/tools", get(pages::tools))
        .route("/approvals/decide", post(pages::decide))
        .route("/assets/console.css", get(stylesheet))
        .route("/assets/console.js", get(script))
        .route("/healthz", get(|| async { "ok" }))
        .layer(axum::middleware::from_fn(web::secure_headers))
        .with_state(console);
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
        .context("the console stopped serving")
}

/// How long the console waits before it asks again for what it needs at
/// start (Redis, the API's answer) while that is not there yet: it may
/// start before them, and waits as the services do (decision 0007).
const START_RETRY: Duration = Duration::from_secs(1);

/// `work`, unless `stop` comes first.
async fn until<T>(
    stop: impl std::future::Future<Output = ()>,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        () = stop => None,
        done = work => Some(done),
    }
}

/// The connection to the sessions' Redis, once it answers.
async fn reach_redis(client: redis::Client) -> redis::aio::ConnectionManager {
    let mut told = false;
    loop {
        match redis::aio::ConnectionManager::new(client.clone()).await {
            Ok(redis) => return redis,
            Err(err) if !told => {
                tracing::warn!(
                    error = %err,
                    "waiting for Redis (--redis-url), where the console keeps its sessions"
                );
                told = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(START_RETRY).await;
    }
}

/// Whether the API lets anyone in (`api.auth = "none"`): `WhoAmI` asked
/// without a token until it says yes or asks for one. An orchestrator that
/// is still starting says neither.
async fn api_is_open(channel: &Channel) -> bool {
    let mut told = false;
    loop {
        match AgentServiceClient::new(channel.clone())
            .who_am_i(v1::WhoAmIRequest {})
            .await
        {
            Ok(_) => return true,
            Err(status) if status.code() == tonic::Code::Unauthenticated => return false,
            Err(status) if !told => {
                tracing::warn!(
                    code = ?status.code(),
                    "waiting for the orchestrator to say whether it needs a sign-in"
                );
                told = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(START_RETRY).await;
    }
}

async fn script() -> Response {
    let js = [(
        axum::http::header::CONTENT_TYPE,
        "text/javascript; charset=utf-8",
    )];
    (js, SCRIPT).into_response()
}

async fn stylesheet() -> Response {
    let css = [(axum::http::header::CONTENT_TYPE, "text/css; charset=utf-8")];
    (css, STYLESHEET).into_response()
}

impl Console {
    /// The person a request comes from: its session; the anonymous caller
    /// when authentication is off.
    ///
    /// # Errors
    ///
    /// [`web::NoSession`]: the sign-in page, or the store is down.
    async fn signed_in(&self, headers: &HeaderMap) -> Result<Session, web::NoSession> {
        if self.open {
            return Ok(Session {
                token: String::new(),
                tenant: "default".to_owned(),
                person: "anyone".to_owned(),
                roles: ["agent", "approver", "operator", "reader"]
                    .map(str::to_owned)
                    .to_vec(),
                csrf: "open".to_owned(),
            });
        }
        let id = web::cookie(headers, web::SESSION_COOKIE).ok_or(web::NoSession::SignIn)?;
        match self.sessions.find(id).await {
            Ok(Some(session)) => Ok(session),
            Ok(None) => Err(web::NoSession::Expired),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read a session from Redis");
                Err(web::NoSession::StoreDown)
            }
        }
    }

    /// A client of the API, as the session's person.
    fn api(&self) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel.clone())
    }
}

/// A handler's person: the request's session (the anonymous caller when
/// authentication is off), or the sign-in page.
impl axum::extract::FromRequestParts<Console> for Session {
    type Rejection = web::NoSession;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        console: &Console,
    ) -> Result<Self, Self::Rejection> {
        console.signed_in(&parts.headers).await
    }
}

/// A job the path names (`/jobs/{id}`...): a job id, or no such job,
/// before anything of it reaches the API.
pub(crate) struct JobPath(pub toolfleet_proto::JobId);

impl axum::extract::FromRequestParts<Console> for JobPath {
    type Rejection = web::NoSuchJob;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        console: &Console,
    ) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(id) =
            axum::extract::Path::<String>::from_request_parts(parts, console)
                .await
                .map_err(|_| web::NoSuchJob)?;
        toolfleet_proto::JobId::parse(&id)
            .map(JobPath)
            .ok_or(web::NoSuchJob)
    }
}

/// `message` as a request of `session`'s person (their bearer token).
fn as_person<T>(session: &Session, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if !session.token.is_empty()
        && let Ok(value) = format!("Bearer {}", session.token).parse()
    {
        request.metadata_mut().insert("authorization", value);
    }
    request
}
