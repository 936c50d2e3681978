//! OpenTelemetry traces across processes, received by a real OTLP collector
//! (`toolfleet_tests::otlp`): one connected trace per job, through a retry,
//! a worker killed mid-call and an orchestrator killed mid-job.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use toolfleet_proto::names::{self, span_attributes};
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{ApiClient, Fleet, scripted_job, test_fleet, wait_finished};
use toolfleet_tests::otlp::{Collector, ReceivedSpan};
use toolfleet_tests::wait_until;

/// The client's own trace: the job's spans continue it.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

const FAST_REDELIVERY: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNTIME__ACK_WAIT", "1s"),
    ("TOOLFLEET_RUNTIME__CLAIM_LEASE", "500ms"),
];
const FAST_TAKEOVER: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNNER__JOB_ACK_WAIT", "2s"),
    ("TOOLFLEET_RUNNER__LEASE_TTL", "1s"),
];
const WAIT: Duration = Duration::from_secs(60);

/// OTLP's span kinds, as the collector receives them.
const SPAN_KIND_INTERNAL: i32 = 1;
const SPAN_KIND_CLIENT: i32 = 3;

fn with<'a>(
    base: &[(&'a str, &'a str)],
    more: &'a [(&'static str, String)],
) -> Vec<(&'a str, &'a str)> {
    base.iter()
        .copied()
        .chain(more.iter().map(|(k, v)| (*k, v.as_str())))
        .collect()
}

/// Stops every live process of the fleet gracefully: each sends the spans
/// it still holds before it exits, so that the collector has them all.
async fn stop_all(fleet: &Fleet) -> anyhow::Result<()> {
    let live = fleet
        .orchestrators()
        .chain(fleet.workers())
        .filter(|p| p.is_running());
    for process in live {
        process.stop(WAIT).await?;
    }
    Ok(())
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.span.name == name).collect()
}

fn children<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    let id = parent.span_id();
    spans.iter().filter(|s| s.parent_id() == id).collect()
}

fn one<'a>(found: Vec<&'a ReceivedSpan>, what: &str) -> &'a ReceivedSpan {
    assert_eq!(found.len(), 1, "{what}: {found:#?}");
    found[0]
}

/// Submits, in the client's trace, three parallel calls: `sleep` (whose
/// worker, then orchestrator, the test kills while it runs), `fail`
/// (retried once) and `echo`. Returns the job's id.
async fn submit_in_the_clients_trace(api: &ApiClient) -> anyhow::Result<String> {
    let script = json!([
        {"tool_calls": [
            {"name": "sleep", "arguments": {"ms": 2000}},
            {"name": "fail", "arguments": {"mode": "retryable", "fail_attempts": 1}},
            {"name": "echo", "arguments": {"said": "hello"}}]},
        {"message": "done"}
    ]);
    let mut request = tonic::Request::new(scripted_job("trace me", &script));
    request.metadata_mut().insert(
        names::headers::TRACEPARENT,
        format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01").parse()?,
    );
    let job_id = api.clone().submit_job(request).await?.into_inner().job_id;
    Ok(job_id)
}

/// The first event of a watch names the trace; the others (up to the
/// second call's result) do not.
async fn only_the_first_event_names_the_trace(api: &ApiClient, job_id: &str) -> anyhow::Result<()> {
    let mut events = api
        .clone()
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_owned(),
            from_offset: 0,
        })
        .await?
        .into_inner();
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|e: &&v1::JobEvent| e.kind == "tool_call_result")
        .count()
        < 2
    {
        let event = tokio::time::timeout(WAIT, events.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the watch ended early: {seen:?}"))??;
        seen.push(event);
    }
    assert_eq!(seen[0].trace_id, CLIENT_TRACE);
    assert!(seen[1..].iter().all(|e| e.trace_id.is_empty()), "{seen:?}");
    drop(events);
    Ok(())
}

