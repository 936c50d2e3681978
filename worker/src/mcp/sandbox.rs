//! What a stdio MCP server may reach of the worker that starts it. The
//! server is third-party code run as the worker's own user: unguarded, it
//! could read the worker's NATS and Redis credentials. Two walls keep them
//! (`mcp.sandbox`, docs/tools/mcp.md):
//!
//! - **The worker is not dumpable** ([`make_the_worker_undumpable`], at
//!   start): no process of the same user may read its memory or its
//!   environment (`/proc/<pid>/environ` shows the initial block, whatever
//!   the process later clears), trace it, or open its `/proc/<pid>/mem`,
//!   `root` or `fd`. Only a process with `CAP_SYS_PTRACE` (root) still can.
//! - **The server runs in a Landlock domain** that reaches every file but
//!   the worker's own (its configuration and credential files,
//!   [`Sandbox::new`]'s `guarded`): Landlock only allows, so the domain
//!   allows each entry of the directories on the way to a guarded file but
//!   that file, and lets those directories themselves be listed and added
//!   to, nothing more ([`rules`]).
//!
//! Landlock restricts the thread that asks for it and what that thread
//! starts, nothing else: the server is started from a thread made for it
//! and ended after, so the worker's own threads keep their rights. (std's
//! `pre_exec` could restrict the child itself, but needs `unsafe`, which
//! the workspace forbids.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};
use tokio::process::Child;
use tracing::{info, warn};

/// Whether stdio MCP servers run in a sandbox (`mcp.sandbox`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// In a Landlock domain where the kernel has Landlock; where it has
    /// not, without one, said in a warning at each start of a server.
    #[default]
    Auto,
    /// In a Landlock domain, or not at all: a server is not started on a
    /// kernel without Landlock.
    Required,
    /// Without one (the worker is still not dumpable).
    Off,
}

/// How far one rule of the domain reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reach {
    /// The path and everything beneath it.
    Whole,
    /// A directory on the way to a guarded file: it may be listed and
    /// added to; what is beneath it is reached by its own rules.
    Passage,
}

/// The domain of `guarded` files (absolute and resolved), under `root`:
/// every entry of each directory on the way to one of them is reached
/// whole, but a guarded file, a directory on the way, and a symbolic link
/// (whoever opens it reaches its target, which the rules judge; reached
/// whole, a link to a guarded file's directory would open it). Entries
/// made after the rules are not reached.
fn rules(root: &Path, guarded: &BTreeSet<PathBuf>) -> Vec<(PathBuf, Reach)> {
    let passages: BTreeSet<&Path> = guarded
        .iter()
        .flat_map(|file| file.ancestors().skip(1))
        .filter(|dir| dir.starts_with(root))
        .collect();
    if passages.is_empty() {
        return vec![(root.to_owned(), Reach::Whole)];
    }
    let mut rules = Vec::new();
    for dir in &passages {
        rules.push((dir.to_path_buf(), Reach::Passage));
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let link = entry.file_type().map_or(true, |kind| kind.is_symlink());
            if !link && !guarded.contains(&path) && !passages.contains(path.as_path()) {
                rules.push((path, Reach::Whole));
            }
        }
    }
    rules
}

/// The sandbox of a worker's stdio MCP servers.
#[derive(Debug, Clone)]
pub struct Sandbox {
    mode: SandboxMode,
    /// The worker's own files, each as configured and as resolved (a
    /// mounted Secret's file is a link to the file of its current version).
    guarded: BTreeSet<PathBuf>,
}

impl Sandbox {
    /// The sandbox of `mode`, keeping servers from the files `guarded`
    /// (relative ones under the worker's working directory; missing ones
    /// need no keeping).
    pub fn new(mode: SandboxMode, guarded: impl IntoIterator<Item = PathBuf>) -> Self {
        let here = std::env::current_dir().unwrap_or_default();
        let guarded = guarded
            .into_iter()
            .map(|path| here.join(path))
            .flat_map(|path| [path.canonicalize().ok(), Some(path)])
            .flatten()
            .collect();
        Self { mode, guarded }
    }

    /// Starts `program` (a stdio server's process) in the sandbox, its
    /// stdin, stdout and stderr piped.
    ///
    /// # Errors
    ///
    /// The program cannot be started, or the sandbox is required and
    /// cannot be made; why, for the log.
    pub(super) async fn spawn(
        &self,
        server: &str,
        program: tokio::process::Command,
    ) -> Result<Child, String> {
        if self.mode == SandboxMode::Off {
            return start(program);
        }
        let (sandbox, server) = (self.clone(), server.to_owned());
        let runtime = tokio::runtime::Handle::current();
        let (answer, answered) = tokio::sync::oneshot::channel();
        // A thread of its own, ended once the server is started: the
        // domain is this thread's, and its children's, for good.
        std::thread::Builder::new()
            .name("mcp-sandbox".into())
            .spawn(move || {
                let _runtime = runtime.enter();
                let started = sandbox
                    .restrict_this_thread(&server)
                    .and_then(|()| start(program));
                let _ = answer.send(started);
            })
            .map_err(|err| format!("cannot make the sandbox's thread: {err}"))?;
        answered
            .await
            .map_err(|_| "the sandbox's thread ended without an answer".to_owned())?
    }

