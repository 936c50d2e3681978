//! Who is calling: every API call carries `authorization: Bearer <token>`,
//! and the tokens file (`api.tokens_file`) maps the token's SHA-256 to a
//! tenant and what that tenant may do. The file holds hashes only, so a copy
//! of it grants nothing. It is reloaded when it changes.
//!
//! ```toml
//! [tenants.search]
//! token_sha256 = ["<sha256 of the token, hex>"]
//! tools = ["calculate", "factual_qa"]   # optional: the tools its jobs may use
//! client_names = ["search.clients.example", "spiffe://example.org/ns/search"]   # optional: mutual TLS
//! ```
//!
//! With mutual TLS (`grpc.tls.client_ca_file`), a client whose certificate
//! is valid for one of a tenant's `client_names` (a DNS name, or a URI such
//! as a SPIFFE id, in its subject alternative names) is that tenant, without
//! a token.
//!
//! With `api.auth = "none"` every caller is the tenant `default` (for `toolfleet
//! dev` and tests; never on a shared network).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls_pki_types::{CertificateDer, ServerName};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tonic::{Request, Status};
pub use toolfleet_proto::job::is_valid_tenant;
use toolfleet_proto::manifest::is_tool_pattern;
use toolfleet_service::reload::{self, Fingerprint};
use tracing::{info, warn};

use crate::quota::Quotas;

/// The tenant of every caller when authentication is off.
pub const DEFAULT_TENANT: &str = "default";

/// Longest accepted `authorization` header value; a longer one is refused
/// before it is hashed.
const MAX_TOKEN_BYTES: usize = 512;

/// How callers prove who they are (`api.auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Bearer tokens from `api.tokens_file`.
    #[default]
    Tokens,
    /// No authentication: every caller is the tenant `default`.
    None,
}

/// The caller of one request, as the API sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    /// The tenant whose jobs the caller submits, reads and cancels.
    pub tenant: String,
    /// The tools the tenant's jobs may use; `None`: every live tool.
    pub tools: Option<Vec<String>>,
    /// What the tenant may use at once; `None`: no limit.
    pub quotas: Quotas,
    /// Tools whose calls wait for a person's approval in the tenant's jobs
    /// (`"*"`: all).
    pub require_approval: Vec<String>,
    /// The person this token or certificate stands for, when the tokens
    /// file names one (`approvers`): recorded with their decisions.
    pub approver: Option<String>,
    /// How long the tenant's held calls wait for a decision; `None`:
    /// `approval.timeout`.
    pub approval_timeout: Option<Duration>,
    /// Whether the tenant's jobs stream their model's answer when the
    /// request does not say.
    pub stream: bool,
}

impl Caller {
    /// The caller when authentication is off: the tenant `default`, no
    /// quotas.
    pub fn anonymous() -> Self {
        Self {
            tenant: DEFAULT_TENANT.to_owned(),
            tools: None,
            quotas: Quotas::default(),
            require_approval: Vec::new(),
            approver: None,
            approval_timeout: None,
            stream: false,
        }
    }
}

/// Why the tokens could not be set up. The message names the file and what
/// to fix.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// `api.auth = "tokens"` without a file.
    #[error(
        "no api.tokens_file: give the orchestrator a tokens file (docs/security.md), or set \
         api.auth = \"none\" to run without authentication (never on a shared network)"
    )]
    NoTokensFile,
    /// The file cannot be read.
    #[error("cannot read api.tokens_file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid tokens file.
    #[error("api.tokens_file {path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// The tokens file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tenants: BTreeMap<String, TenantEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    token_sha256: Vec<String>,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    client_names: Vec<String>,
    #[serde(default)]
    max_active_jobs: Option<u32>,
    #[serde(default)]
    submissions_per_second: Option<f64>,
    #[serde(default)]
    max_calls_in_flight: Option<u32>,
    /// Tools whose calls wait for a person's approval in every job of the
    /// tenant, or `"*"` for all (docs/approvals.md).
    #[serde(default)]
    require_approval: Vec<String>,
    /// Who decides with a token (by its hash) or a client certificate (by
    /// its client name): the name recorded with each decision they make.
    #[serde(default)]
    approvers: BTreeMap<String, String>,
    /// How long the tenant's held calls wait for a decision (`"2h"`);
    /// absent: `approval.timeout`.
    #[serde(default, with = "humantime_serde")]
    approval_timeout: Option<Duration>,
    /// Whether the tenant's jobs stream their model's answer when the
    /// request does not say (docs/api.md, "Streaming").
    #[serde(default)]
    stream: bool,
}

