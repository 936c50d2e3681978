//! The gateway as an OAuth protected resource (the MCP authorization spec,
//! RFC 9728): it publishes which authorization servers sign its clients in
//! (`/.well-known/oauth-protected-resource`), and a request without a token
//! the orchestrator accepts gets 401 with a `WWW-Authenticate` challenge
//! that points there. A hosted MCP client can then add the fleet by its URL
//! and sign its person in.
//!
//! The gateway checks no token itself: it relays each to the API, which
//! accepts a JWT minted for the gateway's resource URL only when it comes
//! through the gateway's certificate (`[gateways.<name>] resource`,
//! docs/security.md).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The well-known path of protected resource metadata (RFC 9728 §3).
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// What the gateway says of itself as a protected resource.
#[derive(Debug, Clone)]
pub struct ProtectedResource {
    /// The gateway's resource URL, as clients reach it (`--resource-url`):
    /// the audience of the tokens it is given.
    resource: String,
    /// The issuers that sign its clients in (`--authorization-server`).
    authorization_servers: Vec<String>,
    /// The scopes it names (`--scope`): what a client asks for.
    scopes: Vec<String>,
}

impl ProtectedResource {
    /// The resource at `resource` (an absolute `https://` URL, or `http://`
    /// for a local test), signed in to by `authorization_servers`, asking
    /// for `scopes`.
    ///
    /// # Errors
    ///
    /// A URL that is not one, or no authorization server.
    pub fn new(
        resource: &str,
        authorization_servers: Vec<String>,
        scopes: Vec<String>,
    ) -> anyhow::Result<Self> {
        let url = url::Url::parse(resource)
            .map_err(|err| anyhow::anyhow!("--resource-url {resource:?}: {err}"))?;
        anyhow::ensure!(
            matches!(url.scheme(), "https" | "http")
                && url.host().is_some()
                && url.fragment().is_none()
                && url.query().is_none(),
            "--resource-url {resource:?}: an https:// URL without a query or fragment, as \
             clients reach the gateway (https://mcp.example.com/mcp)"
        );
        anyhow::ensure!(
            !authorization_servers.is_empty(),
            "--resource-url needs at least one --authorization-server: the issuer that signs \
             the gateway's clients in"
        );
        for server in &authorization_servers {
            url::Url::parse(server)
                .map_err(|err| anyhow::anyhow!("--authorization-server {server:?}: {err}"))?;
        }
        anyhow::ensure!(
            scopes
                .iter()
                .all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() && b != b'"')),
            "--scope: a scope is printable ASCII without spaces or quotes"
        );
        Ok(Self {
            resource: resource.to_owned(),
            authorization_servers,
            scopes,
        })
    }

    /// The paths the metadata is served at: the well-known path with the
    /// resource's path appended (RFC 9728 §3.1), and the bare one, which
    /// clients of an older draft ask.
    pub(crate) fn metadata_paths(&self) -> Vec<String> {
        let mut paths = vec![WELL_KNOWN.to_owned()];
        let path = self.resource_path();
        if !path.is_empty() {
            paths.push(format!("{WELL_KNOWN}{path}"));
        }
        paths
    }

    fn resource_path(&self) -> String {
        url::Url::parse(&self.resource)
            .map(|url| url.path().trim_end_matches('/').to_owned())
            .unwrap_or_default()
    }

    /// Where a client finds the metadata.
    fn metadata_url(&self) -> String {
        let origin = url::Url::parse(&self.resource)
            .map(|url| url.origin().ascii_serialization())
            .unwrap_or_default();
        format!("{origin}{WELL_KNOWN}{}", self.resource_path())
    }

    /// The metadata document.
    pub(crate) fn metadata(&self) -> Response {
        let document = json!({
            "resource": self.resource,
            "authorization_servers": self.authorization_servers,
            "scopes_supported": self.scopes,
            "bearer_methods_supported": ["header"],
            "resource_name": "toolfleet",
        });
        // Public, and read by clients running in web pages.
        let headers = [
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
            (header::CONTENT_TYPE, "application/json"),
        ];
        (headers, document.to_string()).into_response()
    }

    /// The `WWW-Authenticate` of a 401: where the metadata is, what to ask
    /// for, and, when a token came and was refused, `invalid_token`.
    fn challenge(&self, refused: bool) -> HeaderValue {
        let mut value = format!("Bearer resource_metadata=\"{}\"", self.metadata_url());
        if !self.scopes.is_empty() {
            value.push_str(&format!(", scope=\"{}\"", self.scopes.join(" ")));
        }
        if refused {
            value.push_str(", error=\"invalid_token\"");
        }
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }
}

/// The 401 of a request without a token (`refused`: with one the
/// orchestrator refused), saying `why`: the API's reason, which names the
/// check that failed and never the token.
pub(crate) fn unauthorized(
    resource: Option<&ProtectedResource>,
    refused: bool,
    why: String,
) -> Response {
    let challenge = resource.map_or_else(
        || HeaderValue::from_static("Bearer"),
        |resource| resource.challenge(refused),
    );
    let headers = [(header::WWW_AUTHENTICATE, challenge)];
    (StatusCode::UNAUTHORIZED, headers, why).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway() -> ProtectedResource {
        ProtectedResource::new(
            "https://mcp.example.com/mcp",
            vec!["https://id.example.com/realms/acme".into()],
            vec!["agent".into(), "reader".into()],
        )
        .unwrap()
    }

    #[test]
    fn the_challenge_points_at_the_metadata_of_the_resource() {
        let gateway = gateway();
        assert_eq!(
            gateway.metadata_paths(),
            [
                "/.well-known/oauth-protected-resource",
                "/.well-known/oauth-protected-resource/mcp"
            ]
        );
        assert_eq!(
            gateway.challenge(false),
            "Bearer resource_metadata=\"https://mcp.example.com/.well-known/\
             oauth-protected-resource/mcp\", scope=\"agent reader\""
        );
        assert!(
            gateway
                .challenge(true)
                .to_str()
                .unwrap()
                .ends_with(", error=\"invalid_token\"")
        );
    }

    #[test]
    fn a_resource_that_cannot_be_one_is_refused_with_what_to_give() {
        let issuers = || vec!["https://id.example.com".to_owned()];
        for (resource, servers, scopes, expected) in [
            ("mcp.example.com", issuers(), vec![], "relative URL"),
            (
                "ftp://mcp.example.com/mcp",
                issuers(),
                vec![],
                "an https:// URL",
            ),
            (
                "https://mcp.example.com/mcp#x",
                issuers(),
                vec![],
                "without a query",
            ),
            (
                "https://mcp.example.com/mcp",
                vec![],
                vec![],
                "--authorization-server",
            ),
            (
                "https://mcp.example.com/mcp",
                issuers(),
                vec!["a b".to_owned()],
                "without spaces",
            ),
        ] {
            let refused = ProtectedResource::new(resource, servers, scopes).unwrap_err();
            assert!(
                refused.to_string().contains(expected),
                "{resource}: {refused}"
            );
        }
    }
}
