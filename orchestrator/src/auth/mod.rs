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
//!
//! [gateways.mcp]   # relays its clients' requests: never a tenant
//! client_names = ["mcp-gateway.example"]
//! ```
//!
//! With mutual TLS (`grpc.tls.client_ca_file`), a client whose certificate
//! is valid for one of a tenant's `client_names` (a DNS name, or a URI such
//! as a SPIFFE id, in its subject alternative names) is that tenant, without
//! a token. A certificate valid for a gateway's `client_names`
//! (`[gateways.<name>]`, such as `toolfleet mcp-serve`) is never a tenant:
//! it proves the hop only, and each request it relays must carry its
//! client's bearer token, which alone names the tenant.
//!
//! Each credential has roles in its tenant (`roles`: `agent`, `approver`,
//! `operator`, `reader`), and each RPC checks its own (`roles`). A tenant
//! that gives no roles gives every credential every role; one that names
//! `approvers` (the form before roles) makes them `approver` and
//! `operator`, and its other credentials `agent` and `reader`.
//!
//! With `api.auth = "none"` every caller is the tenant `default` (for `toolfleet
//! dev` and tests; never on a shared network).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls_pki_types::{CertificateDer, ServerName};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tonic::{Request, Status};
pub(crate) use toolfleet_proto::job::is_valid_tenant;
use toolfleet_proto::manifest::is_tool_pattern;
use toolfleet_service::reload::{self, Fingerprint};
use tracing::{info, warn};

use crate::budget::tenant::TenantBudget;
use crate::quota::Quotas;

pub mod jwt;
mod layer;
pub(crate) mod roles;
pub(crate) mod submitter;
pub(crate) use layer::Authenticated;
pub use roles::Role;
pub(crate) use roles::{Roles, Rpc};
pub(crate) use submitter::{JobAccess, JobAction, Sight};

use jwt::{Door, Identity, IdentityOptions, Issuers};

/// The tenant of every caller when authentication is off.
pub(crate) const DEFAULT_TENANT: &str = "default";

/// How callers prove who they are (`api.auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Bearer tokens: static ones from `api.tokens_file`, JWTs from the
    /// issuers of `api.identity`, or both.
    #[default]
    Tokens,
    /// No authentication: every caller is the tenant `default`.
    None,
}

/// The caller of one request, as the API sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Caller {
    /// The tenant whose jobs the caller submits, reads and cancels.
    pub tenant: String,
    /// The tools the tenant's jobs may use; `None`: every live tool.
    pub tools: Option<Vec<String>>,
    /// What the tenant may use at once; `None`: no limit.
    pub quotas: Quotas,
    /// Tools whose calls wait for a person's approval in the tenant's jobs
    /// (`"*"`: all).
    pub require_approval: Vec<String>,
    /// What this token or certificate may do in its tenant.
    pub roles: Roles,
    /// The person the tokens file names for this credential (`approvers`),
    /// recorded with each decision it makes.
    pub person: Option<String>,
    /// The credential itself, stable across reloads: `token:` and 16 hex
    /// digits of its hash, or `client:` and its client name; `None`
    /// without authentication ([`Caller::submitter`]).
    pub principal: Option<String>,
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
    pub(crate) fn anonymous() -> Self {
        Self {
            tenant: DEFAULT_TENANT.to_owned(),
            tools: None,
            quotas: Quotas::default(),
            require_approval: Vec::new(),
            roles: Roles::ALL,
            person: None,
            principal: None,
            approval_timeout: None,
            stream: false,
        }
    }

    /// Whether the tenant's jobs may use `tool`.
    pub(crate) fn may_use(&self, tool: &str) -> bool {
        self.tools
            .as_ref()
            .is_none_or(|tools| tools.iter().any(|allowed| allowed == tool))
    }

    /// Refuses a caller none of whose roles lets it make `rpc`: checked
    /// before anything of a job is read, so that a refusal says nothing of
    /// the job.
    ///
    /// # Errors
    ///
    /// `PERMISSION_DENIED` naming the roles `rpc` needs and the caller's.
    pub(crate) fn check(&self, rpc: Rpc) -> Result<(), Status> {
        if self.roles.any(rpc.needs()) {
            return Ok(());
        }
        Err(Status::permission_denied(format!(
            "{} needs the role {}; this credential of tenant {:?} has {} (roles in the tokens \
             file, docs/security.md)",
            rpc.name(),
            rpc.needs_text(),
            self.tenant,
            self.roles
        )))
    }
}

