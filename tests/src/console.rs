//! The web console (`toolfleet console`) as the console's tests start it:
//! over HTTP (tests/tests/console.rs) and in a browser
//! (tests/tests/console_browser.rs).

use std::time::Duration;

use crate::{ChildProcess, cargo_bin};

/// How long the console has to say it serves.
const READY: Duration = Duration::from_secs(30);

/// Spawns `toolfleet console` in front of the orchestrator at `addr`
/// (`http://...`), keeping its sessions in the Redis at `redis`, listening
/// on `listen`, with `flags` too; not waited for ([`start`] is).
///
/// # Errors
///
/// The binary is missing or cannot be started.
pub fn spawn(
    addr: &str,
    redis: &str,
    listen: &str,
    flags: &[&str],
) -> anyhow::Result<ChildProcess> {
    let mut args = vec![
        "console",
        "--addr",
        addr,
        "--listen",
        listen,
        "--redis-url",
        redis,
    ];
    args.extend_from_slice(flags);
    ChildProcess::spawn(
        "console",
        cargo_bin("toolfleet")?,
        args,
        std::iter::empty::<(&str, &str)>(),
    )
}

/// [`spawn`], returned once the console says where it serves.
///
/// # Errors
///
/// It cannot be started, or does not say so in time.
pub async fn start(
    addr: &str,
    redis: &str,
    listen: &str,
    flags: &[&str],
) -> anyhow::Result<ChildProcess> {
    let console = spawn(addr, redis, listen, flags)?;
    console
        .wait_for_log("toolfleet console: http://", READY)
        .await?;
    Ok(console)
}

/// The API's audience in the tokens of [`openid_sign_in`]'s provider.
const API_AUDIENCE: &str = "urn:toolfleet:api";

/// An OpenID provider the console signs people in at, and what to start
/// the fleet and the console with for it.
pub struct OpenIdSignIn {
    /// The provider: its one person, and the console as its one public
    /// client.
    pub provider: crate::identity::OpenIdProvider,
    /// The orchestrators' `api.identity.issuers`, trusting it
    /// (`TOOLFLEET_API__IDENTITY__ISSUERS`).
    pub issuers: String,
    /// The console's `--oidc-*` flags, asking for the person's roles.
    pub flags: Vec<String>,
}

impl OpenIdSignIn {
    /// [`OpenIdSignIn::flags`] as a command line takes them.
    pub fn flags(&self) -> Vec<&str> {
        self.flags.iter().map(String::as_str).collect()
    }
}

/// Starts an OpenID provider whose one person is `person` and whose one
/// client is the console called back at `callback`
/// (`http://<console>/oidc/callback`).
///
/// # Errors
///
/// The provider cannot be started.
pub async fn openid_sign_in(
    callback: &str,
    person: crate::identity::Person<'_>,
) -> anyhow::Result<OpenIdSignIn> {
    use crate::identity::{OpenIdProvider, issuers_setting};
    let scopes = format!("openid {}", person.roles.join(" "));
    let provider = OpenIdProvider::start_with(&[API_AUDIENCE], &[], &[person], &[callback]).await?;
    let flags = [
        "--oidc-issuer",
        provider.issuer(),
        "--oidc-client-id",
        "console",
        "--oidc-redirect-url",
        callback,
        "--oidc-resource",
        API_AUDIENCE,
        "--oidc-scopes",
        &scopes,
    ]
    .map(str::to_owned)
    .to_vec();
    Ok(OpenIdSignIn {
        issuers: issuers_setting(&provider, API_AUDIENCE),
        provider,
        flags,
    })
}
