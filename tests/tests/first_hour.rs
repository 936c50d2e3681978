//! A new user's first hour, against `toolfleet dev --serve` as the docs tell
//! them to start it: every `toolfleet` command of the docs' shell blocks
//! (`toolfleet_tests::markdown` says which), and the template of a worker of
//! your own (`examples/custom-worker`), built as a user builds it and started
//! as worker/README.md says, next to dev's built-in workers.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use toolfleet_tests::markdown::{self, Runner};
use toolfleet_tests::{build_worker_template, cargo_bin, repo_root, run_toolfleet, wait_until};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// What `toolfleet dev --serve` says it serves on; stopped when dropped.
struct Dev {
    _process: Child,
    grpc: String,
    nats: String,
    redis: String,
}

async fn dev_serve() -> anyhow::Result<Dev> {
    let mut process = Command::new(cargo_bin("toolfleet")?)
        .args(["dev", "--serve", "--workers", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(process.stdout.take().expect("piped")).lines();
    let serving = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with("toolfleet is serving gRPC on ") {
                return anyhow::Ok(line);
            }
        }
        anyhow::bail!("toolfleet dev --serve ended without saying where it serves")
    })
    .await??;
    // Read to the end: the lines that follow are written one by one, and a
    // write to a pipe nobody reads any more fails, which stops the fleet
    // (a flake seen under load).
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    // "toolfleet is serving gRPC on URL (NATS URL, Redis URL); Ctrl-C stops it."
    let word_after = |label: &str| -> anyhow::Result<String> {
        let rest = serving
            .split(label)
            .nth(1)
            .ok_or_else(|| anyhow::anyhow!("no {label:?} in {serving:?}"))?;
        Ok(rest
            .split([' ', ',', ')'])
            .next()
            .unwrap_or_default()
            .to_owned())
    };
    Ok(Dev {
        grpc: word_after("gRPC on ")?,
        nats: word_after("(NATS ")?,
        redis: word_after("Redis ")?,
        _process: process,
    })
}

/// Runs a documented command line with `sh`, from the repository's root,
/// `toolfleet` and `target/debug/toolfleet` being the binary under test.
async fn shell(command: &str, grpc: &str) -> anyhow::Result<std::process::Output> {
    let binary = cargo_bin("toolfleet")?;
    let bin_dir = binary.parent().unwrap_or(std::path::Path::new("."));
    let command = command.replacen("target/debug/toolfleet", "toolfleet", 1);
    let path = std::env::var("PATH").unwrap_or_default();
    let output = Command::new("sh")
        .args(["-c", &command])
        .current_dir(repo_root())
        .env("PATH", format!("{}:{path}", bin_dir.display()))
        .env("TOOLFLEET_ADDR", grpc)
        .stdin(Stdio::null())
        .output();
    Ok(tokio::time::timeout(Duration::from_secs(120), output).await??)
}

/// The order service: one order shipped, one unknown, one that fails once.
async fn order_service() -> MockServer {
    let orders = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/orders/A-1042"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"status": "shipped", "eta": "2026-12-08"})),
        )
        .mount(&orders)
        .await;
    Mock::given(method("GET"))
        .and(path("/orders/A-7"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&orders)
        .await;
    Mock::given(method("GET"))
        .and(path("/orders/A-7"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "placed"})))
        .mount(&orders)
        .await;
    // Anything else: no such order (wiremock's 404).
    orders
}

/// The template's configuration is checked as toolfleet-worker's, before
/// anything connects: `tools` names its own tools, and the orders URL must
/// be http or https.
async fn the_template_checks_its_configuration(
    binary: &std::path::Path,
    orders: &MockServer,
) -> anyhow::Result<()> {
    for (tools, orders_url, code, says) in [
        ("[order_status]", orders.uri(), 0, "\"order_status\""),
        (
            "[calculate]",
            orders.uri(),
            2,
            "unknown tool \"calculate\" in `tools`; this worker serves: order_status",
        ),
        (
            "[]",
            "ftp://orders".to_owned(),
            2,
            "--orders-url ftp://orders/: use an http or https URL",
        ),
    ] {
        let checked = Command::new(binary)
            .args(["--orders-url", &orders_url, "--print-config"])
            .env("TOOLFLEET_TOOLS", tools)
            .output()
            .await?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        );
        assert_eq!(checked.status.code(), Some(code), "{said}");
        assert!(said.contains(says), "{said}");
    }
    Ok(())
}

