//! Calls held for a person's approval (decision 0036), end to end with real
//! processes: a held call is not published while the round's other calls
//! run, its job parks (held by no runner), and a decision, made once, runs
//! it, rejects it, or runs it with the approver's arguments.

use std::time::Duration;

use serde_json::{Value, json};
use tonic::Code;
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{
    ApiClient, FAST_REDELIVERY, Fleet, as_tenant, call_results, events, scripted_job, test_fleet,
    wait_finished,
};
use toolfleet_tests::{run_toolfleet, wait_until};

/// A round of two parallel calls, `calculate` (to approve) and `echo`, then
/// an answer that quotes both: the whole envelope of the first.
fn two_calls(require_approval: &[&str]) -> v1::SubmitJobRequest {
    let script = json!([
        {"tool_calls": [
            {"id": "math", "name": "calculate", "arguments": {"expression": "2 + 3"}},
            {"id": "say", "name": "echo", "arguments": {"text": "hi"}}]},
        {"message": "{{math}} / {{say.data.text}}"}
    ]);
    let mut request = scripted_job("add, and say hi", &script);
    request.require_approval = require_approval.iter().map(|t| (*t).to_owned()).collect();
    request
}

async fn fleet() -> anyhow::Result<Fleet> {
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["calculate", "echo"], 1).await?;
    Ok(fleet)
}

/// How long a test waits for a job to reach a state.
const WAIT: Duration = Duration::from_secs(30);

/// Waits until the job is parked, waiting for approval.
async fn parked(api: &ApiClient, job_id: &str) -> anyhow::Result<()> {
    job_in(api, None, job_id, v1::JobStatus::WaitingForApproval)
        .await
        .map(drop)
}

/// Waits until the job is in `status`, asking as the tenant of `token` if
/// one is given, and returns it.
async fn job_in(
    api: &ApiClient,
    token: Option<&str>,
    job_id: &str,
    status: v1::JobStatus,
) -> anyhow::Result<v1::Job> {
    let what = format!("job {job_id} to be {}", status.as_str_name());
    wait_until(&what, WAIT, || {
        let mut api = api.clone();
        let request = v1::GetJobRequest {
            job_id: job_id.to_owned(),
        };
        let request = match token {
            Some(token) => as_tenant(token, request),
            None => tonic::Request::new(request),
        };
        async move {
            let job = api.get_job(request).await.ok()?.into_inner();
            (job.status() == status).then_some(job)
        }
    })
    .await
}

/// Approves or rejects the call `math` of `job_id`.
fn decide(job_id: &str, approve: bool, reason: &str) -> v1::DecideCallRequest {
    let decision = if approve {
        v1::Decision::Approve
    } else {
        v1::Decision::Reject
    };
    v1::DecideCallRequest {
        reason: reason.to_owned(),
        ..verdict(job_id, "math", decision)
    }
}

