//! The orchestrator end to end: real nats-server, redis-server, orchestrator
//! and worker processes; the scripted model plays the LLM.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde_json::{Value, json};
use tonic::Code;
use toolfleet_proto::v1::{self, item::Kind};
use toolfleet_tests::fleet::{
    ApiClient, Fleet, cancelled_job, run_job, scripted_job, test_fleet, wait_finished,
};
use toolfleet_tests::wait_until;

const JOB: Duration = Duration::from_secs(60);

/// NATS, Redis, one orchestrator and `workers` workers with the test tools.
async fn fleet(workers: usize) -> anyhow::Result<Fleet> {
    let mut fleet = Fleet::start(test_fleet(workers)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet
        .wait_for_tools(0, &["calculate", "get_current_weather", "fail", "sleep"], 1)
        .await?;
    Ok(fleet)
}

fn scripted(input: &str, script: Value) -> v1::SubmitJobRequest {
    scripted_job(input, &script)
}

/// Submits, follows the events to the end, and returns the finished job.
async fn run(api: &mut ApiClient, request: v1::SubmitJobRequest) -> anyhow::Result<v1::Job> {
    let job_id = api.submit_job(request).await?.into_inner().job_id;
    wait_finished(api, &job_id).await
}

fn results(job: &v1::Job) -> Vec<(String, Value, u32)> {
    job.items
        .iter()
        .filter_map(|item| match &item.kind {
            Some(Kind::ToolResult(r)) => Some((
                r.call_id.clone(),
                serde_json::from_str(&r.output).expect("outputs are envelopes"),
                r.attempts,
            )),
            _ => None,
        })
        .collect()
}

/// Every event of a finished job.
async fn events_of(api: &mut ApiClient, job_id: &str) -> anyhow::Result<Vec<v1::JobEvent>> {
    let stream = api
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_owned(),
            from_offset: 0,
        })
        .await?
        .into_inner();
    Ok(stream.try_collect().await?)
}

/// The kinds of a job's `tool_call_*` events, in order.
async fn call_event_kinds(api: &mut ApiClient, job_id: &str) -> anyhow::Result<Vec<String>> {
    Ok(events_of(api, job_id)
        .await?
        .into_iter()
        .filter(|e| e.kind.starts_with("tool_call_"))
        .map(|e| e.kind)
        .collect())
}

fn status(job: &v1::Job) -> v1::JobStatus {
    v1::JobStatus::try_from(job.status).unwrap_or(v1::JobStatus::Unspecified)
}

#[tokio::test]
async fn a_turn_of_three_parallel_calls_is_answered_in_call_order() -> anyhow::Result<()> {
    let fleet = fleet(2).await?;
    let mut api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [
            {"name": "get_current_weather", "arguments": {"location": "Boston, MA", "unit": "celsius"}},
            {"name": "calculate", "arguments": {"expression": "23 * 19"}},
            {"name": "get_current_weather", "arguments": {"location": "Boston, MA", "unit": "kelvin"}}
        ]},
        {"message": "{{call_0_0.data.temperature}} degrees; 23*19={{call_0_1.data.result}}; {{call_0_2.error.code}}"}
    ]);
    let job = run(&mut api, scripted("weather and math", script)).await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded, "{job:?}");
    assert_eq!(
        job.output_text,
        "8.0 degrees; 23*19=437; INVALID_TOOL_ARGUMENTS"
    );
    assert_eq!(job.rounds, 1);
    let results = results(&job);
    let ids: Vec<_> = results.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(ids, ["call_0_0", "call_0_1", "call_0_2"]);
    assert_eq!(results[0].1["data"]["location"], "Boston, MA");
    assert_eq!(
        results[1].1,
        json!({"ok": true, "data": {"expression": "23 * 19", "result": 437}})
    );
    assert_eq!(results[2].1["error"]["code"], "INVALID_TOOL_ARGUMENTS");
    assert_eq!(
        results[2].2, 0,
        "the invalid call was answered without a dispatch"
    );
    for worker in fleet.workers() {
        assert!(
            !worker.log_tail(10_000).contains("call_0_2"),
            "{} saw the invalid call",
            worker.name()
        );
    }
    // The transcript: user, 3 calls, 3 results, the final message.
    let kinds: Vec<_> = job
        .items
        .iter()
        .map(|i| match i.kind {
            Some(Kind::User(_)) => "user",
            Some(Kind::Assistant(_)) => "assistant",
            Some(Kind::ToolCall(_)) => "call",
            Some(Kind::ToolResult(_)) => "result",
            None => "none",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user",
            "call",
            "call",
            "call",
            "result",
            "result",
            "result",
            "assistant"
        ]
    );
    Ok(())
}

/// A model asking for a generic escape hatch gets UNKNOWN_TOOL; nothing
/// runs, and nothing is recorded as dispatched: only the round's valid
/// call is.
async fn unknown_tools_run_nothing(fleet: &Fleet, api: &mut ApiClient) -> anyhow::Result<()> {
    let job = run(
        api,
        scripted(
            "hack",
            json!([
                {"tool_calls": [
                    {"name": "run_shell", "arguments": {"cmd": "id"}},
                    {"name": "calculate", "arguments": {"expression": "2*3"}}
                ]},
                {"message": "{{call_0_0.error.code}}"}
            ]),
        ),
    )
    .await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded);
    assert_eq!(job.output_text, "UNKNOWN_TOOL");
    assert_eq!(results(&job)[0].2, 0);
    assert_eq!(results(&job)[1].2, 1);
    assert!(!fleet.worker(0).log_tail(10_000).contains("run_shell"));
    let dispatched: Vec<String> = events_of(api, &job.job_id)
        .await?
        .into_iter()
        .filter(|e| e.kind == "tool_call_dispatched")
        .map(|e| e.data)
        .collect();
    assert_eq!(dispatched.len(), 1, "{dispatched:?}");
    assert!(
        dispatched[0].contains(r#""name":"calculate""#),
        "{dispatched:?}"
    );
    Ok(())
}

/// A tool outside the job's allow-list is unknown to that job too.
async fn a_tool_off_the_allow_list_is_unknown(api: &mut ApiClient) -> anyhow::Result<()> {
    let mut allow = scripted(
        "allow-list",
        json!([
            {"tool_calls": [{"name": "calculate", "arguments": {"expression": "1+1"}}]},
            {"message": "{{call_0_0.error.code}}"}
        ]),
    );
    allow.tools = vec!["get_current_weather".into()];
    assert_eq!(run(api, allow).await?.output_text, "UNKNOWN_TOOL");
    Ok(())
}

/// Retryable failures are retried; terminal ones are not.
async fn retryable_failures_are_retried_terminal_ones_not(
    api: &mut ApiClient,
) -> anyhow::Result<()> {
    let job = run(
        api,
        scripted(
            "flaky",
            json!([
                {"tool_calls": [
                    {"name": "fail", "arguments": {"mode": "retryable", "fail_attempts": 2}},
                    {"name": "fail", "arguments": {"mode": "terminal"}}
                ]},
                {"message": "done"}
            ]),
        ),
    )
    .await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded);
    let results = results(&job);
    assert_eq!(results[0].1, json!({"ok": true, "data": {"attempt": 3}}));
    assert_eq!(results[0].2, 3);
    assert_eq!(results[1].1["error"]["code"], "TEST_FAILURE");
    assert_eq!(results[1].2, 1, "a terminal failure is not retried");
    Ok(())
}

/// More rounds than allowed fails the job.
async fn too_many_rounds_fail_the_job(api: &mut ApiClient) -> anyhow::Result<()> {
    let mut looping = scripted(
        "loop",
        json!([
            {"tool_calls": [{"name": "calculate", "arguments": {"expression": "1"}}]},
            {"tool_calls": [{"name": "calculate", "arguments": {"expression": "2"}}]},
            {"tool_calls": [{"name": "calculate", "arguments": {"expression": "3"}}]},
            {"message": "never"}
        ]),
    );
    looping.max_tool_rounds = 2;
    let job = run(api, looping).await?;
    assert_eq!(status(&job), v1::JobStatus::Failed);
    assert_eq!(
        job.error.as_ref().map(|e| e.code.as_str()),
        Some("MAX_TOOL_ROUNDS_EXCEEDED")
    );
    Ok(())
}

