//! Signing in with a token, and out.
//!
//! The token goes to the API's `WhoAmI`; if the API knows it, a session
//! holds it server-side and the browser gets only the session's cookie.

use askama::Template;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{AppendHeaders, IntoResponse, Redirect, Response};
use serde::Deserialize;
use toolfleet_proto::v1;

use super::{Chrome, html};
use crate::session::{Session, random_hex};
use crate::web::{self, FLOW_COOKIE, SESSION_COOKIE, SIGN_IN_COOKIE};
use crate::{Console, as_person, oidc};

/// Longest token accepted, as the API's `api.identity.max_token_bytes`.
const MAX_TOKEN_BYTES: usize = 8192;

/// How long a sign-in form stays good, in seconds.
const FORM_SECONDS: u64 = 600;

#[derive(Template)]
#[template(path = "sign_in.html")]
struct SignIn<'a> {
    chrome: Chrome<'a>,
    csrf: String,
    expired: bool,
    refused: Option<String>,
    /// The OpenID provider's issuer, when the console signs in with one.
    provider: Option<String>,
}

/// The page of a person just back from the OpenID provider, which moves
/// on to the person's first page.
#[derive(Template)]
#[template(path = "signed_in.html")]
struct SignedIn<'a> {
    chrome: Chrome<'a>,
    landing: &'static str,
}

/// Where a person signing in comes from.
enum Arrival {
    /// This console's sign-in form.
    Form,
    /// The OpenID provider's redirect.
    Provider,
}

#[derive(Deserialize)]
pub(crate) struct Shown {
    #[serde(default)]
    expired: Option<String>,
}

/// The sign-in page, with a fresh CSRF token in the form and its cookie.
pub(crate) async fn sign_in_form(
    State(console): State<Console>,
    Query(shown): Query<Shown>,
) -> Response {
    if console.open {
        return Redirect::to("/jobs").into_response();
    }
    form(&console, shown.expired.is_some(), None, StatusCode::OK)
}

fn form(console: &Console, expired: bool, refused: Option<String>, status: StatusCode) -> Response {
    let csrf = random_hex();
    let page = SignIn {
        chrome: Chrome::default(),
        csrf: csrf.clone(),
        expired,
        refused,
        provider: console.oidc.as_ref().map(|p| p.issuer().to_owned()),
    };
    let cookie = web::set_cookie(SIGN_IN_COOKIE, &csrf, FORM_SECONDS);
    (status, [(header::SET_COOKIE, cookie)], html(&page)).into_response()
}

#[derive(Deserialize)]
pub(crate) struct Credentials {
    csrf: String,
    token: String,
}

/// Signs in with the form's token, if the API knows it.
pub(crate) async fn sign_in(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(sent): Form<Credentials>,
) -> Response {
    let expected = web::cookie(&headers, SIGN_IN_COOKIE).unwrap_or_default();
    if let Err(refused) = web::check_form(&headers, &sent.csrf, expected) {
        return refused.into_response();
    }
    let token = sent.token.trim();
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES || !token.is_ascii() {
        let why = "That is not a token: paste the whole token, as toolfleet --token takes it.";
        return form(
            &console,
            false,
            Some(why.to_owned()),
            StatusCode::UNAUTHORIZED,
        );
    }
    open_session(&console, token.to_owned(), None, Arrival::Form).await
}

/// Opens a session for `token` if the API knows it (`WhoAmI`), for at
/// most `lifetime` (the token's own), and sends the browser, arrived by
/// `arrival`, to its first page; the sign-in form with the API's reason
/// otherwise.
async fn open_session(
    console: &Console,
    token: String,
    lifetime: Option<std::time::Duration>,
    arrival: Arrival,
) -> Response {
    let unknown = Session {
        token,
        tenant: String::new(),
        person: String::new(),
        roles: Vec::new(),
        csrf: random_hex(),
    };
    let who = console
        .api()
        .who_am_i(as_person(&unknown, v1::WhoAmIRequest {}))
        .await;
    let who = match who {
        Ok(who) => who.into_inner(),
        Err(status) if status.code() == tonic::Code::Unauthenticated => {
            // The API's reason names the check, never the token.
            let why = format!("The orchestrator refused this token: {}", status.message());
            return form(console, false, Some(why), StatusCode::UNAUTHORIZED);
        }
        Err(status) => return web::api_failed(&status),
    };
    let session = Session {
        tenant: who.tenant,
        person: if who.person.is_empty() {
            "(a token)".to_owned()
        } else {
            who.person
        },
        roles: who.roles,
        ..unknown
    };
    let ttl = lifetime.map_or(console.sessions.ttl(), |own| {
        own.min(console.sessions.ttl())
    });
    match console.sessions.create(&session, ttl).await {
        Ok(id) => {
            // Appended: an array of headers would keep only the last cookie.
            let cookies = AppendHeaders([
                (
                    header::SET_COOKIE,
                    web::set_cookie(SESSION_COOKIE, &id, ttl.as_secs()),
                ),
                (header::SET_COOKIE, web::set_cookie(SIGN_IN_COOKIE, "", 0)),
                (header::SET_COOKIE, web::set_flow_cookie(FLOW_COOKIE, "", 0)),
            ]);
            match arrival {
                Arrival::Form => (cookies, Redirect::to(landing(&session))).into_response(),
                // Back from the provider's site: a browser sends no
                // `SameSite=Strict` cookie along a redirect that began on
                // another site, so the session's first page is asked for
                // from this page instead.
                Arrival::Provider => {
                    let page = SignedIn {
                        chrome: Chrome::default(),
                        landing: landing(&session),
                    };
                    (cookies, html(&page)).into_response()
                }
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "cannot store a session in Redis");
            web::problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "The console cannot reach its sessions' store. Try again in a moment.",
            )
        }
    }
}

