//! What protects the model and the bill (docs/protection.md), end to end:
//! real nats-server, redis-server, orchestrator and worker processes, the
//! scripted model playing the LLM.
//!
//! Result shaping: a result at the workers' output cap is shown to the
//! model as a view within its tool's limit and paged back byte for byte
//! with `read_result`; a reference of another job or tenant, or an offset
//! out of range, is a terminal envelope that says so.
//!
//! The result cache: a read-only tool with a cache TTL runs once for two
//! jobs with the same arguments, and again after its TTL; never for a held
//! call or a job that turned the cache off.
//!
//! The circuit breaker: a tool whose calls all fail is left out of the
//! next turns, with a line in the model's instructions, and a call made to
//! it anyway is refused without an attempt; after the cool-down one call
//! probes, and its success closes the breaker.

use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_proto::v1::{self, item::Kind};
use toolfleet_tests::fleet::{
    ApiClient, Fleet, as_tenant, events, run_job, scripted_job, test_fleet, wait_finished,
};
use toolfleet_tests::wait_until;

/// The workers' cap on what a tool may return (`runtime.max_output_bytes`)
/// in these tests: below the arguments limit, so that `echo` can return it.
const CAP: usize = 100_000;
/// `echo`'s own shaping limit (`runtime.tool_shape_above_bytes`), over the
/// orchestrator's default (16384), which bounds each `read_result` page.
const ECHO_LIMIT: usize = 32_768;
/// The bytes each `read_result` call asks for.
const PAGE: usize = 8_000;

/// Short runner timers: a dead orchestrator's jobs move within seconds.
const FAST_TAKEOVER: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNNER__JOB_ACK_WAIT", "2s"),
    ("TOOLFLEET_RUNNER__LEASE_TTL", "1s"),
    ("TOOLFLEET_RUNNER__DRAIN_TIMEOUT", "1s"),
];

/// NATS, Redis, one orchestrator and one worker with the test tools, whose
/// output cap is [`CAP`] and whose `echo` is shaped above [`ECHO_LIMIT`].
async fn fleet() -> anyhow::Result<Fleet> {
    fleet_with(FAST_TAKEOVER).await
}

/// [`fleet`], its orchestrator with `env`.
async fn fleet_with(env: &[(&str, &str)]) -> anyhow::Result<Fleet> {
    let cap = CAP.to_string();
    let echo_limit = ECHO_LIMIT.to_string();
    let builder = test_fleet(1).worker_env(&[
        ("TOOLFLEET_RUNTIME__MAX_OUTPUT_BYTES", &cap),
        (
            "TOOLFLEET_RUNTIME__TOOL_SHAPE_ABOVE_BYTES__ECHO",
            &echo_limit,
        ),
    ]);
    let mut fleet = Fleet::start(builder).await?;
    fleet.spawn_orchestrator(env).await?;
    fleet.wait_for_tools(0, &["echo"], 1).await?;
    Ok(fleet)
}

/// Arguments for `echo` whose answer's `data` is exactly `bytes` bytes of
/// JSON: `{"text": ...}`, a text of ASCII, quotes, backslashes, newlines,
/// a control character, and two- and four-byte characters, so that pages
/// and views are cut among escapes and inside characters.
fn echoed(bytes: usize) -> Value {
    let unit = "ab\"c\\d\ne\u{1}fé😀g";
    let size = |text: &str| json!({"text": text}).to_string().len();
    // Whole units as far as they fit, then one-byte characters.
    let mut text = unit.repeat((bytes - size("")) / (size(unit) - size("")));
    let short = bytes - size(&text);
    text.extend(std::iter::repeat_n('z', short));
    assert_eq!(size(&text), bytes);
    json!({"text": text})
}

/// Each call's envelope, in the order of the job's result items.
fn results(job: &v1::Job) -> Vec<(String, Value)> {
    job.items
        .iter()
        .filter_map(|item| match &item.kind {
            Some(Kind::ToolResult(r)) => Some((
                r.call_id.clone(),
                serde_json::from_str(&r.output).expect("outputs are envelopes"),
            )),
            _ => None,
        })
        .collect()
}

/// The envelope of call `call_id` of `job`.
fn result(job: &v1::Job, call_id: &str) -> Value {
    results(job)
        .into_iter()
        .find_map(|(id, envelope)| (id == call_id).then_some(envelope))
        .unwrap_or_else(|| panic!("no result of {call_id}"))
}

/// The code and message of an error envelope.
fn refusal(envelope: &Value) -> (&str, &str) {
    assert_eq!(envelope["ok"], false, "{envelope}");
    assert_eq!(envelope["error"]["retryable"], false, "{envelope}");
    (
        envelope["error"]["code"].as_str().unwrap_or_default(),
        envelope["error"]["message"].as_str().unwrap_or_default(),
    )
}