/// With parallel_tool_calls off, each call is answered before the next
/// is dispatched.
async fn sequential_calls_are_answered_one_by_one(api: &mut ApiClient) -> anyhow::Result<()> {
    let mut one_by_one = scripted(
        "sequential",
        json!([
            {"tool_calls": [
                {"name": "sleep", "arguments": {"ms": 100}},
                {"name": "sleep", "arguments": {"ms": 100}}]},
            {"message": "done"}
        ]),
    );
    one_by_one.parallel_tool_calls = Some(false);
    let job = run(api, one_by_one).await?;
    assert_eq!(
        call_event_kinds(api, &job.job_id).await?,
        [
            "tool_call_dispatched",
            "tool_call_result",
            "tool_call_dispatched",
            "tool_call_result"
        ]
    );
    Ok(())
}

/// The same idempotency key twice is one job.
async fn an_idempotency_key_twice_is_one_job(api: &mut ApiClient) -> anyhow::Result<()> {
    let mut once = scripted("once", json!([{"message": "hi"}]));
    once.idempotency_key = "order-42".into();
    let first = api.submit_job(once.clone()).await?.into_inner();
    let second = api.submit_job(once).await?.into_inner();
    assert!(!first.duplicate && second.duplicate);
    assert_eq!(first.job_id, second.job_id);
    assert_eq!(wait_finished(api, &first.job_id).await?.output_text, "hi");
    Ok(())
}

/// Unknown tools, the allow-list, retries, the round limit, sequential
/// calls and idempotency keys, each through one fleet as its step says.
#[tokio::test]
async fn unknown_tools_retries_rounds_and_idempotency() -> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    unknown_tools_run_nothing(&fleet, &mut api).await?;
    a_tool_off_the_allow_list_is_unknown(&mut api).await?;
    retryable_failures_are_retried_terminal_ones_not(&mut api).await?;
    too_many_rounds_fail_the_job(&mut api).await?;
    sequential_calls_are_answered_one_by_one(&mut api).await?;
    an_idempotency_key_twice_is_one_job(&mut api).await?;
    Ok(())
}

#[tokio::test]
async fn watch_replays_finished_jobs_and_cancel_stops_a_slow_one() -> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    let job = run(
        &mut api,
        scripted(
            "two rounds",
            json!([
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "1+1"}}]},
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "2+2"}}]},
                {"message": "ok"}
            ]),
        ),
    )
    .await?;
    let replay = |from_offset: u64| {
        let mut api = api.clone();
        let job_id = job.job_id.clone();
        async move {
            let stream = api
                .watch_job(v1::WatchJobRequest {
                    job_id,
                    from_offset,
                })
                .await?
                .into_inner();
            let events: Vec<v1::JobEvent> = stream.map(|e| e.expect("an event")).collect().await;
            anyhow::Ok(events)
        }
    };
    let all = replay(0).await?;
    let kinds: Vec<_> = all.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"job_queued"));
    assert_eq!(kinds.last(), Some(&"job_succeeded"));
    assert_eq!(kinds.iter().filter(|k| **k == "model_turn").count(), 3);
    assert!(
        all.iter().enumerate().all(|(i, e)| e.offset == i as u64),
        "offsets are 0..n"
    );
    assert!(all.last().is_some_and(|e| e.r#final));
    let middle = all.len() as u64 / 2;
    let rest = replay(middle).await?;
    assert_eq!(rest, all[middle as usize..].to_vec());
    assert_eq!(
        replay(all.len() as u64 + 5).await?,
        all[all.len() - 1..].to_vec(),
        "past the end: the final event again, so the stream says how the job ended"
    );

    // Cancel during a slow model turn: the turn's answer is not used.
    let slow_model = api
        .submit_job(scripted(
            "slow model",
            json!([{"delay_ms": 3000, "message": "too late"}]),
        ))
        .await?
        .into_inner();
    api.cancel_job(v1::CancelJobRequest {
        job_id: slow_model.job_id.clone(),
    })
    .await?;
    let cancelled = wait_finished(&api, &slow_model.job_id).await?;
    assert_eq!(
        status(&cancelled),
        v1::JobStatus::Cancelled,
        "{cancelled:?}"
    );
    assert_eq!(cancelled.output_text, "");

    // Cancel a job blocked in a slow tool.
    let submitted = api
        .submit_job(scripted(
            "slow",
            json!([
                {"tool_calls": [{"name": "sleep", "arguments": {"ms": 20000}}]},
                {"message": "never"}
            ]),
        ))
        .await?
        .into_inner();
    fleet.worker(0).wait_for_log("executing call", JOB).await?;
    api.cancel_job(v1::CancelJobRequest {
        job_id: submitted.job_id.clone(),
    })
    .await?;
    let cancelled = wait_finished(&api, &submitted.job_id).await?;
    assert_eq!(status(&cancelled), v1::JobStatus::Cancelled);
    assert_eq!(
        cancelled.error.as_ref().map(|e| e.code.as_str()),
        Some("CANCELLED")
    );
    // The worker stops the tool: `sleep` is read-only, so its run holds no
    // claim (decision 0060), and finds the job's cancel mark all the same.
    fleet
        .worker(0)
        .wait_for_log("the call's job was cancelled; the call is stopped", JOB)
        .await?;
    Ok(())
}

/// How many `XRANGE`s (reads of a job's event log) Redis has run.
async fn event_log_reads(fleet: &Fleet) -> anyhow::Result<u64> {
    let mut redis = fleet.redis.connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut redis)
        .await?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_xrange:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(Ok(0), str::parse)?)
}

#[tokio::test]
async fn a_live_watch_gets_the_events_this_replica_stores_without_reading_them_back()
-> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    // Steps apart in time, so that the watcher has sent everything before
    // each write when it comes.
    let job_id = api
        .submit_job(scripted(
            "two rounds, one call each",
            json!([
                {"delay_ms": 100, "tool_calls": [{"name": "sleep", "arguments": {"ms": 100}}]},
                {"delay_ms": 100, "tool_calls": [{"name": "sleep", "arguments": {"ms": 100}}]},
                {"delay_ms": 100, "message": "ok"}
            ]),
        ))
        .await?
        .into_inner()
        .job_id;
    let reads_before = event_log_reads(&fleet).await?;
    let live = events_of(&mut api, &job_id).await?;
    let reads = event_log_reads(&fleet).await? - reads_before;
    // A replay of the finished job reads every event from Redis: the live
    // stream handed over the same events, field for field.
    let stored = events_of(&mut api, &job_id).await?;
    assert_eq!(live, stored);
    assert!(live.len() >= 9, "{live:?}");
    assert!(live.last().is_some_and(|e| e.r#final));
    // The first read, and at most one more where a write came before the
    // watcher had sent the one before it; not one per write.
    assert!(
        reads <= 2,
        "{reads} reads of the event log for {} events",
        live.len()
    );
    Ok(())
}

/// The timestamps of a finished job's `tool_call_result` events, by call.
async fn result_times(api: &mut ApiClient, job_id: &str) -> anyhow::Result<Vec<(String, u64)>> {
    Ok(events_of(api, job_id)
        .await?
        .into_iter()
        .filter(|e| e.kind == "tool_call_result")
        .map(|e| {
            let data: Value = serde_json::from_str(&e.data).expect("event data is JSON");
            (
                data["call_id"].as_str().unwrap_or("").to_owned(),
                e.timestamp_ms,
            )
        })
        .collect())
}

#[tokio::test]
async fn a_parallel_round_s_results_linger_for_one_commit_unless_the_linger_is_zero()
-> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    // The longest linger, longer than the round: the first two results
    // wait for the third; with none, each is stored as it settles.
    let lingering = fleet
        .spawn_orchestrator(&[("TOOLFLEET_DISPATCH__RESULT_LINGER", "1s")])
        .await?;
    let eager = fleet
        .spawn_orchestrator(&[("TOOLFLEET_DISPATCH__RESULT_LINGER", "0s")])
        .await?;
    fleet.wait_for_tools(lingering, &["sleep"], 1).await?;
    fleet.wait_for_tools(eager, &["sleep"], 1).await?;
    let round = || {
        scripted(
            "three calls that settle 150 ms apart",
            json!([
                {"tool_calls": [
                    {"id": "a", "name": "sleep", "arguments": {"ms": 0}},
                    {"id": "b", "name": "sleep", "arguments": {"ms": 150}},
                    {"id": "c", "name": "sleep", "arguments": {"ms": 300}}
                ]},
                {"message": "ok"}
            ]),
        )
    };
    let mut api = fleet.api(lingering).await?;
    let job = run(&mut api, round()).await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded);
    let times = result_times(&mut api, &job.job_id).await?;
    assert_eq!(times.len(), 3, "{times:?}");
    assert!(
        times.iter().all(|(_, at)| *at == times[0].1),
        "one commit, made when the last result came: {times:?}"
    );
    let mut api = fleet.api(eager).await?;
    let job = run(&mut api, round()).await?;
    let times = result_times(&mut api, &job.job_id).await?;
    let at = |id: &str| times.iter().find(|(call, _)| call == id).map(|(_, at)| *at);
    let (a, c) = (at("a").unwrap_or(0), at("c").unwrap_or(0));
    assert!(c >= a + 200, "each stored as it settled: {times:?}");
    Ok(())
}