/// Kills the worker running `sleep` once the settled calls' executions
/// are out (a killed worker's spans not yet exported die with it: 50 ms
/// batches, against the 2 s sleep), then the orchestrator once the settled
/// calls' spans are out.
async fn kill_the_sleeping_worker_then_the_orchestrator(
    fleet: &Fleet,
    collector: &Collector,
) -> anyhow::Result<()> {
    let running_sleep = wait_until("a worker runs sleep", WAIT, || async {
        fleet.workers().iter().position(|w| {
            std::fs::read_to_string(w.log_path())
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("executing call") && l.contains("tool=sleep"))
        })
    })
    .await?;
    // The settled calls' executions are out before their worker may be
    // killed: a killed worker's spans not yet exported die with it (50 ms
    // batches, against the 2 s sleep).
    wait_until("the settled calls' executions", WAIT, || async {
        let spans = collector.spans();
        named(&spans, "execute fail").len() >= 2 && !named(&spans, "execute echo").is_empty()
    })
    .await?;
    fleet.worker(running_sleep).kill();
    wait_until("the settled calls' spans", WAIT, || async {
        let spans = collector.spans();
        !named(&spans, "execute_tool fail").is_empty()
            && !named(&spans, "execute_tool echo").is_empty()
    })
    .await?;
    fleet.orchestrator(0).kill();
    Ok(())
}

/// The JSON log of orchestrator `second`: its line saying the job runs
/// names the trace and the job.
fn the_json_log_names_the_trace(fleet: &Fleet, second: usize, job_id: &str) -> anyhow::Result<()> {
    let log = std::fs::read_to_string(fleet.orchestrator(second).log_path())?;
    let running: serde_json::Value = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["fields"]["message"] == "job running")
        .ok_or_else(|| anyhow::anyhow!("no JSON line says the job runs:\n{log}"))?;
    assert_eq!(running["span"]["trace_id"], CLIENT_TRACE, "{running}");
    assert_eq!(running["span"]["job_id"], job_id, "{running}");
    Ok(())
}

/// One trace, the client's; connected (every parent arrived, but the
/// client's own span, under the root `submit job` of the orchestrator
/// naming the job); no span twice (a resumed step is recorded by one
/// process only). Returns the root.
fn one_connected_trace<'a>(spans: &'a [ReceivedSpan], job_id: &str) -> &'a ReceivedSpan {
    for span in spans {
        assert_eq!(span.trace_id(), CLIENT_TRACE, "{span:#?}");
    }
    // Connected: every parent arrived, but the client's own span.
    let ids: HashSet<String> = spans.iter().map(ReceivedSpan::span_id).collect();
    let unparented: Vec<_> = spans
        .iter()
        .filter(|s| !ids.contains(&s.parent_id()))
        .collect();
    let root = one(unparented, "the only span whose parent is not in the trace");
    assert_eq!(root.span.name, "submit job");
    assert_eq!(root.parent_id(), CLIENT_SPAN);
    assert_eq!(root.service, "toolfleet-orchestrator");
    assert_eq!(
        root.attribute(span_attributes::JOB_ID).as_deref(),
        Some(job_id)
    );
    // No span twice (a resumed step is recorded by one process only).
    let mut twice: Vec<_> = spans
        .iter()
        .filter(|s| spans.iter().filter(|o| o.span_id() == s.span_id()).count() > 1)
        .map(|s| (s.span.name.clone(), s.service.clone(), s.span_id()))
        .collect();
    twice.sort();
    assert!(twice.is_empty(), "spans recorded twice: {twice:#?}");
    root
}

