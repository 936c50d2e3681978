//! Certificates for a local fleet with TLS and for the TLS tests, generated
//! when needed (rcgen): a CA, a server certificate for `localhost` and
//! `127.0.0.1`, and client certificates, written as PEM files. Never for
//! production: the CA's key is thrown away, and nothing is rotated. Made
//! with the `tls` feature; without it, [`Certificates::generate`] says so.

use std::path::{Path, PathBuf};

#[cfg(feature = "tls")]
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};

/// The DNS name of the client certificate `client.pem`.
pub const CLIENT_DNS_NAME: &str = "search.clients.test";
/// The URI name (a SPIFFE id) of the client certificate `spiffe.pem`.
pub const CLIENT_SPIFFE_ID: &str = "spiffe://toolfleet.test/ns/ads/sa/agent";
/// The DNS name of the gateway's client certificate `gateway.pem`.
pub const GATEWAY_DNS_NAME: &str = "gateway.test";

/// PEM files in one dir: `ca.pem`; `server.pem` and `server.key`;
/// `client.pem` and `client.key` ([`CLIENT_DNS_NAME`]); `spiffe.pem` and
/// `spiffe.key` ([`CLIENT_SPIFFE_ID`]); `gateway.pem` and `gateway.key`
/// ([`GATEWAY_DNS_NAME`]).
#[derive(Debug, Clone)]
pub struct Certificates {
    dir: PathBuf,
}

impl Certificates {
    /// Generates every certificate into `dir`: not in this build (no `tls`
    /// feature), so an error that says so.
    ///
    /// # Errors
    ///
    /// Always.
    #[cfg(not(feature = "tls"))]
    pub fn generate(dir: &Path) -> anyhow::Result<Self> {
        anyhow::bail!(
            "cannot make certificates in {}: this build has no TLS for a local fleet \
             (toolfleet-fleet's `tls` feature; `toolfleet bench --tls` has it)",
            dir.display()
        )
    }

    /// Generates every certificate into `dir`.
    ///
    /// # Errors
    ///
    /// Generation or writing failed.
    #[cfg(feature = "tls")]
    pub fn generate(dir: &Path) -> anyhow::Result<Self> {
        // Every certificate gets a subject of its own: OpenSSL (Python's
        // gRPC) takes a leaf whose subject equals its issuer's for
        // self-signed.
        let named = |mut params: CertificateParams, name: &str| {
            params.distinguished_name.push(DnType::CommonName, name);
            params
        };
        let mut ca_params = named(CertificateParams::default(), "toolfleet test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        let server_key = KeyPair::generate()?;
        let server = named(
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?,
            "localhost",
        )
        .signed_by(&server_key, &*ca)?;
        let dns_client = |name: &str| -> anyhow::Result<_> {
            let key = KeyPair::generate()?;
            let certificate = named(CertificateParams::new(vec![name.to_owned()])?, name)
                .signed_by(&key, &*ca)?;
            Ok((certificate, key))
        };
        let (client, client_key) = dns_client(CLIENT_DNS_NAME)?;
        let (gateway, gateway_key) = dns_client(GATEWAY_DNS_NAME)?;
        let spiffe_key = KeyPair::generate()?;
        let mut spiffe_params = named(CertificateParams::default(), "spiffe client");
        spiffe_params.subject_alt_names = vec![SanType::URI(CLIENT_SPIFFE_ID.try_into()?)];
        let spiffe = spiffe_params.signed_by(&spiffe_key, &*ca)?;
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("server.pem", server.pem()),
            ("server.key", server_key.serialize_pem()),
            ("client.pem", client.pem()),
            ("client.key", client_key.serialize_pem()),
            ("spiffe.pem", spiffe.pem()),
            ("spiffe.key", spiffe_key.serialize_pem()),
            ("gateway.pem", gateway.pem()),
            ("gateway.key", gateway_key.serialize_pem()),
        ] {
            std::fs::write(dir.join(name), pem)?;
        }
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// The path of one of the files, as a string (for env and flags).
    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).to_string_lossy().into_owned()
    }

    /// The orchestrator's environment for TLS with required client
    /// certificates.
    pub fn mutual_tls_env(&self) -> [(&'static str, String); 3] {
        [
            ("TOOLFLEET_GRPC__TLS__CERT_FILE", self.path("server.pem")),
            ("TOOLFLEET_GRPC__TLS__KEY_FILE", self.path("server.key")),
            ("TOOLFLEET_GRPC__TLS__CLIENT_CA_FILE", self.path("ca.pem")),
        ]
    }

    /// The flags of a client (`toolfleet mcp-serve`) that reaches the
    /// orchestrator with the gateway's certificate ([`GATEWAY_DNS_NAME`]).
    pub fn gateway_tls_args(&self) -> [String; 6] {
        [
            "--tls-ca-file".to_owned(),
            self.path("ca.pem"),
            "--tls-cert-file".to_owned(),
            self.path("gateway.pem"),
            "--tls-key-file".to_owned(),
            self.path("gateway.key"),
        ]
    }
}