#[tokio::test]
async fn an_interrupted_round_leaves_no_subscriber_on_the_reply_subject() -> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    // One call at a time: the round is cut short in the middle of its first call.
    let mut one_by_one = scripted(
        "slow, one by one",
        json!([
            {"tool_calls": [
                {"name": "sleep", "arguments": {"ms": 20000}},
                {"name": "sleep", "arguments": {"ms": 20000}}
            ]},
            {"message": "never"}
        ]),
    );
    one_by_one.parallel_tool_calls = Some(false);
    let submitted = api.submit_job(one_by_one).await?.into_inner();
    fleet.worker(0).wait_for_log("executing call", JOB).await?;
    let reply_subject =
        toolfleet_proto::names::reply_subject(&toolfleet_tests::fleet::job_id(&submitted.job_id));
    // While the round runs, the orchestrator listens on the job's reply
    // subject: a request there finds a responder (which never answers).
    let listening = probe(&fleet.client, &reply_subject).await;
    assert!(
        !is_no_responders(&listening),
        "the round should be listening: {listening:?}"
    );
    api.cancel_job(v1::CancelJobRequest {
        job_id: submitted.job_id.clone(),
    })
    .await?;
    let cancelled = wait_finished(&api, &submitted.job_id).await?;
    assert_eq!(status(&cancelled), v1::JobStatus::Cancelled);
    // Once the job ended, nobody may be subscribed there any more.
    toolfleet_tests::wait_until(
        "the reply subject to lose its last subscriber",
        Duration::from_secs(10),
        || async { is_no_responders(&probe(&fleet.client, &reply_subject).await) },
    )
    .await?;
    Ok(())
}

/// A request on `subject` that gives up after half a second: the server
/// answers "no responders" at once when nobody subscribes there.
async fn probe(
    client: &async_nats::Client,
    subject: &str,
) -> Result<async_nats::Message, async_nats::RequestError> {
    let request = async_nats::Request::new()
        .payload("probe".into())
        .timeout(Some(Duration::from_millis(500)));
    client.send_request(subject.to_owned(), request).await
}

fn is_no_responders<T>(result: &Result<T, async_nats::RequestError>) -> bool {
    matches!(result, Err(err) if err.kind() == async_nats::RequestErrorKind::NoResponders)
}

/// A request without a model (and no default), with an empty or too long
/// input, an unknown provider or a script that does not parse is
/// `INVALID_ARGUMENT`, its message starting with the field.
async fn bad_fields_are_named(api: &mut ApiClient) -> anyhow::Result<()> {
    let mut unknown_provider = scripted("x", json!([{"message": "m"}]));
    unknown_provider.model.as_mut().expect("set").provider = "gpt-magic".into();
    let mut bad_script = scripted("x", json!([]));
    bad_script.model.as_mut().expect("set").script = "{not json".into();
    let cases = [
        (scripted("", json!([{"message": "m"}])), "input"),
        (
            scripted(&"x".repeat(300 * 1024), json!([{"message": "m"}])),
            "input",
        ),
        (unknown_provider, "model.provider"),
        (bad_script, "model.script"),
    ];
    let no_model = v1::SubmitJobRequest {
        input: "What is 2+2?".into(),
        ..Default::default()
    };
    let status = api
        .submit_job(no_model)
        .await
        .expect_err("no model, no default");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with("model: is required")
            && status.message().contains("api.default_model"),
        "{}",
        status.message()
    );
    for (request, field) in cases {
        let status = api.submit_job(request).await.expect_err("rejected");
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().starts_with(field),
            "{field}: {}",
            status.message()
        );
    }
    Ok(())
}

/// An input of a few MB, past gRPC's usual 4 MiB message limit, is read
/// and refused by name (grpc.max_request_bytes); past that limit, it is
/// refused unread (`OUT_OF_RANGE`).
async fn huge_inputs_are_refused(api: &mut ApiClient) -> anyhow::Result<()> {
    let huge = scripted(&"x".repeat(5_000_000), json!([{"message": "m"}]));
    let status = api.submit_job(huge).await.expect_err("over the limit");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        status.message(),
        "input: is 5000000 bytes; the limit is 262144"
    );
    let past = scripted(&"x".repeat(17 * 1024 * 1024), json!([{"message": "m"}]));
    let status = api
        .submit_job(past)
        .await
        .expect_err("past the message limit");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    Ok(())
}

/// A job that does not exist is `NOT_FOUND` to get, cancel and watch.
async fn a_missing_job_is_not_found(api: &mut ApiClient) {
    for status in [
        api.get_job(v1::GetJobRequest {
            job_id: "nope".into(),
        })
        .await
        .expect_err("missing"),
        api.cancel_job(v1::CancelJobRequest {
            job_id: "nope".into(),
        })
        .await
        .expect_err("missing"),
        api.watch_job(v1::WatchJobRequest {
            job_id: "nope".into(),
            from_offset: 0,
        })
        .await
        .expect_err("missing"),
    ] {
        assert_eq!(status.code(), Code::NotFound);
    }
}

/// ListTools names each live tool's workers, parameters and effects.
async fn tools_are_listed_with_their_effects(api: &mut ApiClient) -> anyhow::Result<()> {
    let tools = api
        .list_tools(v1::ListToolsRequest::default())
        .await?
        .into_inner()
        .tools;
    let calculate = tools
        .iter()
        .find(|t| t.name == "calculate")
        .expect("calculate is live");
    assert_eq!(calculate.workers, 1);
    assert!(calculate.parameters.contains("expression"));
    // What its calls may do, and the flag older clients read beside it.
    assert_eq!(
        (calculate.effects.as_str(), calculate.side_effects),
        ("read_only", false)
    );
    let counter = tools
        .iter()
        .find(|t| t.name == "increment_counter")
        .expect("increment_counter is live");
    assert_eq!(
        (counter.effects.as_str(), counter.side_effects),
        ("not_idempotent", true)
    );
    // The contract hash is the manifest's: remade here from what is listed
    // (name, schema, strict, effects), and other for another tool.
    for tool in [calculate, counter] {
        let mut manifest = toolfleet_proto::ToolManifest::new(
            tool.name.clone(),
            String::new(),
            serde_json::from_str(&tool.parameters)?,
        );
        manifest.strict = tool.strict;
        manifest.effects = serde_json::from_value(serde_json::json!(tool.effects))?;
        assert_eq!(
            tool.contract_hash,
            manifest.contract_hash(),
            "{}",
            tool.name
        );
    }
    assert_ne!(calculate.contract_hash, counter.contract_hash);
    Ok(())
}

/// Bad requests name the field (or are not found), and the server keeps
/// listing tools and running jobs after them.
#[tokio::test]
async fn bad_requests_name_the_field_and_the_server_keeps_serving() -> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    bad_fields_are_named(&mut api).await?;
    huge_inputs_are_refused(&mut api).await?;
    a_missing_job_is_not_found(&mut api).await;
    tools_are_listed_with_their_effects(&mut api).await?;
    let job = run(
        &mut api,
        scripted("still here", json!([{"message": "yes"}])),
    )
    .await?;
    assert_eq!(job.output_text, "yes");
    Ok(())
}

#[tokio::test]
async fn reflection_is_off_by_default_and_answers_in_both_versions_when_on() -> anyhow::Result<()> {
    use tonic_reflection::pb::{v1, v1alpha};
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet
        .spawn_orchestrator(&[("TOOLFLEET_GRPC__REFLECTION", "true")])
        .await?;
    let off = tonic::transport::Endpoint::from_shared(fleet.grpc_url(0).await?)?
        .connect()
        .await?;
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(off);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let refused = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect_err("no reflection unless grpc.reflection = true");
    assert_eq!(refused.code(), Code::Unimplemented);

    let url = fleet.grpc_url(1).await?;
    let channel = tonic::transport::Endpoint::from_shared(url)?
        .connect()
        .await?;

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = alpha
        .server_reflection_info(tokio_stream::iter([request]))
        .await?
        .into_inner();
    let answer = answers.message().await?.expect("an answer");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"toolfleet.v1.AgentService".to_owned()),
        "{names:?}"
    );

    let mut current = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = current
        .server_reflection_info(tokio_stream::iter([request]))
        .await?
        .into_inner();
    assert!(answers.message().await?.is_some());
    Ok(())
}