/// The first page of a person: the jobs, or, for one who may not read
/// them (an approver alone), the held calls.
fn landing(session: &Session) -> &'static str {
    if ["agent", "operator", "reader"]
        .iter()
        .any(|r| session.has(r))
    {
        "/jobs"
    } else {
        "/approvals"
    }
}

#[derive(Deserialize)]
pub(crate) struct Hint {
    #[serde(default)]
    login_hint: Option<String>,
}

/// Sends the browser to the OpenID provider to sign in (authorization
/// code with PKCE); the flow's state goes into a cookie of its own.
pub(crate) async fn oidc_start(
    State(console): State<Console>,
    Query(hint): Query<Hint>,
) -> Response {
    let Some(provider) = &console.oidc else {
        return web::problem(
            StatusCode::NOT_FOUND,
            "This console signs in with tokens only.",
        );
    };
    let hint = hint
        .login_hint
        .filter(|h| h.len() <= 256 && !h.chars().any(char::is_control));
    match provider.start(hint.as_deref()).await {
        Ok(started) => {
            let cookie = web::set_flow_cookie(FLOW_COOKIE, &started.state, oidc::FLOW_SECONDS);
            ([(header::SET_COOKIE, cookie)], Redirect::to(&started.url)).into_response()
        }
        Err(err) => {
            tracing::warn!(error = %err, "cannot start a sign-in at the OpenID provider");
            web::problem(
                StatusCode::BAD_GATEWAY,
                "The identity provider did not answer. Try again, or sign in with a token.",
            )
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct Callback {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    error: Option<String>,
}

/// Where the provider sends the browser back: the code is exchanged for
/// the person's token, which opens a session.
pub(crate) async fn oidc_callback(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(back): Query<Callback>,
) -> Response {
    let Some(provider) = &console.oidc else {
        return web::problem(
            StatusCode::NOT_FOUND,
            "This console signs in with tokens only.",
        );
    };
    // The flow must be this browser's own: its cookie names the state.
    let started_here = web::cookie(&headers, FLOW_COOKIE)
        .is_some_and(|state| !state.is_empty() && web::same_secret(state, &back.state));
    if !started_here {
        return web::StaleForm.into_response();
    }
    let code = match (back.code, back.error) {
        (Some(code), None) if code.len() <= 2048 => code,
        (_, error) => {
            // The provider's error code is a word of RFC 6749; anything
            // else it sends is not shown.
            let error = error.filter(|e| {
                e.len() <= 64 && e.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            });
            let why = format!(
                "The identity provider did not sign you in ({}).",
                error.as_deref().unwrap_or("no code")
            );
            return form(&console, false, Some(why), StatusCode::UNAUTHORIZED);
        }
    };
    match provider.finish(&back.state, &code).await {
        Ok(token) => {
            let (token, lifetime) = (token.access_token, token.lifetime);
            open_session(&console, token, lifetime, Arrival::Provider).await
        }
        Err(err) => {
            tracing::warn!(error = %err, "cannot finish a sign-in at the OpenID provider");
            let why = "The sign-in could not be finished. Try again.".to_owned();
            form(&console, false, Some(why), StatusCode::UNAUTHORIZED)
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct Checked {
    csrf: String,
}

/// Ends the session: every replica refuses its cookie from now on.
pub(crate) async fn sign_out(
    State(console): State<Console>,
    session: Session,
    headers: HeaderMap,
    Form(sent): Form<Checked>,
) -> Response {
    if let Err(refused) = web::check_form(&headers, &sent.csrf, &session.csrf) {
        return refused.into_response();
    }
    if let Some(id) = web::cookie(&headers, SESSION_COOKIE)
        && let Err(err) = console.sessions.end(id).await
    {
        tracing::warn!(error = %err, "cannot end a session in Redis");
        return web::problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "The console cannot reach its sessions' store, so you are still signed in. Try again.",
        );
    }
    let cookie = [(header::SET_COOKIE, web::set_cookie(SESSION_COOKIE, "", 0))];
    (cookie, Redirect::to("/sign-in")).into_response()
}