#[tokio::test]
async fn a_held_call_waits_parked_while_the_others_run_and_runs_once_approved() -> anyhow::Result<()>
{
    let metrics = toolfleet_tests::free_loopback_address()?;
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet
        .spawn_orchestrator(&[("TOOLFLEET_METRICS__LISTEN", &metrics)])
        .await?;
    fleet.wait_for_tools(0, &["calculate", "echo"], 1).await?;
    let mut api = fleet.api(0).await?;
    let job_id = api
        .submit_job(two_calls(&["calculate"]))
        .await?
        .into_inner()
        .job_id;
    parked(&api, &job_id).await?;

    let seen = events(&api, &job_id).await?;
    let kinds: Vec<&str> = seen.iter().map(|(kind, _)| kind.as_str()).collect();
    let dispatched: Vec<&Value> = seen
        .iter()
        .filter(|(kind, _)| kind == "tool_call_dispatched")
        .map(|(_, data)| &data["call_id"])
        .collect();
    // The other call ran; the held one was never published.
    assert_eq!(dispatched, [&json!("say")], "{kinds:?}");
    let (_, asked) = seen
        .iter()
        .find(|(kind, _)| kind == "tool_call_approval_requested")
        .expect("an approval request");
    assert_eq!(asked["call_id"], "math");
    assert_eq!(asked["tool"], "calculate");
    assert_eq!(asked["rule"], "job");
    assert_eq!(
        asked["reason"],
        "the job requires approval of every call of calculate"
    );
    assert_eq!(kinds.last(), Some(&"job_waiting_for_approval"), "{kinds:?}");
    // The gauge, read from Redis by the orchestrator: one call waits.
    scraped_line(
        &metrics,
        r#"toolfleet_approvals_pending{tenant="default",tool="calculate"} 1"#,
    )
    .await?;

    let status = api
        .decide_call(decide(&job_id, true, "fine"))
        .await?
        .into_inner();
    assert_eq!(status.status(), v1::JobStatus::WaitingForApproval);
    // Decided once: the second decision is told the first.
    let again = api
        .decide_call(decide(&job_id, false, "no"))
        .await
        .expect_err("a second decision");
    assert_eq!(again.code(), Code::FailedPrecondition);
    assert!(
        again
            .message()
            .contains("already approved by tenant default"),
        "{}",
        again.message()
    );

    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{job:?}");
    assert!(
        job.output_text.contains(r#""result":5}"#),
        "{}",
        job.output_text
    );
    assert!(job.output_text.ends_with(" / hi"), "{}", job.output_text);
    let seen = events(&api, &job_id).await?;
    let kinds: Vec<&str> = seen.iter().map(|(kind, _)| kind.as_str()).collect();
    assert!(kinds.contains(&"tool_call_decided"), "{kinds:?}");
    assert!(kinds.contains(&"job_resumed"), "{kinds:?}");

    let (_, scraped) = toolfleet_tests::http_get(&metrics, "/metrics").await?;
    for line in [
        r#"toolfleet_approvals_requested_total{tool="calculate",rule="job"} 1"#,
        r#"toolfleet_approval_decisions_total{tool="calculate",decision="approved"} 1"#,
        r#"toolfleet_approval_wait_seconds_bucket{tool="calculate",le="86400"} 1"#,
        r#"toolfleet_approval_wait_seconds_count{tool="calculate"} 1"#,
    ] {
        assert!(scraped.contains(line), "{line} in:\n{scraped}");
    }
    // Decided: the series stays, at 0, and so does the oldest's age.
    scraped_line(
        &metrics,
        r#"toolfleet_approvals_pending{tenant="default",tool="calculate"} 0"#,
    )
    .await?;
    scraped_line(
        &metrics,
        r#"toolfleet_approvals_oldest_pending_seconds{tenant="default",tool="calculate"} 0"#,
    )
    .await?;
    Ok(())
}

/// Waits until a scrape of `metrics` has `line` (the approvals' gauges are
/// refreshed every 5 s).
async fn scraped_line(metrics: &str, line: &str) -> anyhow::Result<()> {
    let seen = wait_until(line, WAIT, || async {
        let (_, scraped) = toolfleet_tests::http_get(metrics, "/metrics").await.ok()?;
        scraped.lines().any(|l| l == line).then_some(())
    })
    .await;
    if seen.is_err() {
        let (_, scraped) = toolfleet_tests::http_get(metrics, "/metrics").await?;
        anyhow::bail!("never scraped {line}; last scrape:\n{scraped}");
    }
    Ok(())
}

#[tokio::test]
async fn a_rejected_call_is_answered_with_the_reason_and_an_edited_one_runs_as_edited()
-> anyhow::Result<()> {
    let fleet = fleet().await?;
    let mut api = fleet.api(0).await?;

    let rejected = api.submit_job(two_calls(&["*"])).await?.into_inner().job_id;
    parked(&api, &rejected).await?;
    // A rejection needs its reason, for the model.
    let silent = api
        .decide_call(decide(&rejected, false, " "))
        .await
        .expect_err("no reason");
    assert_eq!(silent.code(), Code::InvalidArgument);
    // `*` held both calls: each is decided on its own.
    let mut say = decide(&rejected, true, "");
    say.call_id = "say".into();
    api.decide_call(say).await?;
    api.decide_call(decide(&rejected, false, "not on a Sunday"))
        .await?;
    let job = wait_finished(&api, &rejected).await?;
    assert!(
        job.output_text.contains("REJECTED_BY_APPROVER"),
        "{}",
        job.output_text
    );
    assert!(job.output_text.ends_with(" / hi"), "{}", job.output_text);
    let envelope = &call_results(&job)["math"];
    assert_eq!(
        envelope["error"]["message"],
        "a person rejected the call: not on a Sunday"
    );
    assert_eq!(envelope["error"]["retryable"], false);

    let edited = api
        .submit_job(two_calls(&["calculate"]))
        .await?
        .into_inner()
        .job_id;
    parked(&api, &edited).await?;
    let mut request = decide(&edited, true, "");
    request.arguments = Some(r#"{"expression": 7}"#.into());
    let refused = api
        .decide_call(request.clone())
        .await
        .expect_err("against the schema");
    assert_eq!(
        refused.code(),
        Code::InvalidArgument,
        "{}",
        refused.message()
    );
    assert!(
        refused.message().starts_with("arguments: "),
        "{}",
        refused.message()
    );
    request.arguments = Some(r#"{"expression": "6 * 7"}"#.into());
    api.decide_call(request).await?;
    let job = wait_finished(&api, &edited).await?;
    assert!(
        job.output_text.contains(r#""result":42}"#),
        "{}",
        job.output_text
    );
    // The model's own call stays as it made it.
    let call = job
        .items
        .iter()
        .find_map(|item| match &item.kind {
            Some(v1::item::Kind::ToolCall(c)) if c.call_id == "math" => Some(c.arguments.clone()),
            _ => None,
        })
        .expect("the model's call");
    assert_eq!(
        serde_json::from_str::<Value>(&call)?,
        json!({"expression": "2 + 3"})
    );
    Ok(())
}

#[tokio::test]
async fn a_parked_job_cancels_at_once_and_bad_decisions_change_nothing() -> anyhow::Result<()> {
    let fleet = fleet().await?;
    let mut api = fleet.api(0).await?;
    let job_id = api
        .submit_job(two_calls(&["calculate"]))
        .await?
        .into_inner()
        .job_id;
    parked(&api, &job_id).await?;

    let mut unknown = decide(&job_id, true, "");
    unknown.call_id = "say".into();
    let not_held = api
        .decide_call(unknown)
        .await
        .expect_err("a call that needs no approval");
    assert_eq!(not_held.code(), Code::NotFound);
    assert!(
        not_held
            .message()
            .contains("no call \"say\" held for a decision"),
        "{}",
        not_held.message()
    );
    let mut unspecified = decide(&job_id, true, "");
    unspecified.decision = v1::Decision::Unspecified.into();
    let code = api
        .decide_call(unspecified)
        .await
        .expect_err("no decision")
        .code();
    assert_eq!(code, Code::InvalidArgument);
    let other = decide("someone-0123456789abcdef0123456789ab", true, "");
    assert_eq!(
        api.decide_call(other).await.expect_err("no job").code(),
        Code::NotFound
    );

    let cancelled = api
        .cancel_job(v1::CancelJobRequest {
            job_id: job_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(cancelled.status(), v1::JobStatus::Cancelled);
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status(), v1::JobStatus::Cancelled);
    let late = api
        .decide_call(decide(&job_id, true, ""))
        .await
        .expect_err("after the end");
    assert_eq!(late.code(), Code::FailedPrecondition);
    Ok(())
}

#[tokio::test]
async fn eight_parallel_calls_three_held_decided_out_of_order_by_two_clients() -> anyhow::Result<()>
{
    let fleet = fleet().await?;
    let mut first = fleet.api(0).await?;
    let mut second = fleet.api(0).await?;
    let mut calls = Vec::new();
    for (i, expression) in ["1 + 1", "2 + 2", "3 + 3"].iter().enumerate() {
        calls.push(json!({"id": format!("calc{i}"), "name": "calculate",
                          "arguments": {"expression": expression}}));
    }
    for i in 0..5 {
        calls.push(json!({"id": format!("echo{i}"), "name": "echo", "arguments": {"n": i}}));
    }
    let script = json!([{"tool_calls": calls}, {"message": "done"}]);
    let mut request = scripted_job("eight at once", &script);
    request.require_approval = vec!["calculate".into()];
    let job_id = first.submit_job(request).await?.into_inner().job_id;
    parked(&first, &job_id).await?;

    let call = |id: &str, approve: bool, reason: &str| {
        let mut request = decide(&job_id, approve, reason);
        request.call_id = id.to_owned();
        request
    };
    // Out of order, from two clients at once; both race for calc2.
    let mut edited = call("calc1", true, "a bigger sum");
    edited.arguments = Some(r#"{"expression": "10 * 10"}"#.into());
    let (mut first_again, mut second_again) = (first.clone(), second.clone());
    let (a, b, c, d) = tokio::join!(
        first_again.decide_call(call("calc2", true, "first")),
        second_again.decide_call(call("calc2", false, "second")),
        second.decide_call(edited),
        first.decide_call(call("calc0", false, "no sums today")),
    );
    c?;
    d?;
    let winner = match (a, b) {
        (Ok(_), Err(lost)) => {
            assert!(
                lost.message().contains("already approved"),
                "{}",
                lost.message()
            );
            "approved"
        }
        (Err(lost), Ok(_)) => {
            assert!(
                lost.message().contains("already rejected"),
                "{}",
                lost.message()
            );
            "rejected"
        }
        (a, b) => anyhow::bail!("exactly one decision of calc2 wins: {a:?} / {b:?}"),
    };

    let job = wait_finished(&fleet.api(0).await?, &job_id).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{job:?}");
    let results = call_results(&job);
    assert_eq!(results.len(), 8);
    assert_eq!(results["calc0"]["error"]["code"], "REJECTED_BY_APPROVER");
    assert_eq!(
        results["calc0"]["error"]["message"],
        "a person rejected the call: no sums today"
    );
    assert_eq!(
        results["calc1"]["data"]["result"], 100,
        "ran with the approved arguments"
    );
    match winner {
        "approved" => assert_eq!(results["calc2"]["data"]["result"], 6),
        _ => assert_eq!(
            results["calc2"]["error"]["message"],
            "a person rejected the call: second"
        ),
    }
    for i in 0..5 {
        assert_eq!(results[&format!("echo{i}")]["data"]["n"], i, "echo{i}");
    }
    Ok(())
}

#[tokio::test]
async fn time_parked_does_not_count_against_the_deadline() -> anyhow::Result<()> {
    let fleet = fleet().await?;
    let mut api = fleet.api(0).await?;
    let mut request = two_calls(&["calculate"]);
    request.deadline_ms = 1_500;
    let job_id = api.submit_job(request).await?.into_inner().job_id;
    let job = job_in(&api, None, &job_id, v1::JobStatus::WaitingForApproval).await?;
    // Past the deadline (half a second past it), as a person takes their time.
    wait_until("the job's deadline to pass", WAIT, || async {
        toolfleet_service::clock::now_ms() >= job.created_at_ms + 2_000
    })
    .await?;
    api.decide_call(decide(&job_id, true, "")).await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    Ok(())
}

/// Short runner timers: a dead orchestrator's jobs move within seconds.
const FAST_TAKEOVER: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNNER__JOB_ACK_WAIT", "2s"),
    ("TOOLFLEET_RUNNER__LEASE_TTL", "1s"),
    ("TOOLFLEET_RUNNER__DRAIN_TIMEOUT", "1s"),
];

/// A job whose one call, with side effects on the counter `key`, is held.
fn counted(key: &str) -> v1::SubmitJobRequest {
    let script = json!([
        {"tool_calls": [{"id": "count", "name": "increment_counter", "arguments": {"key": key}}]},
        {"message": "{{count.data.value}}"}
    ]);
    let mut request = scripted_job("count once", &script);
    request.require_approval = vec!["increment_counter".into()];
    request
}

fn approve(job_id: &str) -> v1::DecideCallRequest {
    let mut request = decide(job_id, true, "go");
    request.call_id = "count".into();
    request
}

#[tokio::test]
async fn kill_9_of_orchestrators_while_parked_and_around_decisions_loses_and_repeats_nothing()
-> anyhow::Result<()> {
    const JOBS: usize = 6;
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 1).await?;
    let mut api = fleet.api(0).await?;
    let mut ids = Vec::new();
    // One more than is ever decided: it must never run.
    for job in 0..=JOBS {
        let request = counted(&format!("approved:{job}"));
        ids.push(api.submit_job(request).await?.into_inner().job_id);
    }
    for job_id in &ids {
        parked(&api, job_id).await?;
    }
    // Killed while every job is parked: nothing of theirs is in it.
    fleet.orchestrator(0).kill();
    let second = fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    let mut api = fleet.api(second).await?;
    for job_id in &ids[..JOBS / 2] {
        api.decide_call(approve(job_id)).await?;
    }
    // Killed as it takes the decided jobs up: between a decision and the
    // dispatch, or during it.
    fleet.orchestrator(second).kill();
    let third = fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    let mut api = fleet.api(third).await?;
    for job_id in &ids[JOBS / 2..JOBS] {
        api.decide_call(approve(job_id)).await?;
    }
    for (job, job_id) in ids[..JOBS].iter().enumerate() {
        let finished = wait_finished(&api, job_id).await?;
        assert_eq!(finished.status(), v1::JobStatus::Succeeded, "{finished:?}");
        assert_eq!(finished.output_text, "1", "job {job}");
        assert_eq!(
            fleet.counter(&format!("approved:{job}")).await?,
            1,
            "job {job} ran once"
        );
        // A retry of the decision is told the job's status; another
        // decision is refused, naming the first.
        let mut retry = approve(job_id);
        retry.reason = "go, again".into();
        let again = api.decide_call(retry).await?.into_inner();
        assert_eq!(again.status(), v1::JobStatus::Succeeded, "job {job}");
        let reject = decide(job_id, false, "no");
        let other = api
            .decide_call(v1::DecideCallRequest {
                call_id: "count".into(),
                ..reject
            })
            .await
            .expect_err("decided once");
        assert_eq!(other.code(), Code::FailedPrecondition);
        assert!(other.message().contains("already approved"), "{other:?}");
    }
    // The undecided job still waits, and its call never ran.
    let waiting = api
        .get_job(v1::GetJobRequest {
            job_id: ids[JOBS].clone(),
        })
        .await?
        .into_inner();
    assert_eq!(waiting.status(), v1::JobStatus::WaitingForApproval);
    assert_eq!(fleet.counter(&format!("approved:{JOBS}")).await?, 0);
    Ok(())
}

#[tokio::test]
async fn parked_jobs_outlive_a_nats_restart_and_a_redis_restart() -> anyhow::Result<()> {
    // Redis keeps its data across a restart (its append-only file).
    let redis = toolfleet_tests::RedisConfig {
        append_only: true,
        ..Default::default()
    };
    let mut fleet = Fleet::start(test_fleet(1).redis(redis)).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 1).await?;
    let mut api = fleet.api(0).await?;
    let mut ids = Vec::new();
    for job in 0..3 {
        let request = counted(&format!("restarts:{job}"));
        ids.push(api.submit_job(request).await?.into_inner().job_id);
    }
    for job_id in &ids {
        parked(&api, job_id).await?;
    }
    fleet.nats.server().restart().await?;
    fleet.redis.server().restart().await?;
    for (job, job_id) in ids.iter().enumerate() {
        // The API answers once Redis is back.
        let decided = wait_until("Redis to be back for DecideCall", WAIT, || {
            let mut api = api.clone();
            let request = approve(job_id);
            async move {
                api.decide_call(request)
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await?;
        assert_eq!(
            decided.status(),
            v1::JobStatus::WaitingForApproval,
            "job {job}"
        );
        let finished = wait_finished(&api, job_id).await?;
        assert_eq!(finished.status(), v1::JobStatus::Succeeded, "{finished:?}");
        assert_eq!(
            fleet.counter(&format!("restarts:{job}")).await?,
            1,
            "job {job} ran once"
        );
    }
    Ok(())
}

fn pending_page(size: u32, token: &str) -> v1::ListPendingApprovalsRequest {
    v1::ListPendingApprovalsRequest {
        page_size: size,
        page_token: token.to_owned(),
    }
}

#[tokio::test]
async fn pending_approvals_are_listed_oldest_first_a_page_at_a_time_and_decided_from_the_cli()
-> anyhow::Result<()> {
    let fleet = fleet().await?;
    let mut api = fleet.api(0).await?;
    let both = api.submit_job(two_calls(&["*"])).await?.into_inner().job_id;
    parked(&api, &both).await?;
    let one = api
        .submit_job(two_calls(&["calculate"]))
        .await?
        .into_inner()
        .job_id;
    parked(&api, &one).await?;

    let first = api
        .list_pending_approvals(pending_page(2, ""))
        .await?
        .into_inner();
    let second = api
        .list_pending_approvals(pending_page(2, &first.next_page_token))
        .await?
        .into_inner();
    let listed: Vec<(String, String)> = first
        .approvals
        .iter()
        .chain(&second.approvals)
        .map(|a| (a.job_id.clone(), a.call_id.clone()))
        .collect();
    let mut held_first = vec![
        (both.clone(), "math".to_owned()),
        (both.clone(), "say".to_owned()),
    ];
    held_first.sort();
    let mut first_two = listed[..2].to_vec();
    first_two.sort();
    assert_eq!(first_two, held_first, "oldest first");
    assert_eq!(listed[2], (one.clone(), "math".to_owned()));
    assert_eq!(listed.len(), 3);
    assert!(second.next_page_token.is_empty(), "{second:?}");
    assert_eq!(first.approvals[0].rule, "job");
    let bad = api
        .list_pending_approvals(pending_page(2, "nonsense"))
        .await;
    assert_eq!(
        bad.expect_err("a forged token").code(),
        Code::InvalidArgument
    );

    // The CLI lists them with the commands that decide them, and decides.
    let url = fleet.grpc_url(0).await?;
    let shown = run_toolfleet(&["approvals", "--addr", &url]).await?;
    assert!(
        shown.contains(&format!("toolfleet approve {one} math")),
        "{shown}"
    );
    run_toolfleet(&["approve", &both, "say", "--addr", &url]).await?;
    run_toolfleet(&[
        "reject", &both, "math", "--reason", "no sums", "--addr", &url,
    ])
    .await?;
    let job = wait_finished(&api, &both).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    assert_eq!(
        call_results(&job)["math"]["error"]["message"],
        "a person rejected the call: no sums"
    );
    assert_eq!(call_results(&job)["say"]["data"]["text"], "hi");
    // `get` shows who decided what, after how long.
    let shown = run_toolfleet(&["get", &both, "--addr", &url]).await?;
    assert!(shown.contains("held for a person:"), "{shown}");
    assert!(
        shown.contains("math calculate: approval, rejected by tenant default after"),
        "{shown}"
    );
    assert!(shown.contains(": \"no sums\""), "{shown}");
    assert!(
        shown.contains("say echo: approval, approved by tenant default after"),
        "{shown}"
    );
    // Decided calls leave the list.
    let left = api
        .list_pending_approvals(pending_page(0, ""))
        .await?
        .into_inner();
    let left: Vec<&str> = left.approvals.iter().map(|a| a.job_id.as_str()).collect();
    assert_eq!(left, [one.as_str()]);
    Ok(())
}

/// A fleet whose orchestrator authenticates with the tokens file `text`
/// (and `env`), once `token` sees the test tools.
async fn with_tokens(
    text: &str,
    token: &str,
    env: &[(&str, &str)],
) -> anyhow::Result<(tempfile::TempDir, Fleet, ApiClient)> {
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, text)?;
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let file = tokens.to_string_lossy().into_owned();
    let mut all = vec![
        ("TOOLFLEET_API__AUTH", "tokens"),
        ("TOOLFLEET_API__TOKENS_FILE", file.as_str()),
    ];
    all.extend_from_slice(env);
    fleet.spawn_orchestrator(&all).await?;
    let api = fleet.api(0).await?;
    wait_until("the test tools, asked as the tenant", WAIT, || {
        let mut api = api.clone();
        async move {
            let tools = api
                .list_tools(as_tenant(token, v1::ListToolsRequest::default()))
                .await;
            tools.is_ok_and(|t| t.get_ref().tools.iter().any(|t| t.name == "echo"))
        }
    })
    .await?;
    Ok((dir, fleet, api))
}

/// A fleet on the tokens file `text` (whose tenant holds every calculate
/// call) and a job `agent` submitted, parked on its held call as `watcher`
/// sees it.
async fn held_job(
    text: &str,
    agent: &str,
    watcher: &str,
) -> anyhow::Result<(tempfile::TempDir, Fleet, ApiClient, String)> {
    let (dir, fleet, mut api) = with_tokens(text, agent, &[]).await?;
    let job_id = api
        .submit_job(as_tenant(agent, two_calls(&[])))
        .await?
        .into_inner()
        .job_id;
    job_in(
        &api,
        Some(watcher),
        &job_id,
        v1::JobStatus::WaitingForApproval,
    )
    .await?;
    Ok((dir, fleet, api, job_id))
}

/// What the orchestrator takes `token` for (`WhoAmI`).
async fn who_am_i(api: &mut ApiClient, token: &str) -> anyhow::Result<v1::WhoAmIResponse> {
    let request = as_tenant(token, v1::WhoAmIRequest {});
    Ok(api.who_am_i(request).await?.into_inner())
}

/// Another tenant (`other`) neither sees the held call of `job_id` nor
/// decides it: it is `NOT_FOUND`.
async fn another_tenant_neither_sees_nor_decides(
    api: &mut ApiClient,
    other: &str,
    job_id: &str,
) -> anyhow::Result<()> {
    let theirs = api
        .list_pending_approvals(as_tenant(other, pending_page(0, "")))
        .await?
        .into_inner();
    assert!(theirs.approvals.is_empty(), "{theirs:?}");
    let refused = api
        .decide_call(as_tenant(other, decide(job_id, true, "")))
        .await
        .expect_err("another tenant's call");
    assert_eq!(refused.code(), Code::NotFound);
    Ok(())
}

/// The agent's own token (`bot`) is the tenant's but no approver's: it
/// may neither list held calls nor approve, reject or give a verdict.
async fn no_approver_decides(api: &mut ApiClient, bot: &str, job_id: &str) -> anyhow::Result<()> {
    let listing = api
        .list_pending_approvals(as_tenant(bot, pending_page(0, "")))
        .await
        .expect_err("not an approver");
    assert_eq!(listing.code(), Code::PermissionDenied, "{listing:?}");
    for decision in [
        decide(job_id, true, ""),
        decide(job_id, false, "no"),
        verdict(job_id, "math", v1::Decision::Applied),
    ] {
        let refused = api
            .decide_call(as_tenant(bot, decision))
            .await
            .expect_err("not an approver");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }
    Ok(())
}

/// The job, watched as `bot`, succeeds, its decision's event naming the
/// approver, the tenant, the decision and its reason.
async fn the_decision_names_its_approver(
    api: &mut ApiClient,
    bot: &str,
    job_id: &str,
) -> anyhow::Result<()> {
    let mut stream = api
        .watch_job(as_tenant(
            bot,
            v1::WatchJobRequest {
                job_id: job_id.to_owned(),
                from_offset: 0,
            },
        ))
        .await?
        .into_inner();
    let mut decided = None;
    while let Some(event) = stream.message().await? {
        if event.kind == "tool_call_decided" {
            decided = Some(serde_json::from_str::<Value>(&event.data)?);
        }
        if event.r#final {
            assert_eq!(event.kind, "job_succeeded", "{}", event.data);
            break;
        }
    }
    let decided = decided.expect("a tool_call_decided event");
    assert_eq!(decided["approver"], "Ana Lima");
    assert_eq!(decided["tenant"], "ops");
    assert_eq!(decided["decision"], "approved");
    assert_eq!(decided["reason"], "checked");
    Ok(())
}

/// A tenant's approvers decide its held calls; its other tokens (the
/// agent's that submitted the job) neither decide nor list them, and
/// another tenant sees nothing.
#[tokio::test]
async fn decisions_name_who_decided_and_only_the_tenants_approvers_decide() -> anyhow::Result<()> {
    use toolfleet_orchestrator::auth::token_sha256;
    let (ops, bo, bot, other) = (
        "tok-ops-41d2",
        "tok-bo-c3f1",
        "tok-bot-9e07",
        "tok-other-5a3c",
    );
    // The tenant asks approval of every calculate call; its people decide.
    let text = format!(
        "[tenants.ops]\ntoken_sha256 = [\"{}\", \"{}\", \"{}\"]\n\
         require_approval = [\"calculate\"]\n\
         approvers = {{ \"{}\" = \"Ana Lima\", \"{}\" = \"Bo Ek\" }}\n\n\
         [tenants.other]\ntoken_sha256 = [\"{}\"]\n",
        token_sha256(ops),
        token_sha256(bo),
        token_sha256(bot),
        token_sha256(ops),
        token_sha256(bo),
        token_sha256(other)
    );
    // The job asks nothing; the tenant's rule holds its calculate call.
    let (_dir, _fleet, mut api, job_id) = held_job(&text, bot, bot).await?;

    another_tenant_neither_sees_nor_decides(&mut api, other, &job_id).await?;
    // The approvers form: its approvers approve and operate, the rest
    // submit and read.
    let ana = who_am_i(&mut api, ops).await?;
    assert_eq!(
        (ana.tenant.as_str(), ana.person.as_str(), ana.roles),
        (
            "ops",
            "Ana Lima",
            vec!["approver".to_owned(), "operator".to_owned()]
        )
    );
    let agent = who_am_i(&mut api, bot).await?;
    assert_eq!(
        (agent.person.as_str(), agent.roles),
        ("", vec!["agent".to_owned(), "reader".to_owned()])
    );
    no_approver_decides(&mut api, bot, &job_id).await?;
    let ours = api
        .list_pending_approvals(as_tenant(ops, pending_page(0, "")))
        .await?
        .into_inner();
    assert_eq!(ours.approvals.len(), 1, "still held");
    assert_eq!(ours.approvals[0].rule, "tenant");
    assert_eq!(
        ours.approvals[0].reason,
        "the tenant requires approval of every call of calculate"
    );

    api.decide_call(as_tenant(ops, decide(&job_id, true, "checked")))
        .await?;
    let again = api
        .decide_call(as_tenant(bo, decide(&job_id, false, "no")))
        .await
        .expect_err("decided once");
    assert!(
        again
            .message()
            .contains("already approved by Ana Lima (tenant ops)"),
        "{}",
        again.message()
    );
    the_decision_names_its_approver(&mut api, bot, &job_id).await
}

/// Roles given in the tokens file: each credential does what its roles
/// say and nothing else; a refusal names the role the call needed, and
/// comes before any job is read (a reader's cancel of a job and of no job
/// read the same); an approver sees the held call, an operator (who gives
/// verdicts) does not.
#[tokio::test]
async fn each_credential_does_what_its_roles_say() -> anyhow::Result<()> {
    use toolfleet_orchestrator::auth::token_sha256;
    let (bot, ana, ops, eve) = ("tok-bot-1a", "tok-ana-2b", "tok-ops-3c", "tok-eve-4d");
    let text = format!(
        "[tenants.desk]\ntoken_sha256 = [\"{}\", \"{}\", \"{}\", \"{}\"]\n\
         require_approval = [\"calculate\"]\n\
         roles = {{ \"{}\" = [\"agent\"], \"{}\" = [\"approver\"], \"{}\" = [\"operator\"], \
         \"{}\" = [\"reader\"] }}\n",
        token_sha256(bot),
        token_sha256(ana),
        token_sha256(ops),
        token_sha256(eve),
        token_sha256(bot),
        token_sha256(ana),
        token_sha256(ops),
        token_sha256(eve),
    );
    let (_dir, fleet, mut api, job_id) = held_job(&text, bot, eve).await?;
    // Each may ask who it is: `toolfleet whoami` says the reader's role.
    let url = fleet.grpc_url(0).await?;
    let me = run_toolfleet(&["whoami", "--json", "--addr", &url, "--token", eve]).await?;
    let me: serde_json::Value = serde_json::from_str(&me)?;
    assert_eq!(
        me,
        json!({"tenant": "desk", "person": null, "roles": ["reader"]})
    );

    for token in [ana, ops, eve] {
        let refused = api
            .submit_job(as_tenant(token, two_calls(&[])))
            .await
            .expect_err("only an agent submits");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        assert!(
            refused
                .message()
                .starts_with("SubmitJob needs the role agent;"),
            "{refused:?}"
        );
    }
    let missing = "desk-0123456789abcdef0123456789ab";
    for id in [job_id.as_str(), missing] {
        let refused = api
            .cancel_job(as_tenant(
                eve,
                v1::CancelJobRequest {
                    job_id: id.to_owned(),
                },
            ))
            .await
            .expect_err("a reader cancels nothing");
        assert_eq!(refused.code(), Code::PermissionDenied, "{id}: {refused:?}");
        assert!(
            refused.message().contains("agent or operator"),
            "{refused:?}"
        );
    }
    let refused = api
        .list_pending_approvals(as_tenant(bot, pending_page(0, "")))
        .await
        .expect_err("an agent lists no held calls");
    assert!(
        refused
            .message()
            .contains("needs the role approver or operator"),
        "{refused:?}"
    );
    let verdicts = api
        .list_pending_approvals(as_tenant(ops, pending_page(0, "")))
        .await?
        .into_inner();
    assert!(
        verdicts.approvals.is_empty(),
        "an approval is no operator's: {verdicts:?}"
    );
    let held = api
        .list_pending_approvals(as_tenant(ana, pending_page(0, "")))
        .await?
        .into_inner();
    assert_eq!(held.approvals.len(), 1, "{held:?}");
    let refused = api
        .decide_call(as_tenant(ops, decide(&job_id, true, "")))
        .await
        .expect_err("an operator gives verdicts, not approvals");
    assert!(
        refused.message().contains("needs the role approver"),
        "{refused:?}"
    );
    api.decide_call(as_tenant(ana, decide(&job_id, true, "fine")))
        .await?;
    job_in(&api, Some(ops), &job_id, v1::JobStatus::Succeeded).await?;
    Ok(())
}

#[tokio::test]
async fn a_held_call_nobody_decides_expires_by_its_tenants_timeout() -> anyhow::Result<()> {
    use toolfleet_orchestrator::auth::token_sha256;
    let token = "tok-slow-77aa";
    let text = format!(
        "[tenants.slow]\ntoken_sha256 = [\"{}\"]\napproval_timeout = \"1s\"\n",
        token_sha256(token)
    );
    // The sweeper, which wakes a parked job at its first expiry, looks often.
    let env = [("TOOLFLEET_RUNNER__SWEEP_INTERVAL", "200ms")];
    let (_dir, _fleet, mut api) = with_tokens(&text, token, &env).await?;
    let job_id = api
        .submit_job(as_tenant(token, two_calls(&["calculate"])))
        .await?
        .into_inner()
        .job_id;
    job_in(
        &api,
        Some(token),
        &job_id,
        v1::JobStatus::WaitingForApproval,
    )
    .await?;
    let job = job_in(&api, Some(token), &job_id, v1::JobStatus::Succeeded).await?;
    assert!(
        job.output_text.contains("APPROVAL_EXPIRED"),
        "{}",
        job.output_text
    );
    let late = api
        .decide_call(as_tenant(token, decide(&job_id, true, "")))
        .await
        .expect_err("after its expiry");
    assert_eq!(late.code(), Code::FailedPrecondition);
    Ok(())
}

/// `decision` on the call `call_id` of `job_id`, with no reason,
/// arguments or result.
fn verdict(job_id: &str, call_id: &str, decision: v1::Decision) -> v1::DecideCallRequest {
    v1::DecideCallRequest {
        job_id: job_id.to_owned(),
        call_id: call_id.to_owned(),
        decision: decision.into(),
        reason: String::new(),
        arguments: None,
        result: None,
    }
}

/// Submits, asking on unknown outcomes, two calls that kill their worker
/// every time, restarting the dead workers until the job parks: each is
/// given up as MAX_DELIVERIES_EXCEEDED, and held for a verdict instead of
/// answered. Returns the job's id.
async fn park_two_poison_calls(fleet: &Fleet, api: &mut ApiClient) -> anyhow::Result<String> {
    let script = json!([
        {"tool_calls": [
            {"id": "charge", "name": "crash", "arguments": {}},
            {"id": "mail", "name": "crash", "arguments": {}}]},
        {"message": "{{charge.data.charged}} / {{mail.error.code}}: {{mail.error.message}}"}
    ]);
    let mut request = scripted_job("charge and mail", &script);
    request.on_unknown_outcome = "ask".into();
    let job_id = api.submit_job(request).await?.into_inner().job_id;
    tokio::select! {
        parked = parked(api, &job_id) => parked?,
        () = fleet.restart_dead_workers() => unreachable!("the restarter never ends"),
    }
    Ok(job_id)
}

/// Both calls asked for a verdict on their first attempt's
/// MAX_DELIVERIES_EXCEEDED, neither answered, both listed as pending
/// outcomes.
async fn both_wait_for_a_verdict(api: &mut ApiClient, job_id: &str) -> anyhow::Result<()> {
    let seen = events(api, job_id).await?;
    let asked: Vec<&Value> = seen
        .iter()
        .filter(|(kind, _)| kind == "tool_call_verdict_requested")
        .map(|(_, data)| data)
        .collect();
    assert_eq!(asked.len(), 2, "{seen:?}");
    assert!(
        asked
            .iter()
            .all(|data| data["code"] == "MAX_DELIVERIES_EXCEEDED" && data["attempt"] == 1),
        "{asked:?}"
    );
    assert!(!seen.iter().any(|(kind, _)| kind == "tool_call_result"));
    let pending = api
        .list_pending_approvals(pending_page(0, ""))
        .await?
        .into_inner()
        .approvals;
    assert_eq!(pending.len(), 2, "{pending:?}");
    assert!(
        pending
            .iter()
            .all(|p| p.kind == "outcome" && p.attempt == 1)
    );
    assert!(pending[0].outcome.contains("MAX_DELIVERIES_EXCEEDED"));
    Ok(())
}

/// A decision of the wrong kind, a failure without a reason, a result
/// that is not JSON: each refused, naming what to send.
async fn wrong_verdicts_are_refused(api: &mut ApiClient, job_id: &str) -> anyhow::Result<()> {
    let approve = api
        .decide_call(verdict(job_id, "charge", v1::Decision::Approve))
        .await
        .expect_err("an approval for an unknown outcome");
    assert_eq!(approve.code(), Code::InvalidArgument);
    assert!(
        approve.message().contains("DECISION_APPLIED"),
        "{approve:?}"
    );
    let no_reason = api
        .decide_call(verdict(job_id, "mail", v1::Decision::Fail))
        .await
        .expect_err("a failure without a reason");
    assert!(no_reason.message().contains("reason"), "{no_reason:?}");
    let mut not_json = verdict(job_id, "charge", v1::Decision::Applied);
    not_json.result = Some("{charged".into());
    let not_json = api.decide_call(not_json).await.expect_err("not JSON");
    assert!(
        not_json.message().contains("result: is not JSON"),
        "{not_json:?}"
    );
    Ok(())
}

/// `charge` applied with the operator's result (a second verdict is told
/// the first while the other call waits), `mail` failed with a reason.
async fn give_the_verdicts(api: &mut ApiClient, job_id: &str) -> anyhow::Result<()> {
    let mut applied = verdict(job_id, "charge", v1::Decision::Applied);
    applied.result = Some(r#"{"charged": 5}"#.into());
    api.decide_call(applied).await?;
    // While the other call waits, the job cannot end: a second verdict is
    // told the first.
    let again = api
        .decide_call(verdict(job_id, "charge", v1::Decision::NotApplied))
        .await
        .expect_err("a second verdict");
    assert_eq!(again.code(), Code::FailedPrecondition);
    assert!(again.message().contains("already applied"), "{again:?}");
    let mut failed = verdict(job_id, "mail", v1::Decision::Fail);
    failed.reason = "the mail server was down".into();
    api.decide_call(failed).await?;
    Ok(())
}

/// The results are the operator's, and say so, in the events and in
/// GetJob's held calls (with the operator's result); the workers' own
/// stored envelopes are left as they wrote them.
async fn the_results_are_the_operators(
    api: &ApiClient,
    job_id: &str,
    job: &v1::Job,
) -> anyhow::Result<()> {
    let seen = events(api, job_id).await?;
    let sources: Vec<(&Value, &Value)> = seen
        .iter()
        .filter(|(kind, _)| kind == "tool_call_result")
        .map(|(_, data)| (&data["call_id"], &data["source"]))
        .collect();
    assert_eq!(sources.len(), 2, "{seen:?}");
    assert!(
        sources.iter().all(|(_, source)| *source == "operator"),
        "{sources:?}"
    );
    let decided: Vec<&Value> = seen
        .iter()
        .filter(|(kind, _)| kind == "tool_call_decided")
        .map(|(_, data)| &data["decision"])
        .collect();
    assert_eq!(decided, [&json!("applied"), &json!("failed")]);
    // GetJob has them too, with the operator's result.
    let held: Vec<(String, String, String, Option<String>)> = job
        .held_calls
        .iter()
        .map(|h| {
            (
                h.call_id.clone(),
                h.kind.clone(),
                h.decision.clone(),
                h.result.clone(),
            )
        })
        .collect();
    assert!(
        held.contains(&(
            "charge".into(),
            "outcome".into(),
            "applied".into(),
            Some(r#"{"charged": 5}"#.into())
        )),
        "{held:?}"
    );
    assert!(
        held.contains(&("mail".into(), "outcome".into(), "failed".into(), None)),
        "{held:?}"
    );
    Ok(())
}

/// Calls that kill their worker every time wait for an operator's
/// verdict; wrong verdicts are refused, the first verdict wins, and the
/// model gets the operator's result and failure.
#[tokio::test]
async fn poison_calls_wait_for_an_operator_whose_verdict_the_model_gets() -> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1).worker_env(FAST_REDELIVERY)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["crash"], 1).await?;
    let mut api = fleet.api(0).await?;
    let job_id = park_two_poison_calls(&fleet, &mut api).await?;
    both_wait_for_a_verdict(&mut api, &job_id).await?;
    wrong_verdicts_are_refused(&mut api, &job_id).await?;
    give_the_verdicts(&mut api, &job_id).await?;

    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    assert_eq!(
        job.output_text,
        "5 / FAILED_BY_OPERATOR: an operator failed the call: the mail server was down"
    );
    the_results_are_the_operators(&api, &job_id, &job).await
}

#[tokio::test]
async fn an_unknown_outcome_the_operator_says_was_not_applied_runs_again_once() -> anyhow::Result<()>
{
    let mut fleet = Fleet::start(test_fleet(2).worker_env(FAST_REDELIVERY)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["set_flag"], 2).await?;
    let mut api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "flag", "name": "set_flag",
                         "arguments": {"key": "verdict:flag", "delay_ms": 2000}}]},
        {"message": "{{flag.ok}}"}
    ]);
    let mut request = scripted_job("set the flag", &script);
    request.on_unknown_outcome = "ask".into();
    let job_id = api.submit_job(request).await?.into_inner().job_id;
    // The effect happens, then its worker dies before the result: the
    // other worker cannot tell (set_flag has no probe): OUTCOME_UNKNOWN.
    let runner = wait_until("a worker to run the call", WAIT, || async {
        fleet
            .workers()
            .iter()
            .position(|w| w.log_tail(100_000).contains("executing call"))
    })
    .await?;
    wait_until("the flag", WAIT, || async {
        fleet.counter("verdict:flag").await.is_ok_and(|v| v == 1)
    })
    .await?;
    fleet.worker(runner).kill();
    parked(&api, &job_id).await?;
    let seen = events(&api, &job_id).await?;
    let (_, asked) = seen
        .iter()
        .find(|(kind, _)| kind == "tool_call_verdict_requested")
        .expect("a verdict request");
    assert_eq!(asked["code"], "OUTCOME_UNKNOWN", "{asked}");

    // Not applied, says the operator, from the CLI; and the orchestrator
    // dies at once: whichever runs the job next runs attempt 2, once.
    let url = fleet.grpc_url(0).await?;
    let said = run_toolfleet(&["resolve", &job_id, "flag", "not-applied", "--addr", &url]).await?;
    assert!(said.contains("resolved as not applied"), "{said}");
    fleet.orchestrator(0).kill();
    fleet.orchestrator(0).respawn()?;
    let api = fleet.api(0).await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    assert_eq!(job.output_text, "true");
    assert_eq!(
        fleet.count_in_worker_logs("executing call"),
        2,
        "run once more, as the operator said"
    );
    let api = api;
    let seen = events(&api, &job_id).await?;
    let attempts: Vec<&Value> = seen
        .iter()
        .filter(|(kind, _)| kind == "tool_call_dispatched")
        .map(|(_, data)| &data["attempt"])
        .collect();
    assert_eq!(attempts, [&json!(1), &json!(2)], "{seen:?}");
    let (_, result) = seen
        .iter()
        .find(|(kind, _)| kind == "tool_call_result")
        .expect("a result");
    // The worker's answer to attempt 2: no source of its own.
    assert_eq!(
        (result["ok"].clone(), result.get("source")),
        (json!(true), None)
    );
    Ok(())
}