#[tokio::test]
async fn list_jobs_pages_newest_first_and_filters_by_status_and_metadata() -> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    let mut submitted = Vec::new();
    for n in 0..7 {
        let mut request = scripted("x", json!([{"message": "done"}]));
        request
            .metadata
            .insert("team".into(), if n % 2 == 0 { "a" } else { "b" }.into());
        let job_id = api.submit_job(request).await?.into_inner().job_id;
        wait_finished(&api, &job_id).await?;
        submitted.push(job_id);
    }
    let slow = cancelled_job(&api).await?;
    submitted.push(slow.clone());

    let list = |page_token: String, status: v1::JobStatus, metadata: &[(&str, &str)]| {
        let mut api = api.clone();
        let metadata = metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        async move {
            anyhow::Ok(
                api.list_jobs(v1::ListJobsRequest {
                    page_size: 3,
                    page_token,
                    status: status as i32,
                    metadata,
                    ..Default::default()
                })
                .await?
                .into_inner(),
            )
        }
    };
    // Every job once, newest first, three at a time.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = list(token, v1::JobStatus::Unspecified, &[]).await?;
        assert!(page.jobs.len() <= 3);
        assert!(
            page.jobs.iter().all(|j| j.items.is_empty()),
            "no items in a list"
        );
        seen.extend(page.jobs.into_iter().map(|j| j.job_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let newest_first: Vec<String> = submitted.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);

    let cancelled = list(String::new(), v1::JobStatus::Cancelled, &[]).await?;
    let ids: Vec<&str> = cancelled.jobs.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(ids, [slow.as_str()]);
    let team_b = list(String::new(), v1::JobStatus::Succeeded, &[("team", "b")]).await?;
    let ids: Vec<&str> = team_b.jobs.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(ids, [&submitted[5], &submitted[3], &submitted[1]]);

    for (request, field) in [
        (
            v1::ListJobsRequest {
                page_token: "not-a-token".into(),
                ..Default::default()
            },
            "page_token",
        ),
        (
            v1::ListJobsRequest {
                page_size: 501,
                ..Default::default()
            },
            "page_size",
        ),
        (
            v1::ListJobsRequest {
                page_token: "12.a\nb".into(),
                ..Default::default()
            },
            "page_token",
        ),
    ] {
        let status = api.list_jobs(request).await.expect_err("rejected");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{}", status.message());
    }
    Ok(())
}

/// The ids of a listing's pages, read `page_size` at a time to the end,
/// from `request` (its page size and token replaced).
async fn listed_ids(
    api: &ApiClient,
    request: v1::ListJobsRequest,
    page_size: u32,
) -> anyhow::Result<Vec<String>> {
    let mut api = api.clone();
    let mut ids = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = api
            .list_jobs(v1::ListJobsRequest {
                page_size,
                page_token,
                ..request.clone()
            })
            .await?
            .into_inner();
        assert!(page.jobs.len() <= page_size as usize);
        assert!(page.counts.is_empty(), "no counts unless asked");
        ids.extend(page.jobs.into_iter().map(|j| j.job_id));
        if page.next_page_token.is_empty() {
            return Ok(ids);
        }
        page_token = page.next_page_token;
    }
}

/// A window of creation times lists exactly the jobs created in it, from
/// its start (included) to its end (excluded), newest first and page by
/// page with the other filters, whatever the window's edges cut: a job
/// created on an edge, an empty window, one before every job.
#[tokio::test]
async fn list_jobs_reads_a_window_of_creation_times() -> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let api = fleet.api(0).await?;
    let mut created: Vec<(u64, String, bool)> = Vec::new();
    for n in 0..6 {
        let mut request = scripted("x", json!([{"message": "done"}]));
        let even = n % 2 == 0;
        request
            .metadata
            .insert("team".into(), if even { "a" } else { "b" }.into());
        let job = run(&mut api.clone(), request).await?;
        created.push((job.created_at_ms, job.job_id, even));
    }
    let window = |after: u64, before: u64| v1::ListJobsRequest {
        created_after_ms: after,
        created_before_ms: before,
        ..Default::default()
    };
    // What a window holds, as the store's clock wrote the jobs: newest
    // first (the ids break a tie of one millisecond, as the index does).
    let expected = |after: u64, before: u64, team_a: bool| {
        let mut jobs: Vec<&(u64, String, bool)> = created
            .iter()
            .filter(|(ms, _, even)| {
                *ms >= after && (before == 0 || *ms < before) && (!team_a || *even)
            })
            .collect();
        jobs.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
        jobs.into_iter()
            .map(|(_, id, _)| id.clone())
            .collect::<Vec<_>>()
    };
    let (first, second, fifth) = (created[0].0, created[1].0, created[4].0);
    for (after, before) in [
        (second, fifth),
        (first, 0),
        (0, second),
        (second, second + 1),
        (fifth, fifth),
        (1, first),
        (fifth + 1, 0),
    ] {
        for page_size in [1, 2, 50] {
            assert_eq!(
                listed_ids(&api, window(after, before), page_size).await?,
                expected(after, before, false),
                "[{after}, {before}) by {page_size}"
            );
        }
    }
    assert_eq!(expected(second, fifth, false).len(), 3, "the edges cut");
    // With the other filters, and a page token from a page without the
    // window: a token is a place in the index, whatever the filters.
    let mut team_a = window(second, 0);
    team_a.metadata.insert("team".into(), "a".into());
    team_a.status = v1::JobStatus::Succeeded as i32;
    assert_eq!(
        listed_ids(&api, team_a, 1).await?,
        expected(second, 0, true)
    );
    let newest = api
        .clone()
        .list_jobs(v1::ListJobsRequest {
            page_size: 1,
            ..Default::default()
        })
        .await?
        .into_inner();
    let after_newest = api
        .clone()
        .list_jobs(v1::ListJobsRequest {
            page_token: newest.next_page_token,
            ..window(second, fifth)
        })
        .await?
        .into_inner();
    let ids: Vec<String> = after_newest.jobs.into_iter().map(|j| j.job_id).collect();
    assert_eq!(ids, expected(second, fifth, false));

    for (request, field) in [
        (window(fifth, second), "created_after_ms: "),
        (window(u64::MAX, 0), "created_after_ms: "),
        (window(0, 1 << 48), "created_before_ms: "),
    ] {
        let status = api.clone().list_jobs(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{}", status.message());
    }
    Ok(())
}