/// The runs: started by the first orchestrator, resumed by the second,
/// which links back to the first, all under the root.
fn started_then_resumed(spans: &[ReceivedSpan], root: &ReceivedSpan) {
    let started = one(named(spans, "start job"), "start job");
    let resumed = named(spans, "resume job");
    assert!(!resumed.is_empty(), "no resumed run");
    for run in &resumed {
        assert_eq!(run.parent_id(), root.span_id());
        assert_eq!(
            run.attribute(span_attributes::RESUMED).as_deref(),
            Some("true")
        );
        assert_eq!(run.span.links.len(), 1, "{run:#?}");
    }
    let links: HashSet<String> = resumed
        .iter()
        .map(|r| {
            r.span.links[0]
                .span_id
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .collect();
    assert!(
        links.contains(&started.span_id()),
        "no run links to the first: {links:?}"
    );
    assert_eq!(started.parent_id(), root.span_id());
}

/// Two model turns under the root, each the GenAI conventions' chat span
/// (named `chat` alone: the scripted job names no model) with its
/// checkpoint commit: the first its own, the last (the answer) the commit
/// that ends the job.
fn two_turns_with_their_checkpoints(spans: &[ReceivedSpan], root: &ReceivedSpan) {
    let turns = named(spans, "chat");
    assert_eq!(turns.len(), 2, "{turns:#?}");
    for turn in &turns {
        assert_eq!(turn.parent_id(), root.span_id());
        assert_eq!(turn.span.kind, SPAN_KIND_CLIENT);
        for (key, value) in [
            (span_attributes::GEN_AI_OPERATION_NAME, "chat"),
            (span_attributes::GEN_AI_PROVIDER_NAME, "toolfleet.scripted"),
            (span_attributes::PROVIDER, "scripted"),
        ] {
            assert_eq!(turn.attribute(key).as_deref(), Some(value), "{key}");
        }
        // The deprecated name is gone (decision 0053).
        assert_eq!(turn.attribute("gen_ai.system"), None);
        let checkpoint = match turn.attribute(span_attributes::TURN).as_deref() {
            Some("1") => "record_turn",
            Some("2") => "finish",
            other => panic!("turn {other:?}: {turn:#?}"),
        };
        let commits = children(spans, turn);
        assert!(
            commits.iter().any(|c| c.span.name == checkpoint),
            "{checkpoint}: {commits:#?}"
        );
    }
}

/// Each call: one span under the root, the GenAI conventions'
/// execute_tool span, ok, without its arguments or result (they are
/// opt-in); its attempts under it, and the workers' executions (with their
/// queue wait, and the tool and the model's call id in the conventions'
/// words) under the attempts. Returns each tool's attempts.
fn calls_with_their_attempts<'a>(
    spans: &'a [ReceivedSpan],
    root: &ReceivedSpan,
) -> HashMap<&'static str, Vec<&'a ReceivedSpan>> {
    let mut attempts_of: HashMap<&str, Vec<&ReceivedSpan>> = HashMap::new();
    for tool in ["sleep", "fail", "echo"] {
        let call = one(named(spans, &format!("execute_tool {tool}")), tool);
        assert_eq!(call.parent_id(), root.span_id(), "{tool}");
        assert_eq!(call.span.kind, SPAN_KIND_INTERNAL, "{tool}");
        assert_eq!(
            call.attribute(span_attributes::OUTCOME).as_deref(),
            Some("ok"),
            "{tool}"
        );
        for (key, value) in [
            (span_attributes::GEN_AI_OPERATION_NAME, "execute_tool"),
            (span_attributes::GEN_AI_TOOL_NAME, tool),
            (span_attributes::GEN_AI_TOOL_TYPE, "function"),
            (span_attributes::TOOL, tool),
        ] {
            assert_eq!(call.attribute(key).as_deref(), Some(value), "{tool}: {key}");
        }
        // The scripted model's ids are safe: the model's id is the one its
        // events show.
        let model_id = call.attribute(span_attributes::GEN_AI_TOOL_CALL_ID);
        assert!(model_id.is_some(), "{tool}: {call:#?}");
        assert_eq!(model_id, call.attribute(span_attributes::CALL_ID), "{tool}");
        for content in [
            span_attributes::GEN_AI_TOOL_CALL_ARGUMENTS,
            span_attributes::GEN_AI_TOOL_CALL_RESULT,
        ] {
            assert_eq!(call.attribute(content), None, "{tool}: {content} is opt-in");
        }
        let attempts: Vec<_> = children(spans, call)
            .into_iter()
            .filter(|s| s.span.name.starts_with("attempt "))
            .collect();
        for attempt in &attempts {
            let executions: Vec<_> = children(spans, attempt)
                .into_iter()
                .filter(|s| s.span.name == format!("execute {tool}"))
                .collect();
            assert!(
                !executions.is_empty(),
                "{tool}: {attempt:#?} has no execution"
            );
            for execution in executions {
                assert_eq!(execution.service, "toolfleet-worker");
                assert!(
                    execution
                        .attribute(span_attributes::QUEUE_WAIT_MS)
                        .is_some()
                );
                assert_eq!(
                    execution
                        .attribute(span_attributes::GEN_AI_TOOL_NAME)
                        .as_deref(),
                    Some(tool)
                );
                assert_eq!(
                    execution.attribute(span_attributes::GEN_AI_TOOL_CALL_ID),
                    model_id,
                    "{tool}"
                );
            }
        }
        attempts_of.insert(tool, attempts);
    }
    attempts_of
}

/// The retried call: two attempts, the first retryable, the second ok.
fn the_retry_is_a_second_attempt(attempts: &[&ReceivedSpan]) {
    let mut retried = attempts.to_vec();
    retried.sort_by_key(|a| a.attribute(span_attributes::ATTEMPT));
    assert_eq!(retried.len(), 2, "{retried:#?}");
    assert_eq!(
        retried[0].attribute(span_attributes::ATTEMPT).as_deref(),
        Some("1")
    );
    assert_eq!(
        retried[0].attribute(span_attributes::RETRYABLE).as_deref(),
        Some("true")
    );
    // A failure's class in the conventions' words: its code.
    assert!(retried[0].attribute(span_attributes::ERROR_TYPE).is_some());
    assert_eq!(
        retried[0].attribute(span_attributes::ERROR_TYPE),
        retried[0].attribute(span_attributes::OUTCOME)
    );
    assert_eq!(retried[1].attribute(span_attributes::ERROR_TYPE), None);
    assert_eq!(
        retried[1].attribute(span_attributes::ATTEMPT).as_deref(),
        Some("2")
    );
    assert_eq!(
        retried[1].attribute(span_attributes::OUTCOME).as_deref(),
        Some("ok")
    );
}

/// The call whose worker and orchestrator died: its one attempt was
/// picked up again by the second orchestrator and run by the other worker.
fn the_killed_call_was_resumed(spans: &[ReceivedSpan], attempts: &[&ReceivedSpan]) {
    let sleep = one(attempts.to_vec(), "the sleep call's attempt");
    assert_eq!(
        sleep.attribute(span_attributes::RESUMED).as_deref(),
        Some("true")
    );
    assert_eq!(
        sleep.attribute(span_attributes::OUTCOME).as_deref(),
        Some("ok")
    );
    let sleep_call = one(named(spans, "execute_tool sleep"), "sleep");
    assert_eq!(
        sleep_call.attribute(span_attributes::RESUMED).as_deref(),
        Some("true")
    );
}

/// A job of three parallel calls, one retried, one whose worker and then
/// orchestrator are killed while it runs, is one connected trace: the
/// client's, every span once, the run resumed with a link to the first,
/// each turn with its checkpoint, each call with its attempts and their
/// executions; its watch, its `GetJob` and its JSON logs name the trace.
#[tokio::test]
async fn a_job_is_one_connected_trace_across_a_retry_a_killed_worker_and_a_resumed_run()
-> anyhow::Result<()> {
    let collector = Collector::start().await?;
    let export = collector.env();
    let mut fleet = Fleet::start(test_fleet(2).worker_env(&with(FAST_REDELIVERY, &export))).await?;
    fleet
        .spawn_orchestrator(&with(FAST_TAKEOVER, &export))
        .await?;
    fleet
        .wait_for_tools(0, &["sleep", "fail", "echo"], 2)
        .await?;
    let api = fleet.api(0).await?;
    let job_id = submit_in_the_clients_trace(&api).await?;
    only_the_first_event_names_the_trace(&api, &job_id).await?;
    kill_the_sleeping_worker_then_the_orchestrator(&fleet, &collector).await?;
    // The second writes JSON logs: its lines about the job name the trace.
    let mut json_logs = with(FAST_TAKEOVER, &export);
    json_logs.push(("TOOLFLEET_LOG__FORMAT", "json"));
    let second = fleet.spawn_orchestrator(&json_logs).await?;
    let api = fleet.api(second).await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.trace_id, CLIENT_TRACE, "GetJob names the trace");
    the_json_log_names_the_trace(&fleet, second, &job_id)?;

    stop_all(&fleet).await?;
    let spans = collector.spans();
    let root = one_connected_trace(&spans, &job_id);
    started_then_resumed(&spans, root);
    two_turns_with_their_checkpoints(&spans, root);
    let attempts_of = calls_with_their_attempts(&spans, root);
    the_retry_is_a_second_attempt(&attempts_of["fail"]);
    the_killed_call_was_resumed(&spans, &attempts_of["sleep"]);
    Ok(())
}

