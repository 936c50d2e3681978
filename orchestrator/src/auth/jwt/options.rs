//! Which issuers the API trusts and how their tokens' claims map to a
//! tenant, a person and roles (`api.identity`).

use std::collections::BTreeMap;
use std::time::Duration;

use jsonwebtoken::{Algorithm, AlgorithmFamily};
use serde::{Deserialize, Serialize};

use crate::auth::Role;

/// The JWT access tokens the API accepts beside the tokens file
/// (docs/security.md, "Identity and roles").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdentityOptions {
    /// The issuers whose tokens the API accepts. Default: none.
    pub issuers: Vec<IssuerOptions>,
    /// How far a token's `exp` and `nbf` may be off the orchestrator's
    /// clock. Default: 60s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub clock_skew: Duration,
    /// How long an issuer's keys are used before they are fetched again.
    /// Default: 10m.
    #[serde(with = "toolfleet_service::config::duration")]
    pub keys_refresh: Duration,
    /// Least time between two fetches of an issuer's keys: a token that
    /// names a key id the orchestrator does not know fetches them at most
    /// this often. Default: 30s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub keys_refetch_interval: Duration,
    /// Longest wait for an issuer's keys (its discovery document and its
    /// JWKS). Default: 5s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub keys_timeout: Duration,
    /// Largest discovery document or JWKS read, in bytes. Default: 262144.
    pub max_keys_bytes: usize,
    /// Longest `authorization` header accepted, in bytes; a longer one is
    /// refused before it is read. Default: 8192.
    pub max_token_bytes: usize,
}

impl Default for IdentityOptions {
    fn default() -> Self {
        Self {
            issuers: Vec::new(),
            clock_skew: Duration::from_secs(60),
            keys_refresh: Duration::from_secs(600),
            keys_refetch_interval: Duration::from_secs(30),
            keys_timeout: Duration::from_secs(5),
            max_keys_bytes: 256 * 1024,
            max_token_bytes: 8192,
        }
    }
}

/// One trusted issuer, and how its claims map.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerOptions {
    /// The issuer, exactly as its tokens' `iss` claim says it.
    pub issuer: String,
    /// The audiences a token must name one of (`aud`): this API's own,
    /// such as `toolfleet`.
    pub audiences: Vec<String>,
    /// Where the issuer's keys are; default: the `jwks_uri` of its
    /// discovery document (`<issuer>/.well-known/openid-configuration`).
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// The signature algorithms accepted. Asymmetric only. Default:
    /// `["RS256", "ES256"]`.
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<Algorithm>,
    /// The claim that names the tenant (a dotted path reaches into an
    /// object); or give `tenant`.
    #[serde(default)]
    pub tenant_claim: Option<String>,
    /// The one tenant of every token of this issuer; or give
    /// `tenant_claim`.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The tenants `tenant_claim` may name; empty: any.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// The claim that names the person: recorded as the submitter, the
    /// approver and the operator. Default: `sub`.
    #[serde(default = "default_person_claim")]
    pub person_claim: String,
    /// The claims that carry roles, groups or scopes (an array of strings,
    /// or one string of names separated by spaces, as `scope` is). Default:
    /// `["roles"]`.
    #[serde(default = "default_role_claims")]
    pub role_claims: Vec<String>,
    /// What each value of those claims gives (a group to roles); empty:
    /// the values that are role names (`agent`, `approver`, `operator`,
    /// `reader`) give themselves.
    #[serde(default)]
    pub roles: BTreeMap<String, Vec<Role>>,
}

fn default_algorithms() -> Vec<Algorithm> {
    vec![Algorithm::RS256, Algorithm::ES256]
}

fn default_person_claim() -> String {
    "sub".to_owned()
}

fn default_role_claims() -> Vec<String> {
    vec!["roles".to_owned()]
}