/// The template worker, started as a pool of the Helm chart would run it,
/// with what it said on stderr so far.
struct TemplateWorker {
    process: Child,
    said: std::sync::Arc<std::sync::Mutex<String>>,
}

impl TemplateWorker {
    /// Starts it against `dev`'s servers with its tools listed, its stderr
    /// read as it comes (a full pipe would stop the worker).
    fn start(binary: &std::path::Path, dev: &Dev, orders: &MockServer) -> anyhow::Result<Self> {
        let mut process = Command::new(binary)
            .args(["--nats-url", &dev.nats, "--redis-url", &dev.redis])
            .args(["--orders-url", &orders.uri()])
            .env("TOOLFLEET_TOOLS", "[order_status]")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        // Read as it comes (a full pipe would stop the worker), and shown if
        // the tool never appears.
        let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut stderr = BufReader::new(process.stderr.take().expect("piped")).lines();
        tokio::spawn({
            let said = said.clone();
            async move {
                while let Ok(Some(line)) = stderr.next_line().await {
                    let mut said = said
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    said.push_str(&line);
                    said.push('\n');
                }
            }
        });
        Ok(Self { process, said })
    }

    /// Waits for the fleet to offer its tool, showing what it said if the
    /// tool never appears.
    async fn wait_offered(&self, dev: &Dev) -> anyhow::Result<()> {
        let said = &self.said;
        wait_until(
            "order_status in `toolfleet tools`",
            Duration::from_secs(60),
            || async {
                let listed = run_toolfleet(&["tools", "--addr", &dev.grpc]).await;
                listed.is_ok_and(|tools| tools.contains("order_status"))
            },
        )
        .await
        .with_context(|| {
            let said = said
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            format!("the template worker said:\n{said}")
        })?;
        Ok(())
    }

    /// SIGTERM drains and exits 0, as toolfleet-worker does.
    async fn stop(mut self) -> anyhow::Result<()> {
        let worker = &mut self.process;
        let pid = worker.id().expect("running");
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await?;
        let status = tokio::time::timeout(Duration::from_secs(30), worker.wait()).await??;
        assert!(status.success(), "the worker exited with {status}");
        Ok(())
    }
}

/// Submits through `toolfleet submit --watch` four calls of `order_status`
/// (a shipped order, an unknown one, one that fails once, a hostile id);
/// returns the answer printed.
async fn ask_where_the_orders_are(grpc: &str) -> anyhow::Result<String> {
    let call = |id: &str, order_id: &str| json!({"id": id, "name": "order_status", "arguments": {"order_id": order_id}});
    let script = json!([
        {"tool_calls": [call("shipped", "A-1042"), call("unknown", "A-404"),
                        call("flaky", "A-7"), call("hostile", "../admin")]},
        {"message": "{{shipped.data.status}} {{shipped.data.eta}}; {{unknown.error.code}}; \
                     {{flaky.data.status}}; {{hostile.error.code}}"}
    ]);
    run_toolfleet(&[
        "submit",
        "--addr",
        grpc,
        "Where are my orders?",
        "--script",
        &script.to_string(),
        "--watch",
        "--quiet",
    ])
    .await
}

/// The order service was asked for each order once, the failed one twice,
/// and nothing else.
async fn each_order_was_asked_once_the_failed_one_twice(orders: &MockServer) {
    let asked: Vec<String> = orders
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|request| request.url.path().to_owned())
        .collect();
    let times = |path: &str| asked.iter().filter(|p| *p == path).count();
    assert_eq!(
        (
            times("/orders/A-1042"),
            times("/orders/A-404"),
            times("/orders/A-7")
        ),
        (1, 1, 2),
        "each call once, the failed one twice: {asked:?}"
    );
    assert_eq!(
        asked.len(),
        4,
        "nothing else reached the service: {asked:?}"
    );
}