/// Why the tokens could not be set up. The message names the file and what
/// to fix.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// `api.auth = "tokens"` without a file or an issuer.
    #[error(
        "no api.tokens_file and no api.identity.issuers: give the orchestrator a tokens file \
         or an issuer (docs/security.md), or set api.auth = \"none\" to run without \
         authentication (never on a shared network)"
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
    /// `api.identity` cannot work.
    #[error("{0}")]
    Identity(String),
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
    /// Gateways that relay their clients' requests (`toolfleet mcp-serve`
    /// behind mutual TLS): their certificates prove the hop, never a
    /// tenant.
    #[serde(default)]
    gateways: BTreeMap<String, GatewayEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayEntry {
    /// The names the gateway's client certificate is valid for, as a
    /// tenant's `client_names`.
    client_names: Vec<String>,
    /// The gateway's own resource URL (`toolfleet mcp-serve
    /// --resource-url`): a JWT it relays may name it as its audience.
    #[serde(default)]
    resource: Option<String>,
}

/// A gateway, as its certificate proves it.
#[derive(Debug)]
struct Gateway {
    name: String,
    /// The audience its clients' tokens are minted for.
    resource: Option<String>,
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
    /// Without `roles`, an approver is `approver` and `operator`, and the
    /// tenant's other credentials `agent` and `reader` ([`roles::granted`]).
    #[serde(default)]
    approvers: BTreeMap<String, String>,
    /// The roles of each token (by its hash) or client certificate (by its
    /// client name); absent: every credential has every role, unless the
    /// tenant names approvers.
    #[serde(default)]
    roles: BTreeMap<String, Vec<Role>>,
    /// How long the tenant's held calls wait for a decision (`"2h"`);
    /// absent: `approval.timeout`.
    #[serde(default, with = "humantime_serde")]
    approval_timeout: Option<Duration>,
    /// Whether the tenant's jobs stream their model's answer when the
    /// request does not say (docs/api.md, "Streaming").
    #[serde(default)]
    stream: bool,
    /// What the tenant's jobs together may spend per rolling hour and day
    /// (docs/protection.md, "Budgets").
    #[serde(default)]
    budget: TenantBudget,
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
        if !self.approvers.values().all(printable) {
            return Some("an approver's name is 1 to 64 printable characters");
        }
        // A person is the submitter of the jobs she submits.
        self.approvers
            .values()
            .any(|name| submitter::reads_as_principal(name))
            .then_some("an approver's name may not start with token: or client: (a credential's)")
    }

    /// What is wrong with `roles`: a key that is none of the tenant's
    /// token hashes or client names, or, once it gives roles, a credential
    /// it gives none (it could do nothing: a mistake, never meant).
    fn roles_problem(&self) -> Option<&'static str> {
        if self.roles.is_empty() {
            return None;
        }
        let known =
            |key: &String| self.token_sha256.contains(key) || self.client_names.contains(key);
        if !self.roles.keys().all(known) {
            return Some("roles names a key that is none of its token_sha256 or client_names");
        }
        let mut credentials = self.token_sha256.iter().chain(&self.client_names);
        let none = |key: &String| self.roles.get(key).is_none_or(Vec::is_empty);
        credentials.any(none).then_some(
            "roles gives no role to one of its token_sha256 or client_names; give each at least \
             one (agent, approver, operator, reader)",
        )
    }

    /// The caller this entry makes `tenant`, after its checks; quotas it
    /// does not set come from `defaults`.
    fn caller(&self, tenant: &str, defaults: Quotas) -> Result<Arc<Caller>, String> {
        let own = Quotas {
            max_active_jobs: self.max_active_jobs,
            submissions_per_second: self.submissions_per_second,
            max_calls_in_flight: self.max_calls_in_flight,
            budget: self.budget,
        };
        if let Some(why) = self.budget.problem() {
            return Err(format!("tenant {tenant:?}: {why}"));
        }
        let why = if !is_valid_tenant(tenant) {
            Some("names are 1 to 64 lowercase letters, digits, - and _")
        } else if self.tools.as_ref().is_some_and(Vec::is_empty) {
            Some("tools lists no tool; list at least one, or leave the key out to allow every tool")
        } else if !self.require_approval.iter().all(|t| is_tool_pattern(t)) {
            Some("require_approval lists something that is neither a tool name nor \"*\"")
        } else if let Some(why) = self.approvers_problem() {
            Some(why)
        } else if let Some(why) = self.roles_problem() {
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
            roles: Roles::ALL,
            person: None,
            principal: None,
            approval_timeout: self.approval_timeout,
            stream: self.stream,
        }))
    }
}