/// A job whose `echo` returns [`CAP`] bytes: the model is shown a view
/// within echo's own limit (with the head and tail of the whole, its size
/// and its reference); a result of 20000 bytes, under that limit, is shown
/// whole; one byte over the cap is refused by the worker as it always was.
/// The model then pages through the whole with `read_result`, at once and
/// by following `next_offset`, and the pages joined are the result's data
/// byte for byte. Each `read_result` call is recorded as any call, with no
/// attempt and the orchestrator as its source.
#[tokio::test]
async fn a_result_at_the_output_cap_is_shaped_and_paged_back_byte_for_byte() -> anyhow::Result<()> {
    let fleet = fleet().await?;
    let api = fleet.api(0).await?;
    let whole = echoed(CAP).to_string();
    assert_eq!(whole.len(), CAP);
    let pages = CAP.div_ceil(PAGE);
    let reads: Vec<Value> = (0..pages)
        .map(|page| {
            let arguments = json!({"ref": "{{call_0_0.data.ref}}", "offset": page * PAGE,
                                   "limit": PAGE});
            json!({"name": "read_result", "arguments": arguments})
        })
        .collect();
    let script = json!([
        {"tool_calls": [
            {"name": "echo", "arguments": echoed(CAP)},
            {"name": "echo", "arguments": echoed(CAP + 1)},
            {"name": "echo", "arguments": echoed(20_000)}]},
        {"tool_calls": reads},
        {"tool_calls": [{"name": "read_result", "id": "next", "arguments":
            {"ref": "{{call_0_0.data.ref}}", "offset": "{{call_1_0.data.next_offset}}",
             "limit": PAGE}}]},
        {"message": "read {{call_0_0.data.total_bytes}} bytes"}
    ]);
    let job = run_job(&api, scripted_job("shape", &script)).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, format!("read {CAP} bytes"));

    // The view: within echo's limit, with the ends of the whole.
    let view = result(&job, "call_0_0");
    assert_eq!(view["ok"], true);
    let data = &view["data"];
    assert!(
        data.to_string().len() <= ECHO_LIMIT,
        "{}",
        data.to_string().len()
    );
    assert_eq!(data["shaped"], true);
    assert_eq!(data["total_bytes"], CAP);
    assert_eq!(data["read_with"], "read_result");
    assert_eq!(data["ref"], format!("{}/call_0_0", job.job_id));
    let (head, tail) = (
        data["head"].as_str().unwrap(),
        data["tail"].as_str().unwrap(),
    );
    assert!(
        head.len() > 5_000 && whole.starts_with(head),
        "{}",
        head.len()
    );
    assert!(
        tail.len() > 5_000 && whole.ends_with(tail),
        "{}",
        tail.len()
    );
    assert_eq!(data["tail_offset"], CAP - tail.len());
    // The cap still bounds what a tool may return; a result under echo's
    // own limit is shown whole.
    assert_eq!(refusal(&result(&job, "call_0_1")).0, "PAYLOAD_TOO_LARGE");
    assert_eq!(
        result(&job, "call_0_2"),
        json!({"ok": true, "data": echoed(20_000)})
    );

    // The pages, joined, are the whole, byte for byte.
    let mut joined = String::new();
    for page in 0..pages {
        let envelope = result(&job, &format!("call_1_{page}"));
        let data = &envelope["data"];
        assert!(data.to_string().len() <= 16_384, "page {page}");
        assert_eq!(data["total_bytes"], CAP);
        joined.push_str(data["text"].as_str().expect("a page's text"));
        let last = page + 1 == pages;
        assert_eq!(data["next_offset"].is_null(), last, "page {page}: {data}");
    }
    assert_eq!(joined.len(), whole.len());
    assert!(joined == whole, "the pages joined are not the whole");
    // Following next_offset reads the page that follows.
    let next = result(&job, "next");
    let second = result(&job, "call_1_1");
    assert_eq!(
        next["data"]["offset"],
        result(&job, "call_1_0")["data"]["next_offset"]
    );
    assert_eq!(next["data"]["text"], second["data"]["text"]);

    // Each read is a call like any other: recorded, with no attempt, and
    // answered by the orchestrator.
    let events = events(&api, &job.job_id).await?;
    let reads: Vec<&Value> = events
        .iter()
        .filter(|(kind, data)| kind == "tool_call_result" && data["name"] == "read_result")
        .map(|(_, data)| data)
        .collect();
    assert_eq!(reads.len(), pages + 1);
    for read in reads {
        assert_eq!(
            (read["attempts"].as_u64(), read["ok"].as_bool()),
            (Some(0), Some(true))
        );
        assert_eq!(read["source"], "built_in", "{read}");
    }
    let dispatched = events
        .iter()
        .filter(|(kind, data)| kind == "tool_call_dispatched" && data["name"] == "read_result");
    assert_eq!(dispatched.count(), 0, "read_result is never published");

    refusals(&api, &job.job_id).await
}

/// A job that asks for `read_result` before it holds a shaped result knows
/// no such tool; once it holds one, a reference of another job or another
/// tenant's, one that names nothing, and an offset past the end are
/// terminal envelopes that say so; the end itself is an empty last page.
async fn refusals(api: &ApiClient, other_job: &str) -> anyhow::Result<()> {
    let other_tenant = format!("globex-{}/call_0_0", "0".repeat(28));
    let read = |id: &str, reference: &str, offset: Value| {
        json!({"name": "read_result", "id": id, "arguments":
               {"ref": reference, "offset": offset, "limit": 100}})
    };
    let own = "{{call_0_0.data.ref}}";
    let script = json!([
        {"tool_calls": [
            {"name": "echo", "arguments": echoed(ECHO_LIMIT + 1)},
            read("early", &format!("{other_job}/call_0_0"), json!(0))]},
        {"tool_calls": [
            read("other_job", &format!("{other_job}/call_0_0"), json!(0)),
            read("other_tenant", &other_tenant, json!(0)),
            read("nothing", "call_0_0", json!(0)),
            read("no_call", "{{call_0_0.data.ref}}x", json!(0)),
            read("past", own, json!(ECHO_LIMIT + 2)),
            read("end", own, json!(ECHO_LIMIT + 1))]},
        {"message": "done"}
    ]);
    let job = run_job(api, scripted_job("refusals", &script)).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    let said = |id: &str| {
        let envelope = result(&job, id);
        let (code, message) = refusal(&envelope);
        (code.to_owned(), message.to_owned())
    };
    for (id, code, says) in [
        ("early", "UNKNOWN_TOOL", "holds no shaped result"),
        (
            "other_job",
            "RESULT_OF_ANOTHER_JOB",
            "a result of another job;",
        ),
        (
            "other_tenant",
            "RESULT_OF_ANOTHER_JOB",
            "another tenant's job",
        ),
        (
            "nothing",
            "NO_SUCH_RESULT",
            "is not the ref of a shaped result",
        ),
        (
            "no_call",
            "NO_SUCH_RESULT",
            "no shaped result of call \"call_0_0x\"",
        ),
        (
            "past",
            "OFFSET_OUT_OF_RANGE",
            "is past the end of the result",
        ),
    ] {
        let (got, message) = said(id);
        assert_eq!(got, code, "{id}: {message}");
        assert!(message.contains(says), "{id}: {message}");
    }
    let end = result(&job, "end");
    assert_eq!(end["data"]["text"], "", "{end}");
    assert!(end["data"]["next_offset"].is_null(), "{end}");
    Ok(())
}

