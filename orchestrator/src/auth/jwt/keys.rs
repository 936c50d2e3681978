//! An issuer's public keys (its JWKS), fetched when first needed, fetched
//! again when they are older than `keys_refresh` or when a token names a
//! key id they lack, never more often than `keys_refetch_interval`, each
//! fetch bounded in time and bytes.
//!
//! Hand-written rather than a JWKS crate's cache: the bounds (one fetch in
//! flight per issuer, a least interval between fetches whatever tokens
//! arrive, a byte cap on every document read) are the point, and the
//! crates seen either fetch per unknown `kid` or read whole bodies.

use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use tracing::{info, warn};

use super::Refusal;

/// Most keys kept of one JWKS; the rest are ignored (a provider publishes
/// a few: the current ones and those being rotated in and out).
const MAX_KEYS: usize = 64;

/// How fetches are bounded (from `api.identity`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FetchLimits {
    pub refresh: Duration,
    pub refetch_interval: Duration,
    pub timeout: Duration,
    pub max_bytes: usize,
}

/// One public key of the set.
#[derive(Clone)]
struct PublicKey {
    kid: Option<String>,
    /// The algorithm the key is for, when the JWKS says.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

#[derive(Default)]
struct State {
    keys: Arc<Vec<PublicKey>>,
    /// When the keys were last fetched.
    fetched: Option<Instant>,
    /// When a fetch was last started, whatever came of it.
    tried: Option<Instant>,
}

impl State {
    /// The key of `kid` for `alg`: the one with that id, or, for a token
    /// without one, the only key for `alg`.
    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let mut fits = self
            .keys
            .iter()
            .filter(|key| key.key.family() == alg.family() && key.alg.is_none_or(|own| own == alg));
        match kid {
            Some(kid) => fits
                .find(|key| key.kid.as_deref() == Some(kid))
                .map(|key| key.key.clone()),
            None => match (fits.next(), fits.next()) {
                (Some(only), None) => Some(only.key.clone()),
                _ => None,
            },
        }
    }
}

/// The keys of one issuer.
pub(crate) struct IssuerKeys {
    issuer: String,
    /// The JWKS URL configured; `None`: discovered.
    jwks_url: Option<String>,
    client: reqwest::Client,
    limits: FetchLimits,
    state: Mutex<State>,
    /// Held while a fetch runs: one fetch per issuer at a time.
    fetching: tokio::sync::Mutex<()>,
}

