//! JWT access tokens from the issuers of `api.identity`: verified against
//! the issuer's published keys, then mapped to a tenant, a person and roles
//! (docs/security.md, "Identity and roles").
//!
//! Every refusal names the check that failed (`Refusal`), never the
//! token or anything it says: what a token claims is not known to be true
//! until it verifies, and even then it is not for logs.

mod claims;
mod keys;
pub mod options;

use std::collections::HashMap;
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde::Deserialize;

pub(crate) use claims::Identity;
use claims::Mapping;
use keys::{FetchLimits, IssuerKeys};
pub use options::{IdentityOptions, IssuerOptions};

/// Why a token is refused: each names the check, for `UNAUTHENTICATED`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("it is not a JWT ({0})")]
    Malformed(&'static str),
    #[error("its issuer (iss) is none of api.identity.issuers")]
    UnknownIssuer,
    #[error("its algorithm (alg) is none its issuer's tokens may use (algorithms), or none at all")]
    Algorithm,
    #[error("its key id (kid) is none of its issuer's keys")]
    UnknownKey,
    #[error("its issuer's keys (JWKS) cannot be fetched now; try again later")]
    KeysUnavailable,
    #[error("its signature does not verify")]
    Signature,
    #[error("it has expired (exp, with api.identity.clock_skew)")]
    Expired,
    #[error("it is not valid yet (nbf, with api.identity.clock_skew)")]
    NotYetValid,
    #[error("its audience (aud) is not this API's (audiences)")]
    Audience,
    #[error(
        "its audience (aud) is not the gateway's resource URL (the gateway's resource in the \
         tokens file): a gateway relays only tokens minted for it"
    )]
    GatewayAudience,
    #[error("claim {claim:?} {why}")]
    Claim { claim: String, why: &'static str },
    #[error("it gives no role (claims {claims}: agent, approver, operator, reader)")]
    NoRole { claims: String },
}

/// Which door a token came through, which says the audience it must name.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Door<'a> {
    /// The API itself: one of the issuer's `audiences`.
    Api,
    /// A gateway's certificate relayed it: the gateway's resource URL and
    /// nothing else (a token minted for the API, or for anything else, is
    /// not passed through); `None`: the gateway names none, so no JWT.
    Gateway(Option<&'a str>),
}

/// The registered claims a verified token must have, by name: the names a
/// refusal may quote, since they are ours.
const REQUIRED: [&str; 3] = ["exp", "iss", "aud"];

/// One trusted issuer.
struct Issuer {
    audiences: Vec<String>,
    algorithms: Vec<Algorithm>,
    mapping: Mapping,
    keys: IssuerKeys,
}

/// The issuers whose tokens the API accepts.
pub(crate) struct Issuers {
    by_name: HashMap<String, Issuer>,
    clock_skew: Duration,
}

impl std::fmt::Debug for Issuers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuers")
            .field("issuers", &self.by_name.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The part of a token's claims read before it verifies: which issuer's
/// keys to verify it with.
#[derive(Deserialize)]
struct Unverified {
    iss: Option<String>,
}

impl Issuers {
    /// The issuers `options` configures; `None` when it names none.
    ///
    /// # Errors
    ///
    /// What is wrong with the options, naming the setting; or the HTTP
    /// client cannot be built.
    pub(crate) fn new(options: &IdentityOptions) -> Result<Option<Self>, String> {
        if let Some(why) = options.problem() {
            return Err(why);
        }
        if options.issuers.is_empty() {
            return Ok(None);
        }
        // No redirects: the keys are where the issuer says they are.
        let client = reqwest::Client::builder()
            .timeout(options.keys_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|err| format!("cannot build the HTTP client for issuers' keys: {err}"))?;
        let limits = FetchLimits {
            refresh: options.keys_refresh,
            refetch_interval: options.keys_refetch_interval,
            timeout: options.keys_timeout,
            max_bytes: options.max_keys_bytes,
        };
        let mut by_name = HashMap::new();
        for issuer in &options.issuers {
            let keys = IssuerKeys::new(
                &issuer.issuer,
                issuer.jwks_url.as_deref(),
                client.clone(),
                limits,
            );
            let mapping = Mapping::of(issuer)
                .map_err(|why| format!("api.identity.issuers ({:?}): {why}", issuer.issuer))?;
            let trusted = Issuer {
                audiences: issuer.audiences.clone(),
                algorithms: issuer.algorithms.clone(),
                mapping,
                keys,
            };
            by_name.insert(issuer.issuer.clone(), trusted);
        }
        Ok(Some(Self {
            by_name,
            clock_skew: options.clock_skew,
        }))
    }

    /// Whether `token` has a JWT's shape (three dot-separated parts): a
    /// static token never has, so it is looked up in the tokens file
    /// instead.
    pub(crate) fn is_jwt(token: &str) -> bool {
        token.bytes().filter(|&b| b == b'.').count() == 2
    }

    /// Who `token`, come through `door`, stands for, once it verifies.
    ///
    /// # Errors
    ///
    /// The [`Refusal`] of the first check that fails.
    pub(crate) async fn verify(&self, token: &str, door: Door<'_>) -> Result<Identity, Refusal> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|_| Refusal::Malformed("header"))?;
        let unverified: Unverified = jsonwebtoken::dangerous::insecure_decode_claims(token)
            .map_err(|_| Refusal::Malformed("claims"))?;
        let issuer = unverified
            .iss
            .and_then(|iss| self.by_name.get(&iss).map(|issuer| (iss, issuer)));
        let (name, issuer) = issuer.ok_or(Refusal::UnknownIssuer)?;
        if !issuer.algorithms.contains(&header.alg) {
            return Err(Refusal::Algorithm);
        }
        let key = issuer.keys.key(header.kid.as_deref(), header.alg).await?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.clock_skew.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&[name]);
        let wrong_audience = match door {
            Door::Api => {
                validation.set_audience(&issuer.audiences);
                Refusal::Audience
            }
            Door::Gateway(resource) => {
                validation.set_audience(&[resource.ok_or(Refusal::GatewayAudience)?]);
                Refusal::GatewayAudience
            }
        };
        validation.set_required_spec_claims(&REQUIRED);
        let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
            .map_err(|err| match refusal(err.kind()) {
                Refusal::Audience => wrong_audience,
                other => other,
            })?
            .claims;
        issuer.mapping.identity(&claims)
    }
}

/// The refusal of a failed `jsonwebtoken::decode`.
fn refusal(kind: &ErrorKind) -> Refusal {
    match kind {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_) => Refusal::Signature,
        ErrorKind::ExpiredSignature => Refusal::Expired,
        ErrorKind::ImmatureSignature => Refusal::NotYetValid,
        ErrorKind::InvalidAudience => Refusal::Audience,
        ErrorKind::InvalidIssuer => Refusal::UnknownIssuer,
        ErrorKind::InvalidAlgorithm | ErrorKind::UnsupportedAlgorithm => Refusal::Algorithm,
        ErrorKind::MissingRequiredClaim(claim) | ErrorKind::InvalidClaimFormat(claim) => {
            match REQUIRED
                .iter()
                .chain(&["nbf", "sub"])
                .find(|&&c| c == claim)
            {
                Some(claim) => Refusal::Claim {
                    claim: (*claim).to_owned(),
                    why: "is missing or not of its type",
                },
                None => Refusal::Malformed("claims"),
            }
        }
        _ => Refusal::Malformed("signature or claims"),
    }
}

#[cfg(test)]
mod tests;