/// The terminal error took one attempt, the retryable one two; the
/// hostile call never reached a worker's tool.
async fn the_attempts_follow_the_errors(grpc: &str) -> anyhow::Result<()> {
    let jobs: Value =
        serde_json::from_str(&run_toolfleet(&["jobs", "--addr", grpc, "--json"]).await?)?;
    let job_id = jobs["jobs"][0]["job_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let events = run_toolfleet(&["watch", &job_id, "--addr", grpc, "--json"]).await?;
    let mut attempts = std::collections::BTreeMap::new();
    for line in events.lines() {
        let event: Value = serde_json::from_str(line)?;
        if event["kind"] == "tool_call_result" {
            let data = &event["data"];
            attempts.insert(
                data["call_id"].as_str().unwrap_or_default().to_owned(),
                (
                    data["attempts"].as_u64(),
                    data["code"].as_str().map(str::to_owned),
                ),
            );
        }
    }
    let expected = |n, code: Option<&str>| (Some(n), code.map(str::to_owned));
    assert_eq!(attempts["shipped"], expected(1, None), "{events}");
    assert_eq!(
        attempts["unknown"],
        expected(1, Some("ORDER_NOT_FOUND")),
        "{events}"
    );
    assert_eq!(attempts["flaky"], expected(2, None), "{events}");
    assert_eq!(
        attempts["hostile"].1.as_deref(),
        Some("INVALID_TOOL_ARGUMENTS"),
        "{events}"
    );
    Ok(())
}

/// Every `toolfleet` command of the docs (at least three), as pasted: with
/// the address dev printed (and exported as TOOLFLEET_ADDR), ending in
/// status 0.
async fn every_docs_command_runs(grpc: &str) -> anyhow::Result<()> {
    let address = grpc.trim_start_matches("http://");
    let mut ran = 0;
    for doc in markdown::RUN_DOCS {
        let text = std::fs::read_to_string(repo_root().join(doc))?;
        for command in markdown::commands_for(&text, Runner::Toolfleet, address) {
            ran += 1;
            let run = shell(&command, grpc).await?;
            assert!(
                run.status.success(),
                "{doc}: `{command}` ended with {}:\n{}{}",
                run.status,
                String::from_utf8_lossy(&run.stdout),
                String::from_utf8_lossy(&run.stderr)
            );
        }
    }
    assert!(ran >= 3, "the docs' toolfleet commands: {ran}");
    Ok(())
}

/// The template worker checks its configuration, then runs next to dev's
/// built-in workers: its tool offered, its business error terminal, its
/// service's 503 retried, a hostile id kept from the service by the
/// schema; the docs' `toolfleet` commands run against the same dev; the
/// worker drains on SIGTERM.
#[tokio::test]
async fn the_docs_commands_and_the_template_worker_run_against_dev_serve() -> anyhow::Result<()> {
    let binary = build_worker_template().await?;
    let orders = order_service().await;
    let dev = dev_serve().await?;
    the_template_checks_its_configuration(&binary, &orders).await?;
    let worker = TemplateWorker::start(&binary, &dev, &orders)?;
    worker.wait_offered(&dev).await?;

    let answer = ask_where_the_orders_are(&dev.grpc).await?;
    // The business rule is terminal and the arguments' schema keeps a
    // hostile id from the service; the 503 was retried.
    assert_eq!(
        answer.trim(),
        "shipped 2026-12-08; ORDER_NOT_FOUND; placed; INVALID_TOOL_ARGUMENTS"
    );
    each_order_was_asked_once_the_failed_one_twice(&orders).await;
    the_attempts_follow_the_errors(&dev.grpc).await?;
    every_docs_command_runs(&dev.grpc).await?;
    worker.stop().await?;
    drop(dev);
    Ok(())
}

/// The README's first command, `scripts/demo`, is a build and then this:
/// a whole fleet, one job with parallel calls, its transcript, exit 0.
#[tokio::test]
async fn the_demo_runs_a_job_end_to_end() -> anyhow::Result<()> {
    let demo = Command::new(cargo_bin("toolfleet")?)
        .arg("dev")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let demo = tokio::time::timeout(Duration::from_secs(120), demo).await??;
    let stdout = String::from_utf8_lossy(&demo.stdout);
    assert!(
        demo.status.success(),
        "{}\n{stdout}\n{}",
        demo.status,
        String::from_utf8_lossy(&demo.stderr)
    );
    assert_eq!(stdout.matches("tool_result").count(), 2, "{stdout}");
    assert!(
        stdout.contains("output:\n  In Boston it is 8.0 °C (partly cloudy), and 23 * 19 = 437."),
        "{stdout}"
    );
    Ok(())
}
