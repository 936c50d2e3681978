//! The connection to an orchestrator: the `--addr`, `--token` and TLS flags
//! every client command has, the channel and the client they make, and a
//! failed call in words.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use clap::Args;
use tonic::metadata::errors::InvalidMetadataValue;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use toolfleet_proto::v1::agent_service_client::AgentServiceClient;

/// A connected client of `toolfleet.v1.AgentService`, sending the token.
pub(crate) type ApiClient = AgentServiceClient<InterceptedService<Channel, Credentials>>;

/// Adds `authorization: Bearer <token>` to every call, when there is a token.
#[derive(Clone)]
pub(crate) struct Credentials(Option<MetadataValue<Ascii>>);

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// How long connecting to the orchestrator may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the orchestrator is: every client command has this flag.
#[derive(Debug, Args)]
pub(crate) struct Server {
    /// gRPC address of an orchestrator (any replica).
    #[arg(
        long,
        env = "TOOLFLEET_ADDR",
        default_value = "http://127.0.0.1:50051",
        value_name = "URL"
    )]
    addr: String,
    /// API token of your tenant, sent as `authorization: Bearer <token>`.
    #[arg(
        long,
        env = "TOOLFLEET_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

impl Server {
    /// A client of the orchestrator these flags name.
    ///
    /// # Errors
    ///
    /// As [`connect`].
    pub(crate) async fn connect(&self) -> anyhow::Result<ApiClient> {
        connect(&self.addr, self.token.as_deref(), &self.tls).await
    }

    /// A channel to the orchestrator these flags name, for clients with
    /// tokens of their own ([`with_token`]).
    ///
    /// # Errors
    ///
    /// As [`connect`].
    pub(crate) async fn channel(&self) -> anyhow::Result<Channel> {
        channel(&self.addr, &self.tls).await
    }

    /// The endpoint these flags name, not yet connected, and its URL, for
    /// a caller that connects in its own time.
    ///
    /// # Errors
    ///
    /// The address is not a URL, or a TLS file cannot be read.
    pub(crate) fn endpoint(&self) -> anyhow::Result<(Endpoint, String)> {
        endpoint(&self.addr, &self.tls)
    }

    /// The address and the TLS files, as a `--print-config` shows them
    /// (never the token).
    pub(crate) fn shown(&self) -> serde_json::Value {
        serde_json::json!({
            "addr": self.addr,
            "tls": {
                "ca_file": self.tls.tls_ca_file,
                "cert_file": self.tls.tls_cert_file,
                "key_file": self.tls.tls_key_file,
            },
        })
    }

    /// `--token`, if given.
    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_deref().filter(|token| !token.is_empty())
    }
}

/// TLS to the orchestrator: an `https://` address, or any of these flags.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct TlsArgs {
    /// CA certificate (PEM) the orchestrator's certificate chains to
    /// (default: the system's roots).
    #[arg(long, env = "TOOLFLEET_TLS_CA_FILE", value_name = "PEM")]
    tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for an orchestrator that requires mutual TLS.
    #[arg(
        long,
        env = "TOOLFLEET_TLS_CERT_FILE",
        value_name = "PEM",
        requires = "tls_key_file"
    )]
    tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        env = "TOOLFLEET_TLS_KEY_FILE",
        value_name = "PEM",
        requires = "tls_cert_file"
    )]
    tls_key_file: Option<PathBuf>,
}

impl TlsArgs {
    fn is_set(&self) -> bool {
        self.tls_ca_file.is_some() || self.tls_cert_file.is_some()
    }

    fn config(&self) -> anyhow::Result<ClientTlsConfig> {
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))
        };
        let mut config = ClientTlsConfig::new();
        config = match &self.tls_ca_file {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read("--tls-ca-file", ca)?)),
            None => config.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) {
            config = config.identity(Identity::from_pem(
                read("--tls-cert-file", cert)?,
                read("--tls-key-file", key)?,
            ));
        }
        Ok(config)
    }
}

/// Connects to the orchestrator at `addr` (`http://` is assumed without a scheme).
///
/// # Errors
///
/// The address is not a URL, or nothing answers there; the message says what to do.
pub(crate) async fn connect(
    addr: &str,
    token: Option<&str>,
    tls: &TlsArgs,
) -> anyhow::Result<ApiClient> {
    let channel = channel(addr, tls).await?;
    with_token(channel, token)
        .map_err(|_| anyhow!("--token holds characters a header cannot carry"))
}

/// A client over `channel` that sends `token`.
///
/// # Errors
///
/// The token holds characters a header cannot carry.
pub(crate) fn with_token(
    channel: Channel,
    token: Option<&str>,
) -> Result<ApiClient, InvalidMetadataValue> {
    let credentials = match token.filter(|t| !t.is_empty()) {
        Some(token) => Some(format!("Bearer {token}").parse::<MetadataValue<Ascii>>()?),
        None => None,
    };
    Ok(AgentServiceClient::with_interceptor(
        channel,
        Credentials(credentials),
    ))
}

/// A channel to the orchestrator at `addr`.
async fn channel(addr: &str, tls: &TlsArgs) -> anyhow::Result<Channel> {
    let (endpoint, url) = endpoint(addr, tls)?;
    endpoint.connect().await.with_context(|| {
        format!(
            "cannot reach the orchestrator at {url}; start one (`toolfleet dev --serve` runs \
             a local fleet) or point --addr / TOOLFLEET_ADDR at yours"
        )
    })
}

/// The endpoint of the orchestrator at `addr`, with its TLS, not yet
/// connected, and its URL.
fn endpoint(addr: &str, tls: &TlsArgs) -> anyhow::Result<(Endpoint, String)> {
    let scheme = if tls.is_set() { "https" } else { "http" };
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("{scheme}://{addr}")
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .with_context(|| {
            format!("--addr {addr:?} is not a valid URL; use one like http://127.0.0.1:50051")
        })?
        .connect_timeout(CONNECT_TIMEOUT);
    if url.starts_with("https://") || tls.is_set() {
        endpoint = endpoint.tls_config(tls.config()?)?;
    }
    Ok((endpoint, url))
}

/// A failed call, in words: the server's message is written for people.
pub(crate) fn rpc_error(rpc: &str, status: &tonic::Status) -> anyhow::Error {
    use tonic::Code;
    let hint = match status.code() {
        Code::Unavailable => "; is the orchestrator still running? retry, or check --addr",
        Code::Unimplemented => "; is --addr the gRPC address of a toolfleet orchestrator?",
        Code::Unauthenticated => "; pass your tenant's token with --token or TOOLFLEET_TOKEN",
        _ => "",
    };
    anyhow!(
        "{rpc} failed: {} ({:?}){hint}",
        status.message(),
        status.code()
    )
}