impl TenantEntry {
    /// What is wrong with `approvers`: a key that is none of the tenant's
    /// token hashes or client names, or a name that is empty, over 64
    /// characters or not printable (it is shown in events and logs).
    fn approvers_problem(&self) -> Option<&'static str> {
        let known =
            |key: &String| self.token_sha256.contains(key) || self.client_names.contains(key);
        if !self.approvers.keys().all(known) {
            return Some("approvers names a key that is none of its token_sha256 or client_names");
        }
        let printable = |name: &String| {
            (1..=64).contains(&name.chars().count()) && !name.chars().any(char::is_control)
        };
        (!self.approvers.values().all(printable))
            .then_some("an approver's name is 1 to 64 printable characters")
    }

    /// The caller this entry makes `tenant`, after its checks; quotas it
    /// does not set come from `defaults`.
    fn caller(&self, tenant: &str, defaults: Quotas) -> Result<Arc<Caller>, String> {
        let own = Quotas {
            max_active_jobs: self.max_active_jobs,
            submissions_per_second: self.submissions_per_second,
            max_calls_in_flight: self.max_calls_in_flight,
        };
        let why = if !is_valid_tenant(tenant) {
            Some("names are 1 to 64 lowercase letters, digits, - and _")
        } else if self.tools.as_ref().is_some_and(Vec::is_empty) {
            Some("tools lists no tool; list at least one, or leave the key out to allow every tool")
        } else if !self.require_approval.iter().all(|t| is_tool_pattern(t)) {
            Some("require_approval lists something that is neither a tool name nor \"*\"")
        } else if let Some(why) = self.approvers_problem() {
            Some(why)
        } else if self.approval_timeout.is_some_and(|t| t.is_zero()) {
            Some("approval_timeout must be longer than 0s")
        } else {
            own.problem()
        };
        if let Some(why) = why {
            return Err(format!("tenant {tenant:?}: {why}"));
        }
        Ok(Arc::new(Caller {
            tenant: tenant.to_owned(),
            tools: self.tools.clone(),
            quotas: defaults.overridden_by(own),
            require_approval: self.require_approval.clone(),
            approver: None,
            approval_timeout: self.approval_timeout,
            stream: self.stream,
        }))
    }
}

/// Tokens (their SHA-256), and client certificate names, to callers.
#[derive(Debug, Default)]
struct Tokens {
    by_hash: HashMap<[u8; 32], Arc<Caller>>,
    /// DNS names a client certificate may be valid for (mutual TLS).
    by_client_name: Vec<(ServerName<'static>, Arc<Caller>)>,
    /// URI names (SPIFFE ids and the like) a client certificate may carry,
    /// matched exactly.
    by_client_uri: HashMap<String, Arc<Caller>>,
}

impl Tokens {
    fn parse(text: &str, defaults: Quotas) -> Result<Self, String> {
        let file: TokensFile = toml::from_str(text).map_err(|err| err.message().to_owned())?;
        // An empty file is what an editor or `>` leaves for a moment while
        // it rewrites the file: read then, it would lock every tenant out
        // until the next good version. A file for nobody is never meant.
        if file.tenants.is_empty() {
            return Err("the file names no tenant (add a [tenants.<name>] table)".to_owned());
        }
        let mut tokens = Self::default();
        for (tenant, entry) in file.tenants {
            let caller = entry.caller(&tenant, defaults)?;
            tokens
                .add(&caller, &entry)
                .map_err(|why| format!("tenant {tenant:?}: {why}"))?;
        }
        Ok(tokens)
    }