/// Tokens (their SHA-256), and client certificate names, to callers.
#[derive(Debug, Default)]
struct Tokens {
    by_hash: HashMap<[u8; 32], Arc<Caller>>,
    /// The tenants' client names (mutual TLS).
    clients: ClientNames<Arc<Caller>>,
    /// The gateways' client names, to the gateway.
    gateways: ClientNames<Arc<Gateway>>,
    /// Each tenant's settings, for the JWTs that name it.
    by_tenant: HashMap<String, Arc<Caller>>,
}

/// What a client certificate proves.
enum Certified {
    /// A tenant (and maybe one of its approvers).
    Tenant(Arc<Caller>),
    /// A gateway: the hop only.
    Gateway(Arc<Gateway>),
}

impl Tokens {
    fn parse(text: &str, defaults: Quotas) -> Result<Self, String> {
        // The key a value is wrong at is named (`tenants.a.budget.
        // tokens_per_day: invalid value`), never the file's text.
        let file: TokensFile = serde_path_to_error::deserialize(toml::Deserializer::new(text))
            .map_err(|err| match err.path().to_string() {
                path if path == "." => err.inner().message().to_owned(),
                path => format!("{path}: {}", err.inner().message()),
            })?;
        // An empty file is what an editor or `>` leaves for a moment while
        // it rewrites the file: read then, it would lock every tenant out
        // until the next good version. A file for nobody is never meant.
        if file.tenants.is_empty() {
            return Err("the file names no tenant (add a [tenants.<name>] table)".to_owned());
        }
        let mut tokens = Self::default();
        for (name, entry) in file.gateways {
            if entry.resource.as_deref().is_some_and(str::is_empty) {
                return Err(format!("gateway {name:?}: resource is its URL, not empty"));
            }
            let gateway = Arc::new(Gateway {
                name: name.clone(),
                resource: entry.resource,
            });
            for client_name in &entry.client_names {
                tokens
                    .gateways
                    .insert(client_name, &gateway)
                    .map_err(|why| format!("gateway {name:?}: {why}"))?;
            }
        }
        for (tenant, entry) in file.tenants {
            let caller = entry.caller(&tenant, defaults)?;
            tokens
                .add(&caller, &entry)
                .map_err(|why| format!("tenant {tenant:?}: {why}"))?;
            tokens.by_tenant.insert(tenant, caller);
        }
        Ok(tokens)
    }

    /// Maps `entry`'s client names and token hashes to `caller`, each with
    /// its roles, the person it is named for and its principal.
    fn add(&mut self, caller: &Arc<Caller>, entry: &TenantEntry) -> Result<(), String> {
        let caller_of = |key: &str, principal: String| {
            Arc::new(Caller {
                roles: roles::granted(&entry.roles, &entry.approvers, key),
                person: entry.approvers.get(key).cloned(),
                principal: Some(principal),
                ..Caller::clone(caller)
            })
        };
        for name in &entry.client_names {
            // A gateway's certificate must never be a tenant's identity:
            // the two lists share no name.
            if self.gateways.contains(name) {
                return Err(format!(
                    "client name {name:?} is a gateway's: a gateway's certificate proves the \
                     hop only, never a tenant"
                ));
            }
            self.clients
                .insert(name, &caller_of(name, submitter::client_principal(name)))?;
        }
        for hex in &entry.token_sha256 {
            let hash = parse_sha256(hex)
                .ok_or_else(|| format!("{hex:?} is not a SHA-256 in hex (64 characters)"))?;
            let caller = caller_of(hex, submitter::token_principal(&hash));
            if self.by_hash.insert(hash, caller).is_some() {
                return Err("a token hash appears twice in the file".to_owned());
            }
        }
        Ok(())
    }

