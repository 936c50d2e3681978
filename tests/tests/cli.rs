//! The `toolfleet` command line as a user runs it: the binary, against a
//! real fleet, its exit codes and what it prints.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use toolfleet_proto::v1;
use toolfleet_tests::cargo_bin;
use toolfleet_tests::fleet::{Fleet, cancelled_job, scripted_job, test_fleet, wait_finished};

/// What a run of the binary printed and how it exited.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn toolfleet(args: &[&str]) -> anyhow::Result<Run> {
    let output = Command::new(cargo_bin("toolfleet")?)
        .args(args)
        .env_remove("TOOLFLEET_ADDR")
        .stdin(Stdio::null())
        .output()
        .await?;
    Ok(Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

async fn fleet() -> anyhow::Result<(Fleet, String)> {
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["calculate"], 1).await?;
    let url = fleet.grpc_url(0).await?;
    Ok((fleet, url))
}

#[tokio::test]
async fn a_reader_that_goes_away_ends_the_output_quietly() -> anyhow::Result<()> {
    let (_fleet, url) = fleet().await?;
    let script = json!([
        {"delay_ms": 300, "tool_calls": [{"name": "calculate", "arguments": {"expression": "2+2"}}]},
        {"delay_ms": 300, "message": "4"}
    ])
    .to_string();
    let mut child = Command::new(cargo_bin("toolfleet")?)
        .args([
            "submit", "x", "--watch", "--addr", &url, "--script", &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next_line().await?;
    assert!(
        first.is_some_and(|id| !id.is_empty()),
        "the job id comes first"
    );
    drop(lines); // `| head -1`: the reader is gone
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output()).await??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    Ok(())
}

#[tokio::test]
async fn get_and_watch_exit_by_how_the_job_ended_and_watch_ends_with_its_final_state()
-> anyhow::Result<()> {
    let (fleet, url) = fleet().await?;
    let mut api = fleet.api(0).await?;
    let done = api
        .submit_job(scripted_job("x", &json!([{"message": "done"}])))
        .await?
        .into_inner()
        .job_id;
    wait_finished(&api, &done).await?;
    let slow = cancelled_job(&api).await?;

    let get = toolfleet(&["get", &done, "--addr", &url]).await?;
    assert_eq!(get.code, Some(0), "{}", get.stderr);
    let get = toolfleet(&["get", &slow, "--addr", &url]).await?;
    assert_eq!(get.code, Some(4), "a cancelled job: {}", get.stderr);
    let watch = toolfleet(&["watch", &slow, "--addr", &url]).await?;
    assert_eq!(watch.code, Some(4), "{}", watch.stderr);

    // Past the last event: the stream still ends with the final state.
    for from in ["3", "1000"] {
        let watch = toolfleet(&["watch", &done, "--from", from, "--addr", &url]).await?;
        assert_eq!(watch.code, Some(0), "--from {from}: {}", watch.stderr);
        let last = watch.stdout.lines().last().unwrap_or_default().to_owned();
        assert!(
            last.contains("job_succeeded"),
            "--from {from}: {}",
            watch.stdout
        );
        assert!(
            !last.contains(" 0.000s"),
            "the clock starts at the job's start, not at the first event shown: {last}"
        );
    }
    let watch = toolfleet(&["watch", &slow, "--from", "1000", "--addr", &url]).await?;
    assert_eq!(watch.code, Some(4), "{}", watch.stderr);
    assert!(watch.stdout.contains("job_cancelled"), "{}", watch.stdout);

    // --quiet: the answer alone, or why there is none, and the exit code.
    let quiet = toolfleet(&["watch", &done, "--quiet", "--addr", &url]).await?;
    assert_eq!(
        (quiet.code, quiet.stdout.as_str()),
        (Some(0), "done\n"),
        "{}",
        quiet.stderr
    );
    let quiet = toolfleet(&["watch", &slow, "-q", "--addr", &url]).await?;
    assert_eq!(
        (quiet.code, quiet.stdout.as_str()),
        (Some(4), ""),
        "{}",
        quiet.stderr
    );
    assert!(quiet.stderr.contains("was cancelled"), "{}", quiet.stderr);
    let script = r#"[{"message": "hello"}]"#;
    let quiet = toolfleet(&[
        "submit", "x", "--script", script, "--watch", "-q", "--addr", &url,
    ])
    .await?;
    assert_eq!(
        (quiet.code, quiet.stdout.as_str()),
        (Some(0), "hello\n"),
        "{}",
        quiet.stderr
    );

    // Every client command's --json (docs/api.md), cancel's too.
    let cancel = toolfleet(&["cancel", &done, "--json", "--addr", &url]).await?;
    assert_eq!(cancel.code, Some(0), "{}", cancel.stderr);
    let answer: serde_json::Value = serde_json::from_str(&cancel.stdout)?;
    assert_eq!(answer, json!({"job_id": done, "status": "succeeded"}));
    Ok(())
}

/// The commands that call an orchestrator's API.
const CLIENT_COMMANDS: [&str; 11] = [
    "submit",
    "get",
    "watch",
    "trace",
    "cancel",
    "jobs",
    "tools",
    "approvals",
    "approve",
    "reject",
    "whoami",
];

#[tokio::test]
async fn only_the_client_commands_take_an_address() -> anyhow::Result<()> {
    for command in ["dev", "bench"] {
        let help = toolfleet(&[command, "--help"]).await?;
        assert_eq!(help.code, Some(0));
        assert!(
            !help.stdout.contains("--addr"),
            "{command}: {}",
            help.stdout
        );
    }
    for command in CLIENT_COMMANDS {
        let help = toolfleet(&[command, "--help"]).await?;
        assert!(
            help.stdout.contains("--addr <URL>"),
            "{command}: {}",
            help.stdout
        );
    }
    // Each flag's default said once: in its text or by clap, not both.
    for command in CLIENT_COMMANDS.into_iter().chain(["dev", "bench"]) {
        let help = toolfleet(&[command, "--help"]).await?;
        for flag in help.stdout.split("\n\n") {
            assert!(
                !(flag.contains("Default:") && flag.contains("[default:")),
                "{command} --help says a default twice:\n{flag}"
            );
        }
    }
    let dev = toolfleet(&["dev", "--help"]).await?;
    assert!(dev.stdout.contains("measure_concurrency"), "{}", dev.stdout);
    // `bench` is the bench's own binary, its flags and usage passed through.
    let bench = toolfleet(&["bench", "--help"]).await?;
    assert!(
        bench.stdout.contains("Usage: toolfleet bench"),
        "{}",
        bench.stdout
    );
    assert!(bench.stdout.contains("--processes"), "{}", bench.stdout);
    let wrong = toolfleet(&["bench", "--no-such-flag"]).await?;
    assert_eq!(wrong.code, Some(2), "a usage error, as every command's");
    assert!(wrong.stderr.contains("--no-such-flag"), "{}", wrong.stderr);
    Ok(())
}

/// Runs `binary` with `args` against a NATS and a Redis that are not there,
/// for 30 s at most.
async fn run_offline(
    binary: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<std::process::Output> {
    let nowhere = toolfleet_tests::free_loopback_address()?;
    let run = Command::new(cargo_bin(binary)?)
        .args(["--nats-url", &format!("nats://{nowhere}")])
        .args(["--redis-url", &format!("redis://{nowhere}")])
        .args(args)
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output();
    Ok(tokio::time::timeout(Duration::from_secs(30), run).await??)
}

/// A bad configuration: the binary, its arguments, its environment, and
/// what its error must say.
type Case<'a> = (&'a str, Vec<&'a str>, &'a [(&'a str, &'a str)], &'a str);

const BRACE: &[(&str, &str)] = &[("TOOLFLEET_REDIS__KEY_PREFIX", "tf{x}")];
const CREDS: &[(&str, &str)] = &[(
    "TOOLFLEET_NATS__CREDENTIALS_FILE",
    "/nonexistent/orchestrator.creds",
)];
const SMALL: &[(&str, &str)] = &[("TOOLFLEET_GRPC__MAX_REQUEST_BYTES", "1000")];
const NO_WAIT: &[(&str, &str)] = &[("TOOLFLEET_APPROVAL__TIMEOUT", "0s")];

/// Each service's bad configurations, by a flag or the environment, run
/// or only printed; `missing_graph` is a graph file that does not exist.
fn bad_configurations(missing_graph: &str) -> [Case<'_>; 9] {
    [
        (
            "toolfleet-orchestrator",
            vec![],
            CREDS,
            "nats.credentials_file",
        ),
        (
            "toolfleet-orchestrator",
            vec!["--print-config"],
            SMALL,
            "grpc.max_request_bytes",
        ),
        (
            "toolfleet-orchestrator",
            vec!["--print-config"],
            NO_WAIT,
            "approval.timeout is 0s",
        ),
        ("toolfleet-worker", vec![], BRACE, "redis.key_prefix"),
        (
            "toolfleet-worker",
            vec!["--print-config"],
            BRACE,
            "redis.key_prefix",
        ),
        (
            "toolfleet-orchestrator",
            vec!["--print-config"],
            BRACE,
            "redis.key_prefix",
        ),
        (
            "toolfleet-worker",
            vec!["--tools", "nope"],
            &[],
            "unknown tool \"nope\"",
        ),
        (
            "toolfleet-worker",
            vec!["--print-config", "--tools", "nope"],
            &[],
            "unknown tool",
        ),
        (
            "toolfleet-worker",
            vec!["--kg-graph", missing_graph],
            &[],
            "kg.graph_path",
        ),
    ]
}

/// The unknown-tool error lists every tool that could be named.
async fn the_unknown_tool_error_lists_every_tool() -> anyhow::Result<()> {
    let output = run_offline("toolfleet-worker", &["--tools", "nope"], &[]).await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    for tool in [
        "calculate",
        "get_current_weather",
        "factual_qa",
        "trend_analysis",
        "test tools",
    ] {
        assert!(stderr.contains(tool), "{tool}: {stderr}");
    }
    Ok(())
}

/// A graph that does not parse fails before the worker connects, its
/// error said once.
async fn a_bad_graph_fails_before_connecting(dir: &std::path::Path) -> anyhow::Result<()> {
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"not a fact\": true}\n")?;
    let output = run_offline(
        "toolfleet-worker",
        &["--kg-graph", &bad.to_string_lossy()],
        &[],
    )
    .await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        !stderr.contains("waiting for"),
        "it waited for a server first: {stderr}"
    );
    let said = stderr.lines().last().unwrap_or_default();
    assert!(
        said.starts_with("toolfleet-worker: cannot load the knowledge graph"),
        "{stderr}"
    );
    assert_eq!(said.matches("not a fact object").count(), 1, "{said}");
    Ok(())
}