/// The orchestrator that shows a job a shaped result is killed (-9) once
/// the view is stored, and another replica takes the job over: the model
/// is shown the same view, and `read_result` still reads the whole.
#[tokio::test]
async fn a_shaped_result_outlives_its_orchestrator() -> anyhow::Result<()> {
    let mut fleet = fleet().await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"name": "echo", "arguments": echoed(CAP)}]},
        {"tool_calls": [{"name": "read_result", "arguments":
            {"ref": "{{call_0_0.data.ref}}", "offset": 0, "limit": PAGE}}]},
        // Long enough for the kill to fall in it, once the view is stored.
        {"delay_ms": 3_000, "message": "read {{call_1_0.data.next_offset}} bytes"},
    ]);
    let request = scripted_job("takeover", &script);
    let job_id = api.clone().submit_job(request).await?.into_inner().job_id;
    // Stored: the view (with the turn after it) and the read's call.
    let stored = wait_until("the view stored", Duration::from_secs(30), || {
        let (mut api, job_id) = (api.clone(), job_id.clone());
        async move {
            let job = api.get_job(v1::GetJobRequest { job_id }).await.ok()?;
            let job = job.into_inner();
            let read = job.items.iter().any(|item| {
                matches!(&item.kind, Some(Kind::ToolCall(call)) if call.name == "read_result")
            });
            read.then_some(job)
        }
    })
    .await?;
    let view = result(&stored, "call_0_0");
    assert_eq!(view["data"]["shaped"], true, "{view}");
    fleet.orchestrator(0).kill();
    let second = fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    let job = wait_finished(&fleet.api(second).await?, &job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    let resumed = fleet.orchestrator(second);
    resumed
        .wait_for_log("job_resumed", Duration::from_secs(1))
        .await?;
    assert_eq!(
        result(&job, "call_0_0"),
        view,
        "the same view after the takeover"
    );
    let page = result(&job, "call_1_0");
    let whole = echoed(CAP).to_string();
    let text = page["data"]["text"].as_str().expect("a page");
    assert!(text.len() > PAGE - 4 && whole.starts_with(text), "{page}");
    Ok(())
}

