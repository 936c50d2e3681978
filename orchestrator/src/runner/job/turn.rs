//! One model turn of a run: ask the model (within the job's deadline, until
//! a stop), then checkpoint what it said with the round's results before
//! it and the first attempts of the calls it makes. A turn cut short by a
//! stop is dropped unrecorded: the next step sees why (a cancelled job
//! needs no answer, and a handed-back job plays it on its new replica).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use toolfleet_proto::names::span_attributes;
use toolfleet_service::traces::StepSpan;

use super::deltas::TurnDeltas;
use super::{JobRun, LastTurn, Progress, StopSignal, Stopped, model_failure};
use crate::dispatch::{Admission, PlannedCall, Told, instructions};
use crate::job::{
    Ending, JobErrorCode, JobRef, JobSpec, ToolManifest, TurnCheckpoint, WireIds, now_ms,
};
use crate::model::{Delta, DeltaSink, Provider, ToolSpec, Turn, TurnRequest, Usage};
use crate::registry::LiveTool;
use crate::runner::step::{self, StopReason};
use crate::shaping::read;
use crate::spans;
use crate::spend::RunBudget;
use crate::store::{Attempts, DispatchedCall};

/// What a turn is played for: the job, how its calls are named on the
/// wire, and the model that plays it.
pub(super) struct TurnOf<'a> {
    pub(super) job: JobRef<'a>,
    /// What the job and its tenant may still spend: the turn adds its
    /// tokens, and the calls recorded with it take their units.
    pub(super) budget: &'a RunBudget,
    pub(super) wire_ids: &'a WireIds,
    pub(super) provider: &'a dyn Provider,
}

/// What asking the model came to.
enum Asked {
    /// The model's turn.
    Turn(Turn),
    /// The job ends: the deadline passed, or the model failed.
    Ended(Ending),
    /// A stop cut it short; nothing is recorded.
    Dropped,
}

