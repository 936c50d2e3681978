//! `--first-token N`: how long the first piece of a streamed answer takes
//! from the model server to the client. A local server that speaks
//! Anthropic's Messages stream sends each answer's first text delta, notes
//! the instant it hands the bytes over, then the rest 20 ms later; the
//! bench's client watches each of N streamed jobs (one after the other) and
//! notes when its first `model_output_delta` arrives. Everything runs in
//! this process, so both instants are on one clock. docs/benchmarks.md
//! shows a run.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use toolfleet_cli::output::outln;
use toolfleet_fleet::local::LocalFleetOptions;
use toolfleet_fleet::{FleetBuilder, Serving};
use toolfleet_proto::v1;

use super::Api;
use super::args::BenchArgs;
use super::report::Percentiles;

/// What `--first-token` measured.
#[derive(Debug, Serialize)]
pub(super) struct FirstTokenReport {
    /// Streamed jobs measured.
    jobs: usize,
    /// From the model server handing over the first delta's bytes to the
    /// client receiving it as a `model_output_delta`.
    first_token: Percentiles,
    /// From submitting to the final event, for comparison.
    job: Percentiles,
}

/// The model server's side: when it handed over each answer's first
/// delta, and the permits it waits for before it does (one per job, given
/// once the client watches, so that no delta goes out before anyone
/// listens).
#[derive(Clone)]
struct FirstBytes {
    sent: Arc<Mutex<Vec<Instant>>>,
    go: Arc<tokio::sync::Semaphore>,
}

impl Default for FirstBytes {
    fn default() -> Self {
        Self {
            sent: Arc::default(),
            go: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }
}

/// The stream of one answer: its first text delta, then the rest.
const FIRST: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_bench\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"bench\",\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n";
const REST: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" there.\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":3}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// Runs `--first-token jobs` and prints its report.
pub(super) async fn run(args: &BenchArgs, jobs: usize) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let first_bytes = FirstBytes::default();
    let server = serve_model(first_bytes.clone(), stop.clone()).await?;
    eprintln!(
        "starting a local fleet (nats-server, redis-server, 1 orchestrator, 1 worker, in this \
         process), its model a streaming server at {server}..."
    );
    let mut options = LocalFleetOptions::default();
    options.orchestrator.anthropic.http.base_url = server;
    options.orchestrator.anthropic.http.api_key = Some("bench".to_owned());
    options.orchestrator.anthropic.http.api_key_file = None;
    let fleet = FleetBuilder::new()
        .workers(1)
        .serving(Serving::BuiltIn)
        .start_in_process(options)
        .await?;
    let measured = measure(&fleet.grpc_addr(), jobs, &first_bytes).await;
    fleet.shutdown().await;
    let report = measured?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!(
            "streamed answers, one at a time, {} jobs:\n  first token         p50 {:>7.2} ms   p90 {:>7.2} ms   p99 {:>7.2} ms\n  whole job           p50 {:>7.2} ms   p90 {:>7.2} ms   p99 {:>7.2} ms\n",
            report.jobs,
            report.first_token.p50_ms,
            report.first_token.p90_ms,
            report.first_token.p99_ms,
            report.job.p50_ms,
            report.job.p90_ms,
            report.job.p99_ms,
        )?;
    }
    if let Some(path) = &args.json_file {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Runs `jobs` streamed jobs one after the other (after 10 to warm up).
async fn measure(
    address: &str,
    jobs: usize,
    first_bytes: &FirstBytes,
) -> anyhow::Result<FirstTokenReport> {
    let api = Api::connect(address.to_owned()).await?;
    eprintln!("warming up (10 jobs)...");
    for _ in 0..10 {
        one_job(&api, first_bytes).await?;
    }
    eprintln!("first token: {jobs} streamed jobs, one at a time...");
    let mut first = Vec::with_capacity(jobs);
    let mut whole = Vec::with_capacity(jobs);
    for _ in 0..jobs {
        let (token, job) = one_job(&api, first_bytes).await?;
        first.push(token);
        whole.push(job);
    }
    Ok(FirstTokenReport {
        jobs,
        first_token: Percentiles::of(first),
        job: Percentiles::of(whole),
    })
}

/// One streamed job: from the server's first byte to the client's first
/// delta, and from submitting to the final event.
async fn one_job(api: &Api, first_bytes: &FirstBytes) -> anyhow::Result<(Duration, Duration)> {
    let submitted = Instant::now();
    let job_id = api
        .clone()
        .submit_job(v1::SubmitJobRequest {
            input: "Hello".into(),
            model: Some(v1::ModelSpec {
                provider: "anthropic-messages".into(),
                name: "bench".into(),
                ..Default::default()
            }),
            stream: Some(true),
            ..Default::default()
        })
        .await?
        .into_inner()
        .job_id;
    let mut events = api
        .clone()
        .watch_job(v1::WatchJobRequest {
            job_id,
            from_offset: 0,
        })
        .await?
        .into_inner();
    let mut first_delta = None;
    let mut released = false;
    while let Some(event) = events.message().await? {
        // The watch listens: the model may answer.
        if !released {
            first_bytes.go.add_permits(1);
            released = true;
        }
        if event.kind == "model_output_delta" && first_delta.is_none() {
            first_delta = Some(Instant::now());
        }
        if event.r#final {
            anyhow::ensure!(
                event.kind == "job_succeeded",
                "the job ended {}",
                event.kind
            );
            break;
        }
    }
    let job = submitted.elapsed();
    let arrived = first_delta.context("the job streamed no delta")?;
    let sent = first_bytes
        .sent
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop()
        .context("the model server sent nothing")?;
    Ok((arrived.saturating_duration_since(sent), job))
}

/// Serves the streaming model on a free loopback port until `stop`;
/// returns its base URL.
async fn serve_model(first_bytes: FirstBytes, stop: CancellationToken) -> anyhow::Result<String> {
    let answer = move || {
        let first_bytes = first_bytes.clone();
        async move {
            let parts = futures::stream::unfold(0, move |part| {
                let first_bytes = first_bytes.clone();
                async move {
                    match part {
                        0 => {
                            if let Ok(permit) = first_bytes.go.acquire().await {
                                permit.forget();
                            }
                            first_bytes
                                .sent
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(Instant::now());
                            Some((Ok::<_, std::convert::Infallible>(FIRST), 1))
                        }
                        1 => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Some((Ok(REST), 2))
                        }
                        _ => None,
                    }
                }
            });
            let headers = [(axum::http::header::CONTENT_TYPE, "text/event-stream")];
            (headers, axum::body::Body::from_stream(parts))
        }
    };
    let app = axum::Router::new().route("/v1/messages", axum::routing::post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(err) = served {
            eprintln!("first token: the model server stopped: {err}");
        }
    });
    Ok(url)
}