/// With NATS and Redis away, a bad value exits 2 at once, also with
/// --print-config, rather than waiting for the servers, naming the key; a
/// graph that does not parse fails before connecting.
#[tokio::test]
async fn configuration_is_checked_before_anything_connects() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("missing.jsonl");
    let missing = missing.to_string_lossy();
    for (binary, args, env, says) in bad_configurations(&missing) {
        let output = run_offline(binary, &args, env).await?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{binary} {args:?}: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("invalid configuration"),
            "{stderr}"
        );
    }
    the_unknown_tool_error_lists_every_tool().await?;
    a_bad_graph_fails_before_connecting(dir.path()).await
}

#[tokio::test]
async fn print_config_shows_durations_as_documented_and_the_id_in_use() -> anyhow::Result<()> {
    for (binary, id_key) in [
        ("toolfleet-worker", "worker_id"),
        ("toolfleet-orchestrator", "instance_id"),
    ] {
        let output = Command::new(cargo_bin(binary)?)
            .arg("--print-config")
            .output()
            .await?;
        assert!(output.status.success(), "{binary}");
        let config: Value = serde_json::from_slice(&output.stdout)?;
        let id = config[id_key].as_str().unwrap_or_default();
        assert!(!id.is_empty(), "{binary}: {config}");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(!text.contains("day"), "{binary}: {text}");
    }
    let output = Command::new(cargo_bin("toolfleet-worker")?)
        .arg("--print-config")
        .output()
        .await?;
    let config: Value = serde_json::from_slice(&output.stdout)?;
    assert_eq!(config["runtime"]["result_retention"], "24h");
    assert_eq!(config["runtime"]["ack_wait"], "30s");

    // A subcommand with --print-config prints what it would run with and
    // touches nothing: setup would otherwise wait for this NATS forever.
    let nowhere = format!("nats://{}", toolfleet_tests::free_loopback_address()?);
    for (binary, args) in [
        (
            "toolfleet-orchestrator",
            &["setup", "--tools", "calculate", "--print-config"][..],
        ),
        (
            "toolfleet-orchestrator",
            &["healthcheck", "--print-config"][..],
        ),
        (
            "toolfleet-worker",
            &["healthcheck", "--live", "--print-config"][..],
        ),
    ] {
        let output = tokio::time::timeout(
            Duration::from_secs(30),
            Command::new(cargo_bin(binary)?)
                .args(["--nats-url", &nowhere])
                .args(args)
                .output(),
        )
        .await??;
        assert!(output.status.success(), "{binary} {args:?}");
        let config: Value = serde_json::from_slice(&output.stdout)?;
        assert_eq!(config["nats"]["url"], nowhere.as_str(), "{binary} {args:?}");
        if args[0] == "setup" {
            assert_eq!(config["setup"]["tools"], json!(["calculate"]));
        }
    }
    Ok(())
}