    /// Maps `entry`'s client names and token hashes to `caller`, with the
    /// approver each is named for.
    fn add(&mut self, caller: &Arc<Caller>, entry: &TenantEntry) -> Result<(), String> {
        let caller_of = |key: &str| match entry.approvers.get(key) {
            Some(name) => Arc::new(Caller {
                approver: Some(name.clone()),
                ..Caller::clone(caller)
            }),
            None => caller.clone(),
        };
        for name in &entry.client_names {
            let caller = &caller_of(name);
            if is_uri_name(name) {
                if self
                    .by_client_uri
                    .insert(name.clone(), caller.clone())
                    .is_some()
                {
                    return Err(format!("client name {name:?} names two tenants"));
                }
                continue;
            }
            let parsed = ServerName::try_from(name.clone()).map_err(|_| {
                format!(
                    "client name {name:?} is neither a DNS name nor a URI such as \
                     spiffe://example.org/ns/search"
                )
            })?;
            self.by_client_name.push((parsed, caller.clone()));
        }
        for hex in &entry.token_sha256 {
            let caller = &caller_of(hex);
            let hash = parse_sha256(hex)
                .ok_or_else(|| format!("{hex:?} is not a SHA-256 in hex (64 characters)"))?;
            if self.by_hash.insert(hash, caller.clone()).is_some() {
                return Err("a token hash appears twice in the file".to_owned());
            }
        }
        Ok(())
    }

    /// The tenant whose `client_names` the certificate is valid for: one of
    /// its URI names exactly, else one of its DNS names.
    fn client(&self, certificate: &CertificateDer<'_>) -> Option<Arc<Caller>> {
        let certificate = webpki::EndEntityCert::try_from(certificate).ok()?;
        if let Some(caller) = certificate
            .valid_uri_names()
            .find_map(|uri| self.by_client_uri.get(uri))
        {
            return Some(caller.clone());
        }
        self.by_client_name
            .iter()
            .find(|(name, _)| certificate.verify_is_valid_for_subject_name(name).is_ok())
            .map(|(_, caller)| caller.clone())
    }

    fn caller(&self, token: &str) -> Option<Arc<Caller>> {
        self.by_hash.get(&sha256(token)).cloned()
    }
}

/// Whether a `client_names` entry is a URI (`scheme://...`, as SPIFFE ids
/// are) rather than a DNS name: a scheme of letters, digits, `+`, `-`, `.`,
/// then printable ASCII without spaces.
fn is_uri_name(name: &str) -> bool {
    let Some((scheme, rest)) = name.split_once("://") else {
        return false;
    };
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        && !rest.is_empty()
        && name.len() <= 2048
        && name.bytes().all(|b| b.is_ascii_graphic())
}

fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// The SHA-256 of `token`, in hex: what the tokens file stores.
pub fn token_sha256(token: &str) -> String {
    format!("{:x}", Sha256::digest(token.as_bytes()))
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut hash = [0u8; 32];
    for (byte, pair) in hash.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(hash)
}

/// Authenticates every API call: a tonic interceptor that puts the
/// [`Caller`] into the request's extensions, or refuses the call with
/// `UNAUTHENTICATED`.
#[derive(Clone)]
pub struct Authenticator {
    tokens: Option<Arc<ArcSwap<Tokens>>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("tokens", &self.tokens.is_some())
            .finish()
    }
}

impl Authenticator {
    /// The authenticator of `mode`: with tokens, the file at `path` is read
    /// now and watched every `reload_interval` (inside a tokio runtime).
    ///
    /// # Errors
    ///
    /// [`AuthError`] naming the setting or the file to fix.
    pub fn start(
        mode: AuthMode,
        path: Option<&Path>,
        reload_interval: Duration,
        defaults: Quotas,
    ) -> Result<Self, AuthError> {
        if mode == AuthMode::None {
            warn!(
                "api.auth = \"none\": every caller is the tenant \"default\"; never expose this API"
            );
            return Ok(Self { tokens: None });
        }
        let path = path
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or(AuthError::NoTokensFile)?
            .to_owned();
        let paths = vec![path.clone()];
        let seen = Fingerprint::of(&paths);
        let tokens = Arc::new(ArcSwap::from_pointee(load(&path, defaults)?));
        info!(file = %path.display(), tokens = tokens.load().by_hash.len(), "api tokens loaded");
        reload::watch(
            &tokens,
            paths,
            seen,
            reload_interval,
            "the api tokens file",
            move || load(&path, defaults),
        );
        Ok(Self {
            tokens: Some(tokens),
        })
    }