/// The counts a caller asks for, as `(status, jobs)` pairs of the
/// statuses that have any.
async fn counted(api: &ApiClient) -> anyhow::Result<Vec<(v1::JobStatus, u64)>> {
    let page = api
        .clone()
        .list_jobs(v1::ListJobsRequest {
            page_size: 1,
            with_counts: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let statuses: Vec<v1::JobStatus> = page.counts.iter().map(|c| c.status()).collect();
    assert_eq!(
        statuses,
        [
            v1::JobStatus::Queued,
            v1::JobStatus::Running,
            v1::JobStatus::WaitingForApproval,
            v1::JobStatus::Succeeded,
            v1::JobStatus::Failed,
            v1::JobStatus::Cancelled,
        ],
        "every status, in order"
    );
    Ok(page
        .counts
        .iter()
        .filter(|c| c.jobs > 0)
        .map(|c| (c.status(), c.jobs))
        .collect())
}

/// Waits until the caller's counts are `expected`.
async fn counts_become(api: &ApiClient, expected: &[(v1::JobStatus, u64)]) -> anyhow::Result<()> {
    let what = format!("the counts to be {expected:?}");
    let reached = wait_until(&what, Duration::from_secs(20), || {
        let api = api.clone();
        async move { counted(&api).await.is_ok_and(|counts| counts == expected) }
    })
    .await;
    if let Err(err) = reached {
        anyhow::bail!("{err:#}; they are {:?}", counted(api).await?);
    }
    Ok(())
}

/// Counts follow each job's status as it changes (a run, a park for
/// approval, an end, a cancel), whatever the page's filters; and a count
/// its change did not make (a replica that died between the two) is
/// repaired by the sweeper from the job's record.
#[tokio::test]
async fn counts_follow_each_change_of_status_and_the_sweeper_repairs_a_lost_one()
-> anyhow::Result<()> {
    use v1::JobStatus::{Cancelled, Failed, Running, Succeeded, WaitingForApproval};
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_RUNNER__SWEEP_INTERVAL", "200ms"),
            ("TOOLFLEET_RUNNER__SWEEP_AFTER", "500ms"),
        ])
        .await?;
    fleet.wait_for_tools(0, &["calculate", "fail"], 1).await?;
    let api = fleet.api(0).await?;
    assert_eq!(counted(&api).await?, [], "no job yet");
    for _ in 0..3 {
        run(
            &mut api.clone(),
            scripted("x", json!([{"message": "done"}])),
        )
        .await?;
    }
    // A script with no turn after its call: the job fails.
    let failed = run(
        &mut api.clone(),
        scripted(
            "x",
            json!([{"tool_calls": [{"name": "calculate", "arguments": {"expression": "1"}}]}]),
        ),
    )
    .await?;
    assert_eq!(status(&failed), Failed, "the script ran out");
    counts_become(&api, &[(Succeeded, 3), (Failed, 1)]).await?;

    let slow = scripted("x", json!([{"delay_ms": 60_000, "message": "late"}]));
    let slow = api.clone().submit_job(slow).await?.into_inner().job_id;
    let mut held = scripted(
        "x",
        json!([{"tool_calls": [{"name": "calculate", "arguments": {"expression": "1"}}]}, {"message": "ok"}]),
    );
    held.require_approval = vec!["calculate".into()];
    let held = api.clone().submit_job(held).await?.into_inner().job_id;
    counts_become(
        &api,
        &[
            (Running, 1),
            (WaitingForApproval, 1),
            (Succeeded, 3),
            (Failed, 1),
        ],
    )
    .await?;
    // Whatever the page lists, the counts are the caller's whole.
    let filtered = api
        .clone()
        .list_jobs(v1::ListJobsRequest {
            status: Failed as i32,
            created_after_ms: 1 << 47,
            with_counts: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(filtered.jobs.is_empty());
    assert_eq!(filtered.counts.iter().map(|c| c.jobs).sum::<u64>(), 6);

    // A count step lost: the job runs, its count says it is queued.
    let keys = toolfleet_proto::names::RedisKeys::default();
    let mut redis = fleet.redis.connection().await?;
    let live: String = redis::cmd("HGET")
        .arg(keys.tenant_live_jobs("default"))
        .arg(&slow)
        .query_async(&mut redis)
        .await?;
    assert!(live.ends_with(" running "), "{live:?}");
    let () = redis::pipe()
        .cmd("HSET")
        .arg(keys.tenant_live_jobs("default"))
        .arg(&slow)
        .arg("1 queued ")
        .ignore()
        .cmd("HINCRBY")
        .arg(keys.tenant_job_counts("default"))
        .arg("running")
        .arg(-1)
        .ignore()
        .cmd("HINCRBY")
        .arg(keys.tenant_job_counts("default"))
        .arg("queued")
        .arg(1)
        .ignore()
        .query_async(&mut redis)
        .await?;
    // The sweeper looks at the running job (older than sweep_after) and
    // counts it as its record says.
    counts_become(
        &api,
        &[
            (Running, 1),
            (WaitingForApproval, 1),
            (Succeeded, 3),
            (Failed, 1),
        ],
    )
    .await?;

    for job_id in [&slow, &held] {
        api.clone()
            .cancel_job(v1::CancelJobRequest {
                job_id: job_id.clone(),
            })
            .await?;
    }
    counts_become(&api, &[(Succeeded, 3), (Failed, 1), (Cancelled, 2)]).await?;
    Ok(())
}

#[tokio::test]
async fn odd_and_duplicate_call_ids_stay_data_and_never_reach_the_wire() -> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    let odd = "call\r\nNats-Msg-Id: forged";
    let job = run(
        &mut api,
        scripted(
            "x",
            json!([
                {"tool_calls": [
                    {"id": odd, "name": "calculate", "arguments": {"expression": "2+2"}},
                    {"id": "dup", "name": "calculate", "arguments": {"expression": "3*3"}},
                    {"id": "dup", "name": "calculate", "arguments": {"expression": "1000000"}}]},
                {"tool_calls": [
                    {"id": "dup", "name": "calculate", "arguments": {"expression": "5+5"}}]},
                {"message": "{{dup.error.code}}"}
            ]),
        ),
    )
    .await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded, "{job:?}");
    let results = results(&job);
    let view: Vec<(&str, Option<&str>, Value)> = results
        .iter()
        .map(|(id, envelope, _)| {
            (
                id.as_str(),
                envelope["error"]["code"].as_str(),
                envelope["data"]["result"].clone(),
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            (odd, None, json!(4)),
            ("dup", None, json!(9)),
            ("dup", Some("DUPLICATE_CALL_ID"), Value::Null),
            ("dup", Some("DUPLICATE_CALL_ID"), Value::Null),
        ],
        "the model's ids come back verbatim; only the first call with an id runs"
    );
    for orchestrator in fleet.orchestrators() {
        let log = std::fs::read_to_string(orchestrator.log_path()).unwrap_or_default();
        assert!(!log.contains("panicked"), "{log}");
    }
    Ok(())
}

#[tokio::test]
async fn every_request_field_is_bounded_and_errors_echo_little() -> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    let base = || scripted("x", json!([{"message": "m"}]));
    let big = "v".repeat(3 * 1024 * 1024);
    let mut cases: Vec<(v1::SubmitJobRequest, &str)> = Vec::new();
    let mut request = base();
    request.metadata.insert("k".into(), big.clone());
    cases.push((request, "metadata"));
    let mut request = base();
    for n in 0..10_000 {
        request.metadata.insert(format!("k{n}"), "v".into());
    }
    cases.push((request, "metadata"));
    let mut request = base();
    request.idempotency_key = big.clone();
    cases.push((request, "idempotency_key"));
    let mut request = base();
    request.idempotency_key = "{tenant}:stolen".into();
    cases.push((request, "idempotency_key"));
    let mut request = base();
    request.tools = (0..100_000).map(|n| format!("tool_{n}")).collect();
    cases.push((request, "tools"));
    let mut request = base();
    request.model = Some(v1::ModelSpec {
        provider: "p".repeat(100 * 1024),
        ..Default::default()
    });
    cases.push((request, "model.provider"));
    let mut request = base();
    request.model = Some(v1::ModelSpec {
        provider: "openai-chat".into(),
        name: "m".repeat(10_000),
        ..Default::default()
    });
    cases.push((request, "model.name"));
    for (request, field) in cases {
        let status = api.submit_job(request).await.expect_err("rejected");
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().starts_with(field),
            "{field}: {}",
            status.message()
        );
        assert!(
            status.message().len() < 400,
            "{field}: {} bytes",
            status.message().len()
        );
    }

    // An offset past everything saturates: the final event, not a replay from 0.
    let job_id = api.submit_job(base()).await?.into_inner().job_id;
    wait_finished(&api, &job_id).await?;
    let events: Vec<v1::JobEvent> = api
        .watch_job(v1::WatchJobRequest {
            job_id,
            from_offset: u64::MAX,
        })
        .await?
        .into_inner()
        .map(|e| e.expect("an event"))
        .collect()
        .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].r#final);
    Ok(())
}

#[tokio::test]
async fn calls_beyond_the_turn_limit_and_oversized_scripted_answers_are_refused()
-> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_API__MAX_CALLS_PER_TURN", "3"),
            ("TOOLFLEET_API__MAX_SCRIPTED_ANSWER_BYTES", "10000"),
        ])
        .await?;
    fleet.wait_for_tools(0, &["calculate", "echo"], 1).await?;
    let mut api = fleet.api(0).await?;
    let calls: Vec<Value> = (0..5)
        .map(|n| json!({"name": "calculate", "arguments": {"expression": format!("{n}+1")}}))
        .collect();
    let job = run(
        &mut api,
        scripted("x", json!([{"tool_calls": calls}, {"message": "done"}])),
    )
    .await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded, "{job:?}");
    let codes: Vec<Option<String>> = results(&job)
        .iter()
        .map(|(_, envelope, _)| envelope["error"]["code"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        codes,
        [
            None,
            None,
            None,
            Some("TOO_MANY_CALLS".into()),
            Some("TOO_MANY_CALLS".into())
        ]
    );
    // Only the calls within the limit were dispatched.
    let kinds = call_event_kinds(&mut api, &job.job_id).await?;
    let dispatched = kinds.iter().filter(|k| *k == "tool_call_dispatched");
    assert_eq!(dispatched.count(), 3, "{kinds:?}");

    // Each quote of a 4 KB output is fine; twenty of them are not.
    let quotes = "{{call_0_0.data.text}}".repeat(20);
    let job = run(
        &mut api,
        scripted(
            "x",
            json!([
                {"tool_calls": [{"name": "echo", "arguments": {"text": "q".repeat(4000)}}]},
                {"message": quotes}
            ]),
        ),
    )
    .await?;
    assert_eq!(status(&job), v1::JobStatus::Failed, "{job:?}");
    let error = job.error.expect("an error");
    assert_eq!(error.code, "SCRIPT_ERROR");
    assert!(
        error.message.contains("api.max_scripted_answer_bytes"),
        "{}",
        error.message
    );

    // A quote of what a failed call did not return fails the job, saying
    // what it answered, rather than answering with the placeholder.
    let job = run(
        &mut api,
        scripted(
            "x",
            json!([
                {"tool_calls": [{"name": "no_such_tool", "arguments": {}}]},
                {"message": "It is {{call_0_0.data}}"}
            ]),
        ),
    )
    .await?;
    assert_eq!(status(&job), v1::JobStatus::Failed, "{job:?}");
    let error = job.error.expect("an error");
    assert_eq!(error.code, "SCRIPT_ERROR");
    assert!(
        error
            .message
            .contains("{{call_0_0.data}}, which names nothing")
            && error.message.contains("UNKNOWN_TOOL"),
        "{}",
        error.message
    );
    Ok(())
}

