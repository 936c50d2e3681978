//! Calls per second through two `toolfleet-worker` processes with the `echo`
//! tool, and raw NATS request/reply through the same server as the floor, in
//! one run. Build in release for meaningful numbers:
//!
//! ```text
//! cargo build --release --workspace --bins --examples
//! cargo run --release -p toolfleet-tests --example worker_throughput -- [CALLS] [IN_FLIGHT]
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use tokio::sync::{Semaphore, oneshot};
use toolfleet_proto::names;
use toolfleet_tests::fleet::{Fleet, call, test_fleet};

type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().map_or(Ok(20_000), |a| a.parse())?;
    let in_flight: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let fleet = Fleet::start(test_fleet(2).worker_env(&[
        ("TOOLFLEET_RUNTIME__MAX_IN_FLIGHT", "64"),
        ("RUST_LOG", "warn,toolfleet_worker::runtime=info"),
    ]))
    .await?;
    println!("2 workers, {calls} echo calls, {in_flight} in flight");

    // Warm up connections, consumers and caches.
    run_tool_calls(&fleet, "warmup", 500, in_flight).await?;
    let (tool_rate, mut tool_latency) = run_tool_calls(&fleet, "bench", calls, in_flight).await?;
    let (raw_rate, mut raw_latency) = run_raw_requests(&fleet, calls, in_flight).await?;

    println!(
        "tool calls  : {tool_rate:>9.0} calls/s   round trip {}",
        tool_latency.summary()
    );
    println!(
        "raw NATS r/r: {raw_rate:>9.0} req/s     round trip {}",
        raw_latency.summary()
    );
    println!(
        "ratio       : {:.1}% of raw request/reply",
        100.0 * tool_rate / raw_rate
    );
    Ok(())
}

async fn run_tool_calls(
    fleet: &Fleet,
    job: &str,
    calls: usize,
    in_flight: usize,
) -> anyhow::Result<(f64, Latencies)> {
    let mut results = fleet
        .client
        .subscribe(names::reply_subject(&toolfleet_tests::fleet::job_id(job)))
        .await?;
    fleet.client.flush().await?;
    let waiters: Waiters = Arc::default();
    let router = {
        let waiters = waiters.clone();
        tokio::spawn(async move {
            while let Some(message) = results.next().await {
                let Some(call_id) = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(names::headers::CALL_ID))
                    .map(|v| v.as_str().to_owned())
                else {
                    continue;
                };
                if let Some(waiter) = waiters.lock().expect("not poisoned").remove(&call_id) {
                    let _ = waiter.send(());
                }
            }
        })
    };
    let js = async_nats::jetstream::new(fleet.client.clone());
    let window = Arc::new(Semaphore::new(in_flight));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(calls);
    for i in 0..calls {
        let permit = window.clone().acquire_owned().await?;
        let call = call(job, &format!("c{i}"), "echo", r#"{"n":1}"#);
        let (tx, rx) = oneshot::channel();
        waiters
            .lock()
            .expect("not poisoned")
            .insert(call.call_id.clone(), tx);
        let js = js.clone();
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(names::headers::MSG_ID, call.msg_id().as_str());
            let payload = serde_json::to_vec(&call).expect("a call serializes");
            js.publish_with_headers(names::call_subject("echo"), headers, payload.into())
                .await?
                .await?;
            let answered = tokio::time::timeout(Duration::from_secs(30), rx).await;
            drop(permit);
            answered
                .map(|_| sent.elapsed())
                .context("a call was not answered within 30 s")
        }));
    }
    let mut latencies = Latencies::default();
    for task in tasks {
        latencies.0.push(task.await??);
    }
    let rate = calls as f64 / started.elapsed().as_secs_f64();
    router.abort();
    Ok((rate, latencies))
}

async fn run_raw_requests(
    fleet: &Fleet,
    calls: usize,
    in_flight: usize,
) -> anyhow::Result<(f64, Latencies)> {
    let responder_client = fleet.nats.client().await?;
    let mut requests = responder_client.subscribe("bench.raw").await?;
    responder_client.flush().await?;
    let responder = tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            if let Some(reply) = message.reply {
                let _ = responder_client.publish(reply, message.payload).await;
            }
        }
    });
    let window = Arc::new(Semaphore::new(in_flight));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(calls);
    for _ in 0..calls {
        let permit = window.clone().acquire_owned().await?;
        let client = fleet.client.clone();
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let reply = client.request("bench.raw", r#"{"n":1}"#.into()).await;
            drop(permit);
            reply.map(|_| sent.elapsed())
        }));
    }
    let mut latencies = Latencies::default();
    for task in tasks {
        latencies.0.push(task.await??);
    }
    let rate = calls as f64 / started.elapsed().as_secs_f64();
    responder.abort();
    Ok((rate, latencies))
}

#[derive(Default)]
struct Latencies(Vec<Duration>);

impl Latencies {
    fn summary(&mut self) -> String {
        self.0.sort();
        let at = |q: f64| self.0[((self.0.len() - 1) as f64 * q) as usize];
        format!("p50 {:?}  p99 {:?}", at(0.5), at(0.99))
    }
}
