//! The [`KillSwitch`]: a fleet's servers killed and its temp dir removed
//! at once, for the moment a process exits without running destructors.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::supervisor::{ChildProcess, KillHandle, Reaper};

/// Kills a fleet's servers and removes its temp dir, synchronously and at
/// once. For the moment a process exits without running destructors (the
/// second Ctrl-C, see `toolfleet_cli::watch_signals_then`):
/// `move || switch.kill()`. Cheap to clone; harmless to fire more than once or
/// after the fleet stopped.
#[derive(Debug, Clone, Default)]
pub struct KillSwitch {
    inner: Arc<Mutex<KillList>>,
    /// Told the same processes and dirs, for a death that runs no code.
    reaper: Option<Arc<Reaper>>,
}

#[derive(Debug, Default)]
struct KillList {
    processes: Vec<KillHandle>,
    dirs: Vec<PathBuf>,
}

impl KillSwitch {
    /// A kill switch that also keeps a [`Reaper`] (started from `program`,
    /// the `toolfleet` binary) informed, so that even `kill -9` of this
    /// process leaves no server or dir behind. Without the reaper when it
    /// cannot start, with a warning.
    pub fn with_reaper(program: &Path) -> Self {
        let reaper = match Reaper::spawn(program) {
            Ok(reaper) => Some(Arc::new(reaper)),
            Err(err) => {
                eprintln!(
                    "warning: cannot start the reaper ({err}); if this process is killed \
                     with kill -9, its nats-server and redis-server keep running"
                );
                None
            }
        };
        Self {
            inner: Arc::default(),
            reaper,
        }
    }

    /// Kills the registered servers and removes the registered dirs.
    pub fn kill(&self) {
        let list = std::mem::take(&mut *self.lock());
        for process in &list.processes {
            process.kill();
        }
        for dir in list.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    pub(super) fn register_process(&self, process: &ChildProcess) {
        self.lock().processes.push(process.kill_handle());
        if let Some(reaper) = &self.reaper {
            reaper.watch_process(process.pid());
        }
    }

    pub(super) fn register_dir(&self, dir: &Path) {
        self.lock().dirs.push(dir.to_owned());
        if let Some(reaper) = &self.reaper {
            reaper.watch_dir(dir);
        }
    }

    /// Forgets everything registered, the reaper too: the fleet has stopped
    /// its servers and removed its dir itself.
    pub fn disarm(&self) {
        *self.lock() = KillList::default();
        if let Some(reaper) = &self.reaper {
            reaper.disarm();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KillList> {
        // Killing must work even after a panic elsewhere.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_switch_kills_servers_and_removes_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let server = ChildProcess::spawn("sleep", "/bin/sleep", ["30"], NO_ENV).unwrap();
        let switch = KillSwitch::default();
        switch.register_process(&server);
        switch.register_dir(&data);
        assert!(server.is_running());
        switch.clone().kill();
        assert!(!server.is_running());
        assert!(!data.exists());
        // Fired again: nothing left to do.
        switch.kill();
        assert_eq!(server.log_tail(10).matches("sending SIGKILL").count(), 1);

        // A process dropped before the switch fires is already dead.
        let gone = ChildProcess::spawn("sleep", "/bin/sleep", ["30"], NO_ENV).unwrap();
        switch.register_process(&gone);
        drop(gone);
        switch.kill();
    }

    const NO_ENV: [(&str, &str); 0] = [];
}
