//! Fault tests: processes die at any moment, and still no job or call is lost
//! and no side effect happens twice. Each test prints its counts at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use toolfleet_proto::v1::{self, item::Kind};
use toolfleet_tests::fleet::{ApiClient, Fleet};

/// Short timers so that redeliveries happen within a second: the claim lease
/// stays below AckWait, as in production.
const FAST_REDELIVERY: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNTIME__ACK_WAIT", "1s"),
    ("TOOLFLEET_RUNTIME__CLAIM_LEASE", "500ms"),
    ("TOOLFLEET_RUNTIME__MAX_DELIVERIES", "2"),
];

fn scripted(script: Value) -> v1::SubmitJobRequest {
    v1::SubmitJobRequest {
        input: "fault test".into(),
        model: Some(v1::ModelSpec {
            provider: "scripted".into(),
            script: script.to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn wait_finished(mut api: ApiClient, job_id: String) -> anyhow::Result<v1::Job> {
    let mut events = api
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.clone(),
            from_offset: 0,
        })
        .await?
        .into_inner();
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(event) = events.next().await {
            if event?.r#final {
                break;
            }
        }
        anyhow::Ok(())
    })
    .await??;
    Ok(api
        .get_job(v1::GetJobRequest { job_id })
        .await?
        .into_inner())
}

/// Restarts every worker that died, until the test ends. Returns nothing:
/// it runs until dropped.
async fn restart_dead_workers(fleet: &Fleet) {
    loop {
        for worker in fleet.workers() {
            if !worker.is_running() {
                let _ = worker.respawn();
                let _ = worker
                    .wait_for_log("worker ready", Duration::from_secs(30))
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn count_in_logs(fleet: &Fleet, needle: &str) -> usize {
    fleet
        .workers()
        .iter()
        .map(|w| w.log_tail(1_000_000).matches(needle).count())
        .sum()
}

#[tokio::test]
async fn a_poison_call_ends_its_job_with_max_deliveries_exceeded() -> anyhow::Result<()> {
    let mut fleet = Fleet::start_with(1, FAST_REDELIVERY).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["crash", "echo"], 1).await?;
    let api = fleet.api(0).await?;
    let job_id = api
        .clone()
        .submit_job(scripted(json!([
            {"tool_calls": [{"name": "crash", "arguments": {}}, {"name": "echo", "arguments": {"fine": true}}]},
            {"message": "{{call_0_0.error.code}}"}
        ])))
        .await?
        .into_inner()
        .job_id;
    let job = tokio::select! {
        job = wait_finished(api, job_id) => job?,
        () = restart_dead_workers(&fleet) => unreachable!("the restarter never ends"),
    };
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "MAX_DELIVERIES_EXCEEDED");
    // The echo call shared the worker with the poison call and died with it
    // each time, so it may be answered MAX_DELIVERIES_EXCEEDED too; it must
    // be answered either way.
    let crashes = count_in_logs(&fleet, "crash tool: aborting");
    assert_eq!(
        crashes, 2,
        "each of the allowed deliveries crashed once, then no more"
    );
    println!("poison call: jobs 1, calls 2, worker crashes {crashes}, duplicates found 0");
    Ok(())
}

#[tokio::test]
async fn killing_workers_in_a_loop_loses_no_call_and_repeats_no_effect() -> anyhow::Result<()> {
    const JOBS: usize = 100;
    let mut fleet = Fleet::start_with(3, FAST_REDELIVERY).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 3).await?;
    let api = fleet.api(0).await?;

    let mut jobs = Vec::new();
    for job in 0..JOBS {
        let round = |r: usize| {
            let calls: Vec<Value> = (0..3)
                .map(|k| {
                    json!({"name": "increment_counter",
                             "arguments": {"key": format!("chaos:{job}:{r}:{k}"), "delay_ms": 300}})
                })
                .collect();
            json!({"tool_calls": calls})
        };
        let script = json!([round(0), round(1), {"message": "done"}]);
        let job_id = api
            .clone()
            .submit_job(scripted(script))
            .await?
            .into_inner()
            .job_id;
        jobs.push(tokio::spawn(wait_finished(api.clone(), job_id)));
    }

    let kills = Arc::new(AtomicUsize::new(0));
    let chaos = async {
        let mut n = 0usize;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            n += 1;
            let victim = &fleet.workers()[n % fleet.workers().len()];
            if victim.is_running() {
                victim.kill();
                kills.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let all = futures::future::join_all(jobs);
    let finished = tokio::select! {
        finished = all => finished,
        () = chaos => unreachable!(),
        () = restart_dead_workers(&fleet) => unreachable!(),
    };
    let mut calls = 0;
    for (i, job) in finished.into_iter().enumerate() {
        let job = job??;
        assert_eq!(
            job.status,
            v1::JobStatus::Succeeded as i32,
            "job {i}: {job:?}"
        );
        calls += job
            .items
            .iter()
            .filter(|it| matches!(it.kind, Some(Kind::ToolResult(_))))
            .count();
    }
    let mut duplicates = 0;
    for job in 0..JOBS {
        for r in 0..2 {
            for k in 0..3 {
                let value = fleet.counter(&format!("chaos:{job}:{r}:{k}")).await?;
                assert!(
                    value <= 1,
                    "counter chaos:{job}:{r}:{k} is {value}: an effect ran twice"
                );
                if value > 1 {
                    duplicates += 1;
                }
                assert_eq!(
                    value, 1,
                    "counter chaos:{job}:{r}:{k} was never incremented"
                );
            }
        }
    }
    let recovered = count_in_logs(&fleet, "earlier execution was applied");
    let dedup_hits = count_in_logs(&fleet, "answered from the stored result");
    println!(
        "worker chaos: jobs {JOBS}, calls {calls}, kills {}, recovered by probe {recovered}, \
         dedup hits {dedup_hits}, duplicates found {duplicates}",
        kills.load(Ordering::SeqCst)
    );
    assert_eq!(calls, JOBS * 6);
    Ok(())
}
