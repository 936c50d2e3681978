//! A child process with its own scratch dir, one log file holding stdout and
//! stderr, and a kill on drop.

use std::{
    ffi::{OsStr, OsString},
    fs::File,
    io::{Read as _, Seek as _, SeekFrom, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, MutexGuard, PoisonError, Weak},
    time::Duration,
};

use anyhow::{Context as _, anyhow, bail};

use super::wait::{self, Outcome};

/// Set to `1` to keep every scratch dir (logs, data) after the test, e.g. for CI
/// to upload them.
const KEEP_ENV: &str = "TOOLFLEET_TEST_KEEP";

/// How much of a log a failure shows.
const TAIL_LINES: usize = 50;

/// How [`NatsServer`](super::NatsServer) and [`RedisServer`](super::RedisServer)
/// run their process. The default is what tests want; `toolfleet dev` puts its
/// servers in its own temp dir, in their own process group, and quiet.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Where the server's scratch dir (data and log) goes: `<parent_dir>/<name>`,
    /// e.g. `<parent_dir>/nats-server`, left in place on drop for whoever owns
    /// `parent_dir` to keep or remove. Default: none, and the server gets a
    /// temp dir of its own (`toolfleet-<name>-*`), removed on drop unless
    /// `TOOLFLEET_TEST_KEEP=1`.
    pub parent_dir: Option<PathBuf>,
    /// Start the server in a process group of its own, so that a Ctrl-C at the
    /// terminal reaches only this process, which can then stop the server's
    /// clients before the server. Default: false, because a test runner that
    /// kills a test's process group on timeout (nextest) must take the test's
    /// servers with it.
    pub own_process_group: bool,
    /// Print the last 50 lines of the server's log to stderr when it is dropped
    /// (not with `TOOLFLEET_TEST_QUIET=1`). Default: true.
    pub log_tail_on_drop: bool,
    /// How long each step of start-up (and of a restart) may take: the server's
    /// "ready" log line, then its readiness probe. Default: 20s.
    pub start_timeout: Duration,
    /// The threads nats-server's Go runtime runs code on (`GOMAXPROCS`).
    /// Default: none, Go's own choice (one per CPU, or the container's CPU
    /// limit). Redis runs commands on one thread anyway.
    pub nats_threads: Option<usize>,
    /// More environment of nats-server (a deployment's configuration reads
    /// its secrets from there). Default: none.
    pub nats_env: Vec<(String, String)>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            parent_dir: None,
            own_process_group: false,
            log_tail_on_drop: true,
            start_timeout: Duration::from_secs(20),
            nats_threads: None,
            nats_env: Vec::new(),
        }
    }
}

/// A process's scratch dir: a temp dir of its own, which goes on drop unless
/// [`KEEP_ENV`] is set, or a dir inside someone else's, which stays.
#[derive(Debug)]
pub(crate) struct ScratchDir {
    path: PathBuf,
    /// The temp dir of its own, if it has one; `drop` takes it out to keep it.
    temp: Option<tempfile::TempDir>,
}

