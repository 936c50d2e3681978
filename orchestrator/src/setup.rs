//! `toolfleet-orchestrator setup`: the one privileged step of a deployment.
//! It creates (or updates to the configured settings) every JetStream object
//! of the fleet: the job and call streams, the orchestrators' consumer, the
//! consumer of each tool in `setup.tools`, and the registry bucket. Run it
//! once per deployment (and again when a pool adds a tool) with a NATS user
//! that may; the services then only open what it made (`nats.create_missing
//! = false`), so their users need no right to create anything, and a pool's
//! consumer exists before its first worker (KEDA scales a pool from zero on
//! that consumer's backlog). Decision 0012.
//!
//! A failure that may pass (no answer, JetStream or its cluster not ready,
//! as while a NATS server restarts during a Helm upgrade) is tried again
//! for up to [`PATIENCE`] instead of failing the setup Job.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use toolfleet_proto::manifest::is_valid_tool_name;
use toolfleet_service::connect::{self, ConnectError, OwnMessages, Refusals};
use toolfleet_service::queue::{self, QueueError};

use crate::config::OrchestratorOptions;

/// How long setup goes on asking after failures that may pass, pauses
/// only (each request may add JetStream's request timeout).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Why the setup step failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// `setup.tools` names something that cannot be a tool.
    #[error("setup.tools: {0:?} is not a tool name (letters, digits, `_` and `-`, up to 64)")]
    ToolName(String),
    /// The NATS configuration cannot work.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// JetStream refused an object: the NATS user may lack the right to
    /// create it, or a setting cannot change in place.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The NATS server refused the user a request of the step.
    #[error(
        "cannot set up JetStream {}: the NATS user may not ({said}); run setup as \
         the user that may create JetStream objects (`setup` in \
         deploy/nats/toolfleet-users.conf)",
        failed.what
    )]
    NotAllowed {
        /// What the step could not do.
        failed: QueueError,
        /// What the server said.
        said: String,
    },
}

/// Connects with `options.nats` (waiting for the server) and sets up every
/// object; returns what it set up, in order.
///
/// # Errors
///
/// [`SetupError`]: an invalid tool name, a NATS configuration that cannot
/// work, or the first object JetStream refused (after [`PATIENCE`] for a
/// failure that may pass).
pub async fn run(options: &OrchestratorOptions) -> Result<Vec<String>, SetupError> {
    if let Some(bad) = options.setup.tools.iter().find(|t| !is_valid_tool_name(t)) {
        return Err(SetupError::ToolName(bad.clone()));
    }
    let refusals = Refusals::default();
    let nats = connect::nats_noting_refusals(
        &options.nats,
        "toolfleet-orchestrator-setup",
        OwnMessages::Delivered,
        &refusals,
    )
    .await?;
    let js = connect::jetstream(nats.clone(), &options.nats);
    let layout = options.layout();
    // Every object is created or updated to its settings: doing it all
    // again is harmless.
    let done = (|| queue::set_up(&js, &layout))
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(5))
                .with_total_delay(Some(PATIENCE))
                .without_max_times(),
        )
        // A request the user may not make goes unanswered, like one
        // JetStream was not ready for; the server's refusal tells them apart.
        .when(|err| err.is_passing() && refusals.last().is_none())
        .notify(|err, pause| {
            tracing::warn!(
                error = %err,
                cause = %err.source,
                retry_in = ?pause,
                "setup failed for now; trying again"
            );
        })
        .await
        .map_err(|failed| match refusals.last() {
            Some(said) => SetupError::NotAllowed { failed, said },
            None => SetupError::Queue(failed),
        })?;
    // Nothing is pending, but a clean close lets the server log it as one.
    let _ = nats.drain().await;
    Ok(done)
}