    /// What `certificate` proves: a gateway's name first (a certificate
    /// valid for a gateway is never a tenant, whatever else it names), else
    /// the tenant whose `client_names` it is valid for.
    fn client(&self, certificate: &CertificateDer<'_>) -> Option<Certified> {
        let certificate = webpki::EndEntityCert::try_from(certificate).ok()?;
        if let Some(gateway) = self.gateways.find(&certificate) {
            return Some(Certified::Gateway(gateway.clone()));
        }
        self.clients
            .find(&certificate)
            .map(|caller| Certified::Tenant(caller.clone()))
    }

    fn caller(&self, token: &str) -> Option<Arc<Caller>> {
        self.by_hash.get(&sha256(token)).cloned()
    }

    /// The settings of `tenant`, if the file names it.
    fn tenant(&self, tenant: &str) -> Option<&Arc<Caller>> {
        self.by_tenant.get(tenant)
    }
}

/// Client certificate names to what they stand for: DNS names, matched as
/// TLS matches server names, and URIs (SPIFFE ids and the like), matched
/// exactly and tried first.
#[derive(Debug)]
struct ClientNames<T> {
    by_dns: Vec<(ServerName<'static>, T)>,
    by_uri: HashMap<String, T>,
    /// Every name as written, to refuse one listed twice.
    written: HashSet<String>,
}

impl<T> Default for ClientNames<T> {
    fn default() -> Self {
        Self {
            by_dns: Vec::new(),
            by_uri: HashMap::new(),
            written: HashSet::new(),
        }
    }
}

impl<T: Clone> ClientNames<T> {
    fn insert(&mut self, name: &str, value: &T) -> Result<(), String> {
        if !self.written.insert(name.to_owned()) {
            return Err(format!(
                "client name {name:?} is listed twice: a certificate stands for one tenant or \
                 gateway"
            ));
        }
        if is_uri_name(name) {
            self.by_uri.insert(name.to_owned(), value.clone());
            return Ok(());
        }
        let parsed = ServerName::try_from(name.to_owned()).map_err(|_| {
            format!(
                "client name {name:?} is neither a DNS name nor a URI such as \
                 spiffe://example.org/ns/search"
            )
        })?;
        self.by_dns.push((parsed, value.clone()));
        Ok(())
    }

    fn contains(&self, name: &str) -> bool {
        self.written.contains(name)
    }

    /// What the first name `certificate` is valid for stands for.
    fn find(&self, certificate: &webpki::EndEntityCert<'_>) -> Option<&T> {
        if let Some(value) = certificate
            .valid_uri_names()
            .find_map(|uri| self.by_uri.get(uri))
        {
            return Some(value);
        }
        self.by_dns
            .iter()
            .find(|(name, _)| certificate.verify_is_valid_for_subject_name(name).is_ok())
            .map(|(_, value)| value)
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

/// Authenticates every API call ([`Authenticated`] runs it before each):
/// the [`Caller`] a request's credential stands for, or `UNAUTHENTICATED`.
#[derive(Clone)]
pub(crate) struct Authenticator {
    /// `None`: authentication is off (`api.auth = "none"`).
    credentials: Option<Arc<Credentials>>,
}

/// What an [`Authenticator`] checks credentials against.
struct Credentials {
    /// The tokens file, as last loaded; `None` without one (JWTs only).
    tokens: Option<Arc<ArcSwap<Tokens>>>,
    /// The issuers of `api.identity`; `None` when it names none.
    issuers: Option<Issuers>,
    /// The settings of a tenant a JWT names and the tokens file does not.
    defaults: Quotas,
    /// Longest `authorization` header read.
    max_token_bytes: usize,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credentials = self.credentials.as_deref();
        f.debug_struct("Authenticator")
            .field("tokens", &credentials.is_some_and(|c| c.tokens.is_some()))
            .field("issuers", &credentials.and_then(|c| c.issuers.as_ref()))
            .finish()
    }
}

impl Authenticator {
    /// The authenticator of `mode`: with tokens, the file at `path` is read
    /// now and watched every `reload_interval` (inside a tokio runtime), and
    /// the issuers of `identity` are trusted.
    ///
    /// # Errors
    ///
    /// [`AuthError`] naming the setting or the file to fix.
    pub(crate) fn start(
        mode: AuthMode,
        path: Option<&Path>,
        identity: &IdentityOptions,
        reload_interval: Duration,
        defaults: Quotas,
    ) -> Result<Self, AuthError> {
        if mode == AuthMode::None {
            warn!(
                "api.auth = \"none\": every caller is the tenant \"default\"; never expose this API"
            );
            return Ok(Self { credentials: None });
        }
        let issuers = Issuers::new(identity).map_err(AuthError::Identity)?;
        let path = path.filter(|p| !p.as_os_str().is_empty());
        if path.is_none() && issuers.is_none() {
            return Err(AuthError::NoTokensFile);
        }
        let tokens = path
            .map(|path| watch(path.to_owned(), reload_interval, defaults))
            .transpose()?;
        Ok(Self {
            credentials: Some(Arc::new(Credentials {
                tokens,
                issuers,
                defaults,
                max_token_bytes: identity.max_token_bytes,
            })),
        })
    }