#[tokio::test]
async fn submit_warns_of_tools_no_worker_serves() -> anyhow::Result<()> {
    let (_fleet, url) = fleet().await?;
    let run = toolfleet(&[
        "submit",
        "x",
        "--tool",
        "rm_rf",
        "--tool",
        "calculate",
        "--addr",
        &url,
    ])
    .await?;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("no live worker serves \"rm_rf\"")
            && run.stderr.contains("UNKNOWN_TOOL"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("\"calculate\""), "{}", run.stderr);
    Ok(())
}

#[tokio::test]
async fn the_user_message_can_come_from_stdin_beyond_the_argument_limit() -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let (fleet, url) = fleet().await?;
    // Over the 128 KiB a single command-line argument may hold on Linux.
    let input = "q".repeat(200 * 1024);
    let mut child = Command::new(cargo_bin("toolfleet")?)
        .args(["submit", "--input-file", "-", "--addr", &url])
        .args(["--script", r#"[{"message": "read it"}]"#])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(input.as_bytes()).await?;
    drop(stdin);
    let output = child.wait_with_output().await?;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let job_id = String::from_utf8(output.stdout)?.trim().to_owned();
    let job = wait_finished(&fleet.api(0).await?, &job_id).await?;
    let sent = job.items.iter().find_map(|item| match &item.kind {
        Some(v1::item::Kind::User(user)) => Some(user.text.len()),
        _ => None,
    });
    assert_eq!(sent, Some(input.len()));

    let neither = toolfleet(&["submit", "--addr", &url]).await?;
    assert_eq!(neither.code, Some(2), "{}", neither.stderr);
    Ok(())
}

/// The processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(needle)
                .then_some(pid)
        })
        .collect()
}

