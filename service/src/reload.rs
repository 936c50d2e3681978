//! Reference files a service holds in memory and reloads when they change:
//! the worker's knowledge graph, the orchestrator's API tokens.
//!
//! A change is a new modification time or size of any of the files, checked
//! every interval (polling works on every filesystem, Kubernetes ConfigMap
//! volumes included, whose symlink swaps file notifications often miss).
//! A changed set is loaded on a blocking thread and swapped in atomically;
//! readers never wait. A set that does not load is logged, and what was
//! loaded before stays in service until the next change.

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tracing::{info, warn};

/// What changes when a file is rewritten: its modification time and size,
/// per file (`None` for a file that cannot be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(Vec<Option<(SystemTime, u64)>>);

impl Fingerprint {
    /// The files' fingerprint now.
    pub fn of(paths: &[PathBuf]) -> Self {
        Self(
            paths
                .iter()
                .map(|path| {
                    std::fs::metadata(path)
                        .ok()
                        .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
                })
                .collect(),
        )
    }
}

/// Reloads `current` with `load` whenever `paths` change, from the state
/// `seen`, until `current` is dropped. `what` names it in the log. Spawned
/// on the current tokio runtime; does nothing outside one.
pub fn watch<T, E, L>(
    current: &Arc<ArcSwap<T>>,
    paths: Vec<PathBuf>,
    seen: Fingerprint,
    interval: Duration,
    what: &'static str,
    load: L,
) where
    T: Send + Sync + 'static,
    E: Display + Send + 'static,
    L: Fn() -> Result<T, E> + Clone + Send + 'static,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let current: Weak<ArcSwap<T>> = Arc::downgrade(current);
    let interval = interval.max(Duration::from_millis(100));
    tokio::spawn(async move {
        let mut seen = seen;
        loop {
            tokio::time::sleep(interval).await;
            let Some(current) = current.upgrade() else {
                return;
            };
            let now = Fingerprint::of(&paths);
            if now == seen {
                continue;
            }
            // Whatever the outcome, this version was tried: the next change
            // (the fix) is what loads again.
            seen = now;
            match tokio::task::spawn_blocking(load.clone()).await {
                Ok(Ok(loaded)) => {
                    current.store(Arc::new(loaded));
                    info!(what, "reloaded after its files changed");
                }
                Ok(Err(err)) => {
                    warn!(what, error = %err, "the changed files do not load; the previous version stays in service");
                }
                Err(err) => warn!(what, error = %err, "reload failed"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_changed_file_is_swapped_in_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.txt");
        std::fs::write(&path, "1").unwrap();
        let paths = vec![path.clone()];
        let loads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let read = {
            let (path, loads) = (path.clone(), loads.clone());
            move || -> Result<u32, String> {
                let read = std::fs::read_to_string(&path).map_err(|e| e.to_string());
                let parsed = read.and_then(|text| {
                    text.trim()
                        .parse()
                        .map_err(|_| format!("{text:?} is not a number"))
                });
                // Counted once the outcome is known: a count that moved means
                // this version was tried and, if broken, will not be stored.
                loads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                parsed
            }
        };
        let current = Arc::new(ArcSwap::from_pointee(read().unwrap()));
        watch(
            &current,
            paths.clone(),
            Fingerprint::of(&paths),
            Duration::from_millis(100),
            "a number",
            read,
        );
        std::fs::write(&path, "22").unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while **current.load() != 22 {
            assert!(tokio::time::Instant::now() < deadline, "never reloaded");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A broken version is loaded, and does not replace the good one.
        let tried = loads.load(std::sync::atomic::Ordering::SeqCst);
        std::fs::write(&path, "not a number").unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while loads.load(std::sync::atomic::Ordering::SeqCst) == tried {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the broken version was never tried"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(**current.load(), 22);
        std::fs::write(&path, "333").unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while **current.load() != 333 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the fix never loaded"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
