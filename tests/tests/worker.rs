//! The worker fleet against real nats-server and redis-server processes, with
//! `toolfleet-worker` binaries as the workers.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_nats::jetstream;
use serde_json::{Value, json};
use toolfleet_proto::names;
use toolfleet_tests::fleet::{Fleet, Nats, call, test_fleet};
use toolfleet_tests::wait_until;

const RESULT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_call_is_executed_by_one_of_two_workers_and_answered_twice_over() -> anyhow::Result<()> {
    let fleet = Fleet::start(test_fleet(2).worker_env(&[("TOOLFLEET_POOL", "general")])).await?;
    let mut results = fleet.results("job-calc").await?;
    let calc = call(
        "job-calc",
        "call_1",
        "calculate",
        r#"{"expression":"2*(3+4)-1"}"#,
    );
    fleet.publish_call(&calc).await?;

    let received = results.next(RESULT).await?;
    assert_eq!(received.call_id, "call_1");
    let expected = json!({"ok": true, "data": {"expression": "2*(3+4)-1", "result": 13}});
    assert_eq!(serde_json::from_str::<Value>(&received.body)?, expected);
    // The same envelope is stored in Redis, the source of truth.
    assert_eq!(fleet.stored_result(&calc).await?, Some(received.envelope));

    // Exactly one of the two workers executed it.
    let executed: Vec<_> = fleet
        .workers()
        .iter()
        .filter(|w| w.log_tail(10_000).contains("executing call"))
        .collect();
    assert_eq!(executed.len(), 1, "exactly one worker executes the call");

    // Both workers announce their tools in the registry, with their pool.
    let js = jetstream::new(fleet.client.clone());
    let registry = js.get_key_value(names::REGISTRY_BUCKET).await?;
    for worker in ["worker-0", "worker-1"] {
        for tool in [
            "calculate",
            "get_current_weather",
            "echo",
            "increment_counter",
        ] {
            let entry = registry.get(names::registry_key(tool, worker)).await?;
            let entry = entry.unwrap_or_else(|| panic!("{tool} of {worker} is not announced"));
            let announcement: toolfleet_proto::WorkerAnnouncement = serde_json::from_slice(&entry)?;
            assert_eq!(announcement.manifest.name, tool);
            // Its pool (the `pool` key); none of these comes from an MCP
            // server.
            assert_eq!(announcement.pool, "general");
            assert_eq!(announcement.mcp_server, "");
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_thousand_calls_over_two_workers_each_run_exactly_once() -> anyhow::Result<()> {
    const CALLS: usize = 1000;
    let fleet = Fleet::start(test_fleet(2)).await?;
    let mut results = fleet.results("job-many").await?;
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let args = json!({"key": format!("counter:{i}")}).to_string();
            call("job-many", &format!("call_{i}"), "increment_counter", &args)
        })
        .collect();
    let publishes = calls.iter().map(|c| fleet.publish_call(c));
    futures::future::try_join_all(publishes).await?;

    let mut answered = HashSet::new();
    while answered.len() < CALLS {
        let received = results.next(RESULT).await?;
        assert!(received.envelope.is_ok(), "{}", received.body);
        answered.insert(received.call_id);
    }
    for i in 0..CALLS {
        assert_eq!(
            fleet.counter(&format!("counter:{i}")).await?,
            1,
            "counter {i}"
        );
    }
    // Both workers took a share: the consumer is shared, not duplicated.
    for worker in fleet.workers() {
        assert!(
            worker.log_tail(100_000).contains("executing call"),
            "{} executed nothing",
            worker.name()
        );
    }
    Ok(())
}

#[tokio::test]
async fn the_same_call_delivered_twice_runs_once_and_is_answered_twice() -> anyhow::Result<()> {
    // A short lease, so a concurrent duplicate is looked at again quickly.
    let fleet =
        Fleet::start(test_fleet(2).worker_env(&[("TOOLFLEET_RUNTIME__CLAIM_LEASE", "1s")])).await?;
    let mut results = fleet.results("job-dup").await?;

    // One after the other: the second delivery finds the stored result.
    let first = call(
        "job-dup",
        "call_seq",
        "increment_counter",
        r#"{"key":"dup:seq"}"#,
    );
    fleet.publish_duplicate(&first).await?;
    let a = results.next(RESULT).await?;
    fleet.publish_duplicate(&first).await?;
    let b = results.next(RESULT).await?;
    assert_eq!(a.body, b.body, "the same envelope both times");
    assert!(!a.dedup_hit && b.dedup_hit);
    assert_eq!(fleet.counter("dup:seq").await?, 1);

    // At the same time: one delivery executes, the other waits for its result.
    let second = call(
        "job-dup",
        "call_par",
        "increment_counter",
        r#"{"key":"dup:par"}"#,
    );
    fleet.publish_duplicate(&second).await?;
    fleet.publish_duplicate(&second).await?;
    let c = results.next(RESULT).await?;
    let d = results.next(RESULT).await?;
    assert_eq!(c.body, d.body);
    assert_eq!(fleet.counter("dup:par").await?, 1);
    Ok(())
}

#[tokio::test]
async fn a_read_only_call_first_runs_without_a_claim_and_the_first_stored_result_answers()
-> anyhow::Result<()> {
    use toolfleet_proto::envelope::arguments_sha256;
    use toolfleet_proto::names::RedisKeys;

    let fleet = Fleet::start(test_fleet(1)).await?;
    let mut results = fleet.results("job-ro").await?;
    let echo = call("job-ro", "c1", "echo", r#"{"text":"hi"}"#);
    fleet.publish_duplicate(&echo).await?;
    let first = results.next(RESULT).await?;
    assert!(!first.dedup_hit);
    assert_eq!(
        first.envelope,
        toolfleet_proto::Envelope::Ok(json!({"text": "hi"}))
    );
    // Its only write is its result (decision 0060): no claim, no count of
    // claims.
    let keys = RedisKeys::default();
    let (job, tool, id, attempt) = (&echo.job_id, &echo.tool, &echo.call_id, echo.attempt);
    let mut redis = fleet.redis.connection().await?;
    let claims: u32 = redis::cmd("EXISTS")
        .arg(keys.call_claim(job, tool, id, attempt))
        .arg(keys.call_claims(job, tool, id, attempt))
        .query_async(&mut redis)
        .await?;
    assert_eq!(claims, 0, "a claim was taken");

    // Another first delivery of the same attempt (a message published
    // again) runs again, as a read-only call may; the result stored first
    // is its answer, never its own.
    let stored_first = json!({
        "tool": "echo",
        "arguments_sha256": arguments_sha256(&echo.arguments),
        "envelope": {"ok": true, "data": {"text": "stored first"}},
    });
    let () = redis::cmd("SET")
        .arg(keys.call_result(job, tool, id, attempt))
        .arg(stored_first.to_string())
        .query_async(&mut redis)
        .await?;
    fleet.publish_duplicate(&echo).await?;
    let second = results.next(RESULT).await?;
    assert!(second.dedup_hit);
    assert_eq!(
        second.envelope,
        toolfleet_proto::Envelope::Ok(json!({"text": "stored first"}))
    );
    assert_eq!(fleet.count_in_worker_logs("executing call"), 2, "ran twice");
    Ok(())
}

#[tokio::test]
async fn invalid_arguments_are_answered_without_running_the_tool() -> anyhow::Result<()> {
    let fleet = Fleet::start(test_fleet(1)).await?;
    let mut results = fleet.results("job-bad").await?;
    let cases = [
        ("wrong_type", "increment_counter", r#"{"key": 5}"#),
        (
            "extra_property",
            "increment_counter",
            r#"{"key": "bad:x", "shell": "rm -rf /"}"#,
        ),
        ("missing_field", "increment_counter", r"{}"),
        ("not_json", "increment_counter", "key=bad:x"),
        (
            "bad_enum",
            "get_current_weather",
            r#"{"location": "Boston, MA", "unit": "kelvin"}"#,
        ),
        (
            "business_rule",
            "get_current_weather",
            r#"{"location": "B", "unit": "celsius"}"#,
        ),
        (
            "not_arithmetic",
            "calculate",
            r#"{"expression": "__import__('os').system('id')"}"#,
        ),
    ];
    for (id, tool, args) in cases {
        fleet.publish_call(&call("job-bad", id, tool, args)).await?;
    }
    let mut seen = HashMap::new();
    for _ in cases {
        let received = results.next(RESULT).await?;
        let error = received.envelope.error().cloned();
        seen.insert(received.call_id, error);
    }
    for (id, _, _) in cases {
        let error = seen[id]
            .as_ref()
            .unwrap_or_else(|| panic!("{id} succeeded"));
        assert_eq!(
            error.code.as_str(),
            "INVALID_TOOL_ARGUMENTS",
            "{id}: {error:?}"
        );
        assert!(!error.retryable, "{id}");
    }
    // The side-effecting tool never ran: no counter key was ever written.
    let mut redis = fleet.redis.connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("bad:*")
        .query_async(&mut redis)
        .await?;
    assert!(keys.is_empty(), "{keys:?}");
    // Schema failures never reach a tool; business rules are the tool's own.
    let log = fleet.worker(0).log_tail(10_000);
    let invoked: Vec<_> = log
        .lines()
        .filter(|l| l.contains("executing call"))
        .collect();
    assert_eq!(
        invoked.len(),
        2,
        "only the two schema-valid calls ran: {invoked:#?}"
    );
    assert!(
        invoked
            .iter()
            .all(|l| !l.contains("increment_counter") && !l.contains("bad_enum"))
    );
    Ok(())
}

#[tokio::test]
async fn an_unknown_tool_is_never_executed_nor_claimed_nor_answered() -> anyhow::Result<()> {
    let fleet = Fleet::start(test_fleet(1)).await?;
    let mut results = fleet.results("job-unknown").await?;

    // On its own subject, nothing consumes it: it waits in the stream.
    fleet
        .publish_call(&call(
            "job-unknown",
            "shell_1",
            "run_shell",
            r#"{"cmd": "id"}"#,
        ))
        .await?;
    // Smuggled onto a served tool's subject, the worker drops it before the
    // claim, and without an answer: it is not this worker's to answer.
    let shell = call("job-unknown", "shell_2", "run_shell", r#"{"cmd": "id"}"#);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(names::headers::MSG_ID, shell.msg_id().as_str());
    let js = jetstream::new(fleet.client.clone());
    js.publish_with_headers(
        names::call_subject("echo"),
        headers,
        serde_json::to_vec(&shell)?.into(),
    )
    .await?
    .await?;
    // A real tool's name in the body does not help a call on another
    // subject: it is another tool's call, misrouted, and dropped too.
    let counter = call(
        "job-unknown",
        "counter_1",
        "increment_counter",
        r#"{"key":"smuggled"}"#,
    );
    js.publish(
        names::call_subject("echo"),
        serde_json::to_vec(&counter)?.into(),
    )
    .await?
    .await?;
    fleet
        .worker(0)
        .wait_until("both smuggled calls dropped", RESULT, || async {
            fleet.count_in_worker_logs(DROPPED) >= 2
        })
        .await?;

    // The next answer on the job's reply subject is a real echo call's:
    // neither dropped call was answered.
    fleet
        .publish_call(&call("job-unknown", "echo_1", "echo", r#"{"text":"hi"}"#))
        .await?;
    let received = results.next(RESULT).await?;
    assert_eq!(received.call_id, "echo_1");
    assert!(received.envelope.is_ok(), "{}", received.body);
    assert_eq!(fleet.counter("smuggled").await?, 0);
    // Nothing reached the ledger, so nothing is redelivered.
    for dropped in [&shell, &counter] {
        assert_eq!(fleet.stored_result(dropped).await?, None);
    }
    assert_eq!(fleet.count_in_worker_logs("redis unavailable"), 0);

    let mut stream = js.get_stream(names::CALL_STREAM).await?;
    let info = stream.info().await?;
    assert_eq!(
        info.state.messages, 1,
        "the run_shell call is still unconsumed, and the dropped calls are gone"
    );
    assert!(
        js.get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(
            names::call_consumer("run_shell"),
            names::CALL_STREAM
        )
        .await
        .is_err(),
        "no consumer exists for run_shell"
    );
    Ok(())
}

/// What a worker logs when it drops a call that is not its own.
const DROPPED: &str = "call for a tool this worker does not serve here dropped unanswered";

#[tokio::test]
async fn panics_and_timeouts_become_envelopes_and_the_worker_keeps_serving() -> anyhow::Result<()> {
    let fleet = Fleet::start(
        test_fleet(1).worker_env(&[("TOOLFLEET_RUNTIME__TOOL_TIMEOUTS__SLEEP", "300ms")]),
    )
    .await?;
    let mut results = fleet.results("job-crash").await?;

    fleet
        .publish_call(&call("job-crash", "boom", "panic", "{}"))
        .await?;
    let panicked = results.next(RESULT).await?;
    let error = panicked.envelope.error().expect("a panic is an error");
    assert_eq!(error.code.as_str(), "TOOL_EXECUTION_FAILED");
    assert!(!error.retryable);
    assert!(
        !panicked.body.contains("secret"),
        "internals leaked: {}",
        panicked.body
    );
    fleet
        .worker(0)
        .wait_for_log("tool panicked", RESULT)
        .await?;
    // The panic itself went through the structured log, with where it was.
    assert_eq!(
        fleet.count_in_worker_logs("toolfleet_service::telemetry: panicked"),
        1
    );

    fleet
        .publish_call(&call("job-crash", "slow", "sleep", r#"{"ms": 10000}"#))
        .await?;
    let timed_out = results.next(RESULT).await?;
    let error = timed_out.envelope.error().expect("a timeout is an error");
    assert_eq!(error.code.as_str(), "TOOL_TIMEOUT");
    assert!(error.retryable);

    fleet
        .publish_call(&call("job-crash", "after", "echo", r#"{"still": "alive"}"#))
        .await?;
    let echoed = results.next(RESULT).await?;
    assert_eq!(echoed.call_id, "after");
    assert_eq!(
        serde_json::from_str::<Value>(&echoed.body)?,
        json!({"ok": true, "data": {"still": "alive"}})
    );
    assert!(fleet.worker(0).is_running());
    Ok(())
}

#[tokio::test]
async fn calls_with_forged_ids_are_dropped_unrun_and_the_worker_keeps_serving() -> anyhow::Result<()>
{
    let fleet = Fleet::start(test_fleet(1)).await?;
    let victim = toolfleet_tests::fleet::job_id("job-victim");
    let mut victims_results = fleet.results(&victim).await?;
    let effect = r#"{"key":"forged-effect"}"#;
    type Spoil = (&'static str, fn(&mut toolfleet_proto::ToolCall));
    let forged: [Spoil; 5] = [
        // Used to panic the worker on every redelivery (a header value).
        ("job_id", |c| c.job_id = "job\r\nX-Injected: 1".into()),
        ("call_id", |c| c.call_id = "c\n1".into()),
        ("attempt", |c| c.attempt = 0),
        ("idempotency_key", |c| c.idempotency_key = "k e y".into()),
        // A result injected into another job's reply subject.
        ("reply_to", |c| {
            c.reply_to = Some(names::reply_subject(&toolfleet_tests::fleet::job_id(
                "job-victim",
            )))
        }),
    ];
    for (_, spoil) in forged {
        let mut bad = call("job-forger", "c1", "increment_counter", effect);
        spoil(&mut bad);
        // Without a message id header: that header is where a newline
        // would have gone.
        fleet.publish_duplicate(&bad).await?;
    }
    let mut results = fleet.results("job-after").await?;
    fleet
        .publish_call(&call("job-after", "after", "echo", r#"{"still": "alive"}"#))
        .await?;
    assert_eq!(results.next(RESULT).await?.call_id, "after");
    wait_until("every forged call dropped", RESULT, || async {
        fleet.count_in_worker_logs("invalid call message dropped") == forged.len()
    })
    .await?;
    assert_eq!(
        fleet.counter("forged-effect").await?,
        0,
        "a forged call ran"
    );
    assert!(
        victims_results
            .next(Duration::from_millis(200))
            .await
            .is_err(),
        "a result reached another job's reply subject"
    );
    assert!(fleet.worker(0).is_running());
    Ok(())
}

#[tokio::test]
async fn a_stored_result_answers_only_the_call_it_was_stored_for() -> anyhow::Result<()> {
    let fleet = Fleet::start(test_fleet(1)).await?;
    let mut results = fleet.results("job-bound").await?;
    let forged = call(
        "job-bound",
        "c1",
        "calculate",
        r#"{"expression":"1000000"}"#,
    );
    fleet.publish_call(&forged).await?;
    assert!(results.next(RESULT).await?.body.contains("1000000"));
    // The real call with the same ids and other arguments, delivered again
    // (no message id, as a redelivery would be): not answered from the
    // record stored for the forged one.
    let real = call("job-bound", "c1", "calculate", r#"{"expression":"2+2"}"#);
    fleet.publish_duplicate(&real).await?;
    wait_until("the worker to refuse the stored record", RESULT, || async {
        fleet.count_in_worker_logs("answers another call; not answered from it") == 1
    })
    .await?;
    assert!(
        results.next(Duration::from_millis(300)).await.is_err(),
        "the real call was answered with the forged call's result"
    );
    // The same call again is answered from its record, as before.
    fleet.publish_duplicate(&forged).await?;
    assert!(results.next(RESULT).await?.body.contains("1000000"));
    Ok(())
}

#[tokio::test]
async fn sigterm_during_a_slow_call_loses_nothing() -> anyhow::Result<()> {
    // Drain long enough: the slow call finishes before the worker exits.
    let fleet = Fleet::start(test_fleet(1)).await?;
    let mut results = fleet.results("job-term").await?;
    fleet
        .publish_call(&call("job-term", "finishes", "sleep", r#"{"ms": 1500}"#))
        .await?;
    fleet
        .worker(0)
        .wait_for_log("executing call", RESULT)
        .await?;
    fleet.worker(0).terminate()?;
    let finished = results.next(RESULT).await?;
    assert_eq!(finished.call_id, "finishes");
    assert!(finished.envelope.is_ok(), "{}", finished.body);
    let status = fleet.worker(0).wait_exit(RESULT).await?;
    assert!(status.success(), "drained worker exits 0: {status:?}");

    // Drain too short: the call is handed back and another worker runs it.
    let mut short =
        Fleet::start(test_fleet(1).worker_env(&[("TOOLFLEET_RUNTIME__DRAIN_TIMEOUT", "200ms")]))
            .await?;
    let mut results = short.results("job-term2").await?;
    short
        .publish_call(&call(
            "job-term2",
            "handed_back",
            "sleep",
            r#"{"ms": 3000}"#,
        ))
        .await?;
    short
        .worker(0)
        .wait_for_log("executing call", RESULT)
        .await?;
    short.worker(0).terminate()?;
    short.worker(0).wait_exit(RESULT).await?;
    assert!(
        short
            .worker(0)
            .log_tail(200)
            .contains("handing the remaining calls back")
    );
    let next = short.spawn_worker().await?;
    let redelivered = results.next(Duration::from_secs(30)).await?;
    assert_eq!(redelivered.call_id, "handed_back");
    assert!(redelivered.envelope.is_ok(), "{}", redelivered.body);
    assert!(short.worker(next).log_tail(1000).contains("executing call"));
    wait_until("the result to be stored", RESULT, || async {
        short
            .stored_result(&call("job-term2", "handed_back", "sleep", ""))
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_side_effecting_call_that_times_out_is_probed_not_retried_blindly() -> anyhow::Result<()>
{
    let fleet = Fleet::start(test_fleet(1).worker_env(&[
        (
            "TOOLFLEET_RUNTIME__TOOL_TIMEOUTS__INCREMENT_COUNTER",
            "300ms",
        ),
        ("TOOLFLEET_RUNTIME__TOOL_TIMEOUTS__SET_FLAG", "300ms"),
    ]))
    .await?;
    let mut results = fleet.results("job-slow-effect").await?;
    // The counter was incremented before the timeout: the probe says so.
    fleet
        .publish_call(&call(
            "job-slow-effect",
            "counted",
            "increment_counter",
            r#"{"key":"slow:counter","delay_ms":2000}"#,
        ))
        .await?;
    let counted = results.next(RESULT).await?;
    assert_eq!(
        serde_json::from_str::<Value>(&counted.body)?,
        json!({"ok": true, "data": {"key": "slow:counter", "value": 1, "recovered": true}})
    );
    // An orchestrator retry (attempt 2) of a side-effecting call asks the
    // probe first: the increment is not applied twice.
    let mut retry = call(
        "job-slow-effect",
        "counted",
        "increment_counter",
        r#"{"key":"slow:counter"}"#,
    );
    retry.attempt = 2;
    fleet.publish_call(&retry).await?;
    let retried = results.next(RESULT).await?;
    assert_eq!(
        serde_json::from_str::<Value>(&retried.body)?,
        json!({"ok": true, "data": {"key": "slow:counter", "value": 1, "recovered": true}})
    );
    // set_flag has no probe: the outcome is unknown, and not retryable.
    fleet
        .publish_call(&call(
            "job-slow-effect",
            "flagged",
            "set_flag",
            r#"{"key":"slow:flag","delay_ms":2000}"#,
        ))
        .await?;
    let flagged = results.next(RESULT).await?;
    let error = flagged.envelope.error().expect("an error");
    assert_eq!(error.code.as_str(), "OUTCOME_UNKNOWN");
    assert_eq!(error.side_effect.as_deref(), Some("unknown"));
    assert!(!error.retryable);
    // A tool without side effects times out as a plain, retryable TOOL_TIMEOUT
    // (covered by panics_and_timeouts_become_envelopes_and_the_worker_keeps_serving).
    assert_eq!(fleet.counter("slow:counter").await?, 1);
    Ok(())
}

/// A probe can be slow (its store failing over). The delivery that asks it
/// keeps its message and its claim alive meanwhile, as it does while the
/// tool runs: otherwise JetStream redelivers the call after `ack_wait`, the
/// second delivery takes the lapsed claim and asks the probe before the
/// first has run the call, both hear "not applied", and both run it.
#[tokio::test]
async fn a_slow_probe_keeps_its_claim_and_the_call_runs_once() -> anyhow::Result<()> {
    let fleet = Fleet::start(test_fleet(2).worker_env(&[
        ("TOOLFLEET_RUNTIME__ACK_WAIT", "1s"),
        ("TOOLFLEET_RUNTIME__CLAIM_LEASE", "500ms"),
    ]))
    .await?;
    let mut results = fleet.results("job-slow-probe").await?;
    // A retry (attempt 2) of a side-effecting call asks the probe first,
    // which answers "not applied" 2.5 s later: past ack_wait and the lease.
    let mut retry = call(
        "job-slow-probe",
        "counted",
        "increment_counter",
        r#"{"key":"slow-probe:counter","probe_delay_ms":2500}"#,
    );
    retry.attempt = 2;
    fleet.publish_call(&retry).await?;
    let answered = results.next(RESULT).await?;
    assert!(answered.envelope.is_ok(), "{}", answered.body);
    // A redelivery would have come 1 s in, and taken the claim at once:
    // by the answer, 2.5 s in, it would be counted.
    let claims_key = names::RedisKeys::default().call_claims(
        &retry.job_id,
        &retry.tool,
        &retry.call_id,
        retry.attempt,
    );
    let claims: Option<i64> = redis::cmd("GET")
        .arg(&claims_key)
        .query_async(&mut fleet.redis.connection().await?)
        .await?;
    assert_eq!(claims, Some(1), "one delivery took the claim");
    assert_eq!(
        fleet.counter("slow-probe:counter").await?,
        1,
        "the call ran once"
    );
    Ok(())
}

/// A worker serves every built-in and test tool, but only one of them has
/// work. That tool must get every execution slot the worker has: tools with
/// nothing to do hold none.
#[tokio::test]
async fn a_busy_tool_gets_every_slot_while_the_other_tools_are_idle() -> anyhow::Result<()> {
    busy_tool_takes_every_slot(&[]).await?;
    Ok(())
}

/// On a single-threaded runtime (`threads = 1`) the worker still runs its
/// I/O-bound calls at once, every slot of them.
#[tokio::test]
async fn a_single_threaded_worker_still_runs_every_slot_at_once() -> anyhow::Result<()> {
    let fleet = busy_tool_takes_every_slot(&[("TOOLFLEET_THREADS", "1")]).await?;
    // The configuration it logged at start.
    assert_eq!(fleet.count_in_worker_logs(r#""threads":1,"#), 1);
    Ok(())
}

/// More threads than `threads` allows is a bad configuration, said before
/// a thread starts, for both services.
#[tokio::test]
async fn too_many_threads_stop_a_service_at_start() -> anyhow::Result<()> {
    for binary in ["toolfleet-worker", "toolfleet-orchestrator"] {
        let output = tokio::process::Command::new(toolfleet_tests::cargo_bin(binary)?)
            .env("TOOLFLEET_THREADS", "100000000")
            .output()
            .await?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{binary}: {stderr}");
        assert!(
            stderr.contains("threads is 100000000; at most 1024"),
            "{binary}: {stderr}"
        );
    }
    Ok(())
}

/// Runs four calls per slot of `measure_concurrency` on one worker started
/// with `env`, and checks that as many ran at once as it has slots.
async fn busy_tool_takes_every_slot(env: &[(&str, &str)]) -> anyhow::Result<Fleet> {
    const SLOTS: usize = 8;
    const CALLS: usize = 4 * SLOTS;
    let slots = SLOTS.to_string();
    let mut env = env.to_vec();
    env.push(("TOOLFLEET_RUNTIME__MAX_IN_FLIGHT", slots.as_str()));
    let fleet = Fleet::start(test_fleet(1).worker_env(&env)).await?;
    let mut results = fleet.results("job-busy").await?;
    for n in 0..CALLS {
        let busy = call(
            "job-busy",
            &format!("call_{n}"),
            "measure_concurrency",
            r#"{"key": "busy", "ms": 300}"#,
        );
        fleet.publish_call(&busy).await?;
    }
    for _ in 0..CALLS {
        let answer = results.next(Duration::from_secs(120)).await?;
        assert!(answer.envelope.is_ok(), "{}", answer.body);
    }
    let most_key = toolfleet_worker::tools::testing::MeasureConcurrency::most_key("busy");
    let most = fleet.counter(&most_key).await?;
    println!("busy tool: calls {CALLS}, slots {SLOTS}, most running at once {most}");
    assert_eq!(
        most, SLOTS as i64,
        "the busy tool ran at most {most} calls at once on {SLOTS} slots"
    );
    Ok(fleet)
}

#[tokio::test]
async fn the_test_tools_flag_names_every_test_tool() -> anyhow::Result<()> {
    let redis = toolfleet_tests::RedisServer::start().await?;
    let toolbox = toolfleet_worker::tools::testing::toolbox(redis.connection().await?.into());
    for manifest in toolbox.manifests() {
        assert!(
            toolfleet_worker::tools::TEST_TOOLS_HELP.contains(&manifest.name),
            "{} is missing from the --test-tools help",
            manifest.name
        );
    }
    Ok(())
}

/// A tool's consumer that the setup step made keeps its own AckWait, which
/// a worker's `runtime.ack_wait` does not change: the worker keeps its calls
/// alive against the consumer's, so a call that runs longer than that
/// AckWait is delivered once.
#[tokio::test]
async fn calls_are_kept_alive_against_the_consumers_own_ack_wait() -> anyhow::Result<()> {
    let nats = toolfleet_tests::NatsServer::start().await?;
    let set_up =
        tokio::process::Command::new(toolfleet_tests::cargo_bin("toolfleet-orchestrator")?)
            .args(["setup", "--nats-url", &nats.url(), "--tools", "sleep"])
            .env("TOOLFLEET_SETUP__CALL_ACK_WAIT", "2s")
            .output()
            .await?;
    anyhow::ensure!(set_up.status.success(), "{set_up:?}");
    let client = nats.client().await?;
    let env = [("TOOLFLEET_RUNTIME__ACK_WAIT", "30s")];
    let fleet = Fleet::start_as(
        test_fleet(1)
            .on_nats(Nats::Server(nats.into()))
            .worker_env(&env),
        client,
    )
    .await?;
    assert_eq!(fleet.count_in_worker_logs("has its own AckWait"), 1);
    let mut results = fleet.results("job-ack-wait").await?;
    fleet
        .publish_call(&call("job-ack-wait", "nap", "sleep", r#"{"ms": 5000}"#))
        .await?;
    let answer = results.next(Duration::from_secs(30)).await?;
    assert!(answer.envelope.is_ok(), "{}", answer.body);
    let js = jetstream::new(fleet.client.clone());
    let stream = js.get_stream(names::CALL_STREAM).await?;
    let consumer = stream.consumer_info(names::call_consumer("sleep")).await?;
    // Every delivery, redeliveries included, takes a consumer sequence.
    assert_eq!(
        consumer.delivered.consumer_sequence, 1,
        "the call was delivered more than once"
    );
    assert_eq!(fleet.count_in_worker_logs("executing call"), 1);
    Ok(())
}
