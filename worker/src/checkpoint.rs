//! A call's checkpoint: what a tool saves while it runs a call, so that
//! should its worker die, the next execution of the same attempt resumes
//! from it rather than starting again (decision 0044). Temporal's activity
//! heartbeat details, kept beside the call's claim in the ledger.
//!
//! The MCP tools save the id of a server's task once the server made it: a
//! worker that takes over the call follows the same task, and the tool is
//! never called a second time.

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

use crate::ledger::{CheckpointKeys, Ledger};

/// The largest checkpoint, in bytes of JSON: it rides in the claim's
/// answer on every redelivery, so it holds a handle, never a result.
pub const MAX_CHECKPOINT_BYTES: usize = 16 * 1024;

/// A call's checkpoint: what an earlier execution of the attempt saved
/// ([`saved`](Self::saved)), and where this one saves its own
/// ([`save`](Self::save)). Its default (a unit test's) has nothing saved
/// and keeps what is saved in memory only.
#[derive(Clone, Default)]
pub struct Checkpoint {
    /// The last saved, by an earlier execution or this one; shared by the
    /// clones of one call's context.
    saved: Arc<Mutex<Option<Value>>>,
    store: Option<Arc<Store>>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("saved", &self.lock().is_some())
            .finish()
    }
}

/// Where one execution saves: the attempt's keys, under the claim it holds.
struct Store {
    ledger: Ledger,
    keys: CheckpointKeys,
    owner: String,
}

/// Why a checkpoint was not saved. The call goes on either way; what is
/// lost is only the resumption, should the worker die.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Over [`MAX_CHECKPOINT_BYTES`].
    #[error("the checkpoint is {0} bytes; the limit is {MAX_CHECKPOINT_BYTES}")]
    TooLarge(usize),
    /// The claim lapsed: another execution may be running the call.
    #[error("the call is no longer this execution's to run")]
    ClaimLost,
    /// Redis did not take it.
    #[error("the ledger did not take the checkpoint: {0}")]
    Unreachable(#[source] redis::RedisError),
}

impl Checkpoint {
    /// The checkpoint of an execution that holds the claim `owner` of the
    /// attempt with `keys`, after an earlier one saved `saved`.
    pub(crate) fn of(
        ledger: Ledger,
        keys: CheckpointKeys,
        owner: String,
        saved: Option<Value>,
    ) -> Self {
        Self {
            saved: Arc::new(Mutex::new(saved)),
            store: Some(Arc::new(Store {
                ledger,
                keys,
                owner,
            })),
        }
    }

    /// What was saved last: by this execution, or else by an earlier one
    /// of this attempt that ended without a result (it died, or the drain
    /// handed the call back). The runtime runs such a call again without
    /// asking the probe: resuming from its checkpoint is the tool's promise
    /// that its effect is not applied twice.
    pub fn saved(&self) -> Option<Value> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Value>> {
        self.saved.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Saves `value` as the attempt's checkpoint, replacing the last, for
    /// as long as results are kept (`runtime.result_retention`). Only while
    /// this execution holds the call's claim.
    ///
    /// # Errors
    ///
    /// [`CheckpointError`]: too large, the claim lost, or Redis down.
    pub async fn save(&self, value: &Value) -> Result<(), CheckpointError> {
        let json = value.to_string();
        if json.len() > MAX_CHECKPOINT_BYTES {
            return Err(CheckpointError::TooLarge(json.len()));
        }
        let Some(store) = &self.store else {
            *self.lock() = Some(value.clone());
            return Ok(());
        };
        let saved = store
            .ledger
            .save_checkpoint(&store.keys, &store.owner, &json)
            .await
            .map_err(CheckpointError::Unreachable)?;
        if saved {
            *self.lock() = Some(value.clone());
            Ok(())
        } else {
            Err(CheckpointError::ClaimLost)
        }
    }
}