impl ScratchDir {
    /// A new temp dir named after `name`, or `<parent>/<name>` if `parent` is given.
    pub(crate) fn new(name: &str, parent: Option<&Path>) -> anyhow::Result<Self> {
        let name = file_name(name);
        if let Some(parent) = parent {
            let path = parent.join(&name);
            set_aside(&path)?;
            std::fs::create_dir(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            return Ok(Self { path, temp: None });
        }
        let temp = tempfile::Builder::new()
            .prefix(&format!("toolfleet-{name}-"))
            .tempdir()
            .context("cannot create a temp dir")?;
        Ok(Self {
            path: temp.path().to_owned(),
            temp: Some(temp),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::env::var_os(KEEP_ENV).is_some_and(|v| v == "1")
            && let Some(temp) = self.temp.take()
        {
            eprintln!("supervisor: kept {}", temp.keep().display());
        }
    }
}

/// Renames a dir left at `path` by an earlier start of the same server in
/// the same parent (one that failed: a cluster's start is tried again when
/// a port was taken between its reservation and the bind) to the first free
/// `<path>.failed-<n>`, so that the new start gets a fresh dir and the
/// failed one's log is kept with the parent.
fn set_aside(path: &Path) -> anyhow::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let mut aside = path.to_owned();
    for attempt in 1.. {
        aside.set_file_name(format!(
            "{}.failed-{attempt}",
            path.file_name().unwrap_or_default().to_string_lossy()
        ));
        if !aside.exists() {
            break;
        }
    }
    std::fs::rename(path, &aside).with_context(|| {
        format!(
            "cannot move {} aside to {}",
            path.display(),
            aside.display()
        )
    })
}

/// `name` with anything but letters, digits, `-` and `_` replaced, for use in a path.
fn file_name(name: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    name.chars()
        .map(|c| if safe(c) { c } else { '_' })
        .collect()
}

/// A position in a process log; see [`ChildProcess::log_mark`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogMark(u64);

/// A program run by a test or by `toolfleet dev`, e.g. a workspace binary found
/// with [`cargo_bin`].
///
/// It runs in its own scratch dir (also its working directory), with stdout and
/// stderr appended to one log file there; it inherits this process's environment
/// plus the variables given to [`spawn`](Self::spawn).
///
/// Dropping it kills the process, prints the last 50 lines of its log to stderr
/// (not with `TOOLFLEET_TEST_QUIET=1`, nor for a server started with
/// [`ServerOptions::log_tail_on_drop`] off) and removes the dir (kept with
/// `TOOLFLEET_TEST_KEEP=1`; see [`ServerOptions::parent_dir`] for the other
/// place a dir can be). The log is printed on every drop, not only on panic:
/// a test that fails by returning `Err` is not panicking when its locals drop,
/// and the test runner shows stderr only for failing tests anyway.
///
/// Every method takes `&self`, so a test can kill a process it only borrows;
/// [`kill_handle`](Self::kill_handle) kills it from anywhere.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    program: PathBuf,
    envs: Vec<(OsString, OsString)>,
    log_path: PathBuf,
    own_process_group: bool,
    log_tail_on_drop: bool,
    /// Shared only with [`KillHandle`]s, which hold it weakly.
    state: Arc<Mutex<State>>,
    // Last, so the dir goes only after `drop` has killed the process.
    dir: ScratchDir,
}

#[derive(Debug)]
struct State {
    child: Child,
    args: Vec<OsString>,
    /// Where the current run's output starts in the log.
    started_at: LogMark,
}

impl ChildProcess {
    /// Starts `program` with `args` and `envs`; `name` labels its dir, log and errors.
    ///
    /// # Errors
    ///
    /// If the scratch dir or log can't be created, or the program can't be started
    /// (e.g. it doesn't exist).
    pub fn spawn<A, E, K, V>(
        name: &str,
        program: impl Into<PathBuf>,
        args: A,
        envs: E,
    ) -> anyhow::Result<Self>
    where
        A: IntoIterator,
        A::Item: AsRef<OsStr>,
        E: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        // Run as a test's servers are: no process group, tails on drop.
        Self::spawn_with(name, program, args, envs, &ServerOptions::default())
    }