#[tokio::test]
async fn kill_9_of_dev_serve_leaves_no_server_and_no_temp_dir() -> anyhow::Result<()> {
    let mut dev = Command::new(cargo_bin("toolfleet")?)
        .args(["dev", "--serve", "--workers", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stderr = dev.stderr.take().expect("piped");
    let mut lines = BufReader::new(stderr).lines();
    let dir = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(log) = line.strip_prefix("logs: ") {
                let dir = std::path::Path::new(log)
                    .parent()
                    .map(std::path::Path::to_owned);
                return anyhow::Ok(dir);
            }
        }
        anyhow::Ok(None)
    })
    .await??
    .expect("dev --serve prints its log path");
    let needle = dir.to_string_lossy().into_owned();
    assert!(dir.exists());
    // nats-server's command line names its store in the dir; redis-server
    // rewrites its own, so it is found by its port.
    assert_eq!(
        processes_mentioning(&needle).len(),
        1,
        "nats-server in {needle}"
    );
    let stdout = dev.stdout.take().expect("piped");
    let mut out = BufReader::new(stdout).lines();
    let redis = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = out.next_line().await? {
            if let Some(rest) = line.split("Redis redis://").nth(1) {
                let address = rest.split(['/', ')']).next().unwrap_or_default().to_owned();
                return anyhow::Ok(Some(address));
            }
        }
        anyhow::Ok(None)
    })
    .await??
    .expect("dev --serve prints its Redis URL");
    assert!(
        tokio::net::TcpStream::connect(&redis).await.is_ok(),
        "redis-server at {redis}"
    );

    dev.start_kill()?; // SIGKILL: no code of dev runs any more
    dev.wait().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while dir.exists()
        || !processes_mentioning(&needle).is_empty()
        || tokio::net::TcpStream::connect(&redis).await.is_ok()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "left behind: dir exists {}, nats-server {:?}, redis-server on {redis}",
            dir.exists(),
            processes_mentioning(&needle)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test]
async fn jobs_lists_the_newest_first_with_filters() -> anyhow::Result<()> {
    let (fleet, url) = fleet().await?;
    let mut api = fleet.api(0).await?;
    let mut ids = Vec::new();
    for team in ["search", "ads", "search"] {
        let mut request = scripted_job("x", &json!([{"message": "done"}]));
        request.metadata.insert("team".into(), team.into());
        let job_id = api.submit_job(request).await?.into_inner().job_id;
        wait_finished(&api, &job_id).await?;
        ids.push(job_id);
    }
    let run = toolfleet(&["jobs", "--meta", "team=search", "--addr", &url]).await?;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].starts_with("JOB ID"), "{}", run.stdout);
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    assert!(
        lines[1].starts_with(&ids[2]) && lines[2].starts_with(&ids[0]),
        "{}",
        run.stdout
    );
    assert!(lines[1].contains("succeeded") && lines[1].contains("team=search"));

    // The next page's command, run as printed, keeps the filters: the
    // other job of team=search, not the newer one of team=ads.
    let first = toolfleet(&[
        "jobs",
        "--meta",
        "team=search",
        "--limit",
        "1",
        "--addr",
        &url,
    ])
    .await?;
    let more = first
        .stderr
        .lines()
        .find_map(|line| line.strip_prefix("more: toolfleet "))
        .unwrap_or_else(|| panic!("no more: line in {}", first.stderr))
        .to_owned();
    let mut next: Vec<&str> = more.split(' ').collect();
    next.extend(["--addr", &url]);
    let run = toolfleet(&next).await?;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{more}: {}", run.stdout);
    assert!(lines[1].starts_with(&ids[0]), "{more}: {}", run.stdout);

    let run = toolfleet(&["jobs", "--limit", "1", "--json", "--addr", &url]).await?;
    let page: Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(page["jobs"][0]["job_id"], ids[2].as_str());
    let token = page["next_page_token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!token.is_empty());
    let run = toolfleet(&[
        "jobs",
        "--limit",
        "1",
        "--page-token",
        &token,
        "--json",
        "--addr",
        &url,
    ])
    .await?;
    let page: Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(page["jobs"][0]["job_id"], ids[1].as_str());
    assert!(page.get("counts").is_none(), "counts only when asked");

    // The counts of every job the caller sees, whatever the filter.
    let run = toolfleet(&["jobs", "--counts", "--meta", "team=ads", "--addr", &url]).await?;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let first = run.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("queued 0 · running 0 · ") && first.contains("succeeded 3"),
        "{}",
        run.stdout
    );
    let run = toolfleet(&["jobs", "--counts", "--json", "--addr", &url]).await?;
    let page: Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(page["counts"]["succeeded"], 3, "{page}");
    assert_eq!(page["counts"]["failed"], 0, "{page}");
    Ok(())
}