/// `read_result` is offered to a model (Claude, through a fake Messages
/// API) only in the turns after its job holds a shaped result, beside the
/// job's allowed tools, and its shaped result reaches the model as a view.
#[tokio::test]
async fn read_result_is_offered_once_the_job_holds_a_shaped_result() -> anyhow::Result<()> {
    use toolfleet_tests::messages::{MessagesServer, Reply};
    let claude = MessagesServer::start("sk-ant-test").await?;
    claude.push(Reply::message(
        json!([{"type": "tool_use", "id": "toolu_a", "name": "echo",
                "input": {"text": "small"}}]),
        "tool_use",
    ));
    claude.push(Reply::message(
        json!([{"type": "tool_use", "id": "toolu_b", "name": "echo",
                "input": echoed(ECHO_LIMIT + 1)}]),
        "tool_use",
    ));
    claude.push(Reply::message(
        json!([{"type": "text", "text": "seen"}]),
        "end_turn",
    ));
    let base_url = claude.base_url();
    let fleet = fleet_with(&[
        ("TOOLFLEET_ANTHROPIC__API_KEY", "sk-ant-test"),
        ("TOOLFLEET_ANTHROPIC__BASE_URL", base_url.as_str()),
    ])
    .await?;
    let request = v1::SubmitJobRequest {
        input: "Echo twice.".into(),
        model: Some(v1::ModelSpec {
            provider: "anthropic-messages".into(),
            name: "claude-test".into(),
            max_tokens: 300,
            ..Default::default()
        }),
        tools: vec!["echo".into()],
        ..Default::default()
    };
    let job = run_job(&fleet.api(0).await?, request).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(claude.refusals(), Vec::<String>::new());
    let tools = |request: &Value| -> Vec<String> {
        let tools = request["tools"].as_array().expect("tools");
        tools
            .iter()
            .map(|tool| tool["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let requests = claude.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(tools(&requests[0]), ["echo"], "nothing shaped yet");
    assert_eq!(
        tools(&requests[1]),
        ["echo"],
        "a small result is not shaped"
    );
    assert_eq!(tools(&requests[2]), ["echo", "read_result"]);
    let read_result = &requests[2]["tools"][1];
    assert_eq!(
        read_result["input_schema"]["required"],
        json!(["ref", "offset", "limit"])
    );
    let view = result(&job, "toolu_b");
    assert_eq!(view["data"]["shaped"], true, "{view}");
    assert_eq!(view["data"]["ref"], format!("{}/toolu_b", job.job_id));
    Ok(())
}

/// Answers of the calls of `job`, in order: (attempts, the envelope).
fn attempts_and_outputs(job: &v1::Job) -> Vec<(u32, Value)> {
    job.items
        .iter()
        .filter_map(|item| match &item.kind {
            Some(Kind::ToolResult(r)) => Some((
                r.attempts,
                serde_json::from_str(&r.output).expect("outputs are envelopes"),
            )),
            _ => None,
        })
        .collect()
}

/// The keys of the default tenant's result cache.
async fn cache_keys(fleet: &Fleet) -> anyhow::Result<Vec<String>> {
    let mut redis = fleet.redis.connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tf:cache:{default}:*")
        .query_async(&mut redis)
        .await?;
    Ok(keys)
}

/// `echo` caches its results for a minute, `sleep` for a second: a second
/// job's `echo` with the same arguments (however they are written) is
/// answered from the cache, without a worker, as the first job's was
/// answered; other arguments run. A job that turns the cache off runs its
/// call, and a call held for approval is held, not answered from the
/// cache. Once `sleep`'s entry has expired, the same call runs again.
#[tokio::test]
async fn a_cached_tool_runs_once_for_two_jobs_and_again_after_its_ttl() -> anyhow::Result<()> {
    let builder = test_fleet(1).worker_env(&[
        ("TOOLFLEET_RUNTIME__TOOL_CACHE_TTL__ECHO", "1m"),
        ("TOOLFLEET_RUNTIME__TOOL_CACHE_TTL__SLEEP", "1s"),
    ]);
    let mut fleet = Fleet::start(builder).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["echo", "sleep"], 1).await?;
    let api = fleet.api(0).await?;
    let echo = |arguments: Value| json!({"name": "echo", "arguments": arguments});
    let job = |script: Value| {
        scripted_job(
            "cache",
            &json!([{"tool_calls": script}, {"message": "done"}]),
        )
    };

    let first = run_job(
        &api,
        job(json!([
            echo(json!({"q": "x", "n": 1})),
            echo(json!({"q": "y"}))
        ])),
    )
    .await?;
    let second = run_job(
        &api,
        job(json!([
            echo(json!({"n": 1.0, "q": "x"})),
            echo(json!({"q": "z"}))
        ])),
    )
    .await?;
    let (first_calls, second_calls) = (attempts_and_outputs(&first), attempts_and_outputs(&second));
    assert_eq!(
        first_calls
            .iter()
            .map(|(attempts, _)| *attempts)
            .collect::<Vec<_>>(),
        [1, 1]
    );
    assert_eq!(
        second_calls
            .iter()
            .map(|(attempts, _)| *attempts)
            .collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(
        second_calls[0].1, first_calls[0].1,
        "the first job's answer"
    );
    assert_eq!(
        second_calls[0].1,
        json!({"ok": true, "data": {"q": "x", "n": 1}})
    );
    // The hit is recorded with the job, from the cache, never dispatched.
    let events = events(&api, &second.job_id).await?;
    let sources: Vec<(u64, Option<&str>)> = events
        .iter()
        .filter(|(kind, _)| kind == "tool_call_result")
        .map(|(_, data)| {
            (
                data["attempts"].as_u64().unwrap_or(99),
                data["source"].as_str(),
            )
        })
        .collect();
    assert_eq!(sources, [(0, Some("cache")), (1, None)]);
    let dispatched = events
        .iter()
        .filter(|(kind, _)| kind == "tool_call_dispatched")
        .count();
    assert_eq!(dispatched, 1, "only the call with new arguments ran");

    // A job may turn the cache off: its call runs.
    let mut off = job(json!([echo(json!({"q": "x", "n": 1}))]));
    off.result_cache = Some(false);
    let off = run_job(&api, off).await?;
    assert_eq!(attempts_and_outputs(&off)[0].0, 1);
    // Approval is decided first: a held call waits for its person.
    let mut held = job(json!([echo(json!({"q": "x", "n": 1}))]));
    held.require_approval = vec!["echo".into()];
    let held = api.clone().submit_job(held).await?.into_inner().job_id;
    wait_until(
        "the held call's job to park",
        Duration::from_secs(30),
        || {
            let (mut api, job_id) = (api.clone(), held.clone());
            async move {
                let job = api.get_job(v1::GetJobRequest { job_id }).await;
                job.is_ok_and(|job| {
                    job.get_ref().status == v1::JobStatus::WaitingForApproval as i32
                })
            }
        },
    )
    .await?;

    // After its TTL, the same call runs again.
    let nap = || job(json!([{"name": "sleep", "arguments": {"ms": 1}}]));
    let before = run_job(&api, nap()).await?;
    assert_eq!(attempts_and_outputs(&before)[0].0, 1);
    wait_until(
        "sleep's cached result to expire",
        Duration::from_secs(10),
        || async { cache_keys(&fleet).await.is_ok_and(|keys| keys.len() == 3) },
    )
    .await?;
    let after = run_job(&api, nap()).await?;
    assert_eq!(attempts_and_outputs(&after)[0].0, 1, "run again");
    Ok(())
}

/// A scripted model that asks for two `echo` calls in each of ten turns,
/// then answers; `max_tokens` 100 per turn (the scripted model reports no
/// usage, so each turn counts its `max_tokens`).
fn looping_job(budget: v1::Budget) -> v1::SubmitJobRequest {
    let echo = |n: u32| json!({"name": "echo", "arguments": {"n": n}});
    let mut turns: Vec<Value> = (0..10)
        .map(|turn| json!({"tool_calls": [echo(2 * turn), echo(2 * turn + 1)]}))
        .collect();
    turns.push(json!({"message": "done"}));
    let mut job = scripted_job("loop", &Value::Array(turns));
    if let Some(model) = job.model.as_mut() {
        model.max_tokens = 100;
    }
    job.max_tool_rounds = 20;
    job.budget = Some(budget);
    job
}

/// How a job ended: its error code and message.
fn failure(job: &v1::Job) -> (&str, &str) {
    let error = job.error.as_ref().expect("the job failed");
    (error.code.as_str(), error.message.as_str())
}

/// What a job spent, as GetJob says: tokens, cost units, tool calls.
fn spent(job: &v1::Job) -> (u64, u64, u64) {
    let spent = job.spent.expect("GetJob says what the job spent");
    (spent.tokens, spent.cost_units, spent.tool_calls)
}

/// A model that loops is stopped by each budget of its job, within the
/// documented overshoot: none for tool calls and cost units (a call that
/// does not fit is answered BUDGET_EXCEEDED unrun, and so is every call
/// after it), one turn for tokens. `echo` costs 3 units an attempt and
/// `fail` 2; a retry that does not fit is not made.
#[tokio::test]
async fn a_looping_model_is_stopped_by_each_budget_of_its_job() -> anyhow::Result<()> {
    let builder = test_fleet(1).worker_env(&[
        ("TOOLFLEET_RUNTIME__TOOL_COST__ECHO", "3"),
        ("TOOLFLEET_RUNTIME__TOOL_COST__FAIL", "2"),
    ]);
    let mut fleet = Fleet::start(builder).await?;
    fleet
        .spawn_orchestrator(&[("TOOLFLEET_DISPATCH__RETRY_INITIAL_BACKOFF", "10ms")])
        .await?;
    fleet.wait_for_tools(0, &["echo", "fail"], 1).await?;
    let api = fleet.api(0).await?;

    // Five calls: the third turn's second call is refused, unrun.
    let calls = v1::Budget {
        max_tool_calls: Some(5),
        ..Default::default()
    };
    let job = run_job(&api, looping_job(calls)).await?;
    assert_eq!(job.status, v1::JobStatus::Failed as i32, "{job:?}");
    let (code, message) = failure(&job);
    assert_eq!(code, "BUDGET_EXCEEDED");
    assert!(message.contains("budget.max_tool_calls"), "{message}");
    assert_eq!(spent(&job), (300, 15, 5));
    let answered = attempts_and_outputs(&job);
    assert_eq!(answered.len(), 6, "three turns of two calls: {answered:?}");
    assert_eq!(answered[5].0, 0, "the sixth call did not run");
    assert_eq!(answered[5].1["error"]["code"], "BUDGET_EXCEEDED");
    assert!(
        !answered[5].1["error"]["retryable"]
            .as_bool()
            .unwrap_or(true)
    );
    let events = events(&api, &job.job_id).await?;
    let (kind, end) = events.last().expect("the job's events");
    assert_eq!(kind, "job_failed");
    assert_eq!(
        end["spent"],
        json!({"tokens": 300, "cost_units": 15, "tool_calls": 5}),
        "watch and trace read what the job spent on its last event"
    );
    let sources: Vec<Option<String>> = events
        .iter()
        .filter(|(kind, _)| kind == "tool_call_result")
        .map(|(_, data)| data["source"].as_str().map(str::to_owned))
        .collect();
    let refused = sources.iter().filter(|s| s.as_deref() == Some("budget"));
    assert_eq!(refused.count(), 1, "{sources:?}");
    assert_eq!(sources.len(), 6);
    assert_eq!(job.budget, Some(calls), "GetJob shows the budget");

    // Ten units at 3 an attempt: three calls, the fourth refused.
    let cost = v1::Budget {
        max_cost_units: Some(10),
        ..Default::default()
    };
    let job = run_job(&api, looping_job(cost)).await?;
    let (code, message) = failure(&job);
    assert_eq!(code, "BUDGET_EXCEEDED");
    assert!(message.contains("budget.max_cost_units"), "{message}");
    assert_eq!(spent(&job), (200, 9, 3));
    assert_eq!(attempts_and_outputs(&job).len(), 4);

    // 250 tokens at 100 a turn: the third turn is played (200 < 250) and
    // its calls run; the fourth is not (300 >= 250).
    let tokens = v1::Budget {
        max_tokens: Some(250),
        ..Default::default()
    };
    let job = run_job(&api, looping_job(tokens)).await?;
    let (code, message) = failure(&job);
    assert_eq!(code, "BUDGET_EXCEEDED");
    assert!(message.contains("budget.max_tokens"), "{message}");
    assert_eq!(spent(&job), (300, 18, 6));
    assert!(
        attempts_and_outputs(&job)
            .iter()
            .all(|(attempts, _)| *attempts == 1),
        "every call ran"
    );

    // A retry is not made when its cost does not fit: 2 + 2, then no 6.
    let mut retried = scripted_job(
        "retry",
        &json!([
            {"tool_calls": [{"name": "fail", "arguments": {"mode": "retryable"}}]},
            {"message": "done"}
        ]),
    );
    retried.budget = Some(v1::Budget {
        max_cost_units: Some(5),
        ..Default::default()
    });
    let job = run_job(&api, retried).await?;
    assert_eq!(failure(&job).0, "BUDGET_EXCEEDED");
    let answered = attempts_and_outputs(&job);
    assert_eq!(answered[0].0, 2, "two attempts of five");
    assert_eq!(answered[0].1["error"]["code"], "BUDGET_EXCEEDED");
    assert_eq!(spent(&job).1, 4);

    // A job without a budget spends freely, and says what it spent.
    let free = run_job(&api, looping_job(v1::Budget::default())).await?;
    assert_eq!(free.status, v1::JobStatus::Succeeded as i32, "{free:?}");
    assert_eq!(spent(&free), (1100, 60, 20));
    Ok(())
}

/// Runs `job` as the tenant of `token` on `api` to its end.
async fn run_as(
    api: &ApiClient,
    token: &str,
    job: v1::SubmitJobRequest,
) -> anyhow::Result<v1::Job> {
    let job_id = api
        .clone()
        .submit_job(as_tenant(token, job))
        .await?
        .into_inner()
        .job_id;
    wait_until("the job to end", Duration::from_secs(60), || {
        let (mut api, job_id) = (api.clone(), job_id.clone());
        async move {
            let job = api
                .get_job(as_tenant(token, v1::GetJobRequest { job_id }))
                .await?
                .into_inner();
            anyhow::ensure!(
                ![v1::JobStatus::Queued as i32, v1::JobStatus::Running as i32]
                    .contains(&job.status),
                "still running"
            );
            anyhow::Ok(job)
        }
    })
    .await
}

/// A job of `turns` turns of one `echo` call each, then an answer.
fn echoing(turns: u32) -> v1::SubmitJobRequest {
    let mut script: Vec<Value> = (0..turns)
        .map(|n| json!({"tool_calls": [{"name": "echo", "arguments": {"n": n}}]}))
        .collect();
    script.push(json!({"message": "done"}));
    scripted_job("echo", &Value::Array(script))
}

/// A tenant's period budgets hold across two orchestrators at once: eight
/// jobs of three calls each, submitted to both, run seven calls in all
/// (each call takes its unit atomically, so none is run over the budget);
/// the jobs refused end BUDGET_EXCEEDED naming the key, and the tenant's
/// next submission is refused with when to come back. Job time and tokens
/// are counted too: a job that has run over its tenant's second of job
/// time, or a day's tokens, gets no more turns.
#[tokio::test]
async fn a_tenants_period_budgets_hold_across_two_orchestrators() -> anyhow::Result<()> {
    use tonic_types::StatusExt as _;
    use toolfleet_orchestrator::auth::token_sha256;
    let (thrifty, brief, wordy) = ("tok-thrifty-1a2b", "tok-brief-3c4d", "tok-wordy-5e6f");
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[tenants.thrifty]\ntoken_sha256 = [\"{}\"]\n[tenants.thrifty.budget]\n\
             tool_calls_per_hour = 7\n\
             [tenants.brief]\ntoken_sha256 = [\"{}\"]\n[tenants.brief.budget]\n\
             job_seconds_per_hour = 1\n\
             [tenants.wordy]\ntoken_sha256 = [\"{}\"]\n[tenants.wordy.budget]\n\
             tokens_per_day = 150\n",
            token_sha256(thrifty),
            token_sha256(brief),
            token_sha256(wordy)
        ),
    )?;
    let file = tokens.to_string_lossy().into_owned();
    let env = [
        ("TOOLFLEET_API__AUTH", "tokens"),
        ("TOOLFLEET_API__TOKENS_FILE", file.as_str()),
    ];
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet.spawn_orchestrator(&env).await?;
    fleet.spawn_orchestrator(&env).await?;
    let apis = [fleet.api(0).await?, fleet.api(1).await?];
    for api in &apis {
        wait_until("the tools to go live", Duration::from_secs(30), || {
            let mut api = api.clone();
            async move {
                let tools = api
                    .list_tools(as_tenant(thrifty, v1::ListToolsRequest::default()))
                    .await?
                    .into_inner()
                    .tools;
                let live = |name: &str| tools.iter().any(|t| t.name == name);
                anyhow::ensure!(live("echo") && live("sleep"), "not yet");
                anyhow::Ok(())
            }
        })
        .await?;
    }

    let jobs = (0..8).map(|n| run_as(&apis[n % 2], thrifty, echoing(3)));
    let jobs = futures::future::try_join_all(jobs).await?;
    let ran: usize = jobs
        .iter()
        .flat_map(attempts_and_outputs)
        .filter(|(attempts, _)| *attempts > 0)
        .count();
    assert_eq!(ran, 7, "seven calls of twenty-four ran");
    let calls: u64 = jobs.iter().map(|job| spent(job).2).sum();
    assert_eq!(calls, 7, "and the jobs say so");
    let refused: Vec<&v1::Job> = jobs
        .iter()
        .filter(|job| job.status == v1::JobStatus::Failed as i32)
        .collect();
    assert!(!refused.is_empty());
    for job in refused {
        let (code, message) = failure(job);
        assert_eq!(code, "BUDGET_EXCEEDED");
        assert!(message.contains("budget.tool_calls_per_hour"), "{message}");
    }
    let refused = apis[1]
        .clone()
        .submit_job(as_tenant(thrifty, echoing(1)))
        .await
        .expect_err("the tenant's hour is spent");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("tool_calls_per_hour"),
        "{}",
        refused.message()
    );
    let delay = refused
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .expect("RetryInfo in the status details");
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_secs(3600),
        "{delay:?}"
    );

    // A second of job time: a call of 1.2 s spends it, and no turn follows.
    let nap = scripted_job(
        "nap",
        &json!([
            {"tool_calls": [{"name": "sleep", "arguments": {"ms": 1200}}]},
            {"message": "rested"}
        ]),
    );
    let job = run_as(&apis[0], brief, nap).await?;
    let (code, message) = failure(&job);
    assert_eq!(code, "BUDGET_EXCEEDED");
    assert!(message.contains("budget.job_seconds_per_hour"), "{message}");
    assert_eq!(attempts_and_outputs(&job)[0].0, 1, "the call ran");

    // 150 tokens a day at 100 a turn: two turns, then none.
    let mut words = echoing(5);
    if let Some(model) = words.model.as_mut() {
        model.max_tokens = 100;
    }
    let job = run_as(&apis[1], wordy, words).await?;
    let (code, message) = failure(&job);
    assert_eq!(code, "BUDGET_EXCEEDED");
    assert!(message.contains("budget.tokens_per_day"), "{message}");
    assert_eq!(spent(&job).0, 200);
    Ok(())
}