/// OTLP over HTTP, configured by the standard variables on the worker and
/// by the config on the orchestrator; and a job that is not sampled sends
/// no span from any process, though its trace id is returned.
#[tokio::test]
async fn spans_go_over_http_too_and_an_unsampled_job_sends_none() -> anyhow::Result<()> {
    let collector = Collector::start().await?;
    let endpoint = collector.http_endpoint.as_str();
    let standard = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let mut fleet = Fleet::start(test_fleet(0).worker_env(FAST_REDELIVERY)).await?;
    fleet.spawn_worker_with(&standard).await?;
    let configured = [
        ("TOOLFLEET_TELEMETRY__OTLP_ENDPOINT", endpoint),
        ("TOOLFLEET_TELEMETRY__OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let traced = fleet.spawn_orchestrator(&configured).await?;
    fleet.wait_for_tools(traced, &["echo"], 1).await?;
    let api = fleet.api(traced).await?;
    let echo = json!([
        {"tool_calls": [{"name": "echo", "arguments": {"n": 1}},
                        {"name": "echo", "arguments": {"n": 2}},
                        {"name": "echo", "arguments": {"n": 3}},
                        {"name": "echo", "arguments": {"n": 4}}]},
        {"message": "done"}
    ]);
    let job = toolfleet_tests::fleet::run_job(&api, scripted_job("over http", &echo)).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    // No client context: the job's trace is its own.
    assert_eq!(job.trace_id.len(), 32, "{job:?}");
    assert_ne!(job.trace_id, CLIENT_TRACE);
    let of_job = |trace: &str| -> Vec<ReceivedSpan> {
        collector
            .spans()
            .into_iter()
            .filter(|s| s.trace_id() == trace)
            .collect()
    };
    wait_until("the job's spans over HTTP", WAIT, || async {
        let spans = of_job(&job.trace_id);
        spans.iter().any(|s| s.span.name == "submit job")
            && spans
                .iter()
                .filter(|s| s.span.name == "execute_tool echo")
                .count()
                == 4
    })
    .await?;
    // The worker, configured by the standard variables alone.
    wait_until("the worker's execution spans over HTTP", WAIT, || async {
        of_job(&job.trace_id)
            .iter()
            .filter(|s| s.span.name == "execute echo" && s.service == "toolfleet-worker")
            .count()
            == 4
    })
    .await?;

    // Not sampled: a trace id, and not one span anywhere.
    fleet.orchestrator(traced).kill();
    let unsampled = fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_TELEMETRY__OTLP_ENDPOINT", endpoint),
            ("TOOLFLEET_TELEMETRY__OTLP_PROTOCOL", "http/protobuf"),
            ("TOOLFLEET_TELEMETRY__SAMPLE_RATIO", "0.0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ])
        .await?;
    let api = fleet.api(unsampled).await?;
    let job = toolfleet_tests::fleet::run_job(&api, scripted_job("not sampled", &echo)).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.trace_id.len(), 32, "{job:?}");
    stop_all(&fleet).await?;
    assert!(
        of_job(&job.trace_id).is_empty(),
        "{:#?}",
        of_job(&job.trace_id)
    );
    Ok(())
}

#[tokio::test]
async fn a_held_calls_wait_for_a_person_is_a_span_of_its_call() -> anyhow::Result<()> {
    let collector = Collector::start().await?;
    let export = collector.env();
    let mut fleet = Fleet::start(test_fleet(1).worker_env(&with(&[], &export))).await?;
    fleet.spawn_orchestrator(&with(&[], &export)).await?;
    fleet.wait_for_tools(0, &["calculate"], 1).await?;
    let mut api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "math", "name": "calculate", "arguments": {"expression": "1 + 1"}}]},
        {"message": "{{math.data.result}}"}
    ]);
    let mut request = scripted_job("held", &script);
    request.require_approval = vec!["calculate".into()];
    let job_id = api.submit_job(request).await?.into_inner().job_id;
    wait_until("the job to park", WAIT, || {
        let (mut api, job_id) = (api.clone(), job_id.clone());
        async move {
            let job = api.get_job(v1::GetJobRequest { job_id }).await.ok()?;
            (job.get_ref().status() == v1::JobStatus::WaitingForApproval).then_some(())
        }
    })
    .await?;
    // A person takes a moment: at least 300 ms from when the call was held.
    let held_at = api
        .list_pending_approvals(v1::ListPendingApprovalsRequest::default())
        .await?
        .into_inner()
        .approvals
        .first()
        .map(|pending| pending.requested_at_ms)
        .ok_or_else(|| anyhow::anyhow!("the held call is not pending"))?;
    wait_until("the call to have waited 300 ms", WAIT, || async {
        toolfleet_service::clock::now_ms() >= held_at + 300
    })
    .await?;
    api.decide_call(v1::DecideCallRequest {
        job_id: job_id.clone(),
        call_id: "math".into(),
        decision: v1::Decision::Approve.into(),
        reason: String::new(),
        arguments: None,
        result: None,
    })
    .await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.output_text, "2");
    stop_all(&fleet).await?;

    let spans = collector.spans();
    let call = one(named(&spans, "execute_tool calculate"), "the call");
    assert_eq!(
        call.attribute(span_attributes::GEN_AI_TOOL_CALL_ID)
            .as_deref(),
        Some("math"),
        "the model's id of the call"
    );
    let wait = one(named(&spans, "approval calculate"), "the wait");
    assert_eq!(wait.parent_id(), call.span_id(), "under its call");
    assert_eq!(
        wait.attribute(span_attributes::DECISION).as_deref(),
        Some("approved")
    );
    assert_eq!(
        wait.attribute(span_attributes::APPROVAL_RULE).as_deref(),
        Some("job")
    );
    let lasted = wait.span.end_time_unix_nano - wait.span.start_time_unix_nano;
    assert!(lasted >= 300_000_000, "from held to decided: {lasted} ns");
    // The call ran after the wait, under the same call span.
    let attempt = one(named(&spans, "attempt 1"), "the attempt");
    assert_eq!(attempt.parent_id(), call.span_id());
    assert!(attempt.span.start_time_unix_nano >= wait.span.end_time_unix_nano);
    Ok(())
}