    /// No authentication: every caller is [`Caller::anonymous`].
    #[cfg(test)]
    pub(crate) fn none() -> Self {
        Self { credentials: None }
    }

    /// The caller of a request with `headers`, over a connection whose
    /// client presented `certificates` (mutual TLS).
    async fn caller(
        &self,
        headers: &http::HeaderMap,
        certificates: Option<&[CertificateDer<'static>]>,
    ) -> Result<Caller, Status> {
        let Some(credentials) = &self.credentials else {
            return Ok(Caller::anonymous());
        };
        credentials.caller(headers, certificates).await
    }
}

impl Credentials {
    async fn caller(
        &self,
        headers: &http::HeaderMap,
        certificates: Option<&[CertificateDer<'static>]>,
    ) -> Result<Caller, Status> {
        let tokens = self.tokens.as_ref().map(|tokens| tokens.load_full());
        // A client certificate (verified by the TLS handshake against
        // grpc.tls.client_ca_file) that names a tenant is that tenant; one
        // that names a gateway relays a client, whose token must come too.
        let certified = tokens
            .as_ref()
            .zip(certificates.and_then(<[_]>::first))
            .and_then(|(tokens, certificate)| tokens.client(certificate));
        let gateway = match certified {
            Some(Certified::Tenant(caller)) => return Ok(caller.as_ref().clone()),
            Some(Certified::Gateway(gateway)) => Some(gateway),
            None => None,
        };
        let refused = || missing_token(gateway.as_deref());
        let token = bearer(headers, self.max_token_bytes)?.ok_or_else(refused)?;
        if let Some(issuers) = self.issuers.as_ref().filter(|_| Issuers::is_jwt(token)) {
            let door = match &gateway {
                Some(gateway) => Door::Gateway(gateway.resource.as_deref()),
                None => Door::Api,
            };
            let identity = issuers.verify(token, door).await.map_err(|refusal| {
                Status::unauthenticated(format!(
                    "authorization: the token is refused: {refusal} (docs/security.md, \
                     \"Identity and roles\")"
                ))
            })?;
            return Ok(self.caller_of(tokens.as_deref(), identity));
        }
        let caller = tokens
            .and_then(|tokens| tokens.caller(token))
            .ok_or_else(refused)?;
        Ok(caller.as_ref().clone())
    }

    /// The caller a verified JWT makes: its tenant's settings (from the
    /// tokens file, else the defaults), its roles and its person.
    fn caller_of(&self, tokens: Option<&Tokens>, identity: Identity) -> Caller {
        let tenant = tokens.and_then(|tokens| tokens.tenant(&identity.tenant));
        let base = match tenant {
            Some(caller) => caller.as_ref().clone(),
            None => Caller {
                tenant: identity.tenant,
                quotas: self.defaults,
                ..Caller::anonymous()
            },
        };
        Caller {
            roles: identity.roles,
            person: Some(identity.person),
            ..base
        }
    }
}

/// The `UNAUTHENTICATED` of a request without a known token.
fn missing_token(gateway: Option<&Gateway>) -> Status {
    Status::unauthenticated(match gateway {
        Some(gateway) => format!(
            "authorization: gateway {:?} relays its clients: send each request with its \
             client's \"authorization: Bearer <token>\" (the gateway's certificate proves the \
             hop only)",
            gateway.name
        ),
        None => "authorization: send \"authorization: Bearer <token>\" with a token of this \
                 orchestrator (toolfleet --token, or TOOLFLEET_TOKEN) or of one of its issuers"
            .to_owned(),
    })
}

/// The token of a request's `authorization: Bearer` header; `None` for a
/// missing or malformed one.
///
/// # Errors
///
/// `UNAUTHENTICATED` for a header over `max_bytes`, refused before it is
/// read.
fn bearer(headers: &http::HeaderMap, max_bytes: usize) -> Result<Option<&str>, Status> {
    let Some(header) = headers.get(http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    if header.len() > max_bytes {
        return Err(Status::unauthenticated(format!(
            "authorization: the token is refused: it is over {max_bytes} bytes \
             (api.identity.max_token_bytes)"
        )));
    }
    let token = header.to_str().ok().and_then(|header| {
        header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
    });
    Ok(token.map(str::trim))
}

/// The tokens file at `path`, loaded now and again whenever it changes.
fn watch(
    path: std::path::PathBuf,
    reload_interval: Duration,
    defaults: Quotas,
) -> Result<Arc<ArcSwap<Tokens>>, AuthError> {
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
    Ok(tokens)
}

/// The caller [`Authenticated`] put into `request`; anonymous where none
/// ran (unit tests that call the API directly).
pub(crate) fn caller_of<T>(request: &Request<T>) -> Caller {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(Caller::anonymous)
}

/// The caller of `request`, if one of its roles lets it make `rpc`.
///
/// # Errors
///
/// `PERMISSION_DENIED` naming the roles `rpc` needs ([`Caller::check`]).
pub(crate) fn caller_for<T>(request: &Request<T>, rpc: Rpc) -> Result<Caller, Status> {
    let caller = caller_of(request);
    caller.check(rpc)?;
    Ok(caller)
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
        assert_eq!(caller.person.as_deref(), Some("Ana"));
        let principal = format!("token:{}", &search[..16]);
        assert_eq!(
            caller.principal,
            Some(principal),
            "the hash's first 16 digits"
        );
        assert_eq!(caller.approval_timeout, Some(Duration::from_secs(7200)));
        assert_eq!(tokens.caller("tok-ads").unwrap().tools, None);
        assert!(tokens.caller("tok-other").is_none());
        assert!(tokens.caller(&search).is_none(), "the hash is not a token");
        let defaults = Quotas {
            max_active_jobs: Some(10),
            submissions_per_second: Some(5.0),
            max_calls_in_flight: Some(100),
            budget: Default::default(),
        };
        let tokens = Tokens::parse(
            &format!(
                "[tenants.a]\ntoken_sha256 = [\"{ads}\"]\nmax_active_jobs = 2\n\
                 max_calls_in_flight = 3\n[tenants.a.budget]\ntool_calls_per_hour = 50\n\
                 job_seconds_per_day = 3600\n"
            ),
            defaults,
        )
        .unwrap();
        let quotas = tokens.caller("tok-ads").unwrap().quotas;
        assert_eq!(quotas.max_active_jobs, Some(2), "the tenant's own");
        assert_eq!(quotas.submissions_per_second, Some(5.0), "the default");
        assert_eq!(quotas.max_calls_in_flight, Some(3));
        assert_eq!(quotas.budget.tool_calls_per_hour, Some(50));
        assert_eq!(quotas.budget.job_seconds_per_day, Some(3600));
        assert_eq!(quotas.budget.tokens_per_hour, None);
    }

    #[test]
    fn each_credential_has_its_roles_and_each_rpc_checks_them() {
        let (agent, ana, solo, ops, bot) = (
            token_sha256("tok-agent"),
            token_sha256("tok-ana"),
            token_sha256("tok-solo"),
            token_sha256("tok-ops"),
            token_sha256("tok-bot"),
        );
        let tokens = Tokens::parse(
            &format!(
                "[tenants.pay]\ntoken_sha256 = [\"{agent}\", \"{ana}\"]\n\
                 approvers = {{ \"{ana}\" = \"Ana\" }}\n\
                 [tenants.solo]\ntoken_sha256 = [\"{solo}\"]\n\
                 [tenants.ops]\ntoken_sha256 = [\"{ops}\", \"{bot}\"]\n\
                 roles = {{ \"{ops}\" = [\"operator\", \"reader\"], \"{bot}\" = [\"agent\"] }}\n"
            ),
            Quotas::default(),
        )
        .unwrap();
        // The approvers form: the approver approves and operates, and is
        // the person its decisions name; the agent submits and reads.
        let approver = tokens.caller("tok-ana").unwrap();
        assert_eq!(approver.person.as_deref(), Some("Ana"));
        assert!(approver.check(Rpc::DecideApproval).is_ok());
        assert!(approver.check(Rpc::DecideVerdict).is_ok());
        let agent = tokens.caller("tok-agent").unwrap();
        assert_eq!(
            (agent.tenant.as_str(), agent.person.as_deref()),
            ("pay", None)
        );
        assert!(agent.check(Rpc::SubmitJob).is_ok());
        let refused = agent.check(Rpc::DecideApproval).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            refused.message(),
            "DecideCall on a held call needs the role approver; this credential of tenant \
             \"pay\" has agent, reader (roles in the tokens file, docs/security.md)"
        );
        // Roles given: each credential its own.
        let ops = tokens.caller("tok-ops").unwrap();
        assert!(ops.check(Rpc::ReadJobs).is_ok());
        assert!(ops.check(Rpc::CancelJob).is_ok());
        let refused = ops.check(Rpc::SubmitJob).unwrap_err();
        assert!(
            refused
                .message()
                .starts_with("SubmitJob needs the role agent;"),
            "{refused:?}"
        );
        assert!(
            tokens
                .caller("tok-bot")
                .unwrap()
                .check(Rpc::ListPending)
                .is_err()
        );
        // No roles, no approvers: everything, as with authentication off.
        let solo = tokens.caller("tok-solo").unwrap();
        assert_eq!(solo.roles, Roles::ALL, "a tenant that names none");
        assert_eq!(Caller::anonymous().roles, Roles::ALL, "auth off");
    }