impl JobRun<'_> {
    /// Plays one model turn and checkpoints it; returns the job's ending if
    /// the turn ends it, and then leaves the turn to the commit that ends
    /// the job.
    pub(super) async fn play_turn(
        &self,
        of: TurnOf<'_>,
        progress: &mut Progress,
        stop: &StopSignal,
    ) -> Result<Option<Ending>, Stopped> {
        let JobRef { spec, trace, .. } = of.job;
        let number = progress.turns + 1;
        let mut span = spans::turn(trace, number, spec);
        let (tools, new_offers) = self.tools_for_turn(spec, &progress.offered);
        let (tools, instructions) = self.without_unavailable(spec, tools, progress).await;
        // A streamed job's turn is published as it is written.
        let deltas = spec.stream.then(|| {
            let live = self.runner.live.clone();
            TurnDeltas::start(live, &self.lease.job_id, progress.turns, self.lease.epoch)
        });
        let offer = Offer {
            tools: &tools,
            instructions: &instructions,
        };
        let asked = ask_model(&of, offer, progress, stop, &mut span, deltas.as_ref()).await;
        if let Some(deltas) = deltas {
            deltas.finish().await;
        }
        let turn = match asked {
            Asked::Turn(turn) => turn,
            Asked::Ended(ending) => {
                span.end();
                return Ok(Some(ending));
            }
            Asked::Dropped => return Ok(None),
        };
        let has_calls = turn.tool_calls().next().is_some();
        let offered: Vec<ToolManifest> = new_offers.iter().map(|t| (*t.manifest).clone()).collect();
        let (turns, rounds) = (progress.turns + 1, progress.rounds + u32::from(has_calls));
        let ending = step::after_turn(&turn.items, rounds, spec);
        let start = progress.items.len();
        let usage = turn.usage;
        let tokens = of.budget.add_turn(usage, spec.max_tokens);
        progress.items.extend(turn.items);
        progress.turns = turns;
        progress.rounds = rounds;
        for tool in new_offers {
            progress.offered.insert(tool.manifest.name.clone(), tool);
        }
        if ending.is_some() {
            // Stored with the end, in the same commit: one round trip less.
            progress.last_turn = Some(LastTurn {
                start,
                turns,
                rounds,
                offered,
                usage,
                tokens,
                commit: spans::commit(trace, spans::Step::Turn(number), "finish"),
            });
        } else {
            let played = Played {
                number,
                start,
                has_calls,
                offered: &offered,
                usage,
                tokens,
            };
            self.checkpoint(&of, played, progress).await?;
        }
        span.end();
        Ok(ending)
    }

    /// Records a turn that did not end the job, with the round's results
    /// before it and the first attempts of the calls it makes (the round
    /// that follows publishes them without a commit of its own). Once this
    /// commit lands, the turn is never played again.
    async fn checkpoint(
        &self,
        of: &TurnOf<'_>,
        played: Played<'_>,
        progress: &mut Progress,
    ) -> Result<(), Stopped> {
        let spec = of.job.spec;
        let admitted = if played.has_calls && spec.parallel_tool_calls {
            self.admitted_calls(of, progress).await?
        } else {
            Vec::new()
        };
        let dispatched: Vec<DispatchedCall<'_>> = admitted
            .iter()
            .map(|(call, cost, version)| call.dispatched(*cost, version.as_deref()))
            .collect();
        let (results, items) =
            progress.items[progress.stored..].split_at(played.start - progress.stored);
        let checkpoint = TurnCheckpoint {
            results,
            full: &progress.full,
            items,
            turns: progress.turns,
            rounds: progress.rounds,
            offered: played.offered,
            usage: played.usage,
            tokens: played.tokens,
        };
        let commit = spans::commit(
            of.job.trace,
            spans::Step::Turn(played.number),
            "record_turn",
        );
        self.runner
            .store
            .record_turn(&self.lease, checkpoint, &dispatched)
            .await?;
        commit.end();
        progress.stored = progress.items.len();
        progress.full.clear();
        progress.fresh_round = played.has_calls.then(|| {
            admitted
                .iter()
                .map(|(call, ..)| (call.wire_id.clone(), 0))
                .collect::<Attempts>()
        });
        Ok(())
    }

    /// The calls of the turn just played that dispatch will publish, with
    /// what each attempt costs: those it admits now, their tools' breakers
    /// asked first, within the budgets (which they take), are recorded with
    /// the turn.
    async fn admitted_calls(
        &self,
        of: &TurnOf<'_>,
        progress: &Progress,
    ) -> Result<Vec<(PlannedCall, u64, Option<Arc<str>>)>, Stopped> {
        let dispatcher = &self.runner.dispatcher;
        let pending = step::pending_calls(&progress.items, of.wire_ids);
        let refused = dispatcher
            .gate_calls(
                &self.lease.job_id,
                &pending,
                &Attempts::default(),
                &progress.offered,
            )
            .await;
        let publish = pending.into_iter().enumerate().filter(|(index, call)| {
            matches!(
                dispatcher.admit(of.job.spec, (*index, call), &progress.offered, &refused),
                Admission::Publish(_)
            )
        });
        let mut admitted = Vec::new();
        for (_, call) in publish {
            let cost = dispatcher.cost_of(&call.name, &progress.offered);
            // A call the budgets refuse is answered by the round.
            if of.budget.take_call(cost).await?.is_ok() {
                let version = dispatcher
                    .shown(&call.name, &progress.offered)
                    .map(|tool| tool.contract);
                admitted.push((call, cost, version));
            }
        }
        Ok(admitted)
    }

    /// `tools` without those whose breakers keep them out of the turn, and
    /// the job's instructions with a line for each of those; each is told
    /// in a `tool_unavailable` event. A tool left out keeps its place in the
    /// job's offered tools: only this turn's list shrinks, and never to
    /// nothing (then every tool stays listed, and the lines alone tell).
    async fn without_unavailable(
        &self,
        spec: &JobSpec,
        tools: Vec<LiveTool>,
        progress: &Progress,
    ) -> (Vec<LiveTool>, String) {
        let dispatcher = &self.runner.dispatcher;
        let names: Vec<&str> = tools.iter().map(|t| t.manifest.name.as_str()).collect();
        let left_out = dispatcher.left_out(&names, &progress.offered).await;
        if left_out.is_empty() {
            return (tools, spec.instructions.clone());
        }
        let told = left_out
            .iter()
            .map(|(tool, why)| Told {
                tool: tool.clone(),
                why: *why,
                call_id: None,
            })
            .collect();
        dispatcher.tell_unavailable(&self.lease, told).await;
        let instructions = instructions(&spec.instructions, &left_out);
        // Never down to no tool at all: a provider may refuse a conversation
        // that holds tool calls and declares no tools (Anthropic does). The
        // line still tells the model, and a call is still refused.
        if tools
            .iter()
            .all(|t| left_out.contains_key(&t.manifest.name))
            && !progress.shaped
        {
            return (tools, instructions);
        }
        let tools = tools
            .into_iter()
            .filter(|t| !left_out.contains_key(&t.manifest.name))
            .collect();
        (tools, instructions)
    }

    /// The tools the job may use in its next turn: the live ones, and those
    /// offered earlier in the job whose workers are gone for now (so that the
    /// model's tool list does not flicker with an outage). Also returns the
    /// live tools that are new to the job or changed, to record.
    fn tools_for_turn(
        &self,
        spec: &JobSpec,
        offered: &HashMap<String, LiveTool>,
    ) -> (Vec<LiveTool>, Vec<LiveTool>) {
        let allowed = |name: &str| spec.tools.is_empty() || spec.tools.iter().any(|t| t == name);
        let live: Vec<LiveTool> = self.runner.dispatcher.registry.available_tools(&spec.tools);
        let new: Vec<LiveTool> = live
            .iter()
            .filter(|t| {
                offered
                    .get(&t.manifest.name)
                    .is_none_or(|o| o.manifest != t.manifest)
            })
            .cloned()
            .collect();
        let mut tools = live;
        let mut gone: Vec<LiveTool> = offered
            .values()
            .filter(|o| allowed(&o.manifest.name))
            .filter(|o| !tools.iter().any(|t| t.manifest.name == o.manifest.name))
            .cloned()
            .collect();
        gone.sort_by(|a, b| a.manifest.name.cmp(&b.manifest.name));
        tools.extend(gone);
        (tools, new)
    }
}