/// A fake Chat Completions model (`wiremock`) that calls `calculate` with
/// the model's id `call_abc`, then answers; each answer says its id, its
/// model, why it stopped and its tokens.
async fn chat_model_that_calls_calculate() -> wiremock::MockServer {
    use wiremock::matchers::{body_string_contains, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let model = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_string_contains("\"role\":\"tool\""))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "chatcmpl-2", "object": "chat.completion", "created": 1,
            "model": "gpt-test-0613",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "437."}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 3}
        })))
        .with_priority(1)
        .mount(&model)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1,
            "model": "gpt-test-0613",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": null, "tool_calls": [
                             {"id": "call_abc", "type": "function",
                              "function": {"name": "calculate",
                                           "arguments": "{\"expression\": \"23*19\"}"}}]}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 7}
        })))
        .with_priority(2)
        .mount(&model)
        .await;
    model
}

/// The turns of a job on a real provider's wire format are the GenAI
/// conventions' chat spans (`chat <model>`: the provider in the
/// conventions' words, the model asked for and the one that answered, the
/// answer's id, why it stopped, its tokens), and, with
/// `telemetry.capture_tool_content`, its call's execute_tool span carries
/// the arguments as the model wrote them and the result's data.
#[tokio::test]
async fn a_models_turns_and_calls_follow_the_genai_conventions_with_content_when_asked()
-> anyhow::Result<()> {
    let model = chat_model_that_calls_calculate().await;
    let collector = Collector::start().await?;
    let export = collector.env();
    let mut fleet = Fleet::start(test_fleet(1).worker_env(&with(&[], &export))).await?;
    let base_url = format!("{}/v1", model.uri());
    let env = [
        ("OPENAI_API_KEY", "sk-test"),
        ("TOOLFLEET_OPENAI__BASE_URL", base_url.as_str()),
        ("TOOLFLEET_TELEMETRY__CAPTURE_TOOL_CONTENT", "true"),
    ];
    fleet.spawn_orchestrator(&with(&env, &export)).await?;
    fleet.wait_for_tools(0, &["calculate"], 1).await?;
    let api = fleet.api(0).await?;
    let request = v1::SubmitJobRequest {
        input: "What is 23*19?".into(),
        model: Some(v1::ModelSpec {
            provider: "openai-chat".into(),
            name: "gpt-test".into(),
            max_tokens: 500,
            ..Default::default()
        }),
        tools: vec!["calculate".into()],
        ..Default::default()
    };
    let job = toolfleet_tests::fleet::run_job(&api, request).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    stop_all(&fleet).await?;
    let spans = collector.spans();

    let mut turns = named(&spans, "chat gpt-test");
    turns.sort_by_key(|t| t.attribute(span_attributes::TURN));
    assert_eq!(turns.len(), 2, "{turns:#?}");
    for (turn, (id, finish, input_tokens)) in turns.iter().zip([
        ("chatcmpl-1", r#"["tool_calls"]"#, "20"),
        ("chatcmpl-2", r#"["stop"]"#, "30"),
    ]) {
        assert_eq!(turn.span.kind, SPAN_KIND_CLIENT);
        for (key, value) in [
            (span_attributes::GEN_AI_OPERATION_NAME, "chat"),
            (span_attributes::GEN_AI_PROVIDER_NAME, "openai"),
            (span_attributes::OPENAI_API_TYPE, "chat_completions"),
            (span_attributes::PROVIDER, "openai-chat"),
            (span_attributes::GEN_AI_REQUEST_MODEL, "gpt-test"),
            (span_attributes::GEN_AI_REQUEST_MAX_TOKENS, "500"),
            (span_attributes::GEN_AI_RESPONSE_MODEL, "gpt-test-0613"),
            (span_attributes::GEN_AI_RESPONSE_ID, id),
            (span_attributes::GEN_AI_RESPONSE_FINISH_REASONS, finish),
            (span_attributes::GEN_AI_USAGE_INPUT_TOKENS, input_tokens),
        ] {
            assert_eq!(turn.attribute(key).as_deref(), Some(value), "{id}: {key}");
        }
    }

    let call = one(named(&spans, "execute_tool calculate"), "the call");
    for (key, value) in [
        (span_attributes::GEN_AI_OPERATION_NAME, "execute_tool"),
        (span_attributes::GEN_AI_TOOL_NAME, "calculate"),
        (span_attributes::GEN_AI_TOOL_CALL_ID, "call_abc"),
        // As the model wrote them, spaces and all.
        (
            span_attributes::GEN_AI_TOOL_CALL_ARGUMENTS,
            r#"{"expression": "23*19"}"#,
        ),
    ] {
        assert_eq!(call.attribute(key).as_deref(), Some(value), "{key}");
    }
    let result = call
        .attribute(span_attributes::GEN_AI_TOOL_CALL_RESULT)
        .ok_or_else(|| anyhow::anyhow!("no result on {call:#?}"))?;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&result)?,
        json!({"expression": "23*19", "result": 437}),
        "the envelope's data, not the envelope"
    );
    // The worker's execution names the model's id too, and carries no
    // content: only the orchestrator's call span does.
    let execution = one(named(&spans, "execute calculate"), "the execution");
    assert_eq!(
        execution
            .attribute(span_attributes::GEN_AI_TOOL_CALL_ID)
            .as_deref(),
        Some("call_abc")
    );
    assert_eq!(
        execution.attribute(span_attributes::GEN_AI_TOOL_CALL_ARGUMENTS),
        None
    );
    Ok(())
}