#[tokio::test]
async fn the_scripted_demo_answers_its_own_questions_and_says_when_it_cannot() -> anyhow::Result<()>
{
    let (fleet, url) = fleet().await?;
    fleet.wait_for_tools(0, &["factual_qa"], 1).await?;
    let other = toolfleet(&["submit", "What is 2+2?", "--watch", "--addr", &url]).await?;
    assert_eq!(other.code, Some(0), "{}", other.stderr);
    assert!(
        other
            .stderr
            .contains("the scripted model answers only its demo questions")
            && other
                .stderr
                .contains("What did AMD launch between 2016 and 2020?")
            && !other
                .stderr
                .lines()
                .any(|line| line.trim_start().contains("  ")),
        "{}",
        other.stderr
    );
    let known = toolfleet(&[
        "submit",
        "What did AMD launch between 2016 and 2020?",
        "--watch",
        "--addr",
        &url,
    ])
    .await?;
    assert_eq!(known.code, Some(0), "{}", known.stderr);
    assert!(!known.stderr.contains("demo questions"), "{}", known.stderr);
    // Each fact once, in the output: the tool's result, which the model
    // read, is cut short in the transcript, and the last assistant message
    // is the output.
    assert_eq!(
        known
            .stdout
            .matches("AMD – LAUNCHED – Ryzen [Valid-from: 2017-03-02]")
            .count(),
        1,
        "{}",
        known.stdout
    );
    assert!(
        known.stdout.contains("(the output, below)"),
        "{}",
        known.stdout
    );
    Ok(())
}

#[tokio::test]
async fn trace_draws_a_job_as_a_waterfall_with_its_retries_and_slowest_step() -> anyhow::Result<()>
{
    let (fleet, url) = fleet().await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [
            {"id": "nap", "name": "sleep", "arguments": {"ms": 1200}},
            {"id": "flaky", "name": "fail", "arguments": {"mode": "retryable", "fail_attempts": 1}}
        ]},
        {"message": "done"}
    ]);
    let job = toolfleet_tests::fleet::run_job(&api, scripted_job("x", &script)).await?;
    // An axis too wide to draw is refused as bad usage, before anything runs.
    let too_wide = toolfleet(&["trace", &job.job_id, "--addr", &url, "--width", "100000"]).await?;
    assert_eq!(too_wide.code, Some(2), "{}", too_wide.stderr);
    let trace = toolfleet(&["trace", &job.job_id, "--addr", &url, "--width", "40"]).await?;
    assert_eq!(trace.code, Some(0), "{}", trace.stderr);
    println!("{}", trace.stdout);
    let lines: Vec<&str> = trace.stdout.lines().collect();
    assert!(
        lines[0].starts_with(&format!("job {}: succeeded in ", job.job_id))
            && lines[0].ends_with(
                "2 turns, 2 calls, 1 retry; spent 0 model tokens, 3 tool cost units, 2 tool calls"
            ),
        "{}",
        trace.stdout
    );
    let row = |label: &str| lines.iter().find(|line| line.starts_with(label)).copied();
    assert!(
        row("turn 0").is_some_and(|l| l.ends_with("2 calls")),
        "{}",
        trace.stdout
    );
    assert!(
        row("  nap sleep")
            .is_some_and(|l| l.contains("ok, worker 1.2") && l.ends_with("◀ slowest")),
        "the 1.2 s sleep is the slowest step, and the worker's: {}",
        trace.stdout
    );
    assert!(
        row("  flaky fail").is_some_and(|l| l.contains('↻') && l.contains("ok, 2 attempts")),
        "{}",
        trace.stdout
    );
    assert!(
        row("turn 1").is_some_and(|l| l.ends_with("answered")),
        "{}",
        trace.stdout
    );
    Ok(())
}

/// A `toolfleet bench` run small enough for a test.
const SMALL_BENCH: [&str; 11] = [
    "bench",
    "-J",
    "20",
    "-C",
    "4",
    "--sequential",
    "5",
    "--raw-requests",
    "100",
    "--raw-calls",
    "2000",
];

/// The raw calls of `SMALL_BENCH`: enough that nats-server spends several
/// of the kernel's CPU ticks (10 ms) on them; with 200 its share could
/// round to 0.
const SMALL_BENCH_RAW_CALLS: u64 = 2000;