impl IssuerKeys {
    pub(crate) fn new(
        issuer: &str,
        jwks_url: Option<&str>,
        client: reqwest::Client,
        limits: FetchLimits,
    ) -> Self {
        Self {
            issuer: issuer.to_owned(),
            jwks_url: jwks_url.map(str::to_owned),
            client,
            limits,
            state: Mutex::new(State::default()),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key that verifies a token signed with `alg` under `kid`.
    ///
    /// # Errors
    ///
    /// [`Refusal::UnknownKey`] when the issuer has no such key (after one
    /// fetch, if the last was long enough ago); [`Refusal::KeysUnavailable`]
    /// when its keys could never be fetched.
    pub(crate) async fn key(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<DecodingKey, Refusal> {
        let (found, fresh) = {
            let state = self.state();
            let fresh = state
                .fetched
                .is_some_and(|at| at.elapsed() < self.limits.refresh);
            (state.find(kid, alg), fresh)
        };
        if let (Some(key), true) = (&found, fresh) {
            return Ok(key.clone());
        }
        self.refetch().await;
        let state = self.state();
        // A key that was there before a failed refresh still verifies.
        match state.find(kid, alg).or(found) {
            Some(key) => Ok(key),
            None if state.fetched.is_none() => Err(Refusal::KeysUnavailable),
            None => Err(Refusal::UnknownKey),
        }
    }

    /// Fetches the keys, unless a fetch started less than
    /// `refetch_interval` ago (waiting for one in flight).
    async fn refetch(&self) {
        let _one_at_a_time = self.fetching.lock().await;
        {
            let mut state = self.state();
            if state
                .tried
                .is_some_and(|at| at.elapsed() < self.limits.refetch_interval)
            {
                return;
            }
            state.tried = Some(Instant::now());
        }
        let fetched = tokio::time::timeout(self.limits.timeout, self.fetch()).await;
        match fetched {
            Ok(Ok(keys)) => {
                info!(issuer = %self.issuer, keys = keys.len(), "issuer keys fetched");
                let mut state = self.state();
                state.keys = Arc::new(keys);
                state.fetched = Some(Instant::now());
            }
            Ok(Err(why)) => {
                warn!(issuer = %self.issuer, error = %why, "cannot fetch the issuer's keys");
            }
            Err(_) => warn!(
                issuer = %self.issuer,
                timeout = ?self.limits.timeout,
                "cannot fetch the issuer's keys: no answer within api.identity.keys_timeout"
            ),
        }
    }

    /// The issuer's signing keys, from its JWKS.
    async fn fetch(&self) -> Result<Vec<PublicKey>, String> {
        let url = match &self.jwks_url {
            Some(url) => url.clone(),
            None => self.discover().await?,
        };
        let set: KeySet = self.get_json(&url).await?;
        let keys: Vec<PublicKey> = set
            .keys
            .into_iter()
            .take(MAX_KEYS)
            .filter_map(signing_key)
            .collect();
        if keys.is_empty() {
            return Err(format!("the JWKS at {url} holds no signing key"));
        }
        Ok(keys)
    }

    /// The JWKS URL the issuer's discovery document names, after checking
    /// that the document is the issuer's.
    async fn discover(&self) -> Result<String, String> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.issuer.trim_end_matches('/')
        );
        let document: Discovery = self.get_json(&url).await?;
        if document.issuer != self.issuer {
            return Err(format!(
                "{url} names another issuer; set api.identity.issuers' jwks_url"
            ));
        }
        if !super::options::is_allowed_url(&document.jwks_uri) {
            return Err(format!(
                "{url} names a jwks_uri that is not https://; set jwks_url"
            ));
        }
        Ok(document.jwks_uri)
    }

    /// `url`'s JSON body, read up to `max_bytes`.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let max = self.limits.max_bytes;
        let mut response = self
            .client
            .get(url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|err| format!("{url}: {}", err.without_url()))?;
        if response.content_length().is_some_and(|n| n > max as u64) {
            return Err(format!("{url}: over api.identity.max_keys_bytes ({max})"));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| format!("{url}: {}", err.without_url()))?
        {
            if body.len() + chunk.len() > max {
                return Err(format!("{url}: over api.identity.max_keys_bytes ({max})"));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|err| format!("{url}: not the JSON expected: {err}"))
    }
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

#[derive(Deserialize)]
struct KeySet {
    keys: Vec<serde_json::Value>,
}

/// The key `value` describes, if it is a public key for signatures: not a
/// shared secret (HMAC with a published key is how tokens get forged), not
/// an encryption key, not a kind this crate cannot verify with.
fn signing_key(value: serde_json::Value) -> Option<PublicKey> {
    let jwk: Jwk = serde_json::from_value(value).ok()?;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    if !matches!(
        jwk.algorithm,
        AlgorithmParameters::RSA(_)
            | AlgorithmParameters::EllipticCurve(_)
            | AlgorithmParameters::OctetKeyPair(_)
    ) {
        return None;
    }
    let alg = match jwk.common.key_algorithm {
        // A key for another use (RSA-OAEP...) signs nothing.
        Some(alg) => Some(Algorithm::from_str(&alg.to_string()).ok()?),
        None => None,
    };
    Some(PublicKey {
        kid: jwk.common.key_id.clone(),
        alg,
        key: DecodingKey::from_jwk(&jwk).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rsa() -> serde_json::Value {
        // A 2048-bit modulus is not needed to be a key: any base64url does.
        json!({"kty": "RSA", "kid": "r1", "alg": "RS256", "n": "sXch", "e": "AQAB"})
    }

    #[test]
    fn only_public_signing_keys_are_kept() {
        let kept = |value| signing_key(value).is_some();
        assert!(kept(rsa()));
        assert!(
            kept(json!({"kty": "RSA", "n": "sXch", "e": "AQAB"})),
            "no alg, no kid"
        );
        assert!(kept(
            json!({"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"})
        ));
        assert!(
            !kept(json!({"kty": "oct", "k": "c2VjcmV0", "alg": "HS256"})),
            "a shared secret"
        );
        assert!(!kept(
            json!({"kty": "RSA", "use": "enc", "n": "sXch", "e": "AQAB"})
        ));
        assert!(!kept(
            json!({"kty": "RSA", "alg": "RSA-OAEP", "n": "sXch", "e": "AQAB"})
        ));
        assert!(!kept(json!({"kty": "XYZ"})));
        assert!(!kept(json!("not a key")));
    }

    #[test]
    fn a_key_is_found_by_its_id_and_algorithm_or_as_the_only_one() {
        let one = |value| signing_key(value).unwrap();
        let state = |keys: Vec<PublicKey>| State {
            keys: Arc::new(keys),
            ..State::default()
        };
        let single = state(vec![one(rsa())]);
        assert!(single.find(Some("r1"), Algorithm::RS256).is_some());
        assert!(
            single.find(None, Algorithm::RS256).is_some(),
            "the only key"
        );
        assert!(single.find(Some("r2"), Algorithm::RS256).is_none());
        assert!(
            single.find(Some("r1"), Algorithm::RS384).is_none(),
            "its alg is RS256"
        );
        assert!(
            single.find(Some("r1"), Algorithm::ES256).is_none(),
            "another family"
        );
        assert!(
            single.find(Some("r1"), Algorithm::HS256).is_none(),
            "never a secret"
        );
        let mut second = rsa();
        second["kid"] = json!("r2");
        let two = state(vec![one(rsa()), one(second)]);
        assert!(two.find(Some("r2"), Algorithm::RS256).is_some());
        assert!(two.find(None, Algorithm::RS256).is_none(), "which one?");
    }
}
