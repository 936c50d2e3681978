//! The [`FleetLog`]: where an in-process fleet's tracing output goes.

use std::fs::File;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use anyhow::Context as _;

/// Where the fleet's tracing output goes: the current fleet's `fleet.log`, or
/// nowhere between fleets. The global subscriber is installed once per
/// process, so a second fleet (a benchmark's) re-targets it.
pub(super) struct FleetLog;

static FLEET_LOG: Mutex<Option<File>> = Mutex::new(None);

impl FleetLog {
    pub(super) fn install(path: &Path) -> anyhow::Result<()> {
        let file = File::options()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        *FLEET_LOG.lock().unwrap_or_else(PoisonError::into_inner) = Some(file);
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        // try_init: an embedding program's own subscriber wins.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(|| FleetLog)
            .try_init();
        Ok(())
    }

    pub(super) fn close() {
        *FLEET_LOG.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl std::io::Write for FleetLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut *FLEET_LOG.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(file) => file.write(buf),
            None => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut *FLEET_LOG.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }
}