    /// No authentication: every caller is [`Caller::anonymous`].
    pub fn none() -> Self {
        Self { tokens: None }
    }

    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(Caller::anonymous());
        };
        // A client certificate (verified by the TLS handshake against
        // grpc.tls.client_ca_file) that names a tenant is that tenant.
        if let Some(certificates) = request.peer_certs()
            && let Some(caller) = certificates.first().and_then(|c| tokens.load().client(c))
        {
            return Ok(caller.as_ref().clone());
        }
        let refused = || {
            Status::unauthenticated(
                "authorization: send \"authorization: Bearer <token>\" with a token of this \
                 orchestrator (toolfleet --token, or TOOLFLEET_TOKEN)",
            )
        };
        let header = request
            .metadata()
            .get("authorization")
            .ok_or_else(refused)?
            .to_str()
            .map_err(|_| refused())?;
        if header.len() > MAX_TOKEN_BYTES {
            return Err(refused());
        }
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or_else(refused)?
            .trim();
        let caller = tokens.load().caller(token).ok_or_else(refused)?;
        Ok(caller.as_ref().clone())
    }
}

impl tonic::service::Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let caller = self.caller(&request)?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

/// The caller an [`Authenticator`] put into `request`; anonymous where none
/// ran (unit tests that call the API directly).
pub fn caller_of<T>(request: &Request<T>) -> Caller {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(Caller::anonymous)
}

