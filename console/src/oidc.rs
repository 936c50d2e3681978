//! Signing in with the company's OpenID provider: the authorization code
//! flow with PKCE (RFC 7636), the console as the client. The provider's
//! one-time `code` on the redirect is the only credential a URL ever
//! carries; the access token goes from the token endpoint into the
//! session in Redis, never to the browser.

use std::time::Duration;

use redis::AsyncCommands as _;
use redis::aio::ConnectionManager;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::session::random_hex;

/// How long a sign-in may take at the provider.
pub(crate) const FLOW_SECONDS: u64 = 600;

/// Largest answer read from the provider.
const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// The console as a client of the provider (`--oidc-*`).
#[derive(Debug, Clone)]
pub struct OidcOptions {
    /// The issuer, exactly as its tokens' `iss` says it.
    pub issuer: String,
    /// The console's client id at the provider.
    pub client_id: String,
    /// Its secret, for a confidential client; `None`: a public client
    /// (PKCE alone).
    pub client_secret: Option<String>,
    /// The console's callback, as registered at the provider
    /// (`https://console.example.com/oidc/callback`).
    pub redirect_url: String,
    /// The API's resource indicator (RFC 8707), so the token's audience is
    /// the API's; `None`: the provider's default.
    pub resource: Option<String>,
    /// The scopes asked for.
    pub scopes: String,
}

/// The provider's endpoints, from its discovery document.
#[derive(Debug, Clone, Deserialize)]
struct Endpoints {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// A sign-in that went to the provider: what the callback needs.
pub(crate) struct Started {
    /// Where the browser goes.
    pub url: String,
    /// The flow's `state`, which the browser keeps in a cookie.
    pub state: String,
}

/// A token the provider gave, and how long it lasts.
pub(crate) struct Token {
    pub access_token: String,
    pub lifetime: Option<Duration>,
}

/// The provider and the flows under way (their PKCE verifiers in Redis,
/// so the callback may land on any replica).
#[derive(Clone)]
pub(crate) struct Provider {
    options: OidcOptions,
    http: reqwest::Client,
    redis: ConnectionManager,
    key_prefix: String,
}

impl Provider {
    pub(crate) fn new(options: OidcOptions, redis: ConnectionManager, key_prefix: &str) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self {
            options,
            http,
            redis,
            key_prefix: key_prefix.to_owned(),
        }
    }

    /// Where the provider's sign-in page says it is: its issuer.
    pub(crate) fn issuer(&self) -> &str {
        &self.options.issuer
    }

    fn flow_key(&self, state: &str) -> String {
        let hash = Sha256::digest(state.as_bytes());
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}console:sign-in:{hex}", self.key_prefix)
    }

    async fn endpoints(&self) -> anyhow::Result<Endpoints> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.options.issuer.trim_end_matches('/')
        );
        let endpoints: Endpoints = self.json(self.http.get(&url)).await?;
        anyhow::ensure!(
            endpoints.issuer == self.options.issuer,
            "the provider's discovery document names another issuer"
        );
        Ok(endpoints)
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> anyhow::Result<T> {
        let mut response = request.send().await.map_err(|e| e.without_url())?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| e.without_url())? {
            anyhow::ensure!(
                body.len() + chunk.len() <= MAX_ANSWER_BYTES,
                "its answer is too large"
            );
            body.extend_from_slice(&chunk);
        }
        anyhow::ensure!(status.is_success(), "it answered {status}");
        Ok(serde_json::from_slice(&body)?)
    }

    /// Starts a sign-in: a PKCE verifier kept in Redis under the flow's
    /// state, and the provider's URL to send the browser to, with
    /// `login_hint` passed on when given.
    pub(crate) async fn start(&self, login_hint: Option<&str>) -> anyhow::Result<Started> {
        let endpoints = self.endpoints().await?;
        let (state, verifier) = (random_hex(), random_hex());
        let challenge = base64url(&Sha256::digest(verifier.as_bytes()));
        let mut url = url::Url::parse(&endpoints.authorization_endpoint)?;
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("response_type", "code")
                .append_pair("client_id", &self.options.client_id)
                .append_pair("redirect_uri", &self.options.redirect_url)
                .append_pair("scope", &self.options.scopes)
                .append_pair("state", &state)
                .append_pair("code_challenge", &challenge)
                .append_pair("code_challenge_method", "S256");
            if let Some(resource) = &self.options.resource {
                query.append_pair("resource", resource);
            }
            if let Some(hint) = login_hint {
                query.append_pair("login_hint", hint);
            }
        }
        self.redis
            .clone()
            .set_ex::<_, _, ()>(self.flow_key(&state), verifier, FLOW_SECONDS)
            .await?;
        Ok(Started {
            url: url.into(),
            state,
        })
    }

    /// Ends a sign-in: the `code` the provider sent back, exchanged with
    /// the flow's verifier (taken from Redis, so a code is used once).
    ///
    /// # Errors
    ///
    /// An unknown or spent flow, or the provider refused.
    pub(crate) async fn finish(&self, state: &str, code: &str) -> anyhow::Result<Token> {
        let verifier: Option<String> = self.redis.clone().get_del(self.flow_key(state)).await?;
        let verifier =
            verifier.ok_or_else(|| anyhow::anyhow!("this sign-in ran out or was used"))?;
        let endpoints = self.endpoints().await?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", self.options.redirect_url.as_str()),
            ("client_id", self.options.client_id.as_str()),
            ("code_verifier", verifier.as_str()),
        ];
        if let Some(resource) = &self.options.resource {
            form.push(("resource", resource));
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&form)
            .finish();
        let mut request = self
            .http
            .post(&endpoints.token_endpoint)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(secret) = &self.options.client_secret {
            request = request.basic_auth(&self.options.client_id, Some(secret));
        }
        let answer: TokenAnswer = self.json(request).await?;
        Ok(Token {
            access_token: answer.access_token,
            lifetime: answer.expires_in.map(Duration::from_secs),
        })
    }
}

/// Base64url without padding (RFC 4648 §5), for the PKCE challenge.
/// Hand-written: ten lines against a crate for one call.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pkce_challenge_is_the_base64url_of_the_verifiers_sha256() {
        // As Python's `base64.urlsafe_b64encode(hashlib.sha256(v).digest())`
        // says it, padding dropped.
        let verifier = "dBjftJeZ4CVP-mJ92IxF3fQhVAtlxOmzsYbyjo5ZMhs";
        assert_eq!(
            base64url(&Sha256::digest(verifier.as_bytes())),
            "Ydi1GLJ2PrlXjljHS6Is5T5glW6Uts9D2wRjqqcdMrc"
        );
        assert_eq!(base64url(b"f"), "Zg");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert_eq!(base64url(b"foo"), "Zm9v");
    }
}