/// A breaker that opens after two calls and cools down in two seconds.
const QUICK_BREAKER: &[(&str, &str)] = &[
    ("TOOLFLEET_BREAKER__MIN_CALLS", "2"),
    ("TOOLFLEET_BREAKER__WINDOW", "30s"),
    ("TOOLFLEET_BREAKER__COOL_DOWN", "2s"),
];

/// Claude calls `fail` twice and both fail: its breaker opens. The next
/// turn is offered `echo` and `sleep` only, and its instructions end with
/// the line that says why; Claude calls `fail` anyway and is answered
/// `TOOL_UNAVAILABLE` with no attempt (no worker saw it), then sleeps past
/// the cool-down. `fail` is offered again, with no line; the call it
/// makes, which succeeds, is the probe, and closes the breaker (its key is
/// gone). The job's events say when the tool was left out and which call
/// was refused.
#[tokio::test]
async fn a_failing_tool_is_left_out_refused_and_probed_back() -> anyhow::Result<()> {
    use toolfleet_tests::messages::{MessagesServer, Reply};
    let claude = MessagesServer::start("sk-ant-test").await?;
    let call = |id: &str, name: &str, input: Value| json!({"type": "tool_use", "id": id, "name": name, "input": input});
    let fails = json!({"mode": "terminal"});
    for content in [
        json!([
            call("toolu_1", "fail", fails.clone()),
            call("toolu_2", "fail", fails.clone())
        ]),
        json!([call("toolu_3", "fail", fails.clone())]),
        json!([call("toolu_4", "sleep", json!({"ms": 2500}))]),
        json!([call(
            "toolu_5",
            "fail",
            json!({"mode": "terminal", "fail_attempts": 0})
        )]),
    ] {
        claude.push(Reply::message(content, "tool_use"));
    }
    claude.push(Reply::message(
        json!([{"type": "text", "text": "done"}]),
        "end_turn",
    ));
    let base_url = claude.base_url();
    let mut env = vec![
        ("TOOLFLEET_ANTHROPIC__API_KEY", "sk-ant-test"),
        ("TOOLFLEET_ANTHROPIC__BASE_URL", base_url.as_str()),
    ];
    env.extend_from_slice(QUICK_BREAKER);
    let fleet = fleet_with(&env).await?;
    fleet.wait_for_tools(0, &["fail", "sleep"], 1).await?;
    let request = v1::SubmitJobRequest {
        input: "Try the tools.".into(),
        instructions: "Be brief.".into(),
        model: Some(v1::ModelSpec {
            provider: "anthropic-messages".into(),
            name: "claude-test".into(),
            max_tokens: 300,
            ..Default::default()
        }),
        tools: vec!["echo".into(), "fail".into(), "sleep".into()],
        ..Default::default()
    };
    let api = fleet.api(0).await?;
    let job = run_job(&api, request).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(claude.refusals(), Vec::<String>::new());

    let requests = claude.requests();
    assert_eq!(requests.len(), 5);
    let tools = |request: &Value| -> Vec<String> {
        let mut names: Vec<String> = request["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|tool| tool["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        names.sort();
        names
    };
    let line = "The tool fail is unavailable for now (2 of its last 2 calls failed); \
                do not call it.";
    let system = |request: &Value| request["system"].to_string();
    let all = ["echo", "fail", "sleep"];
    assert_eq!(tools(&requests[0]), all);
    assert!(!system(&requests[0]).contains("unavailable"));
    for left_out in &requests[1..3] {
        assert_eq!(tools(left_out), ["echo", "sleep"]);
        assert!(
            system(left_out).contains("Be brief."),
            "{}",
            system(left_out)
        );
        assert!(system(left_out).contains(line), "{}", system(left_out));
    }
    for offered in &requests[3..] {
        assert_eq!(tools(offered), all, "after the cool-down");
        assert!(!system(offered).contains("unavailable"));
    }
    // What the providers' prompt caches key on first (Anthropic: tools,
    // then system): it changes exactly at the two moves, when the tool is
    // left out and when it is back, and is stable in between.
    let prefix = |request: &Value| (request["tools"].to_string(), system(request));
    let changed: Vec<bool> = requests
        .windows(2)
        .map(|pair| prefix(&pair[0]) != prefix(&pair[1]))
        .collect();
    assert_eq!(changed, [true, false, true, false]);

    let answers = attempts_and_outputs(&job);
    assert_eq!(answers.len(), 5, "{answers:?}");
    assert_eq!(answers[0].0, 1);
    assert_eq!(answers[1].0, 1);
    let (attempts, refused) = &answers[2];
    assert_eq!(*attempts, 0, "refused before any attempt");
    let (code, message) = refusal(refused);
    assert_eq!(code, "TOOL_UNAVAILABLE");
    assert!(
        message.contains("2 of its last 2 calls failed"),
        "{message}"
    );
    assert_eq!(answers[4].0, 1);
    assert_eq!(answers[4].1["ok"], true, "the probe ran: {:?}", answers[4]);

    let mut redis = fleet.redis.connection().await?;
    let exists: bool = redis::cmd("EXISTS")
        .arg("tf:breaker:fail")
        .query_async(&mut redis)
        .await?;
    assert!(!exists, "the probe's success closed the breaker");

    let unavailable: Vec<Value> = events(&api, &job.job_id)
        .await?
        .into_iter()
        .filter_map(|(kind, data)| (kind == "tool_unavailable").then_some(data))
        .collect();
    let reason = "2 of its last 2 calls failed";
    assert_eq!(
        unavailable,
        [
            json!({"tool": "fail", "reason": reason}),
            json!({"tool": "fail", "reason": reason, "call_id": "toolu_3"}),
            json!({"tool": "fail", "reason": reason}),
        ]
    );
    Ok(())
}

/// The fleet's `/metrics` text, or nothing while it does not answer.
async fn scrape(address: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
        return String::new();
    };
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    let mut response = String::new();
    if stream.write_all(request.as_bytes()).await.is_err()
        || stream.read_to_string(&mut response).await.is_err()
    {
        return String::new();
    }
    response
}