fn load(path: &Path, defaults: Quotas) -> Result<Tokens, AuthError> {
    let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
        path: path.display().to_string(),
        source,
    })?;
    Tokens::parse(&text, defaults).map_err(|reason| AuthError::Invalid {
        path: path.display().to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tenants: &str) -> String {
        tenants.to_owned()
    }

    #[test]
    fn a_token_is_stored_as_the_hex_of_its_sha256() {
        // `printf token | sha256sum`: what `toolfleet tokens` writes.
        assert_eq!(
            token_sha256("token"),
            "3c469e9d6c5875d37a43f353d4f88e61fcf812c66eee3457465a40b0da4153e0"
        );
    }

    #[test]
    fn tokens_map_to_their_tenant_and_nothing_else_does() {
        let search = token_sha256("tok-search");
        let ads = token_sha256("tok-ads");
        let tokens = Tokens::parse(
            &file(&format!(
                "[tenants.search]\ntoken_sha256 = [\"{search}\"]\ntools = [\"calculate\"]\n\
             require_approval = [\"*\"]\napprovers = {{ \"{search}\" = \"Ana\" }}\n\
             approval_timeout = \"2h\"\n\
             [tenants.ads]\ntoken_sha256 = [\"{ads}\"]\n"
            )),
            Quotas::default(),
        )
        .unwrap();
        let caller = tokens.caller("tok-search").unwrap();
        assert_eq!(caller.tenant, "search");
        assert_eq!(caller.tools.as_deref(), Some(&["calculate".to_owned()][..]));
        assert_eq!(caller.require_approval, ["*"]);
        assert_eq!(caller.approver.as_deref(), Some("Ana"));
        assert_eq!(caller.approval_timeout, Some(Duration::from_secs(7200)));
        assert_eq!(tokens.caller("tok-ads").unwrap().tools, None);
        assert!(tokens.caller("tok-other").is_none());
        assert!(tokens.caller(&search).is_none(), "the hash is not a token");
        let defaults = Quotas {
            max_active_jobs: Some(10),
            submissions_per_second: Some(5.0),
            max_calls_in_flight: Some(100),
        };
        let tokens = Tokens::parse(
            &format!(
                "[tenants.a]\ntoken_sha256 = [\"{ads}\"]\nmax_active_jobs = 2\n\
                 max_calls_in_flight = 3\n"
            ),
            defaults,
        )
        .unwrap();
        let quotas = tokens.caller("tok-ads").unwrap().quotas;
        assert_eq!(quotas.max_active_jobs, Some(2), "the tenant's own");
        assert_eq!(quotas.submissions_per_second, Some(5.0), "the default");
        assert_eq!(quotas.max_calls_in_flight, Some(3));
    }

    #[test]
    fn client_names_are_dns_names_or_uris() {
        for uri in [
            "spiffe://example.org/ns/search",
            "urn+x://a",
            "https://a/b?c=d",
        ] {
            assert!(is_uri_name(uri), "{uri}");
        }
        for not_uri in [
            "search.clients.example",
            "://a",
            "1x://a",
            "spiffe://",
            "spiffe://a b",
            "spiffe://é",
        ] {
            assert!(!is_uri_name(not_uri), "{not_uri}");
        }
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let good = token_sha256("t");
        for (text, expected) in [
            ("[tenants.Search]\ntoken_sha256 = []\n", "lowercase"),
            ("[tenants.a]\ntoken_sha256 = [\"abc\"]\n", "not a SHA-256"),
            (
                &format!(
                    "[tenants.a]\ntoken_sha256 = [\"{good}\"]\n[tenants.b]\ntoken_sha256 = [\"{good}\"]\n"
                ),
                "appears twice",
            ),
            ("[tenants.a]\ntoken = \"x\"\n", "unknown field"),
            (
                "[tenants.a]\ntoken_sha256 = []\ntools = []\n",
                "lists no tool",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\napproval_timeout = \"0s\"\n",
                "approval_timeout must be longer than 0s",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\napprovers = { \"nobody\" = \"Al\" }\n",
                "approvers names a key that is none of its token_sha256 or client_names",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\nclient_names = [\"a.example\"]\n\
                 approvers = { \"a.example\" = \"\" }\n",
                "1 to 64 printable characters",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\nrequire_approval = [\"a b\"]\n",
                "require_approval lists something that is neither a tool name nor \"*\"",
            ),
            ("not toml [", ""),
            ("", "names no tenant"),
            ("# all gone\n", "names no tenant"),
            (
                "[tenants.a]\ntoken_sha256 = []\nclient_names = [\"not a name\"]\n",
                "neither a DNS name nor a URI",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\nclient_names = [\"spiffe://x/a\"]\n\
                 [tenants.b]\ntoken_sha256 = []\nclient_names = [\"spiffe://x/a\"]\n",
                "names two tenants",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\nmax_calls_in_flight = 0\n",
                "at least 1",
            ),
        ] {
            let err = Tokens::parse(text, Quotas::default()).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn requests_are_refused_without_a_known_bearer_token() {
        let path = std::env::temp_dir().join(format!("tf-tokens-{}", std::process::id()));
        let hash = token_sha256("tok");
        std::fs::write(&path, format!("[tenants.t]\ntoken_sha256 = [\"{hash}\"]\n")).unwrap();
        let auth = Authenticator::start(
            AuthMode::Tokens,
            Some(&path),
            Duration::from_secs(1),
            Quotas::default(),
        )
        .unwrap();
        std::fs::remove_file(&path).unwrap();
        let with = |value: &str| {
            let mut request = Request::new(());
            request
                .metadata_mut()
                .insert("authorization", value.parse().unwrap());
            request
        };
        assert_eq!(auth.caller(&with("Bearer tok")).unwrap().tenant, "t");
        for refused in [
            Request::new(()),
            with("Bearer nope"),
            with("Basic dG9r"),
            with("tok"),
            with(&format!("Bearer {}", "t".repeat(600))),
        ] {
            let status = auth.caller(&refused).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
        }
        assert!(matches!(
            Authenticator::start(
                AuthMode::Tokens,
                None,
                Duration::from_secs(1),
                Quotas::default()
            ),
            Err(AuthError::NoTokensFile)
        ));
        assert_eq!(
            Authenticator::none().caller(&Request::new(())).unwrap(),
            Caller::anonymous()
        );
    }
}