    /// [`spawn`](Self::spawn), placed and run as `options` say (its dir, its
    /// process group, whether its log tail is printed on drop).
    ///
    /// # Errors
    ///
    /// As [`spawn`](Self::spawn).
    pub fn spawn_with<A, E, K, V>(
        name: &str,
        program: impl Into<PathBuf>,
        args: A,
        envs: E,
        options: &ServerOptions,
    ) -> anyhow::Result<Self>
    where
        A: IntoIterator,
        A::Item: AsRef<OsStr>,
        E: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let args = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let envs = envs
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
            .collect();
        let dir = ScratchDir::new(name, options.parent_dir.as_deref())?;
        Self::spawn_in(name, dir, program.into(), args, envs, options)
    }

    /// [`spawn`](Self::spawn) into a dir the caller prepared, for servers whose
    /// arguments name paths inside it, as `options` say.
    pub(crate) fn spawn_in(
        name: &str,
        dir: ScratchDir,
        program: PathBuf,
        args: Vec<OsString>,
        envs: Vec<(OsString, OsString)>,
        options: &ServerOptions,
    ) -> anyhow::Result<Self> {
        let log_path = dir.path().join(format!("{}.log", file_name(name)));
        let own_process_group = options.own_process_group;
        let (child, started_at) = launch(
            name,
            &program,
            &args,
            &envs,
            own_process_group,
            dir.path(),
            &log_path,
        )?;
        Ok(Self {
            name: name.to_owned(),
            program,
            envs,
            log_path,
            own_process_group,
            log_tail_on_drop: options.log_tail_on_drop,
            state: Arc::new(Mutex::new(State {
                child,
                args,
                started_at,
            })),
            dir,
        })
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current run's process id (it stays valid after exit until the next respawn).
    pub fn pid(&self) -> u32 {
        self.lock().child.id()
    }

    /// The scratch dir, which is also the working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log file: stdout and stderr of every run, each run after a
    /// `=== supervisor: starting ...` line.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Whether the current run has not exited yet.
    pub fn is_running(&self) -> bool {
        matches!(self.lock().child.try_wait(), Ok(None))
    }

    /// Sends SIGKILL, if the process is still running, and reaps it.
    pub fn kill(&self) {
        kill_and_reap(&mut self.lock().child, &self.log_path);
    }

    /// A handle that kills this process from any thread, without owning it:
    /// for a signal handler that exits without running destructors.
    pub fn kill_handle(&self) -> KillHandle {
        KillHandle {
            state: Arc::downgrade(&self.state),
            log_path: self.log_path.clone(),
        }
    }

    /// Sends SIGTERM, if the process is still running, without waiting for it;
    /// follow with [`wait_exit`](Self::wait_exit).
    ///
    /// # Errors
    ///
    /// If the signal can't be sent.
    pub fn terminate(&self) -> anyhow::Result<()> {
        self.signal("TERM")
    }

    /// Sends SIGSTOP, if the process is still running: it does nothing, and
    /// answers nobody, until [`thaw`](Self::thaw) (a hung or partitioned
    /// server, as its peers see it).
    ///
    /// # Errors
    ///
    /// If the signal can't be sent.
    pub fn freeze(&self) -> anyhow::Result<()> {
        self.signal("STOP")
    }

    /// Sends SIGCONT: a [`freeze`](Self::freeze)n process goes on.
    ///
    /// # Errors
    ///
    /// If the signal can't be sent.
    pub fn thaw(&self) -> anyhow::Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let mut state = self.lock();
        // Only an unreaped child is signalled, so its pid can't have been reused.
        if state.child.try_wait()?.is_some() {
            return Ok(());
        }
        let pid = state.child.id();
        note(&self.log_path, &format!("sending SIG{signal} to pid {pid}"));
        // `kill` through the shell, because `unsafe_code` is forbidden (no libc)
        // and this doesn't deserve a dependency.
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("kill -s {signal} {pid}"))
            .status()
            .with_context(|| format!("cannot run sh to send SIG{signal}"))?;
        if !status.success() {
            bail!("kill -s {signal} {pid} ({}) failed: {status}", self.name);
        }
        Ok(())
    }

    /// Waits for the current run to exit and returns its status.
    ///
    /// # Errors
    ///
    /// If it is still running after `timeout`.
    pub async fn wait_exit(&self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let what = format!("{} (pid {}) to exit", self.name, self.pid());
        // A failed `try_wait` counts as "not yet"; it shows up as the timeout.
        wait::wait_until(&what, timeout, || async {
            self.lock().child.try_wait().ok().flatten()
        })
        .await
    }

    /// SIGTERM, then waits up to `timeout` for the process to exit; if it doesn't,
    /// kills it and fails.
    ///
    /// # Errors
    ///
    /// If SIGTERM can't be sent or the process outlives `timeout`.
    pub async fn stop(&self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        self.terminate()?;
        match self.wait_exit(timeout).await {
            Ok(status) => Ok(status),
            Err(err) => {
                self.kill();
                Err(err.context(format!("{} ignored SIGTERM; killed it", self.name)))
            }
        }
    }

    /// Kills the current run, if any, and starts the program again with the same
    /// arguments, environment and dir; the log is appended to.
    ///
    /// # Errors
    ///
    /// If the program can't be started.
    pub fn respawn(&self) -> anyhow::Result<()> {
        let mut state = self.lock();
        kill_and_reap(&mut state.child, &self.log_path);
        let (child, started_at) = launch(
            &self.name,
            &self.program,
            &state.args,
            &self.envs,
            self.own_process_group,
            self.dir.path(),
            &self.log_path,
        )?;
        state.child = child;
        state.started_at = started_at;
        Ok(())
    }

    /// Where the current run's output starts in the log.
    pub(crate) fn started_at(&self) -> LogMark {
        self.lock().started_at
    }

    /// Replaces the arguments used by the next [`respawn`](Self::respawn).
    pub(crate) fn set_args(&self, args: Vec<OsString>) {
        self.lock().args = args;
    }

    /// The end of the log as it is now: pass it to
    /// [`wait_for_log_after`](Self::wait_for_log_after) to wait for a line that
    /// hasn't been logged yet.
    pub fn log_mark(&self) -> LogMark {
        LogMark(std::fs::metadata(&self.log_path).map_or(0, |m| m.len()))
    }

    /// Waits until the current run logs a line containing `needle`, and returns
    /// that line. Lines from earlier runs (before a respawn) don't count.
    ///
    /// # Errors
    ///
    /// If the process exits first, or `timeout` passes; the error carries the
    /// log's tail.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        self.wait_for_log_after(self.started_at(), needle, timeout)
            .await
    }

    /// Like [`wait_for_log`](Self::wait_for_log), but only lines logged after `mark` count.
    ///
    /// # Errors
    ///
    /// If the process exits first, or `timeout` passes; the error carries the
    /// log's tail.
    pub async fn wait_for_log_after(
        &self,
        mark: LogMark,
        needle: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        let what = format!("{} to log {needle:?}", self.name);
        // The log file exists from spawn on, so a read error is only ever transient.
        self.wait_until(&what, timeout, || async {
            self.find_log_line(mark, needle).ok().flatten()
        })
        .await
    }

    /// [`wait_until`](super::wait_until) while this process runs: it gives up as
    /// soon as the process exits, and either error carries the log's tail. Use it
    /// for readiness probes (a health check, a port that accepts connections).
    ///
    /// # Errors
    ///
    /// If the process exits first, or `timeout` passes.
    pub async fn wait_until<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        probe: F,
    ) -> anyhow::Result<<Fut::Output as Outcome>::Output>
    where
        F: FnMut() -> Fut,
        Fut: Future,
        Fut::Output: Outcome,
    {
        let exited = || match self.lock().child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) => Some(anyhow!("{} exited ({status})", self.name)),
            Err(err) => Some(anyhow!(err).context(format!("cannot check on {}", self.name))),
        };
        // The probe runs once more after the exit is seen: a process that logs a
        // line and then exits has still logged it.
        let mut gone = false;
        let result = wait::poll(what, timeout, probe, || {
            if gone {
                exited()
            } else {
                gone = exited().is_some();
                None
            }
        })
        .await;
        result.map_err(|err| anyhow!("{err:#}\n{}", self.log_tail_report()))
    }

    /// The last `lines` lines of the log, across all runs.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }

    fn log_tail_report(&self) -> String {
        log_tail_report(&self.name, &self.log_path)
    }

    /// The first complete line after `mark` that contains `needle`. A line still
    /// being written is skipped: half of "listening on 127.0.0.1:4222" would give
    /// the wrong port.
    pub(crate) fn find_log_line(
        &self,
        mark: LogMark,
        needle: &str,
    ) -> anyhow::Result<Option<String>> {
        let mut file = File::open(&self.log_path)
            .with_context(|| format!("cannot open {}", self.log_path.display()))?;
        file.seek(SeekFrom::Start(mark.0))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        Ok(text
            .split_inclusive('\n')
            .filter(|line| line.ends_with('\n') && line.contains(needle))
            .map(|line| line.trim_end().to_owned())
            .next())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic elsewhere must not stop a kill.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Set to `1` to skip the log tails printed when a process is dropped.
const QUIET_ENV: &str = "TOOLFLEET_TEST_QUIET";

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
        // Neither a local fleet nor the demos and benchmarks built on the
        // harness are tests: no tails.
        if self.log_tail_on_drop && std::env::var_os(QUIET_ENV).is_none_or(|v| v != "1") {
            eprintln!("{}", self.log_tail_report());
        }
    }
}