impl IdentityOptions {
    /// What is wrong with the issuers, naming the setting to fix.
    pub(crate) fn problem(&self) -> Option<String> {
        let mut seen = std::collections::HashSet::new();
        for issuer in &self.issuers {
            if !seen.insert(issuer.issuer.as_str()) {
                return Some(format!(
                    "api.identity.issuers names {:?} twice",
                    issuer.issuer
                ));
            }
            if let Some(why) = issuer.problem() {
                return Some(format!("api.identity.issuers ({:?}): {why}", issuer.issuer));
            }
        }
        (self.max_token_bytes < 512 || self.max_token_bytes > 65536)
            .then(|| "api.identity.max_token_bytes is 512 to 65536".to_owned())
    }
}

impl IssuerOptions {
    fn problem(&self) -> Option<String> {
        if !is_allowed_url(&self.issuer) {
            return Some("issuer is an https:// URL (http:// only on loopback)".to_owned());
        }
        if self
            .jwks_url
            .as_deref()
            .is_some_and(|url| !is_allowed_url(url))
        {
            return Some("jwks_url is an https:// URL (http:// only on loopback)".to_owned());
        }
        if self.audiences.is_empty() || self.audiences.iter().any(String::is_empty) {
            return Some("audiences names at least one audience, none empty".to_owned());
        }
        if self.algorithms.is_empty() {
            return Some("algorithms names at least one algorithm".to_owned());
        }
        if let Some(alg) = self
            .algorithms
            .iter()
            .find(|alg| alg.family() == AlgorithmFamily::Hmac)
        {
            return Some(format!(
                "algorithms names {alg:?}: a shared secret is not a key an issuer publishes; \
                 name asymmetric algorithms (RS256, PS256, ES256, EdDSA...)"
            ));
        }
        None
    }
}

/// Whether `url` may serve keys: https, or http to a loopback host (tests,
/// a provider beside the orchestrator).
pub(super) fn is_allowed_url(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return false;
    };
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match url.scheme() {
        "https" => true,
        "http" => loopback,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> IssuerOptions {
        IssuerOptions {
            issuer: "https://id.example/realms/acme".into(),
            audiences: vec!["toolfleet".into()],
            jwks_url: None,
            algorithms: default_algorithms(),
            tenant_claim: Some("tenant".into()),
            tenant: None,
            tenants: Vec::new(),
            person_claim: default_person_claim(),
            role_claims: default_role_claims(),
            roles: BTreeMap::new(),
        }
    }

    #[test]
    fn issuers_that_cannot_be_trusted_safely_are_refused_with_the_setting_to_fix() {
        let options = |issuer: IssuerOptions| IdentityOptions {
            issuers: vec![issuer],
            ..IdentityOptions::default()
        };
        assert_eq!(options(issuer()).problem(), None);
        let loopback = IssuerOptions {
            issuer: "http://127.0.0.1:4000".into(),
            ..issuer()
        };
        assert_eq!(options(loopback).problem(), None, "http on loopback");
        for (changed, expected) in [
            (
                IssuerOptions {
                    issuer: "http://id.example".into(),
                    ..issuer()
                },
                "issuer is an https:// URL",
            ),
            (
                IssuerOptions {
                    jwks_url: Some("file:///etc/keys".into()),
                    ..issuer()
                },
                "jwks_url is an https:// URL",
            ),
            (
                IssuerOptions {
                    audiences: Vec::new(),
                    ..issuer()
                },
                "audiences names at least one",
            ),
            (
                IssuerOptions {
                    algorithms: vec![Algorithm::RS256, Algorithm::HS256],
                    ..issuer()
                },
                "algorithms names HS256: a shared secret",
            ),
        ] {
            let problem = options(changed).problem().expect(expected);
            assert!(problem.contains(expected), "{problem}");
        }
        let twice = IdentityOptions {
            issuers: vec![issuer(), issuer()],
            ..IdentityOptions::default()
        };
        assert!(twice.problem().unwrap().contains("twice"));
    }
}