#[tokio::test]
async fn the_scripted_model_is_off_unless_allowed() -> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet
        .spawn_orchestrator(&[("TOOLFLEET_API__ALLOW_SCRIPTED", "false")])
        .await?;
    let mut api = fleet.api(0).await?;
    let status = api
        .submit_job(scripted("x", json!([{"message": "m"}])))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().starts_with("model.provider:")
            && status.message().contains("api.allow_scripted"),
        "{}",
        status.message()
    );
    Ok(())
}

#[tokio::test]
async fn an_idempotency_key_reused_for_another_request_is_refused_without_leaking_the_job()
-> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    let mut first = scripted("my secret prompt", json!([{"message": "secret answer"}]));
    first.idempotency_key = "order-42".into();
    let original = api.submit_job(first.clone()).await?.into_inner();
    assert!(!original.duplicate);
    let again = api.submit_job(first).await?.into_inner();
    assert!(again.duplicate);
    assert_eq!(
        again.job_id, original.job_id,
        "the same request: the same job"
    );

    let mut other = scripted("another prompt", json!([{"message": "m"}]));
    other.idempotency_key = "order-42".into();
    let status = api
        .submit_job(other)
        .await
        .expect_err("a different request");
    assert_eq!(status.code(), Code::AlreadyExists);
    assert!(
        status.message().contains("\"order-42\""),
        "{}",
        status.message()
    );
    assert!(
        !status.message().contains(&original.job_id),
        "{}",
        status.message()
    );
    Ok(())
}

#[tokio::test]
async fn forged_registry_announcements_are_ignored_and_liveness_needs_no_shared_clock()
-> anyhow::Result<()> {
    use toolfleet_proto::{ToolManifest, WorkerAnnouncement, names};
    let fleet = fleet(1).await?;
    let api = fleet.api(0).await?;
    let registry = async_nats::jetstream::new(fleet.client.clone())
        .get_key_value(names::REGISTRY_BUCKET)
        .await?;
    let now = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let announce_in = |pool: &str, tool: &str, worker: &str, manifest, heartbeat_ms| {
        let key = names::registry_key(tool, worker);
        let value = serde_json::to_vec(&WorkerAnnouncement {
            worker_id: worker.to_owned(),
            manifest,
            heartbeat_ms,
            available: true,
            pool: pool.to_owned(),
            mcp_server: String::new(),
            pins: true,
        })
        .expect("an announcement serializes");
        let registry = registry.clone();
        async move { registry.put(key, value.into()).await }
    };
    let announce = |tool: &str, worker: &str, manifest: ToolManifest, heartbeat_ms: u64| {
        announce_in("", tool, worker, manifest, heartbeat_ms)
    };
    let schema = json!({"type": "object"});
    // A key that names one tool over the manifest of another.
    announce(
        "calculate_v2",
        "forger",
        ToolManifest::new("run_shell", "runs anything", schema.clone()),
        now,
    )
    .await?;
    // A schema far over the bound, and one that does not compile.
    let huge = json!({"type": "object", "description": "x".repeat(100_000)});
    announce("huge", "forger", ToolManifest::new("huge", "h", huge), now).await?;
    let broken = json!({"type": "no-such-type"});
    announce(
        "broken",
        "forger",
        ToolManifest::new("broken", "b", broken),
        now,
    )
    .await?;
    // A pool that is markup, for the pages that show it.
    announce_in(
        "<script>alert(1)</script>",
        "hostile_pool",
        "forger",
        ToolManifest::new("hostile_pool", "p", schema.clone()),
        now,
    )
    .await?;
    // A heartbeat an hour ahead of every clock here.
    announce(
        "future",
        "forger",
        ToolManifest::new("future", "f", schema.clone()),
        now + 3_600_000,
    )
    .await?;
    // A worker whose clock is 9 minutes behind: within the bound, and live
    // from when its announcement arrived (it used to be dead on arrival,
    // 9 minutes past a 15 s TTL).
    announce(
        "slow_clock",
        "skewed",
        ToolManifest::new("slow_clock", "s", schema),
        now - 540_000,
    )
    .await?;

    let names_of =
        |tools: &[v1::Tool]| -> Vec<String> { tools.iter().map(|t| t.name.clone()).collect() };
    let tools = toolfleet_tests::wait_until("slow_clock to be listed", JOB, || {
        let mut api = api.clone();
        async move {
            let tools = api.list_tools(v1::ListToolsRequest::default()).await.ok()?;
            let tools = tools.into_inner().tools;
            names_of(&tools)
                .contains(&"slow_clock".to_owned())
                .then_some(tools)
        }
    })
    .await?;
    // Written before slow_clock, so read before it: none made it.
    for forged in [
        "calculate_v2",
        "run_shell",
        "huge",
        "broken",
        "hostile_pool",
        "future",
    ] {
        assert!(
            !names_of(&tools).contains(&forged.to_owned()),
            "{forged} was listed: {:?}",
            names_of(&tools)
        );
    }
    assert_eq!(
        fleet
            .orchestrator(0)
            .log_tail(100_000)
            .matches("ignoring an invalid announcement")
            .count(),
        4,
        "the name, size, pool and clock checks each logged once"
    );
    Ok(())
}

/// A call goes on the bus under its wire id, never the model's; the model's
/// own id reaches the tool in a header of its own, and only when it is a
/// safe one (1 to 64 ASCII letters, digits, `_` and `-`): a model's other
/// words never become a header.
#[tokio::test]
async fn a_call_carries_the_model_s_id_in_a_header_only_when_it_is_safe() -> anyhow::Result<()> {
    use toolfleet_proto::names::{self, headers};
    use toolfleet_proto::{ToolCall, WireId};
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    let mut calls = fleet
        .client
        .subscribe(names::call_subject("calculate"))
        .await?;
    fleet.client.flush().await?;
    let add = json!({"expression": "1+1"});
    let job = run(
        &mut api,
        scripted(
            "add twice",
            json!([
                {"tool_calls": [
                    {"id": "call_Safe-1", "name": "calculate", "arguments": add},
                    {"id": "call one: \"unsafe\"", "name": "calculate", "arguments": add}
                ]},
                {"message": "done"}
            ]),
        ),
    )
    .await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded, "{job:?}");
    let mut model_ids = Vec::new();
    for _ in 0..2 {
        let message = tokio::time::timeout(JOB, calls.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("a call was not published"))?;
        let call: ToolCall = serde_json::from_slice(&message.payload)?;
        assert!(WireId::parse(&call.call_id).is_some(), "{}", call.call_id);
        assert!(
            !call.call_id.contains("call"),
            "the model's id is not the wire id"
        );
        let model_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(headers::MODEL_CALL_ID))
            .map(|v| v.as_str().to_owned());
        model_ids.push(model_id);
    }
    model_ids.sort();
    assert_eq!(model_ids, [None, Some("call_Safe-1".to_owned())]);
    Ok(())
}