/// Kills a [`ChildProcess`] without owning it; see
/// [`ChildProcess::kill_handle`]. Cheap to clone; harmless to use more than
/// once or after the process was dropped (which killed it).
#[derive(Debug, Clone)]
pub struct KillHandle {
    state: Weak<Mutex<State>>,
    log_path: PathBuf,
}

impl KillHandle {
    /// Sends SIGKILL to the process's current run, if it still runs, and reaps it.
    pub fn kill(&self) {
        if let Some(state) = self.state.upgrade() {
            kill_and_reap(&mut lock(&state).child, &self.log_path);
        }
    }
}

/// The last `lines` lines of the log file at `path`, or why it can't be read.
fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|err| format!("(cannot read {}: {err})\n", path.display()));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last 50 lines of the log file at `path`, framed and labelled with
/// `name`, for an error message to carry.
pub fn log_tail_report(name: &str, path: &Path) -> String {
    format!(
        "--- last {TAIL_LINES} lines of {name} ({}) ---\n{}\n--- end of {name} log ---",
        path.display(),
        log_tail(path, TAIL_LINES),
    )
}

fn launch(
    name: &str,
    program: &Path,
    args: &[OsString],
    envs: &[(OsString, OsString)],
    own_process_group: bool,
    dir: &Path,
    log_path: &Path,
) -> anyhow::Result<(Child, LogMark)> {
    let mut log = File::options()
        .create(true)
        .append(true)
        .open(log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let command_line = std::iter::once(program.as_os_str())
        .chain(args.iter().map(OsString::as_os_str))
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    writeln!(log, "=== supervisor: starting {command_line} ===")?;
    let started_at = LogMark(log.metadata()?.len());
    let stderr = log.try_clone()?;
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr);
    if own_process_group {
        command.process_group(0);
    }
    let child = command
        .spawn()
        .with_context(|| format!("cannot start {name}: {command_line}"))?;
    Ok((child, started_at))
}