/// What a turn offers the model: its tools and its instructions (the
/// job's, with a line for each tool its breaker left out).
#[derive(Clone, Copy)]
struct Offer<'a> {
    tools: &'a [LiveTool],
    instructions: &'a str,
}

/// A turn the model played that did not end the job, to checkpoint.
struct Played<'a> {
    number: u32,
    /// Where its items start in the run's conversation.
    start: usize,
    has_calls: bool,
    /// The tools first offered (or changed) in this turn.
    offered: &'a [ToolManifest],
    /// The tokens it used.
    usage: Option<Usage>,
    /// The tokens it counts against the job's budget.
    tokens: u64,
}

/// Asks the model for the job's next turn, within the job's deadline and
/// until a stop; records the turn's metrics and its span's attributes.
async fn ask_model(
    of: &TurnOf<'_>,
    offer: Offer<'_>,
    progress: &Progress,
    stop: &StopSignal,
    span: &mut StepSpan,
    deltas: Option<&TurnDeltas>,
) -> Asked {
    let spec = of.job.spec;
    let mut specs: Vec<ToolSpec> = offer.tools.iter().map(tool_spec).collect();
    if progress.shaped {
        specs.push(read::tool_spec());
    }
    let sink = |delta: Delta| {
        if let Some(deltas) = deltas {
            deltas.send(delta);
        }
    };
    let request = TurnRequest {
        model: &spec.model,
        instructions: offer.instructions,
        items: &progress.items,
        tools: &specs,
        parallel_tool_calls: spec.parallel_tool_calls,
        turn: progress.turns,
        max_tokens: spec.max_tokens,
        deltas: deltas.map(|_| &sink as DeltaSink<'_>),
    };
    let left = Duration::from_millis(spec.deadline_ms.saturating_sub(now_ms()));
    let asked = Instant::now();
    let provider = spec.provider.as_str();
    let answer = tokio::select! {
        answer = tokio::time::timeout(left, of.provider.turn(request)) => answer,
        // Not recorded: the turn is played again where the job goes on.
        () = stop.token.cancelled() => return Asked::Dropped,
    };
    let turn = match answer {
        Err(_) => {
            let code = JobErrorCode::DeadlineExceeded.as_str().to_owned();
            span.set(span_attributes::ERROR_TYPE, code.clone());
            crate::metrics::model_turn(provider, code, asked.elapsed());
            span.fail("the job's deadline passed during the turn");
            return Asked::Ended(step::deadline_exceeded());
        }
        Ok(Err(err)) => {
            crate::metrics::model_turn(provider, err.code().to_string(), asked.elapsed());
            span.set(span_attributes::OUTCOME, err.code().to_string());
            span.set(span_attributes::ERROR_TYPE, err.code().to_string());
            span.fail(err.code().to_string());
            return Asked::Ended(model_failure(&err));
        }
        Ok(Ok(turn)) => turn,
    };
    if stop.reason() == Some(StopReason::CancelRequested) {
        return Asked::Dropped;
    }
    crate::metrics::model_turn(provider, "ok".to_owned(), asked.elapsed());
    if let Some(usage) = &turn.usage {
        crate::metrics::model_tokens(provider, usage);
    }
    record_answer(span, &turn);
    Asked::Turn(turn)
}

/// What the span of a turn records of the model's answer: how many calls it
/// made, the tokens it took, and what the provider said of it (the model
/// that answered, its id, why it stopped).
fn record_answer(span: &mut StepSpan, turn: &Turn) {
    if !span.is_recording() {
        return;
    }
    span.set(
        span_attributes::TOOL_CALLS,
        turn.tool_calls().count() as i64,
    );
    let answered = &turn.answered;
    if let Some(model) = &answered.model {
        span.set(span_attributes::GEN_AI_RESPONSE_MODEL, model.clone());
    }
    if let Some(id) = &answered.id {
        span.set(span_attributes::GEN_AI_RESPONSE_ID, id.clone());
    }
    if let Some(reason) = &answered.finish_reason {
        // One choice, one reason.
        span.set_strings(
            span_attributes::GEN_AI_RESPONSE_FINISH_REASONS,
            [reason.clone()],
        );
    }
    if let Some(usage) = &turn.usage {
        span.set(
            span_attributes::GEN_AI_USAGE_INPUT_TOKENS,
            usage.input_tokens as i64,
        );
        span.set(
            span_attributes::GEN_AI_USAGE_OUTPUT_TOKENS,
            usage.output_tokens as i64,
        );
        // OpenTelemetry's GenAI names for the prompt cache.
        span.set(
            span_attributes::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
            usage.cache_read_tokens as i64,
        );
        span.set(
            span_attributes::GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
            usage.cache_write_tokens as i64,
        );
    }
}

/// A tool as the model is told about it.
fn tool_spec(tool: &LiveTool) -> ToolSpec {
    ToolSpec {
        name: tool.manifest.name.clone(),
        description: tool.manifest.description.clone(),
        parameters: tool.manifest.parameters.clone(),
        strict: tool.manifest.strict,
    }
}