/// Two failed calls of `fail` open its breaker for ten minutes: ListTools
/// says so (with since when) beside `echo`'s closed one, the gauge and
/// the transitions counter count it, and a later job's call of `fail` (a
/// scripted model, which does not read its tool list) is refused before
/// any attempt, its refusal in the job's events.
#[tokio::test]
async fn an_open_breaker_is_listed_counted_and_refuses_other_jobs() -> anyhow::Result<()> {
    let metrics = toolfleet_tests::free_loopback_address()?;
    let fleet = fleet_with(&[
        ("TOOLFLEET_BREAKER__MIN_CALLS", "2"),
        ("TOOLFLEET_BREAKER__COOL_DOWN", "10m"),
        ("TOOLFLEET_METRICS__LISTEN", metrics.as_str()),
    ])
    .await?;
    fleet.wait_for_tools(0, &["fail"], 1).await?;
    let api = fleet.api(0).await?;
    let fail = json!({"name": "fail", "arguments": {"mode": "terminal"}});
    let script = json!([{"tool_calls": [fail, fail]}, {"message": "done"}]);
    let before = toolfleet_service::clock::now_ms();
    let first = run_job(&api, scripted_job("fail twice", &script)).await?;
    assert!(
        attempts_and_outputs(&first).iter().all(|(n, _)| *n == 1),
        "{first:?}"
    );

    let listed = api
        .clone()
        .list_tools(v1::ListToolsRequest::default())
        .await?
        .into_inner()
        .tools;
    let breaker = |name: &str| {
        let tool = listed.iter().find(|t| t.name == name).expect("listed");
        (tool.breaker.clone(), tool.breaker_since_ms)
    };
    let (state, since) = breaker("fail");
    assert_eq!(state, "open");
    assert!(since.is_some_and(|ms| ms >= before), "{since:?}");
    assert_eq!(breaker("echo"), ("closed".to_owned(), None));

    let second = run_job(&api, scripted_job("fail again", &script)).await?;
    let answers = attempts_and_outputs(&second);
    assert_eq!(answers.len(), 2);
    for (attempts, envelope) in &answers {
        assert_eq!(*attempts, 0, "{envelope}");
        assert_eq!(refusal(envelope).0, "TOOL_UNAVAILABLE");
    }
    let refused: Vec<Value> = events(&api, &second.job_id)
        .await?
        .into_iter()
        .filter_map(|(kind, data)| (kind == "tool_unavailable").then_some(data))
        .collect();
    // Each turn left `fail` out, and each call was refused.
    let calls: Vec<&Value> = refused
        .iter()
        .filter(|e| e["call_id"].is_string())
        .collect();
    assert_eq!(calls.len(), 2, "one per call refused: {refused:?}");
    assert_eq!(refused.len(), 4, "and one per turn: {refused:?}");
    assert!(refused.iter().all(|e| e["tool"] == "fail"));

    let gauge = "toolfleet_tool_breaker_open{tool=\"fail\"} 1";
    let opened = "toolfleet_tool_breaker_transitions_total{tool=\"fail\",to=\"open\"} 1";
    wait_until(
        "the breaker's gauge and counter",
        Duration::from_secs(15),
        || {
            let metrics = metrics.clone();
            async move {
                let text = scrape(&metrics).await;
                (text.contains(gauge) && text.contains(opened)).then_some(())
            }
        },
    )
    .await?;
    Ok(())
}