/// `arg` as a shell would need it, so the logged command line can be pasted to
/// rerun the process by hand.
fn shell_quote(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// Appends a line of the supervisor's own to the log, so a tail shows what the
/// test (or the CLI) did to the process. Best effort: it only explains.
fn note(log_path: &Path, text: &str) {
    if let Ok(mut log) = File::options().append(true).open(log_path) {
        let _ = writeln!(log, "=== supervisor: {text} ===");
    }
}

fn kill_and_reap(child: &mut Child, log_path: &Path) {
    if let Ok(None) = child.try_wait() {
        note(log_path, &format!("sending SIGKILL to pid {}", child.id()));
        // Errors mean it exited meanwhile; `wait` reaps it either way.
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The path of a binary built from this workspace (`toolfleet-worker`, ...).
///
/// Honours `CARGO_BIN_EXE_<name>` and `NEXTEST_BIN_EXE_<name>`, which are set for
/// a package's own binaries; otherwise looks beside the test executable
/// (`target/<profile>/deps/<test>` gives `target/<profile>/<name>`).
///
/// # Errors
///
/// If the binary hasn't been built: build it first with `cargo build --workspace --bins`.
/// A binary older than the sources is not detected.
pub fn cargo_bin(name: &str) -> anyhow::Result<PathBuf> {
    for var in [
        format!("CARGO_BIN_EXE_{name}"),
        format!("NEXTEST_BIN_EXE_{name}"),
    ] {
        if let Some(path) = std::env::var_os(&var) {
            return Ok(path.into());
        }
    }
    let exe = std::env::current_exe().context("cannot find the test executable")?;
    let mut dir = exe.parent().context("test executable has no parent dir")?;
    // Tests run from target/<profile>/deps, examples from target/<profile>/examples.
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir = dir.parent().context("deps dir has no parent")?;
    }
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.is_file() {
        bail!(
            "binary {name} not found at {}; build it first: cargo build --workspace --bins",
            path.display()
        );
    }
    Ok(path)
}

/// The program the environment variable `var` names, if it is set; `hint`
/// says how to get one when the path is not a file.
pub(crate) fn program_from_env(var: &str, hint: &str) -> anyhow::Result<Option<PathBuf>> {
    let Some(path) = std::env::var_os(var) else {
        return Ok(None);
    };
    let path = PathBuf::from(path);
    if !path.is_file() {
        bail!("{var}={} is not a file; {hint}", path.display());
    }
    Ok(Some(path))
}

/// The first `name` in a `PATH` dir.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_started_again_in_the_same_parent_gets_a_fresh_dir_and_keeps_the_old() {
        let parent = tempfile::tempdir().unwrap();
        let first = ScratchDir::new("nats-server-0", Some(parent.path())).unwrap();
        std::fs::write(first.path().join("server.log"), "first").unwrap();
        let second = ScratchDir::new("nats-server-0", Some(parent.path())).unwrap();
        assert_eq!(second.path(), parent.path().join("nats-server-0"));
        assert!(
            std::fs::read_dir(second.path()).unwrap().next().is_none(),
            "fresh"
        );
        let kept = parent.path().join("nats-server-0.failed-1");
        assert_eq!(
            std::fs::read_to_string(kept.join("server.log")).unwrap(),
            "first"
        );
        ScratchDir::new("nats-server-0", Some(parent.path())).unwrap();
        assert!(parent.path().join("nats-server-0.failed-2").is_dir());
        assert!(
            kept.join("server.log").is_file(),
            "an older one stays as it was"
        );
    }
}