/// Anyone on the bus can publish on a job's reply subject. A reply that is
/// not a stored record is only a wake-up, read from Redis (which holds
/// nothing yet). One that is a record answering the call, as a reader of
/// the call can forge, is checked against Redis when its result is
/// recorded: the commit writes nothing, and the round reads what the worker
/// stored.
#[tokio::test]
async fn a_reply_published_by_anyone_but_a_worker_answers_nothing() -> anyhow::Result<()> {
    use toolfleet_proto::envelope::StoredResult;
    use toolfleet_proto::names::{self, headers};
    use toolfleet_proto::{Envelope, ToolCall};
    let fleet = fleet(1).await?;
    let api = fleet.api(0).await?;
    let mut calls = fleet.client.subscribe(names::call_subject("sleep")).await?;
    fleet.client.flush().await?;
    let job_id = api
        .clone()
        .submit_job(scripted(
            "sleep",
            json!([
                {"tool_calls": [{"id": "nap", "name": "sleep", "arguments": {"ms": 1500}}]},
                {"message": "{{nap}}"}
            ]),
        ))
        .await?
        .into_inner()
        .job_id;
    // Once the call is out, forged answers on the job's reply subject.
    let mark = fleet.orchestrator(0).log_mark();
    let message = tokio::time::timeout(JOB, calls.next())
        .await?
        .ok_or_else(|| anyhow::anyhow!("no call was published"))?;
    // Its wire id and arguments, as anyone who read the call knows them.
    let call: ToolCall = serde_json::from_slice(&message.payload)?;
    let subject = names::reply_subject(&toolfleet_tests::fleet::job_id(&call.job_id));
    let forge = |body: String| {
        let mut forged = async_nats::HeaderMap::new();
        forged.insert(headers::CALL_ID, call.call_id.as_str());
        forged.insert(headers::ATTEMPT, "1");
        fleet
            .client
            .publish_with_headers(subject.clone(), forged, body.into())
    };
    forge(r#"{"ok":true,"data":"injected"}"#.to_owned()).await?;
    fleet.client.flush().await?;
    fleet
        .orchestrator(0)
        .wait_for_log_after(mark, "no stored result", JOB)
        .await?;
    let record = StoredResult::new(&call, Envelope::Ok(json!("injected"))).to_json();
    forge(record).await?;
    fleet.client.flush().await?;
    fleet
        .orchestrator(0)
        .wait_for_log_after(mark, "is not the stored one", JOB)
        .await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded);
    assert!(!job.output_text.contains("injected"), "{}", job.output_text);
    assert!(job.output_text.contains("slept_ms"), "{}", job.output_text);
    Ok(())
}

/// Junk on the job queue (what a reply-subject trick once made the server
/// write there) is terminated at its first delivery: never run, never
/// redelivered, and the queue keeps serving real jobs.
#[tokio::test]
async fn junk_on_the_job_queue_is_terminated_once() -> anyhow::Result<()> {
    use async_nats::jetstream;
    use toolfleet_proto::names;
    let fleet = fleet(1).await?;
    let js = jetstream::new(fleet.client.clone());
    for junk in [
        "",
        "not a job id",
        r#"{"type":"io.nats.jetstream.api.v1.stream_info_response"}"#,
    ] {
        js.publish(names::JOB_SUBJECT, junk.into()).await?.await?;
    }
    let job = run(
        &mut fleet.api(0).await?,
        scripted("hi", json!([{"message": "still serving"}])),
    )
    .await?;
    assert_eq!(job.output_text, "still serving");
    let dropped = "dropping a queue message that is not a job id";
    let log = || {
        std::fs::read_to_string(fleet.orchestrator(0).log_path())
            .unwrap_or_default()
            .matches(dropped)
            .count()
    };
    fleet
        .orchestrator(0)
        .wait_until("the junk dropped", JOB, || async { log() >= 3 })
        .await?;
    let mut stream = js.get_stream(names::JOB_STREAM).await?;
    let mut consumer: jetstream::consumer::PullConsumer = stream
        .get_consumer(names::JOB_CONSUMER)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let info = consumer.info().await?;
    assert_eq!(info.num_redelivered, 0, "{info:?}");
    assert_eq!(info.num_ack_pending, 0, "{info:?}");
    assert_eq!(stream.info().await?.state.messages, 0, "the junk is gone");
    assert_eq!(log(), 3, "each junk message was delivered once");
    Ok(())
}

/// A pool that may write its own tool's ledger (the Redis ACLs allow no
/// more) stores, for a call it was sent, a result bound to other arguments,
/// and wakes the round. The record answers another call, so it is refused
/// and logged, never the answer: the call runs as its next attempt. The
/// call's wire id comes from the job's secret, so the forger had to read
/// the call to learn it.
#[tokio::test]
async fn a_stored_result_bound_to_other_arguments_is_never_the_answer() -> anyhow::Result<()> {
    use toolfleet_proto::envelope::StoredResult;
    use toolfleet_proto::names::{self, RedisKeys};
    use toolfleet_proto::{Envelope, ToolCall};
    let fleet = fleet(1).await?;
    let api = fleet.api(0).await?;
    let mut calls = fleet
        .client
        .subscribe(names::call_subject("calculate"))
        .await?;
    fleet.client.flush().await?;
    let job_id = api
        .clone()
        .submit_job(scripted(
            "2+2",
            json!([
                {"delay_ms": 1000,
                 "tool_calls": [{"id": "calc", "name": "calculate",
                                 "arguments": {"expression": "2+2"}}]},
                {"message": "{{calc.data.result}}"}
            ]),
        ))
        .await?
        .into_inner()
        .job_id;
    // No worker takes the call while the forger is at work. Killed, not
    // stopped: its announcement lives on until the registry TTL, so the
    // tool stays live and the call is published (a drained worker withdraws
    // its tools, and the call would wait unpublished for a worker).
    fleet.worker(0).kill();
    let message = tokio::time::timeout(JOB, calls.next())
        .await?
        .ok_or_else(|| anyhow::anyhow!("no call was published"))?;
    let call: ToolCall = serde_json::from_slice(&message.payload)?;
    assert_eq!(call.job_id, job_id);
    assert_ne!(call.call_id, "calc", "the model's id went on the wire");
    let forged_call = ToolCall {
        arguments: r#"{"expression":"1000000"}"#.into(),
        ..call.clone()
    };
    let forged = StoredResult::new(
        &forged_call,
        Envelope::Ok(json!({"expression": "1000000", "result": 1_000_000})),
    );
    let key = RedisKeys::default().call_result(&job_id, &call.tool, &call.call_id, call.attempt);
    let mut redis = fleet.redis.connection().await?;
    redis::cmd("SET")
        .arg(&key)
        .arg(forged.to_json())
        .query_async::<()>(&mut redis)
        .await?;
    fleet
        .client
        .publish(
            names::reply_subject(&toolfleet_tests::fleet::job_id(&job_id)),
            "{}".into(),
        )
        .await?;
    fleet.client.flush().await?;
    fleet.worker(0).respawn()?;

    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded);
    assert_eq!(job.output_text, "4", "{job:?}");
    assert_eq!(results(&job)[0].2, 2, "the forged record cost one attempt");
    assert!(
        fleet
            .orchestrator(0)
            .log_tail(100_000)
            .contains("the stored result answers another call"),
        "the orchestrator refused the record"
    );
    Ok(())
}

/// GETs `path` over plain HTTP/1.0 (the metrics endpoint), and returns the
/// body.
async fn http_get(address: &str, path: &str) -> anyhow::Result<String> {
    let (status, body) = toolfleet_tests::http_get(address, path).await?;
    anyhow::ensure!(status == 200, "{path}: {status}");
    Ok(body)
}

/// What a deployment that applies the setup step together with the
/// services relies on (the chart's plain setup Job under `helm install
/// --wait`, Argo CD or Flux; decision 0007): an orchestrator and a worker
/// that may not create JetStream objects, started before the setup step
/// ran, are alive but not ready, and SubmitJob answers UNAVAILABLE naming
/// the step; once it has run, both become ready and a job runs.
#[tokio::test]
async fn services_started_before_the_setup_step_wait_for_it_then_serve() -> anyhow::Result<()> {
    let (orchestrator_metrics, worker_metrics) = (
        toolfleet_tests::free_loopback_address()?,
        toolfleet_tests::free_loopback_address()?,
    );
    let mut fleet =
        Fleet::start(test_fleet(0).env(&[("TOOLFLEET_NATS__CREATE_MISSING", "false")])).await?;
    fleet.start_orchestrator(&[("TOOLFLEET_METRICS__LISTEN", &orchestrator_metrics)])?;
    fleet.start_pool_worker(
        &["calculate"],
        &[("TOOLFLEET_METRICS__LISTEN", &worker_metrics)],
    )?;
    let missing = "`toolfleet-orchestrator setup` creates it";
    fleet.orchestrator(0).wait_for_log(missing, JOB).await?;
    fleet.worker(0).wait_for_log(missing, JOB).await?;
    for (service, metrics) in [
        ("orchestrator", &orchestrator_metrics),
        ("worker", &worker_metrics),
    ] {
        let live = toolfleet_tests::http_get(metrics, "/healthz").await?.0;
        let ready = toolfleet_tests::http_get(metrics, "/readyz").await?.0;
        assert_eq!(
            (live, ready),
            (200, 503),
            "{service} waiting for the setup step"
        );
    }
    let listening = fleet
        .orchestrator(0)
        .wait_for_log("grpc listening", JOB)
        .await?;
    let address = toolfleet_fleet::supervisor::logged_grpc_url(&listening)
        .ok_or_else(|| anyhow::anyhow!("no address in {listening}"))?;
    let mut api = ApiClient::connect(address).await?;
    let script = json!([
        {"tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}]},
        {"message": "{{call_0_0.data.result}}"}
    ]);
    let refused = api
        .submit_job(scripted_job("before the setup", &script))
        .await
        .expect_err("a job before the setup step");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("toolfleet-orchestrator setup"),
        "{refused:?}"
    );

    let setup = tokio::process::Command::new(toolfleet_tests::cargo_bin("toolfleet-orchestrator")?)
        .args([
            "setup",
            "--nats-url",
            &fleet.nats.url(),
            "--tools",
            "calculate",
        ])
        .output()
        .await?;
    assert!(setup.status.success(), "{setup:?}");
    for metrics in [&orchestrator_metrics, &worker_metrics] {
        toolfleet_tests::wait_until("ready after the setup step", JOB, || async {
            toolfleet_tests::http_get(metrics, "/readyz")
                .await
                .is_ok_and(|(status, _)| status == 200)
        })
        .await?;
    }
    fleet.wait_for_tools(0, &["calculate"], 1).await?;
    let job = run_job(
        &fleet.api(0).await?,
        scripted_job("after the setup", &script),
    )
    .await?;
    assert_eq!(job.output_text, "42", "{job:?}");
    Ok(())
}