/// The raw JetStream floor of a report: it ran `calls` calls, each a
/// publish, its ack, a pull, a reply and the pull's ack, which nats-server
/// did work for.
fn assert_jetstream_floor(report: &serde_json::Value, calls: u64) {
    let floor = &report["raw_jetstream"];
    assert_eq!(floor["calls"], calls, "{report}");
    assert!(
        floor["calls_per_sec"].as_f64().is_some_and(|n| n > 0.0),
        "{report}"
    );
    // In: the publish, the consumer's ack, the reply (the pull requests
    // come on top); out: the publish's ack, the delivery, the reply's.
    for key in ["nats_messages_in_per_call", "nats_messages_out_per_call"] {
        assert!(
            floor[key].as_f64().is_some_and(|n| n >= 3.0),
            "{key}: {report}"
        );
    }
    let nats = floor["cpu_ms_per_call_by_process"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, _)| name.starts_with("nats-server"))
        .filter_map(|(_, ms)| ms.as_f64())
        .sum::<f64>();
    assert!(nats > 0.0, "{report}");
}

/// A small `toolfleet bench` run, traced: its report names the ratio and
/// counts the spans its collector received; without tracing both are null.
#[tokio::test]
async fn bench_runs_end_to_end_and_reports_the_spans_of_a_traced_run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for (tracing, json) in [(true, "traced.json"), (false, "plain.json")] {
        let path = dir.path().join(json);
        let mut args = SMALL_BENCH.to_vec();
        let path_arg = path.to_string_lossy().into_owned();
        args.extend(["--json-file", &path_arg]);
        if tracing {
            args.extend(["--trace-ratio", "1.0"]);
        }
        let run = toolfleet(&args).await?;
        assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
        let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        assert_eq!(report["jobs"], 20, "{report}");
        if tracing {
            assert_eq!(report["trace_ratio"], 1.0, "{report}");
            // At least a root, a run, two turns and a call per job.
            let spans = report["spans_received"].as_u64().unwrap_or_default();
            assert!(spans >= 20 * 5, "{report}");
            assert!(
                run.stdout.contains("tracing              sampling ratio 1"),
                "{}",
                run.stdout
            );
        } else {
            assert!(report["trace_ratio"].is_null(), "{report}");
            assert!(report["spans_received"].is_null(), "{report}");
        }
    }
    // The load phase is accounted process by process, NATS and Redis too.
    let plain: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("plain.json"))?)?;
    let cpu = &plain["accounting"]["cpu_ms_per_job_by_process"];
    for process in [
        "bench (orchestrator, workers, client)",
        "nats-server",
        "redis-server",
    ] {
        assert!(
            cpu[process].as_f64().is_some_and(|ms| ms > 0.0),
            "{process}: {plain}"
        );
    }
    assert_jetstream_floor(&plain, SMALL_BENCH_RAW_CALLS);
    let accounting = &plain["accounting"];
    // 2 rounds of 3 calls: every call is published to JetStream and its
    // result stored in Redis, at the least.
    assert!(
        accounting["nats_messages_in_per_job"]
            .as_f64()
            .unwrap_or_default()
            >= 6.0,
        "{plain}"
    );
    assert!(
        accounting["redis_commands_per_job"]
            .as_f64()
            .unwrap_or_default()
            >= 6.0,
        "{plain}"
    );
    assert!(
        plain["load_seconds"].as_f64().unwrap_or_default() > 0.0,
        "{plain}"
    );

    let refused = toolfleet(&["bench", "--trace-ratio", "2"]).await?;
    assert_eq!(refused.code, Some(2));
    assert!(
        refused.stderr.contains("not a ratio from 0.0 to 1.0"),
        "{}",
        refused.stderr
    );
    Ok(())
}

/// `bench --mcp N` times N calls of an MCP server's tool made directly and
/// N made through the fleet, and reports both and their difference.
#[tokio::test]
async fn bench_mcp_times_an_mcp_tool_directly_and_through_the_fleet() -> anyhow::Result<()> {
    let run = toolfleet(&["bench", "--mcp", "5", "--workers", "1", "--json"]).await?;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(report["calls"], 5, "{report}");
    let p50 = |path: &str| report[path]["p50_ms"].as_f64().unwrap_or_default();
    assert!(p50("direct") > 0.0, "{report}");
    assert!(p50("through_the_fleet") > 0.0, "{report}");
    let overhead = report["overhead_p50_ms"].as_f64().unwrap_or(f64::NAN);
    assert!(
        (overhead - (p50("through_the_fleet") - p50("direct"))).abs() < 1e-9,
        "{report}"
    );
    assert!(run.stderr.contains("warming up"), "{}", run.stderr);
    Ok(())
}

/// `bench --first-token N` times N streamed jobs from the model server's
/// first bytes to the client's first delta, and reports it with the whole
/// job's time.
#[tokio::test]
async fn bench_first_token_times_streamed_answers() -> anyhow::Result<()> {
    let run = toolfleet(&["bench", "--first-token", "5", "--json"]).await?;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(report["jobs"], 5, "{report}");
    let p50 = |what: &str| report[what]["p50_ms"].as_f64().unwrap_or_default();
    assert!(p50("first_token") > 0.0, "{report}");
    assert!(p50("job") > 0.0, "{report}");
    Ok(())
}