    #[test]
    fn a_tenant_may_use_its_tools_or_every_tool() {
        let only_echo = Caller {
            tools: Some(vec!["echo".into()]),
            ..Caller::anonymous()
        };
        assert!(only_echo.may_use("echo"));
        assert!(!only_echo.may_use("calculate"));
        assert!(!only_echo.may_use("ech"));
        assert!(Caller::anonymous().may_use("calculate"));
    }

    #[test]
    fn a_gateways_client_name_is_never_a_tenants() {
        let hash = token_sha256("t");
        let tokens = Tokens::parse(
            &format!(
                "[gateways.mcp]\nclient_names = [\"gateway.example\", \"spiffe://x/gw\"]\n\
                 [tenants.a]\ntoken_sha256 = [\"{hash}\"]\nclient_names = [\"a.example\"]\n"
            ),
            Quotas::default(),
        )
        .unwrap();
        assert!(tokens.gateways.contains("gateway.example"));
        assert!(tokens.gateways.contains("spiffe://x/gw"));
        assert!(!tokens.clients.contains("gateway.example"));
        for (text, expected) in [
            (
                format!(
                    "[gateways.mcp]\nclient_names = [\"gateway.example\"]\n\
                     [tenants.a]\ntoken_sha256 = [\"{hash}\"]\n\
                     client_names = [\"gateway.example\"]\n"
                ),
                "tenant \"a\": client name \"gateway.example\" is a gateway's",
            ),
            (
                "[gateways.mcp]\nclient_names = [\"not a name\"]\n[tenants.a]\ntoken_sha256 = []\n"
                    .to_owned(),
                "gateway \"mcp\": client name \"not a name\" is neither",
            ),
            (
                "[gateways.mcp]\nclient_names = [\"g.example\"]\ntoken_sha256 = []\n\
                 [tenants.a]\ntoken_sha256 = []\n"
                    .to_owned(),
                "unknown field",
            ),
            (
                "[gateways.mcp]\nclient_names = [\"g.example\"]\n".to_owned(),
                "names no tenant",
            ),
        ] {
            let err = Tokens::parse(&text, Quotas::default()).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
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
                "[tenants.a]\ntoken_sha256 = []\nclient_names = [\"a.example\"]\n\
                 approvers = { \"a.example\" = \"client:b.example\" }\n",
                "may not start with token: or client:",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\nroles = { \"nobody\" = [\"agent\"] }\n",
                "roles names a key that is none of its token_sha256 or client_names",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\nclient_names = [\"a.example\", \"b.example\"]\n\
                 roles = { \"a.example\" = [\"agent\"] }\n",
                "roles gives no role to one of its token_sha256 or client_names",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\nclient_names = [\"a.example\"]\n\
                 roles = { \"a.example\" = [\"admin\"] }\n",
                "unknown variant `admin`",
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
                "is listed twice",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\nmax_calls_in_flight = 0\n",
                "at least 1",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\n[tenants.a.budget]\ntokens_per_day = 0\n",
                "tenant \"a\": budget.tokens_per_day must be at least 1",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\n[tenants.a.budget]\ntool_calls_per_hour = -1\n",
                "tool_calls_per_hour",
            ),
            (
                "[tenants.a]\ntoken_sha256 = []\n[tenants.a.budget]\ntokens_per_week = 5\n",
                "tokens_per_week",
            ),
        ] {
            let err = Tokens::parse(text, Quotas::default()).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[tokio::test]
    async fn requests_are_refused_without_a_known_bearer_token() {
        let path = std::env::temp_dir().join(format!("tf-tokens-{}", std::process::id()));
        let hash = token_sha256("tok");
        std::fs::write(&path, format!("[tenants.t]\ntoken_sha256 = [\"{hash}\"]\n")).unwrap();
        let start = |path: Option<&Path>| {
            Authenticator::start(
                AuthMode::Tokens,
                path,
                &IdentityOptions::default(),
                Duration::from_secs(1),
                Quotas::default(),
            )
        };
        let auth = start(Some(&path)).unwrap();
        std::fs::remove_file(&path).unwrap();
        let with = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::AUTHORIZATION, value.parse().unwrap());
            headers
        };
        assert_eq!(
            auth.caller(&with("Bearer tok"), None).await.unwrap().tenant,
            "t"
        );
        for refused in [
            http::HeaderMap::new(),
            with("Bearer nope"),
            with("Basic dG9r"),
            with("tok"),
            with("Bearer a.b.c"),
            with(&format!("Bearer {}", "t".repeat(9000))),
        ] {
            let status = auth.caller(&refused, None).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
            assert!(!status.message().contains("tttt"), "{status:?}");
        }
        assert!(matches!(start(None), Err(AuthError::NoTokensFile)));
        let no_headers = http::HeaderMap::new();
        assert_eq!(
            Authenticator::none()
                .caller(&no_headers, None)
                .await
                .unwrap(),
            Caller::anonymous()
        );
    }

    #[test]
    fn a_jwt_caller_has_its_tenants_settings_and_its_own_roles_and_person() {
        let hash = token_sha256("t");
        let tokens = Tokens::parse(
            &format!(
                "[tenants.search]\ntoken_sha256 = [\"{hash}\"]\ntools = [\"echo\"]\n\
                 max_active_jobs = 3\n"
            ),
            Quotas::default(),
        )
        .unwrap();
        let defaults = Quotas {
            max_active_jobs: Some(10),
            ..Quotas::default()
        };
        let credentials = Credentials {
            tokens: None,
            issuers: None,
            defaults,
            max_token_bytes: 8192,
        };
        let identity = |tenant: &str| Identity {
            tenant: tenant.into(),
            person: "ana".into(),
            roles: Roles::of(&[Role::Reader]),
        };
        let known = credentials.caller_of(Some(&tokens), identity("search"));
        assert_eq!(known.tools.as_deref(), Some(&["echo".to_owned()][..]));
        assert_eq!(known.quotas.max_active_jobs, Some(3));
        assert_eq!(
            (known.roles, known.person.as_deref()),
            (Roles::of(&[Role::Reader]), Some("ana"))
        );
        let unknown = credentials.caller_of(Some(&tokens), identity("ads"));
        assert_eq!(unknown.tenant, "ads");
        assert_eq!((unknown.tools, unknown.quotas), (None, defaults));
        assert_eq!(
            unknown.roles,
            Roles::of(&[Role::Reader]),
            "never every role"
        );
    }
}