    /// Puts the calling thread in the servers' Landlock domain.
    #[cfg(target_os = "linux")]
    fn restrict_this_thread(&self, server: &str) -> Result<(), String> {
        use landlock::{
            ABI, Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
            RulesetStatus, Scope,
        };
        let abi = ABI::V6;
        let passage = AccessFs::ReadDir
            | AccessFs::MakeReg
            | AccessFs::MakeDir
            | AccessFs::MakeSock
            | AccessFs::MakeFifo;
        let failed = |err: landlock::RulesetError| format!("cannot make the sandbox: {err}");
        let mut ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(abi))
            .and_then(|ruleset| ruleset.scope(Scope::Signal))
            .and_then(Ruleset::create)
            .map_err(failed)?;
        for (path, reach) in rules(Path::new("/"), &self.guarded) {
            // Gone since it was listed: nothing to reach.
            let Ok(fd) = PathFd::new(&path) else { continue };
            let access = match reach {
                Reach::Passage => passage,
                Reach::Whole if path.is_dir() => AccessFs::from_all(abi),
                Reach::Whole => AccessFs::from_file(abi),
            };
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, access))
                .map_err(failed)?;
        }
        let status = ruleset.restrict_self().map_err(failed)?;
        match (status.ruleset, self.mode) {
            (RulesetStatus::NotEnforced, SandboxMode::Required) => Err(
                "mcp.sandbox is \"required\" and this kernel has no Landlock (Linux 5.13 or \
                 later, with landlock among its LSMs): the server is not started"
                    .to_owned(),
            ),
            (RulesetStatus::NotEnforced, _) => {
                warn!(
                    server,
                    "this kernel has no Landlock: the MCP server runs without a sandbox and can \
                     read the worker's files (set mcp.sandbox = \"required\" to refuse)"
                );
                Ok(())
            }
            (RulesetStatus::PartiallyEnforced | RulesetStatus::FullyEnforced, _) => {
                info!(server, guarded = self.guarded.len(), "MCP server sandboxed");
                Ok(())
            }
        }
    }

    /// No Landlock outside Linux.
    #[cfg(not(target_os = "linux"))]
    fn restrict_this_thread(&self, server: &str) -> Result<(), String> {
        if self.mode == SandboxMode::Required {
            return Err("mcp.sandbox is \"required\", and only Linux has Landlock".to_owned());
        }
        warn!(
            server,
            "the MCP server runs without a sandbox (Landlock is Linux's)"
        );
        Ok(())
    }
}

/// Starts a stdio server's process, its stdin, stdout and stderr piped.
fn start(mut program: tokio::process::Command) -> Result<Child, String> {
    let command = program
        .as_std()
        .get_program()
        .to_string_lossy()
        .into_owned();
    program
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))
}

/// Makes this process not dumpable, so that no process of its user (a
/// stdio MCP server it starts) can read its memory or environment.
pub fn make_the_worker_undumpable() {
    #[cfg(target_os = "linux")]
    if let Err(err) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        warn!(error = %err, "cannot make the worker not dumpable: a process of its user could read its memory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_reach_everything_but_the_guarded_files() {
        let root = tempfile::tempdir().unwrap();
        let at = |path: &str| root.path().join(path);
        for dir in ["etc/toolfleet/nats/..2026", "srv/server", "tmp"] {
            std::fs::create_dir_all(at(dir)).unwrap();
        }
        for file in [
            "etc/passwd",
            "etc/toolfleet/worker.toml",
            "etc/toolfleet/nats/..2026/password",
            "srv/server/main.py",
        ] {
            std::fs::write(at(file), "x").unwrap();
        }
        // A mounted Secret: its file a link to the current version's.
        std::os::unix::fs::symlink("..2026", at("etc/toolfleet/nats/..data")).unwrap();
        std::os::unix::fs::symlink("..data/password", at("etc/toolfleet/nats/password")).unwrap();
        std::os::unix::fs::symlink("toolfleet", at("etc/alias")).unwrap();
        let guarded: BTreeSet<PathBuf> = [
            at("etc/toolfleet/worker.toml"),
            at("etc/toolfleet/nats/password"),
            at("etc/toolfleet/nats/..2026/password"),
        ]
        .into();
        let mut rules = rules(root.path(), &guarded);
        rules.sort();
        let relative: Vec<(String, Reach)> = rules
            .into_iter()
            .map(|(path, reach)| {
                let path = path
                    .strip_prefix(root.path())
                    .unwrap()
                    .display()
                    .to_string();
                (path, reach)
            })
            .collect();
        let expected = [
            ("", Reach::Passage),
            ("etc", Reach::Passage),
            ("etc/passwd", Reach::Whole),
            ("etc/toolfleet", Reach::Passage),
            ("etc/toolfleet/nats", Reach::Passage),
            ("etc/toolfleet/nats/..2026", Reach::Passage),
            ("srv", Reach::Whole),
            ("tmp", Reach::Whole),
        ];
        let expected: Vec<(String, Reach)> = expected
            .into_iter()
            .map(|(path, reach)| (path.to_owned(), reach))
            .collect();
        assert_eq!(relative, expected);
        assert_eq!(
            super::rules(root.path(), &BTreeSet::new()),
            [(root.path().to_owned(), Reach::Whole)],
            "nothing guarded: everything reached"
        );
    }

    #[test]
    fn guarded_files_are_kept_as_configured_and_as_resolved() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("..2026")).unwrap();
        std::fs::write(dir.path().join("..2026/token"), "t").unwrap();
        std::os::unix::fs::symlink("..2026/token", dir.path().join("token")).unwrap();
        let sandbox = Sandbox::new(
            SandboxMode::Auto,
            [dir.path().join("token"), dir.path().join("missing")],
        );
        let resolved = dir.path().canonicalize().unwrap().join("..2026/token");
        assert!(sandbox.guarded.contains(&resolved), "{sandbox:?}");
        assert!(sandbox.guarded.contains(&dir.path().join("token")));
        assert!(sandbox.guarded.contains(&dir.path().join("missing")));
    }
}
