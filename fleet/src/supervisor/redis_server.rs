//! A `redis-server`, per test or per local fleet.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::Duration,
};

use anyhow::Context as _;

use super::free_port;
use super::process::{self, ChildProcess, ScratchDir, ServerOptions};

/// Path of the `redis-server` binary to use; wins over `PATH`.
const BINARY_ENV: &str = "TOOLFLEET_REDIS_SERVER";

const INSTALL_HINT: &str = "install it: apt-get install redis-server (or run scripts/setup)";

/// The line the server logs once it serves clients (7.0 ends it there, 7.2 adds " tcp").
const READY: &str = "Ready to accept connections";

/// How redis-server reports that another process bound the port first.
const PORT_TAKEN: &str = "Address already in use";

/// Fresh ports to try before giving up on start-up.
const PORT_ATTEMPTS: usize = 5;

const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How to run a [`RedisServer`].
#[derive(Debug, Clone, Default)]
pub struct RedisConfig {
    /// Log every write to an append-only file before answering it
    /// (`appendfsync always`), so data survives [`RedisServer::kill`] and
    /// [`RedisServer::restart`]. Default: off, and nothing is persisted.
    pub append_only: bool,
    /// Serve TLS only (`rediss://`), with these files. Default: plaintext.
    pub tls: Option<RedisTls>,
    /// A config file to `include` (ACL users, say). Default: none.
    pub include: Option<PathBuf>,
    /// The user and password the harness itself connects as, where the
    /// included file turns the default user off. Default: none.
    pub admin: Option<(String, String)>,
    /// Run as a Redis Cluster node whose cluster bus listens on this port
    /// ([`super::RedisCluster`] forms the cluster). Default: none, a
    /// standalone server.
    pub cluster_bus_port: Option<u16>,
    /// Start from this configuration file (a deployment's own): then only
    /// where the server runs comes from here (its port, data dir, log and
    /// `include`), and everything else from the file, TLS included;
    /// [`tls`](Self::tls) only says which port it serves TLS on and how
    /// the harness trusts it. Default: none.
    pub config_file: Option<PathBuf>,
}

/// TLS files of a [`RedisServer`] (PEM).
#[derive(Debug, Clone)]
pub struct RedisTls {
    /// The server's certificate.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
    /// The CA the harness trusts the server by (and client certificates
    /// must chain to, where clients are verified).
    pub ca_file: PathBuf,
}

/// A `redis-server` on a free loopback port, with its data dir in its own
/// scratch dir. Killed on drop; see [`ChildProcess`].
///
/// The binary is `$TOOLFLEET_REDIS_SERVER`, else `redis-server` on `PATH`.
#[derive(Debug)]
pub struct RedisServer {
    process: ChildProcess,
    port: u16,
    client: redis::Client,
    tls: bool,
    start_timeout: Duration,
}

