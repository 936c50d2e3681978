//! One job's model loop, resumable at every step from what Redis holds.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::jetstream::{self, AckKind};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use super::Runner;
use crate::dispatch::{PlannedCall, RoundError};
use crate::model::{Item, ModelError, ToolSpec, TurnRequest};
use crate::store::{self, Commit, JobStatus, Lease, NewEvent, now_ms};

/// Why a job stopped without finishing.
#[derive(Debug)]
pub(super) enum Stopped {
    /// Shutdown: hand the job to another replica.
    HandedBack,
    /// Another runner took the job over.
    LeaseLost,
    /// Redis failed; retry later.
    Store(store::Error),
}

impl From<store::Error> for Stopped {
    fn from(err: store::Error) -> Self {
        match err {
            store::Error::LeaseLost(_) => Self::LeaseLost,
            other => Self::Store(other),
        }
    }
}

/// How a job ends.
enum Ending {
    Succeeded(String),
    Failed { code: String, message: String },
    Cancelled,
}

pub(super) struct JobRun<'a> {
    pub(super) runner: &'a Runner,
    pub(super) lease: Lease,
    pub(super) message: &'a jetstream::Message,
}

impl JobRun<'_> {
    /// Runs the job to its end, unless stopped.
    pub(super) async fn drive(self, abandon: CancellationToken) -> Result<(), Stopped> {
        let span = info_span!("job", job_id = %self.lease.job_id, epoch = self.lease.epoch);
        async move {
            // `stop` ends the job's waits: shutdown, lease lost or cancel.
            let stop = abandon.child_token();
            let lease_lost = Arc::new(AtomicBool::new(false));
            let cancelled = Arc::new(AtomicBool::new(false));
            let run = async {
                let result = self.run(&stop, &cancelled).await;
                stop.cancel(); // ends keep_alive
                result
            };
            let keep_alive = self.keep_alive(stop.clone(), lease_lost.clone(), cancelled.clone());
            let (result, ()) = tokio::join!(run, keep_alive);
            let result = if lease_lost.load(Ordering::SeqCst) {
                Err(Stopped::LeaseLost)
            } else {
                result
            };
            match result {
                Ok(None) => Ok(()),
                Ok(Some(ending)) => self.finish(ending).await,
                Err(stopped) => Err(stopped),
            }
        }
        .instrument(span)
        .await
    }

    /// Keeps the job message and the lease alive, and watches for a cancel
    /// request, until `stop`.
    async fn keep_alive(
        &self,
        stop: CancellationToken,
        lease_lost: Arc<AtomicBool>,
        cancelled: Arc<AtomicBool>,
    ) {
        let options = &self.runner.options;
        let period = options.job_ack_wait.min(options.lease_ttl) / 3;
        let mut renew = tokio::time::interval(period);
        let mut poll = tokio::time::interval(options.cancel_poll_interval);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = renew.tick() => {
                    if let Err(err) = self.message.ack_with(AckKind::Progress).await {
                        warn!(error = %err, "could not keep the job message alive");
                    }
                    match self.runner.store.renew(&self.lease, options.lease_ttl).await {
                        Ok(()) => {}
                        Err(store::Error::LeaseLost(_)) => {
                            warn!("lease lost: another runner took the job over; stopping");
                            lease_lost.store(true, Ordering::SeqCst);
                            stop.cancel();
                            return;
                        }
                        Err(err) => warn!(error = %err, "could not renew the lease"),
                    }
                }
                _ = poll.tick() => {
                    if let Ok(true) = self.runner.store.cancel_requested(&self.lease.job_id).await {
                        cancelled.store(true, Ordering::SeqCst);
                        stop.cancel();
                        return;
                    }
                }
            }
        }
    }

    /// The loop. `Ok(None)`: the job had already ended.
    async fn run(
        &self,
        stop: &CancellationToken,
        cancelled: &AtomicBool,
    ) -> Result<Option<Ending>, Stopped> {
        let store = &self.runner.store;
        let job_id = &self.lease.job_id;
        let Some(record) = store.get(job_id).await? else {
            return Ok(None);
        };
        if record.status.is_final() {
            return Ok(None);
        }
        let (kind, status) = if record.status == JobStatus::Queued {
            ("job_started", JobStatus::Running)
        } else {
            ("job_resumed", JobStatus::Running)
        };
        store
            .commit(
                &self.lease,
                Commit {
                    events: vec![NewEvent::new(
                        kind,
                        json!({"owner": self.runner.owner, "epoch": self.lease.epoch}),
                    )],
                    fields: vec![("status", status.as_str().to_owned())],
                    ..Commit::default()
                },
            )
            .await?;
        info!(kind, "job running");
        let spec = &record.spec;
        let provider = match self.runner.providers.for_job(spec) {
            Ok(provider) => provider,
            Err(err) => return Ok(Some(model_failure(&err))),
        };
        let mut items = store.items(job_id, 0).await?;
        let mut turns = record.turns;
        let mut rounds = record.rounds;
        loop {
            // The keep-alive task polls for cancel requests and sets the flag.
            if cancelled.load(Ordering::SeqCst) || record.cancel_requested {
                return Ok(Some(Ending::Cancelled));
            }
            if stop.is_cancelled() {
                return Err(Stopped::HandedBack);
            }
            if now_ms() >= spec.deadline_ms {
                return Ok(Some(deadline_exceeded()));
            }
            let pending = pending_calls(&items);
            if !pending.is_empty() {
                let attempts = store.attempts(job_id).await?;
                let outcomes = match self
                    .runner
                    .dispatcher
                    .run_round(&self.lease, spec, &pending, &attempts, stop)
                    .await
                {
                    Ok(outcomes) => outcomes,
                    Err(RoundError::Interrupted) if cancelled.load(Ordering::SeqCst) => {
                        return Ok(Some(Ending::Cancelled));
                    }
                    Err(RoundError::Interrupted) => return Err(Stopped::HandedBack),
                    Err(RoundError::DeadlineExceeded) => return Ok(Some(deadline_exceeded())),
                    Err(RoundError::Store(err)) => return Err(err.into()),
                    Err(RoundError::Nats(err)) => {
                        warn!(error = %err, "nats unavailable during the round; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        continue;
                    }
                };
                let results: Vec<Item> = outcomes
                    .into_iter()
                    .map(|o| Item::ToolResult {
                        call_id: o.call_id,
                        name: o.name,
                        output: o.output,
                        attempts: o.attempts,
                    })
                    .collect();
                store
                    .commit(
                        &self.lease,
                        Commit {
                            items: &results,
                            ..Commit::default()
                        },
                    )
                    .await?;
                items.extend(results);
                continue;
            }
            if let Some(Item::Assistant { text, .. }) = items.last() {
                // Resumed after the final turn was stored but before the end was.
                return Ok(Some(Ending::Succeeded(text.clone())));
            }
            let tools = self.allowed_tools(spec);
            let request = TurnRequest {
                model: &spec.model,
                instructions: &spec.instructions,
                items: &items,
                tools: &tools,
                parallel_tool_calls: spec.parallel_tool_calls,
                turn: turns,
            };
            let left = std::time::Duration::from_millis(spec.deadline_ms.saturating_sub(now_ms()));
            let turn = tokio::select! {
                turn = tokio::time::timeout(left, provider.turn(request)) => match turn {
                    Err(_) => return Ok(Some(deadline_exceeded())),
                    Ok(Err(err)) => return Ok(Some(model_failure(&err))),
                    Ok(Ok(turn)) => turn,
                },
                // The turn is dropped unrecorded: a cancelled job needs no
                // answer, and a handed-back job plays it on its new replica.
                () = stop.cancelled() => {
                    if cancelled.load(Ordering::SeqCst) {
                        return Ok(Some(Ending::Cancelled));
                    }
                    return Err(Stopped::HandedBack);
                }
            };
            if cancelled.load(Ordering::SeqCst) {
                return Ok(Some(Ending::Cancelled));
            }
            let calls: Vec<_> = turn
                .tool_calls()
                .filter_map(|item| match item {
                    Item::ToolCall { call_id, name, .. } => {
                        Some(json!({"call_id": call_id, "name": name}))
                    }
                    _ => None,
                })
                .collect();
            turns += 1;
            if !calls.is_empty() {
                rounds += 1;
            }
            let text = turn.text();
            // The checkpoint: once this commit lands, the turn is never played again.
            store
                .commit(&self.lease, Commit {
                    items: &turn.items,
                    events: vec![NewEvent::new(
                        "model_turn",
                        json!({"turn": turns - 1, "round": rounds, "tool_calls": calls, "text": text}),
                    )],
                    fields: vec![("turns", turns.to_string()), ("rounds", rounds.to_string())],
                    ..Commit::default()
                })
                .await?;
            items.extend(turn.items);
            if calls.is_empty() {
                return Ok(Some(Ending::Succeeded(text)));
            }
            if rounds > spec.max_tool_rounds {
                return Ok(Some(Ending::Failed {
                    code: "MAX_TOOL_ROUNDS_EXCEEDED".into(),
                    message: format!(
                        "the model asked for tools in more than {} rounds",
                        spec.max_tool_rounds
                    ),
                }));
            }
        }
    }

    /// The live tools the job may use, as the model sees them.
    fn allowed_tools(&self, spec: &store::JobSpec) -> Vec<ToolSpec> {
        self.runner
            .dispatcher
            .registry
            .live_tools()
            .into_iter()
            .filter(|t| spec.tools.is_empty() || spec.tools.contains(&t.manifest.name))
            .map(|t| ToolSpec {
                name: t.manifest.name,
                description: t.manifest.description,
                parameters: t.manifest.parameters,
                strict: t.manifest.strict,
            })
            .collect()
    }

    async fn finish(&self, ending: Ending) -> Result<(), Stopped> {
        let now = now_ms().to_string();
        let (kind, mut fields, data) = match &ending {
            Ending::Succeeded(text) => (
                "job_succeeded",
                vec![
                    ("status", "succeeded".to_owned()),
                    ("output_text", text.clone()),
                ],
                json!({"output_text": text}),
            ),
            Ending::Failed { code, message } => (
                "job_failed",
                vec![
                    ("status", "failed".to_owned()),
                    ("error_code", code.clone()),
                    ("error_message", message.clone()),
                ],
                json!({"code": code, "message": message}),
            ),
            Ending::Cancelled => (
                "job_cancelled",
                vec![
                    ("status", "cancelled".to_owned()),
                    ("error_code", "CANCELLED".to_owned()),
                    ("error_message", "the job was cancelled".to_owned()),
                ],
                json!({"code": "CANCELLED"}),
            ),
        };
        fields.push(("finished_at_ms", now));
        self.runner
            .store
            .commit(
                &self.lease,
                Commit {
                    events: vec![NewEvent {
                        kind,
                        data,
                        is_final: true,
                    }],
                    fields,
                    finished: true,
                    ..Commit::default()
                },
            )
            .await?;
        info!(kind, "job finished");
        crate::metrics::job_finished(kind);
        Ok(())
    }
}

fn deadline_exceeded() -> Ending {
    Ending::Failed {
        code: "DEADLINE_EXCEEDED".into(),
        message: "the job did not finish before its deadline".into(),
    }
}

fn model_failure(err: &ModelError) -> Ending {
    Ending::Failed {
        code: err.code().into(),
        message: err.to_string(),
    }
}

/// The calls of the conversation that have no result yet, in order.
fn pending_calls(items: &[Item]) -> Vec<PlannedCall> {
    let answered: HashSet<&str> = items
        .iter()
        .filter_map(|item| match item {
            Item::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    items
        .iter()
        .filter_map(|item| match item {
            Item::ToolCall {
                call_id,
                name,
                arguments,
                ..
            } if !answered.contains(call_id.as_str()) => Some(PlannedCall {
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            }),
            _ => None,
        })
        .collect()
}