/// `toolfleet bench --processes` on a NATS cluster and a Redis Cluster,
/// every write waiting for a replica: each server is accounted for by
/// name, the Redis commands include the `WAIT`s, and the report says what
/// ran.
#[tokio::test]
async fn cluster_bench_accounts_every_node_of_both_clusters() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("report.json");
    let path_arg = path.to_string_lossy().into_owned();
    let mut args = SMALL_BENCH.to_vec();
    args.extend([
        "--processes",
        "--nats-cluster",
        "--redis-cluster",
        "--wait-replicas",
        "1",
        "--json-file",
        &path_arg,
    ]);
    let run = toolfleet(&args).await?;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    assert_eq!(report["nats_cluster"], true, "{report}");
    assert_eq!(report["redis_cluster"], true, "{report}");
    assert_eq!(report["wait_replicas"], 1, "{report}");
    let accounting = &report["accounting"];
    let nodes = (0..3)
        .map(|i| format!("nats-server-{i}"))
        .chain((0..6).map(|i| format!("redis-server-{i}")));
    for process in nodes {
        let rss = accounting["rss_mb_by_process"][&process].as_f64();
        assert!(rss.is_some_and(|mb| mb > 1.0), "{process}: {report}");
    }
    let waits = accounting["redis_commands_per_job_by_name"]["wait"].as_f64();
    assert!(waits.is_some_and(|n| n > 1.0), "{report}");
    // The floor's stream is kept on all three servers too.
    assert_jetstream_floor(&report, SMALL_BENCH_RAW_CALLS);
    for line in [
        "servers              NATS cluster of 3 (3 copies of each stream), Redis Cluster of 3 primaries, 1 replica each",
        "replication          every write waits for 1 replica(s)",
    ] {
        assert!(run.stdout.contains(line), "{}", run.stdout);
    }
    Ok(())
}

/// `toolfleet bench --processes --nats-accounts` runs its fleet on the
/// shipped NATS accounts and users: the workers, as the pool `general` in
/// its own account, serve `calculate` to every job, and NATS carries the
/// same messages per job as without accounts; the floors, whose clients
/// have no user there, are skipped and say so.
#[tokio::test]
async fn bench_on_the_shipped_nats_accounts_runs_the_pools_tool() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("report.json");
    let path_arg = path.to_string_lossy().into_owned();
    let mut args = SMALL_BENCH.to_vec();
    args.extend(["--processes", "--nats-accounts", "--json-file", &path_arg]);
    let run = toolfleet(&args).await?;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    assert_eq!(report["tool"], "calculate", "{report}");
    assert_eq!(report["nats_accounts"], true, "{report}");
    assert!(
        report["tool_calls_per_sec"]
            .as_f64()
            .is_some_and(|n| n > 0.0),
        "{report}"
    );
    for key in ["raw_nats_requests_per_sec", "raw_jetstream"] {
        assert!(report[key].is_null(), "{key}: {report}");
    }
    assert!(
        run.stdout
            .contains("raw NATS floors      skipped (--nats-accounts"),
        "{}",
        run.stdout
    );
    // Per job, the calls' publishes and acks and the replies: as many as
    // a job's 2 rounds of 3 calls need, whatever account they cross.
    let messages_in = report["accounting"]["nats_messages_in_per_job"].as_f64();
    assert!(messages_in.is_some_and(|n| n >= 18.0), "{report}");
    Ok(())
}

