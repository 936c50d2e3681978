//! A certified OpenID provider (npm `oidc-provider`, tests/identity) on a
//! free loopback port, issuing JWT access tokens by client credentials and
//! by authorization code with PKCE, and rotating its signing key on demand.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::{ChildProcess, free_port, repo_root, venv_python};

/// The scopes the provider grants, one per role.
const SCOPES: [&str; 4] = ["agent", "approver", "operator", "reader"];

/// The redirect URI of the provider's public client (`console`): the code
/// comes back there, and the test reads it from the redirect.
pub const REDIRECT_URI: &str = "http://127.0.0.1/callback";

/// A service the provider signs in by client credentials.
#[derive(Clone, Copy)]
pub struct Service<'a> {
    pub client_id: &'a str,
    pub secret: &'a str,
    pub tenant: &'a str,
    pub roles: &'a [&'a str],
}

/// A person the provider signs in (as `login_hint` names them).
#[derive(Clone, Copy)]
pub struct Person<'a> {
    pub name: &'a str,
    pub tenant: &'a str,
    pub roles: &'a [&'a str],
}

/// The provider, killed when dropped.
pub struct OpenIdProvider {
    process: ChildProcess,
    issuer: String,
    config_path: PathBuf,
    config: Value,
    _dir: tempfile::TempDir,
}

fn identity_tests() -> PathBuf {
    repo_root().join("tests/identity")
}

impl OpenIdProvider {
    /// Starts a provider whose access tokens are for `resources` (the first
    /// is the default audience), for `services` and `people`, and a public
    /// client `console` redirecting to [`REDIRECT_URI`].
    ///
    /// # Errors
    ///
    /// scripts/setup did not install it, or it did not start.
    pub async fn start(
        resources: &[&str],
        services: &[Service<'_>],
        people: &[Person<'_>],
    ) -> anyhow::Result<Self> {
        Self::start_with(resources, services, people, &[REDIRECT_URI]).await
    }

    /// [`start`](Self::start), its public client `console` redirecting to
    /// `redirect_uris` (a web console's callback).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_with(
        resources: &[&str],
        services: &[Service<'_>],
        people: &[Person<'_>],
        redirect_uris: &[&str],
    ) -> anyhow::Result<Self> {
        let node = identity_tests().join("node_modules/.bin/node");
        anyhow::ensure!(
            node.is_file(),
            "{} not found: run scripts/setup (npm ci in tests/identity)",
            node.display()
        );
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let mut clients: Vec<Value> = services
            .iter()
            .map(|s| {
                json!({"client_id": s.client_id, "client_secret": s.secret,
                       "tenant": s.tenant, "roles": s.roles})
            })
            .collect();
        clients.push(json!({"client_id": "console", "redirect_uris": redirect_uris}));
        let accounts: serde_json::Map<String, Value> = people
            .iter()
            .map(|p| {
                (
                    p.name.to_owned(),
                    json!({"tenant": p.tenant, "roles": p.roles}),
                )
            })
            .collect();
        let config = json!({
            "port": port,
            "keys_file": dir.path().join("keys.json"),
            "rotate": false,
            "resources": resources,
            "scopes": SCOPES,
            "clients": clients,
            "accounts": accounts,
        });
        let config_path = dir.path().join("provider.json");
        std::fs::write(&config_path, config.to_string())?;
        let process = ChildProcess::spawn(
            "oidc-provider",
            node,
            [
                identity_tests().join("provider.mjs").into_os_string(),
                config_path.clone().into_os_string(),
            ],
            std::iter::empty::<(&str, &str)>(),
        )?;
        process
            .wait_for_log("\"issuer\"", Duration::from_secs(30))
            .await?;
        Ok(Self {
            process,
            issuer: format!("http://127.0.0.1:{port}"),
            config_path,
            config,
            _dir: dir,
        })
    }

    /// The issuer, as its tokens' `iss` names it.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Restarts the provider signing with a new key, the old ones still
    /// published: what a provider's key rotation looks like from outside.
    ///
    /// # Errors
    ///
    /// It did not come back.
    pub async fn rotate_keys(&mut self) -> anyhow::Result<()> {
        self.config["rotate"] = json!(true);
        std::fs::write(&self.config_path, self.config.to_string())?;
        self.process.respawn()?;
        self.process
            .wait_for_log("\"issuer\"", Duration::from_secs(30))
            .await?;
        self.config["rotate"] = json!(false);
        std::fs::write(&self.config_path, self.config.to_string())?;
        Ok(())
    }

    /// A token for `service`, by client credentials, for `resource` with
    /// `scope`.
    ///
    /// # Errors
    ///
    /// The provider refused.
    pub async fn service_token(
        &self,
        service: &Service<'_>,
        resource: &str,
        scope: &str,
    ) -> anyhow::Result<String> {
        let args = [
            "client",
            &self.issuer,
            service.client_id,
            service.secret,
            resource,
            scope,
        ];
        access_token(&args).await
    }

    /// A token for the person `name`, signed in by authorization code with
    /// PKCE through the public client, for `resource` with `scope`.
    ///
    /// # Errors
    ///
    /// The provider refused.
    pub async fn sign_in(&self, name: &str, resource: &str, scope: &str) -> anyhow::Result<String> {
        let args = [
            "signin",
            &self.issuer,
            "console",
            REDIRECT_URI,
            name,
            resource,
            scope,
        ];
        access_token(&args).await
    }
}

/// A browser's part of a sign-in at the provider: `authorization_url`
/// followed (the provider signs in the account its `login_hint` names)
/// until the provider sends the browser to `redirect_uri`; that URL, with
/// its `code` and `state`.
///
/// # Errors
///
/// The provider refused.
pub async fn authorize(authorization_url: &str, redirect_uri: &str) -> anyhow::Result<String> {
    access_token(&["authorize", authorization_url, redirect_uri]).await
}

/// Runs tests/identity/access_token.py with `args`: the token it prints.
async fn access_token(args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(venv_python()?)
        .arg(identity_tests().join("access_token.py"))
        .args(args)
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "access_token.py {}: {}",
        args[0],
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

/// `message` with `token` as its bearer token.
pub fn bearer<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {token}").parse().expect("a token is ascii");
    request.metadata_mut().insert("authorization", value);
    request
}

/// Waits until `api`, asked with `token`, lists every tool of `tools`.
///
/// # Errors
///
/// They are not listed within 30 s.
pub async fn wait_for_tools(
    api: &crate::fleet::ApiClient,
    token: &str,
    tools: &[&str],
) -> anyhow::Result<()> {
    let what = format!("{} listed with the token", tools.join(", "));
    crate::wait_until(&what, Duration::from_secs(30), || {
        let mut api = api.clone();
        async move {
            let request = bearer(token, toolfleet_proto::v1::ListToolsRequest::default());
            api.list_tools(request).await.is_ok_and(|listed| {
                let listed = &listed.get_ref().tools;
                tools.iter().all(|t| listed.iter().any(|l| l.name == *t))
            })
        }
    })
    .await
}

/// The orchestrator's `api.identity.issuers` trusting `provider` for
/// `audience`: tenants from the `tenant` claim, people from `sub`, roles
/// from `roles`, RS256 only; as an environment variable's value.
pub fn issuers_setting(provider: &OpenIdProvider, audience: &str) -> String {
    format!(
        "[{{issuer = \"{}\", audiences = [\"{audience}\"], algorithms = [\"RS256\"], \
         tenant_claim = \"tenant\", person_claim = \"sub\", role_claims = [\"roles\"]}}]",
        provider.issuer()
    )
}
