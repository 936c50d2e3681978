//! A watchdog process that cleans up after its parent dies without warning.
//!
//! `toolfleet dev` stops its nats-server and redis-server and removes its
//! temp dir on Ctrl-C and SIGTERM, but `kill -9` runs no code at all. So
//! `dev` starts `toolfleet reap` (a hidden command) with a pipe on its stdin
//! and tells it, one line each, the processes to kill and the dirs to
//! remove. When the pipe closes without a `disarm` line (the kernel closes it
//! when the parent dies, however it dies), the reaper kills and removes what
//! it was told. A parent that cleaned up itself sends `disarm` first, so
//! that a pid the kernel has since reused is never signalled.
//!
//! Written with a pipe rather than `PR_SET_PDEATHSIG` because that needs
//! `unsafe` between fork and exec, which this workspace forbids, and it would
//! not remove the dir.

use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, PoisonError};

/// The hidden subcommand that runs [`serve`].
pub const COMMAND: &str = "reap";

/// The parent's end of a reaper.
#[derive(Debug)]
pub struct Reaper {
    stdin: Mutex<ChildStdin>,
    /// Kept so that the reaper is waited for when it exits early.
    _child: Child,
}

impl Reaper {
    /// Starts `program reap` (the `toolfleet` binary) in its own process
    /// group, so that a Ctrl-C at the terminal reaches only the parent.
    ///
    /// # Errors
    ///
    /// The program cannot be started.
    pub fn spawn(program: &Path) -> std::io::Result<Self> {
        use std::os::unix::process::CommandExt as _;
        let mut child = Command::new(program)
            .arg(COMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take().expect("stdin is piped");
        Ok(Self {
            stdin: Mutex::new(stdin),
            _child: child,
        })
    }

    /// Kill process `pid` if the parent dies first.
    pub fn watch_process(&self, pid: u32) {
        self.send(&format!("pid {pid}"));
    }

    /// Remove `dir` if the parent dies first. A path with a line break
    /// cannot be said on the line protocol and is left alone.
    pub fn watch_dir(&self, dir: &Path) {
        if let Some(path) = dir.to_str().filter(|p| !p.contains('\n')) {
            self.send(&format!("dir {path}"));
        }
    }

    /// Forget everything: the parent has cleaned up itself.
    pub fn disarm(&self) {
        self.send("disarm");
    }

    fn send(&self, line: &str) {
        let mut stdin = self.stdin.lock().unwrap_or_else(PoisonError::into_inner);
        // A reaper that is gone cannot help; the parent goes on without it.
        let _ = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
    }
}

/// The reaper's side: reads the parent's lines until the pipe closes, then
/// kills the processes and removes the dirs it was told of since the last
/// `disarm`.
pub fn serve(input: impl BufRead) {
    let mut pids: Vec<u32> = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        match line.split_once(' ') {
            Some(("pid", pid)) => pids.extend(pid.parse::<u32>().ok().filter(|&p| p > 1)),
            Some(("dir", dir)) => dirs.push(PathBuf::from(dir)),
            _ if line == "disarm" => {
                pids.clear();
                dirs.clear();
            }
            _ => {}
        }
    }
    for pid in pids {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    // The servers are gone: nothing writes into the dirs any more.
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_what_it_was_told_unless_disarmed() {
        let kept = tempfile::tempdir().unwrap();
        let removed = tempfile::tempdir().unwrap();
        let script = format!(
            "dir {}\ndisarm\ndir {}\nnonsense line\npid 1\npid x\n",
            kept.path().display(),
            removed.path().display()
        );
        serve(script.as_bytes());
        assert!(kept.path().exists(), "disarmed before the end");
        assert!(!removed.path().exists());
    }
}
