//! What every page shares: the security headers, the session cookie, the
//! check of a form's CSRF token and origin, and errors as pages.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

/// The session cookie. `__Host-`: only set over a secure connection (a
/// browser counts `localhost` as one), for this host and every path.
pub(crate) const SESSION_COOKIE: &str = "__Host-toolfleet-session";

/// The cookie of a sign-in form's CSRF token, before there is a session.
pub(crate) const SIGN_IN_COOKIE: &str = "__Host-toolfleet-sign-in";

/// The cookie of a sign-in at the OpenID provider: the flow's `state`,
/// so that only the browser that started it can finish it.
pub(crate) const FLOW_COOKIE: &str = "__Host-toolfleet-flow";

/// Scripts and styles from this origin only, nothing inline, no frames, no
/// forms to elsewhere: every string a page shows came from a model, a tool
/// or a client, and none may run.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; \
    frame-ancestors 'none'; base-uri 'none'";

/// Adds the headers every answer carries.
pub(crate) async fn secure_headers(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Not `no-referrer`: with it a browser sends `Origin: null` on a form,
        // which the CSRF check then refuses.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// A `Set-Cookie` for `name` = `value` that scripts cannot read, sent only
/// over secure connections and only with requests from this site's pages;
/// `max_age` 0 deletes it.
pub(crate) fn set_cookie(name: &str, value: &str, max_age: u64) -> HeaderValue {
    cookie_header(name, value, max_age, "Strict")
}

/// [`set_cookie`], but sent also when another site sends the browser here
/// by a link or a redirect (`SameSite=Lax`): the cookie of a sign-in at an
/// OpenID provider, which comes back from the provider's site. It binds
/// the flow to this browser and opens nothing by itself.
pub(crate) fn set_flow_cookie(name: &str, value: &str, max_age: u64) -> HeaderValue {
    cookie_header(name, value, max_age, "Lax")
}

fn cookie_header(name: &str, value: &str, max_age: u64, same_site: &str) -> HeaderValue {
    let cookie = format!(
        "{name}={value}; Path=/; Max-Age={max_age}; HttpOnly; Secure; SameSite={same_site}"
    );
    HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Whether two secrets are equal, in a time that does not say where they
/// differ.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |differ, (x, y)| differ | (x ^ y))
            == 0
}

/// A form refused: 403, saying to reload the page.
#[derive(Debug)]
pub(crate) struct StaleForm;

impl IntoResponse for StaleForm {
    fn into_response(self) -> Response {
        problem(
            StatusCode::FORBIDDEN,
            "This form is out of date or came from another site. Reload the page and try again.",
        )
    }
}

/// A path that names no job: 404, as for a job that does not exist.
#[derive(Debug)]
pub(crate) struct NoSuchJob;

impl IntoResponse for NoSuchJob {
    fn into_response(self) -> Response {
        problem(StatusCode::NOT_FOUND, "No such job.")
    }
}

/// Why a request has no person: it goes to sign in, or the sessions'
/// store is down.
#[derive(Debug)]
pub(crate) enum NoSession {
    /// No session cookie.
    SignIn,
    /// A cookie of a session that ended.
    Expired,
    /// Redis did not answer.
    StoreDown,
}

impl IntoResponse for NoSession {
    fn into_response(self) -> Response {
        match self {
            Self::SignIn => Redirect::to("/sign-in").into_response(),
            Self::Expired => Redirect::to("/sign-in?expired=1").into_response(),
            Self::StoreDown => problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "The console cannot reach its sessions' store. Try again in a moment.",
            ),
        }
    }
}

/// Refuses a state-changing request whose form does not carry `expected`
/// as its CSRF token, or that a page of another origin sent (`Origin`,
/// which browsers send with every POST).
///
/// # Errors
///
/// [`StaleForm`].
pub(crate) fn check_form(headers: &HeaderMap, sent: &str, expected: &str) -> Result<(), StaleForm> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    let same_origin = match (origin, host) {
        (None, _) => true,
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority == host),
        (Some(_), None) => false,
    };
    if same_origin && !expected.is_empty() && same_secret(sent, expected) {
        return Ok(());
    }
    Err(StaleForm)
}

/// A page that says what went wrong, in words.
pub(crate) fn problem(status: StatusCode, message: &str) -> Response {
    let page = crate::pages::Problem {
        chrome: crate::pages::Chrome::default(),
        status: status.as_u16(),
        message,
    };
    (status, crate::pages::html(&page)).into_response()
}

/// The answer to an API call that failed: sign in again, not found, not
/// allowed, or the API's own words.
pub(crate) fn api_failed(status: &tonic::Status) -> Response {
    match status.code() {
        tonic::Code::Unauthenticated => Redirect::to("/sign-in?expired=1").into_response(),
        tonic::Code::NotFound => problem(StatusCode::NOT_FOUND, status.message()),
        tonic::Code::PermissionDenied => problem(StatusCode::FORBIDDEN, status.message()),
        tonic::Code::InvalidArgument => problem(StatusCode::BAD_REQUEST, status.message()),
        _ => problem(
            StatusCode::BAD_GATEWAY,
            &format!("The orchestrator did not answer: {}", status.message()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_read_by_exact_name() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, "a=1; b=2".parse().unwrap());
        headers.append(
            header::COOKIE,
            "__Host-toolfleet-session=abc".parse().unwrap(),
        );
        assert_eq!(cookie(&headers, "b"), Some("2"));
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
        assert_eq!(cookie(&headers, "__Host-toolfleet"), None);
    }

    #[test]
    fn a_form_passes_only_with_its_token_from_this_origin() {
        let headers = |origin: Option<&str>| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, "console.example:8080".parse().unwrap());
            if let Some(origin) = origin {
                headers.insert(header::ORIGIN, origin.parse().unwrap());
            }
            headers
        };
        let same = headers(Some("https://console.example:8080"));
        assert!(check_form(&same, "t0k", "t0k").is_ok());
        assert!(check_form(&headers(None), "t0k", "t0k").is_ok());
        assert!(check_form(&same, "t0x", "t0k").is_err());
        assert!(check_form(&same, "", "").is_err(), "no token is no token");
        assert!(check_form(&headers(Some("https://evil.example")), "t0k", "t0k").is_err());
        assert!(same_secret("abc", "abc") && !same_secret("abc", "abd") && !same_secret("a", "ab"));
    }
}