impl RedisServer {
    /// Starts a server without persistence, as tests want it (see
    /// [`ServerOptions::default`]), and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// See [`start_with`](Self::start_with).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(RedisConfig::default()).await
    }

    /// Starts a server configured by `config`, as tests want it (see
    /// [`ServerOptions::default`]), and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// See [`start_with_options`](Self::start_with_options).
    pub async fn start_with(config: RedisConfig) -> anyhow::Result<Self> {
        Self::start_with_options(config, &ServerOptions::default()).await
    }

    /// Starts a server configured by `config` as `options` say, and waits until
    /// it answers `PING`.
    ///
    /// The port is one the kernel just handed out as free; if another process
    /// binds it before redis-server does, start-up is retried on a fresh one.
    ///
    /// # Errors
    ///
    /// If no `redis-server` is found (the message says how to install it), the
    /// scratch dir can't be created, or the server doesn't come up in time (the
    /// message carries its log).
    pub async fn start_with_options(
        config: RedisConfig,
        options: &ServerOptions,
    ) -> anyhow::Result<Self> {
        Self::launch("redis-server", config, options).await
    }

    /// Starts a server named `name` (its dir and log), as
    /// [`start_with_options`](Self::start_with_options) does.
    pub(super) async fn launch(
        name: &str,
        config: RedisConfig,
        options: &ServerOptions,
    ) -> anyhow::Result<Self> {
        let binary = match process::program_from_env(BINARY_ENV, INSTALL_HINT)? {
            Some(path) => path,
            None => process::find_on_path("redis-server").with_context(|| {
                format!("redis-server not found ({BINARY_ENV} unset, none on PATH); {INSTALL_HINT}")
            })?,
        };
        let dir = ScratchDir::new(name, options.parent_dir.as_deref())?;
        let mut port = free_port()?;
        let args = server_args(port, dir.path(), &config);
        let process = ChildProcess::spawn_in(name, dir, binary, args, Vec::new(), options)?;
        for attempt in 1.. {
            match process.wait_for_log(READY, options.start_timeout).await {
                Ok(_) => break,
                Err(err) => {
                    let taken = process
                        .find_log_line(process.started_at(), PORT_TAKEN)?
                        .is_some();
                    if !taken || attempt == PORT_ATTEMPTS {
                        return Err(err);
                    }
                }
            }
            port = free_port()?;
            process.set_args(server_args(port, process.dir(), &config));
            process.respawn()?;
        }
        let client = admin_client(port, &config)?;
        let server = Self {
            process,
            port,
            client,
            tls: config.tls.is_some(),
            start_timeout: options.start_timeout,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    /// `redis://127.0.0.1:<port>/`, or `rediss://` with TLS.
    pub fn url(&self) -> String {
        url(self.port, self.tls)
    }

    /// The port; it stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data dir (where the append-only files go).
    pub fn dir(&self) -> &Path {
        self.process.dir()
    }

    /// The server process, for its log.
    pub fn process(&self) -> &ChildProcess {
        &self.process
    }

    /// A client for this server; connections are made from it on demand.
    pub fn client(&self) -> redis::Client {
        self.client.clone()
    }

    /// A connection that reconnects by itself, e.g. across [`restart`](Self::restart).
    ///
    /// # Errors
    ///
    /// If the server can't be reached.
    pub async fn connection(&self) -> anyhow::Result<redis::aio::ConnectionManager> {
        self.client
            .get_connection_manager()
            .await
            .with_context(|| format!("cannot connect to redis-server at {}", self.url()))
    }

    /// Deletes every key.
    ///
    /// # Errors
    ///
    /// If the server can't be reached.
    pub async fn flush_all(&self) -> anyhow::Result<()> {
        let mut connection = self.client.get_multiplexed_async_connection().await?;
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut connection)
            .await?;
        Ok(())
    }

    /// Kills the server (SIGKILL) if it runs, and starts it again on the same port
    /// with the same dir and config; returns once it answers `PING`. Keys survive
    /// only with [`RedisConfig::append_only`].
    ///
    /// # Errors
    ///
    /// If the server doesn't come back in time, e.g. because another process took
    /// the port meanwhile.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.process.respawn()?;
        self.process.wait_for_log(READY, self.start_timeout).await?;
        self.wait_ready().await
    }

    /// SIGKILL: the server dies as in a crash. [`restart`](Self::restart) brings it back.
    pub fn kill(&self) {
        self.process.kill();
    }

    /// SIGTERM, and waits for the server to exit (it is killed after 10s).
    ///
    /// # Errors
    ///
    /// If it didn't exit within 10s of SIGTERM.
    pub async fn stop(&self) -> anyhow::Result<ExitStatus> {
        self.process.stop(STOP_TIMEOUT).await
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let what = format!("redis-server at {} to answer PING", self.url());
        self.process
            .wait_until(&what, self.start_timeout, || async {
                let mut connection = self.client.get_multiplexed_async_connection().await?;
                redis::cmd("PING")
                    .query_async::<String>(&mut connection)
                    .await
            })
            .await?;
        Ok(())
    }
}

fn url(port: u16, tls: bool) -> String {
    let scheme = if tls { "rediss" } else { "redis" };
    format!("{scheme}://127.0.0.1:{port}/")
}