/// Durations are real Prometheus histograms (buckets that can be summed over
/// replicas), on both services.
#[tokio::test]
async fn call_durations_are_exported_as_histograms_with_buckets() -> anyhow::Result<()> {
    let (worker_metrics, orchestrator_metrics) = (
        toolfleet_tests::free_loopback_address()?,
        toolfleet_tests::free_loopback_address()?,
    );
    let mut fleet =
        Fleet::start(test_fleet(1).worker_env(&[("TOOLFLEET_METRICS__LISTEN", &worker_metrics)]))
            .await?;
    fleet
        .spawn_orchestrator(&[("TOOLFLEET_METRICS__LISTEN", &orchestrator_metrics)])
        .await?;
    fleet.wait_for_tools(0, &["calculate"], 1).await?;
    let api = fleet.api(0).await?;
    let job = toolfleet_tests::fleet::run_job(
        &api,
        scripted(
            "2+2",
            json!([
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "2+2"}}]},
                {"message": "{{call_0_0.data.result}}"}
            ]),
        ),
    )
    .await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded);
    for (address, metric) in [
        (&worker_metrics, "toolfleet_worker_call_duration_seconds"),
        (
            &orchestrator_metrics,
            "toolfleet_tool_call_round_trip_seconds",
        ),
    ] {
        let text = http_get(address, "/metrics").await?;
        for bucket in ["le=\"0.001\"", "le=\"300\"", "le=\"+Inf\""] {
            let line = format!("{metric}_bucket{{tool=\"calculate\",{bucket}}}");
            assert!(text.contains(&line), "no {line} in\n{text}");
        }
        assert!(
            text.contains(&format!("{metric}_count{{tool=\"calculate\"}} 1")),
            "{text}"
        );
    }
    Ok(())
}

/// How many workers `ListTools` of `api` says serve `tool`; `None` when it
/// does not list the tool.
async fn listed_workers(api: &ApiClient, tool: &str) -> Option<u32> {
    let tools = api
        .clone()
        .list_tools(v1::ListToolsRequest::default())
        .await
        .ok()?;
    tools
        .into_inner()
        .tools
        .into_iter()
        .find(|t| t.name == tool)
        .map(|t| t.workers)
}

/// A pool scaled to zero (its workers stopped, its queue kept): its tools
/// stay listed with 0 workers and offered to new jobs, also by an
/// orchestrator started afterwards (the manifests are kept in Redis); a
/// call waits in the queue until a worker starts, then runs. A tool whose
/// queue is deleted is no longer offered.
#[tokio::test]
async fn a_tool_with_no_live_worker_stays_available_while_its_queue_exists() -> anyhow::Result<()> {
    let mut fleet = fleet(1).await?;
    fleet.worker(0).stop(Duration::from_secs(30)).await?;
    let first = fleet.api(0).await?;
    toolfleet_tests::wait_until("calculate listed with 0 workers", JOB, || async {
        (listed_workers(&first, "calculate").await == Some(0)).then_some(())
    })
    .await?;

    let second = fleet.spawn_orchestrator(&[]).await?;
    let api = fleet.api(second).await?;
    toolfleet_tests::wait_until("the new orchestrator to know calculate", JOB, || async {
        (listed_workers(&api, "calculate").await == Some(0)).then_some(())
    })
    .await?;
    let job_id = api
        .clone()
        .submit_job(scripted(
            "6*7 with no worker up",
            json!([
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}]},
                {"message": "{{call_0_0.data.result}}"}
            ]),
        ))
        .await?
        .into_inner()
        .job_id;
    // The call is dispatched (not answered UNKNOWN_TOOL), and waits for a
    // worker, answered by nobody in the meantime.
    let mut events = api
        .clone()
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.clone(),
            from_offset: 0,
        })
        .await?
        .into_inner();
    tokio::time::timeout(JOB, async {
        while let Some(event) = events.next().await {
            if event?.kind == "tool_call_dispatched" {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("the events ended before the call was dispatched")
    })
    .await??;
    let waiting = api
        .clone()
        .get_job(v1::GetJobRequest {
            job_id: job_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(status(&waiting), v1::JobStatus::Running, "{waiting:?}");
    assert!(results(&waiting).is_empty(), "{waiting:?}");

    fleet.spawn_worker().await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(status(&job), v1::JobStatus::Succeeded, "{job:?}");
    assert_eq!(job.output_text, "42");

    // No queue, no tool: its calls would wait for nothing.
    let js = async_nats::jetstream::new(fleet.client.clone());
    js.get_stream(toolfleet_proto::names::CALL_STREAM)
        .await?
        .delete_consumer(&toolfleet_proto::names::call_consumer("fail"))
        .await?;
    fleet.worker(1).stop(Duration::from_secs(30)).await?;
    toolfleet_tests::wait_until("fail to be withdrawn", JOB, || async {
        listed_workers(&api, "fail").await.is_none().then_some(())
    })
    .await?;
    assert_eq!(listed_workers(&api, "calculate").await, Some(0));
    Ok(())
}

/// A call job (`SubmitJobRequest.call`): no model, one call through the
/// fleet, and the job's output is the call's envelope, an error one
/// included; a request that mixes it with a model's fields is refused.
#[tokio::test]
async fn a_call_job_runs_one_call_without_a_model_and_answers_with_its_envelope()
-> anyhow::Result<()> {
    let fleet = fleet(1).await?;
    let mut api = fleet.api(0).await?;
    let call = |tool: &str, arguments: &str| v1::SubmitJobRequest {
        call: Some(v1::ToolCallRequest {
            tool: tool.into(),
            arguments: arguments.into(),
        }),
        ..Default::default()
    };
    let job = run(&mut api, call("calculate", r#"{"expression": "6*7"}"#)).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    let output: Value = serde_json::from_str(&job.output_text)?;
    assert_eq!(output["ok"], true, "{output}");
    assert_eq!(output["data"]["result"], 42, "{output}");
    assert_eq!(results(&job).len(), 1, "one call");
    let kinds: Vec<String> = toolfleet_tests::fleet::events(&api, &job.job_id)
        .await?
        .into_iter()
        .map(|(kind, _)| kind)
        .collect();
    assert!(
        kinds.contains(&"tool_call_dispatched".to_owned()),
        "{kinds:?}"
    );
    assert!(kinds.contains(&"tool_call_result".to_owned()), "{kinds:?}");

    // A tool's error is the output too: the job did what it was asked.
    let job = run(
        &mut api,
        call("fail", r#"{"mode": "terminal", "code": "NOPE"}"#),
    )
    .await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    let output: Value = serde_json::from_str(&job.output_text)?;
    assert_eq!(output["error"]["code"], "NOPE", "{output}");
    let job = run(&mut api, call("no_such_tool", "{}")).await?;
    let output: Value = serde_json::from_str(&job.output_text)?;
    assert_eq!(output["error"]["code"], "UNKNOWN_TOOL", "{output}");

    let mixed = v1::SubmitJobRequest {
        input: "and a question".into(),
        ..call("calculate", "{}")
    };
    for (request, field) in [
        (mixed, "input"),
        (call("calculate", "[1]"), "call.arguments"),
        (call("not a name", "{}"), "call.tool"),
    ] {
        let refused = api.submit_job(request).await.expect_err(field);
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().starts_with(field), "{refused:?}");
    }
    Ok(())
}