/// `toolfleet bench --processes` accounts the load phase to every process
/// of the fleet: the orchestrator, each worker, NATS, Redis and the client.
#[tokio::test]
async fn bench_with_processes_accounts_every_process() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("report.json");
    let path_arg = path.to_string_lossy().into_owned();
    // Enough jobs that every process spends several of the kernel's CPU
    // ticks (10 ms) on the load: with 20, Redis's share could round to 0.
    let mut args = SMALL_BENCH.to_vec();
    args[2] = "200";
    args[4] = "16";
    let chart = dir.path().join("floors.svg");
    let chart_arg = chart.to_string_lossy().into_owned();
    args.extend([
        "--processes",
        "--json-file",
        &path_arg,
        "--chart",
        &chart_arg,
    ]);
    let run = toolfleet(&args).await?;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    assert_eq!(report["jobs"], 200, "{report}");
    // The one-call floor: raw JetStream calls one at a time, as many as
    // the sequential jobs, drawn beside them.
    let one_call_floor = report["raw_one_call"]["p50_ms"].as_f64();
    assert!(one_call_floor.is_some_and(|ms| ms > 0.0), "{report}");
    assert!(run.stdout.contains("one-call floor  "), "{}", run.stdout);
    let chart = std::fs::read_to_string(&chart)?;
    assert!(chart.starts_with("<svg"), "{chart:.100}");
    assert!(
        chart.contains("CPU ms per tool call, by process"),
        "{chart:.100}"
    );
    let accounting = &report["accounting"];
    for process in [
        "orchestrator",
        "worker-0",
        "worker-1",
        "nats-server",
        "redis-server",
    ] {
        let cpu = accounting["cpu_ms_per_job_by_process"][process].as_f64();
        assert!(cpu.is_some_and(|ms| ms > 0.0), "{process}: {report}");
        let rss = accounting["rss_mb_by_process"][process].as_f64();
        assert!(rss.is_some_and(|mb| mb > 1.0), "{process}: {report}");
    }
    assert!(
        accounting["cpu_ms_per_job_by_process"]["bench client"].is_number(),
        "{report}"
    );
    // JetStream syncs every two minutes and Redis keeps nothing, by default.
    assert_eq!(report["fsync_always"], false, "{report}");
    assert_jetstream_floor(&report, SMALL_BENCH_RAW_CALLS);
    assert!(
        run.stdout.contains("raw JetStream calls  "),
        "{}",
        run.stdout
    );

    // With --fsync-always both servers say they fsync every write.
    let run = toolfleet(&[
        "bench",
        "-J",
        "10",
        "-C",
        "2",
        "--sequential",
        "2",
        "--raw-requests",
        "10",
        "--raw-calls",
        "20",
        "--fsync-always",
        "--json-file",
        &path_arg,
    ])
    .await?;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    assert_eq!(report["fsync_always"], true, "{report}");
    assert!(
        run.stdout
            .contains("durability           JetStream and Redis fsync every write"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("load phase, per job:"),
        "{}",
        run.stdout
    );
    Ok(())
}

/// `toolfleet bench --sweep` runs the load once per value on a fresh fleet
/// of processes and writes each dimension's table, JSON and chart: here
/// jobs parked waiting for approval (`--awaiting-approval`) at 0 and 4,
/// which the runs' reports say they had.
#[tokio::test]
async fn bench_sweep_writes_a_table_a_report_and_a_chart_per_dimension() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("sweeps");
    let out_arg = out.to_string_lossy().into_owned();
    let run = toolfleet(&[
        "bench",
        "--sweep",
        "awaiting-approval",
        "--sweep-values",
        "0,4",
        "-J",
        "40",
        "-C",
        "4",
        "--sequential",
        "3",
        "--sweep-dir",
        &out_arg,
    ])
    .await?;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let sweep: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("awaiting-approval.json"))?)?;
    assert_eq!(sweep["per"], "job", "{sweep}");
    let steps = sweep["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "{sweep}");
    for (step, parked) in steps.iter().zip([0, 4]) {
        assert_eq!(step["value"], parked, "{step}");
        assert_eq!(step["report"]["awaiting_approval"], parked, "{step}");
        assert_eq!(step["report"]["jobs"], 40, "{step}");
        assert!(
            step["cpu_ms_by_process"]["orchestrator"].as_f64() > Some(0.0),
            "{step}"
        );
        assert!(step["cpu_ms_by_process"]["workers"].is_number(), "{step}");
        assert!(step["redis_commands"].as_f64() > Some(0.0), "{step}");
    }
    let table = std::fs::read_to_string(out.join("awaiting-approval.md"))?;
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(
        table.starts_with("| jobs parked waiting for approval |"),
        "{table}"
    );
    assert!(run.stdout.contains(&table), "{}", run.stdout);
    let chart = std::fs::read_to_string(out.join("awaiting-approval.svg"))?;
    assert!(chart.starts_with("<svg"), "{chart:.100}");
    assert!(chart.contains("CPU ms per job"), "{chart:.100}");
    Ok(())
}

/// `toolfleet bench --processes --tenants N --idle-tools M`: the
/// orchestrator takes only the tokens of the file the bench wrote, each of
/// the N tenants' jobs gets through with its own, and every worker serves
/// M more tools of the bench's MCP server besides its own.
#[tokio::test]
async fn bench_with_tenants_and_idle_tools_runs_every_tenants_jobs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("report.json");
    let path_arg = path.to_string_lossy().into_owned();
    let run = toolfleet(&[
        "bench",
        "--processes",
        "--tenants",
        "3",
        "--idle-tools",
        "5",
        "-J",
        "12",
        "-C",
        "4",
        "--sequential",
        "2",
        "--raw-calls",
        "0",
        "--raw-requests",
        "0",
        "--json-file",
        &path_arg,
    ])
    .await?;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    assert_eq!(report["tenants"], 3, "{report}");
    assert_eq!(report["idle_tools"], 5, "{report}");
    assert_eq!(report["jobs"], 12, "{report}");
    // Each tenant's budget is checked in Redis with every job of its.
    let budget_scripts = report["accounting"]["redis_commands_per_job_by_name"]["hmget"].as_f64();
    assert!(budget_scripts.is_some_and(|n| n > 2.0), "{report}");
    assert!(
        run.stdout
            .contains("tenants              3 in the tokens file"),
        "{}",
        run.stdout
    );
    Ok(())
}