/// A job whose only tool's breaker opens is still offered it (a
/// conversation with tool calls and no tools is one Anthropic refuses),
/// with the line in its instructions; its call is refused as any other.
#[tokio::test]
async fn a_job_whose_every_tool_is_open_keeps_its_list_and_is_told() -> anyhow::Result<()> {
    use toolfleet_tests::messages::{MessagesServer, Reply};
    let claude = MessagesServer::start("sk-ant-test").await?;
    let fails = |id: &str| json!({"type": "tool_use", "id": id, "name": "fail", "input": {"mode": "terminal"}});
    claude.push(Reply::message(
        json!([fails("toolu_1"), fails("toolu_2")]),
        "tool_use",
    ));
    claude.push(Reply::message(json!([fails("toolu_3")]), "tool_use"));
    claude.push(Reply::message(
        json!([{"type": "text", "text": "done"}]),
        "end_turn",
    ));
    let base_url = claude.base_url();
    let fleet = fleet_with(&[
        ("TOOLFLEET_ANTHROPIC__API_KEY", "sk-ant-test"),
        ("TOOLFLEET_ANTHROPIC__BASE_URL", base_url.as_str()),
        ("TOOLFLEET_BREAKER__MIN_CALLS", "2"),
        ("TOOLFLEET_BREAKER__COOL_DOWN", "10m"),
    ])
    .await?;
    fleet.wait_for_tools(0, &["fail"], 1).await?;
    let request = v1::SubmitJobRequest {
        input: "Fail.".into(),
        model: Some(v1::ModelSpec {
            provider: "anthropic-messages".into(),
            name: "claude-test".into(),
            max_tokens: 300,
            ..Default::default()
        }),
        tools: vec!["fail".into()],
        ..Default::default()
    };
    let job = run_job(&fleet.api(0).await?, request).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    let requests = claude.requests();
    assert_eq!(requests.len(), 3);
    for request in &requests[1..] {
        assert_eq!(request["tools"][0]["name"], "fail", "still listed");
        let system = request["system"].to_string();
        assert!(
            system.contains("The tool fail is unavailable for now"),
            "{system}"
        );
    }
    let (attempts, refused) = &attempts_and_outputs(&job)[2];
    assert_eq!((*attempts, refusal(refused).0), (0, "TOOL_UNAVAILABLE"));
    Ok(())
}