/// The harness's own client: as `config.admin`, over TLS trusting its CA.
fn admin_client(port: u16, config: &RedisConfig) -> anyhow::Result<redis::Client> {
    use redis::IntoConnectionInfo;
    let mut info = url(port, config.tls.is_some()).into_connection_info()?;
    if let Some((user, password)) = &config.admin {
        let settings = info
            .redis_settings()
            .clone()
            .set_username(user)
            .set_password(password);
        info = info.set_redis_settings(settings);
    }
    let Some(tls) = &config.tls else {
        return Ok(redis::Client::open(info)?);
    };
    let root_cert = std::fs::read(&tls.ca_file)
        .with_context(|| format!("cannot read {}", tls.ca_file.display()))?;
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_cert),
    };
    Ok(redis::Client::build_with_tls(info, certificates)?)
}

fn server_args(port: u16, dir: &Path, config: &RedisConfig) -> Vec<OsString> {
    if let Some(file) = &config.config_file {
        return file_args(file, port, dir, config);
    }
    let port = port.to_string();
    let append_only = if config.append_only { "yes" } else { "no" };
    // With TLS, the port speaks TLS only.
    let (plain_port, tls_port) = match config.tls {
        Some(_) => ("0", port.as_str()),
        None => (port.as_str(), "0"),
    };
    let mut args: Vec<OsString> = [
        "--port",
        plain_port,
        "--tls-port",
        tls_port,
        "--bind",
        "127.0.0.1",
        "--daemonize",
        "no",
        // No RDB snapshots: persistence, when wanted, is the AOF alone.
        "--save",
        "",
        "--appendonly",
        append_only,
        // A write is on disk before it is acknowledged, so a SIGKILL loses nothing.
        "--appendfsync",
        "always",
        // To stdout, which the harness captures into the process log.
        "--logfile",
        "",
        "--dir",
    ]
    .map(OsString::from)
    .into();
    args.push(PathBuf::from(dir).into());
    if let Some(tls) = &config.tls {
        args.extend([
            "--tls-cert-file".into(),
            tls.cert_file.clone().into(),
            "--tls-key-file".into(),
            tls.key_file.clone().into(),
            "--tls-ca-cert-file".into(),
            tls.ca_file.clone().into(),
            // Clients authenticate with ACL users; a certificate is optional.
            "--tls-auth-clients".into(),
            "optional".into(),
        ]);
    }
    if let Some(include) = &config.include {
        args.extend(["--include".into(), include.clone().into()]);
    }
    if let Some(bus_port) = config.cluster_bus_port {
        args.extend(
            [
                "--cluster-enabled",
                "yes",
                // In the data dir, so that a restarted node rejoins as itself.
                "--cluster-config-file",
                "nodes.conf",
                // A primary that stops answering for 2 s is failed over.
                "--cluster-node-timeout",
                "2000",
                "--cluster-port",
                &bus_port.to_string(),
            ]
            .map(OsString::from),
        );
    }
    args
}

/// The arguments of a server started from `file`: where it runs, nothing
/// else.
fn file_args(file: &Path, port: u16, dir: &Path, config: &RedisConfig) -> Vec<OsString> {
    let port_flag = if config.tls.is_some() {
        "--tls-port"
    } else {
        "--port"
    };
    let mut args: Vec<OsString> = vec![file.into()];
    args.extend(
        [
            port_flag,
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--daemonize",
            "no",
            "--logfile",
            "",
        ]
        .map(OsString::from),
    );
    args.extend(["--dir".into(), dir.into()]);
    if let Some(include) = &config.include {
        args.extend(["--include".into(), include.clone().into()]);
    }
    args
}

/// The `redis-cli` beside the `redis-server` in use (Debian's redis-tools,
/// which redis-server depends on), else the one on `PATH`.
pub(super) fn redis_cli() -> anyhow::Result<PathBuf> {
    let beside = process::program_from_env(BINARY_ENV, INSTALL_HINT)?
        .and_then(|server| server.parent().map(|dir| dir.join("redis-cli")))
        .filter(|path| path.is_file());
    beside
        .or_else(|| process::find_on_path("redis-cli"))
        .with_context(|| format!("redis-cli not found; {INSTALL_HINT}"))
}
