//! The web console (`toolfleet console`, decision 0050) in a real browser,
//! Debian's Chromium driven by the scenarios of tests/console
//! (`toolfleet_tests::browser`), against a real fleet: a person signs in
//! by keyboard, reads a job, cancels another and signs out; another
//! tenant sees none of it; every page fits a laptop and a phone; and what
//! a job carries (its input, metadata, a tool's arguments and output, the
//! answer) is shown as text and never runs. Each page is screenshotted at
//! each width (docs/console.md says how to refresh its pictures).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_proto::v1;
use toolfleet_tests::browser::Browser;
use toolfleet_tests::fleet::{FAST_REDELIVERY, Fleet, scripted_job, test_fleet};
use toolfleet_tests::identity::{bearer, wait_for_tools};
use toolfleet_tests::messages::{MessagesServer, PAUSE, Reply, streamed_job};
use toolfleet_tests::{ChildProcess, free_loopback_address, repo_root, venv_python, wait_until};

const AGENT: &str = "tok-browser-agent-7a31";
const APPROVER: &str = "tok-browser-approver-19bd";
const OPERATOR: &str = "tok-browser-operator-5e02";
const READER: &str = "tok-browser-reader-d6a4";
const STRANGER: &str = "tok-browser-other-c4e8";

const WAIT: Duration = Duration::from_secs(30);

/// What a model, a tool or a client might write to attack the page that
/// shows it. Each sets `window.__xss` if it ever runs.
const PAYLOADS: [&str; 5] = [
    "<script>window.__xss=1</script>",
    "<img src=x onerror=\"window.__xss=1\">",
    "\"><svg onload=window.__xss=1>",
    "<a href=\"javascript:window.__xss=1\">open me</a>",
    "javascript:window.__xss=1",
];

/// A fleet and the console in front of it (as tests/tests/console.rs
/// starts them), with the base URL to browse.
///
/// Its tokens file has, in tenant `ops`, an agent, an approver, an
/// operator and a reader, and a token of tenant `other`. Its worker
/// redelivers fast (a call that kills it twice is an unknown outcome) and
/// serves, beside the test tools, an MCP server whose tool describes itself
/// with every payload (`bad__shown`). Its orchestrator's Anthropic model is
/// `claude`, a local server of the Messages API.
struct Stage {
    _dir: tempfile::TempDir,
    fleet: Fleet,
    _console: ChildProcess,
    base: String,
    claude: Arc<MessagesServer>,
}

impl Stage {
    async fn start() -> anyhow::Result<Self> {
        Self::start_with(&[], &[], free_loopback_address()?).await
    }

    /// [`Stage::start`], the orchestrator with `env` too and the console
    /// with `flags`, listening on `listen`.
    async fn start_with(
        env: &[(&str, &str)],
        flags: &[&str],
        listen: String,
    ) -> anyhow::Result<Self> {
        use toolfleet_orchestrator::auth::token_sha256;
        let dir = tempfile::tempdir()?;
        let tokens = dir.path().join("tokens.toml");
        // An approver who reads the jobs too, to open the one it decided.
        let ops = [
            (AGENT, "\"agent\""),
            (APPROVER, "\"approver\", \"reader\""),
            (OPERATOR, "\"operator\""),
            (READER, "\"reader\""),
        ];
        let hashes: Vec<String> = ops.iter().map(|(t, _)| token_sha256(t)).collect();
        let roles: Vec<String> = ops
            .iter()
            .map(|(token, roles)| format!("\"{}\" = [{roles}]", token_sha256(token)))
            .collect();
        std::fs::write(
            &tokens,
            format!(
                "[tenants.ops]\ntoken_sha256 = {hashes:?}\nroles = {{ {} }}\n\
                 approvers = {{ \"{}\" = \"Ana Lima\", \"{}\" = \"Otto Reis\" }}\n\
                 [tenants.other]\ntoken_sha256 = [\"{}\"]\n",
                roles.join(", "),
                token_sha256(APPROVER),
                token_sha256(OPERATOR),
                token_sha256(STRANGER),
            ),
        )?;
        let worker_config = dir.path().join("worker.toml");
        std::fs::write(&worker_config, markup_server(dir.path())?)?;
        let worker_config = worker_config.display().to_string();
        let worker_env = [
            FAST_REDELIVERY,
            &[("TOOLFLEET_CONFIG", worker_config.as_str())],
        ]
        .concat();
        let mut fleet = Fleet::start(test_fleet(1).worker_env(&worker_env)).await?;
        let claude = MessagesServer::start("sk-ant-test").await?;
        let (file, claude_url) = (tokens.display().to_string(), claude.base_url());
        let mut all = vec![
            ("TOOLFLEET_API__AUTH", "tokens"),
            ("TOOLFLEET_API__TOKENS_FILE", file.as_str()),
            ("ANTHROPIC_API_KEY", "sk-ant-test"),
            ("TOOLFLEET_ANTHROPIC__BASE_URL", claude_url.as_str()),
        ];
        all.extend_from_slice(env);
        fleet.spawn_orchestrator(&all).await?;
        let api = fleet.api(0).await?;
        wait_for_tools(&api, AGENT, &["calculate", "echo", "crash", "bad__shown"]).await?;
        let (addr, redis) = (fleet.grpc_url(0).await?, fleet.redis.url());
        let console = toolfleet_tests::console::start(&addr, &redis, &listen, flags).await?;
        // By name: a browser keeps the console's `Secure` cookies over plain
        // HTTP only for localhost.
        let port = listen.rsplit(':').next().unwrap_or_default();
        Ok(Self {
            _dir: dir,
            fleet,
            _console: console,
            base: format!("http://localhost:{port}"),
            claude: Arc::new(claude),
        })
    }
}

/// A worker configuration serving tests/mcp/hostile.py in its `markup`
/// mode, as server `bad`: its tool `shown` describes itself with every
/// payload.
fn markup_server(scratch: &std::path::Path) -> anyhow::Result<String> {
    let python = venv_python()?.display().to_string();
    let server = repo_root()
        .join("tests/mcp/hostile.py")
        .display()
        .to_string();
    let args = [server.as_str(), "markup", &PAYLOADS.join(" ")];
    Ok(format!(
        "[[mcp.servers]]\nname = \"bad\"\ncommand = {python:?}\nargs = {args:?}\n\
         env = {{ MCP_TEST_DIR = {scratch:?} }}\ntools = [\"shown\"]\nlifecycle = \"initialize\"\n",
        scratch = scratch.display().to_string(),
    ))
}

/// Submits `request` as the agent; its job's id.
async fn submit(fleet: &Fleet, request: v1::SubmitJobRequest) -> anyhow::Result<String> {
    let mut api = fleet.api(0).await?;
    Ok(api
        .submit_job(bearer(AGENT, request))
        .await?
        .into_inner()
        .job_id)
}

/// Waits until job `id` has `status`.
async fn wait_for_status(fleet: &Fleet, id: &str, status: v1::JobStatus) -> anyhow::Result<()> {
    let api = fleet.api(0).await?;
    wait_until(&format!("job {id} to be {status:?}"), WAIT, || {
        let mut api = api.clone();
        let id = id.to_owned();
        async move {
            let job = api
                .get_job(bearer(AGENT, v1::GetJobRequest { job_id: id }))
                .await
                .ok()?;
            (job.into_inner().status() == status).then_some(())
        }
    })
    .await
}

/// A job that adds two numbers with `calculate` and says the sum.
fn sum_job() -> v1::SubmitJobRequest {
    let script = json!([
        {"tool_calls": [{"id": "math", "name": "calculate", "arguments": {"expression": "6 * 7"}}]},
        {"message": "6 times 7 is {{math.data.result}}."}
    ]);
    let mut job = scripted_job("What is 6 times 7?", &script);
    job.metadata.insert("team".into(), "billing".into());
    job
}

/// A job whose `calculate` call waits for an approver: running until
/// someone decides or cancels it.
fn held_job() -> v1::SubmitJobRequest {
    let script = json!([
        {"tool_calls": [{"id": "math", "name": "calculate", "arguments": {"expression": "1 + 1"}}]},
        {"message": "{{math.data.result}}"}
    ]);
    let mut job = scripted_job("Add one and one, once approved.", &script);
    job.require_approval = vec!["calculate".to_owned()];
    job
}

/// A job that carries every payload in its input, its metadata (keys and
/// values), a tool's arguments and output (`echo` returns its arguments)
/// and its answer (which quotes that output).
fn hostile_job() -> v1::SubmitJobRequest {
    let all = PAYLOADS.join(" ");
    let script = json!([
        {"tool_calls": [{"id": "say", "name": "echo", "arguments": {"text": all}}]},
        {"message": "The tool said: {{say.data.text}}"}
    ]);
    let mut job = scripted_job(&all, &script);
    for (i, payload) in PAYLOADS.iter().enumerate() {
        job.metadata
            .insert(format!("note{i}"), (*payload).to_owned());
    }
    job.metadata
        .insert("<svg onload=window.__xss=1>".into(), "a key".into());
    job
}

/// Everything a visit of tests/console/pages.mjs saw that must never
/// happen: a script run, a dialog, a policy violation, an error, markup
/// made of what the page shows, a request for anything but the page, its
/// stylesheet, its script and a running job's events, a page wider than
/// the window.
fn harmless(visit: &Value) -> Vec<String> {
    let at = format!("{} at {} px", visit["name"], visit["width"]);
    let mut wrong = Vec::new();
    if visit["xss"] != json!(false) {
        wrong.push(format!("{at}: a payload ran (window.__xss is set)"));
    }
    for list in ["dialogs", "csp", "errors"] {
        if visit[list].as_array().is_none_or(|l| !l.is_empty()) {
            wrong.push(format!("{at}: {list}: {}", visit[list]));
        }
    }
    if let Some(markup) = visit["markup"].as_object() {
        for (what, count) in markup.iter().filter(|(_, n)| **n != json!(0)) {
            wrong.push(format!("{at}: {count} {what} in the page"));
        }
    }
    let fetched = visit["requests"].as_array().cloned().unwrap_or_default();
    for request in fetched.iter().filter_map(Value::as_str) {
        let allowed = request.starts_with("document ")
            || request.ends_with("/assets/console.css")
            || request.ends_with("/assets/console.js")
            || (request.starts_with("eventsource ")
                && (request.ends_with("/events") || request.contains("/jobs/live?")))
            || request.ends_with("/favicon.ico");
        if !allowed {
            wrong.push(format!("{at}: fetched {request}"));
        }
    }
    let (wide, window) = (visit["scroll_width"].as_u64(), visit["width"].as_u64());
    if wide.is_none() || wide > window || visit["client_width"].as_u64() > window {
        wrong.push(format!("{at}: {} px wide", visit["scroll_width"]));
    }
    wrong
}

/// The visits of a pages.mjs report, by name and width.
fn visits(report: &Value) -> Vec<&Value> {
    report["visits"]
        .as_array()
        .map(|v| v.iter().collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_person_signs_in_by_keyboard_reads_a_job_cancels_one_and_signs_out() -> anyhow::Result<()>
{
    let stage = Stage::start().await?;
    let (fleet, base) = (&stage.fleet, stage.base.as_str());
    let browser = Browser::new("session")?;
    let finished = submit(fleet, sum_job()).await?;
    let held = submit(fleet, held_job()).await?;
    wait_for_status(fleet, &finished, v1::JobStatus::Succeeded).await?;
    wait_for_status(fleet, &held, v1::JobStatus::WaitingForApproval).await?;

    let input = json!({"console": base, "token": AGENT, "job": finished, "held": held});
    let seen = browser.run("session", &input).await?;
    let at = |step: &str| seen[step].to_string();
    // Not signed in: sent to sign in. The skip link is the first Tab stop
    // and passes the header: the next Tab is the token field.
    assert_eq!(seen["unsigned"]["path"], "/sign-in", "{}", at("unsigned"));
    assert_eq!(
        seen["first_tab"]["text"],
        "Skip to content",
        "{}",
        at("first_tab")
    );
    assert_eq!(seen["after_skip"]["hash"], "#main");
    assert_eq!(
        seen["tab_after_skip"]["id"],
        "token",
        "{}",
        at("tab_after_skip")
    );
    // Typed, then Enter: the jobs page, with a cookie scripts cannot read.
    assert_eq!(seen["signed_in"]["path"], "/jobs", "{}", at("signed_in"));
    assert_eq!(
        seen["session_cookie"],
        json!({"http_only": true, "secure": true, "same_site": "Strict"})
    );
    let jobs = seen["jobs"]["text"].as_str().unwrap_or_default();
    assert!(jobs.contains(&finished) && jobs.contains(&held), "{jobs}");
    assert!(jobs.contains("succeeded") && jobs.contains("waiting_for_approval"));
    assert_eq!(seen["jobs_first_tab"]["text"], "Skip to content");
    let past_header = &seen["jobs_tab_after_skip"];
    assert!(
        past_header["in_main"] == json!(true) && past_header["id"] == "status",
        "the Tab after the skip link: {past_header}"
    );
    // The job, opened from the list: its facts, answer and transcript.
    assert_eq!(seen["opened"]["path"], format!("/jobs/{finished}"));
    let job = seen["job"]["text"].as_str().unwrap_or_default();
    assert!(
        job.contains("6 times 7 is 42.") && job.contains("billing"),
        "{job}"
    );
    assert_eq!(
        seen["job"]["labels"],
        json!([
            "Input",
            "Call calculate (math)",
            "Result of calculate (math), after 1 attempt(s)",
            "Model"
        ])
    );
    // Cancelled from its page: the page says so and offers no more cancel.
    assert_eq!(seen["held_before"], "waiting_for_approval");
    assert_eq!(seen["cancelled"]["path"], format!("/jobs/{held}"));
    assert_eq!(seen["held_after"], "cancelled");
    assert_eq!(seen["cancel_button_after"], false);
    // Signed out: the sign-in page, and it stays so; the old cookie, put
    // back, is a session the console no longer knows.
    assert_eq!(seen["signed_out"]["path"], "/sign-in");
    assert_eq!(seen["reloaded"], "/sign-in");
    assert_eq!(seen["after_sign_out"]["path"], "/sign-in");
    assert_eq!(seen["old_cookie"]["path"], "/sign-in?expired=1");
    for list in ["dialogs", "csp", "errors"] {
        assert_eq!(seen["seen"][list], json!([]), "{list}");
    }

    // Another tenant's person sees none of it: not in the list, and the
    // job's own address says not found.
    let job_path = format!("/jobs/{finished}");
    let input = json!({
        "console": base, "token": STRANGER, "widths": [1280],
        "pages": [{"name": "other-jobs", "path": "/jobs"}, {"name": "other-job", "path": job_path}],
    });
    let report = browser.run("pages", &input).await?;
    let [list, foreign] = visits(&report)[..] else {
        anyhow::bail!("two visits: {report}");
    };
    let listed = list["text"].as_str().unwrap_or_default();
    assert!(
        list["status"] == 200 && !listed.contains(&finished) && !listed.contains(&held),
        "{listed}"
    );
    assert_eq!(foreign["status"], 404, "{}", foreign["text"]);
    assert_eq!(foreign["h1"], "404");
    assert!(
        !foreign["text"]
            .as_str()
            .unwrap_or_default()
            .contains("billing")
    );
    Ok(())
}

/// A round of three parallel calls held for approval, each to decide
/// differently: the answer says what each call gave.
fn three_held_calls() -> v1::SubmitJobRequest {
    let script = json!([
        {"tool_calls": [
            {"id": "one", "name": "calculate", "arguments": {"expression": "1 + 1"}},
            {"id": "two", "name": "calculate", "arguments": {"expression": "2 + 2"}},
            {"id": "three", "name": "calculate", "arguments": {"expression": "3 + 3"}}]},
        {"message": "{{one.data.result}} {{two.data.result}} {{three.error.code}}"}
    ]);
    let mut job = scripted_job("Three sums, each approved or not.", &script);
    job.require_approval = vec!["calculate".to_owned()];
    job
}

/// Submits two calls that kill their worker every time, asking an
/// operator when their outcome is unknown, and restarts the dead worker
/// (as a supervisor would) until the job waits for the verdicts, then
/// once more so that the next calls have a worker. Its job's id.
async fn two_unknown_outcomes(fleet: &Fleet) -> anyhow::Result<String> {
    let script = json!([
        {"tool_calls": [
            {"id": "charge", "name": "crash", "arguments": {}},
            {"id": "mail", "name": "crash", "arguments": {}}]},
        {"message": "{{charge.data.charged}} / {{mail.error.code}}: {{mail.error.message}}"}
    ]);
    let mut job = scripted_job("Charge, then mail.", &script);
    job.on_unknown_outcome = "ask".into();
    let id = submit(fleet, job).await?;
    tokio::select! {
        parked = wait_for_status(fleet, &id, v1::JobStatus::WaitingForApproval) => parked?,
        () = fleet.restart_dead_workers() => unreachable!("the restarter never ends"),
    }
    for worker in fleet.workers() {
        if !worker.is_running() {
            worker.respawn()?;
            worker.wait_for_log("worker ready", WAIT).await?;
        }
    }
    Ok(id)
}

#[tokio::test]
async fn approvers_and_operators_decide_held_calls_and_a_reader_decides_nothing()
-> anyhow::Result<()> {
    let stage = Stage::start().await?;
    let fleet = &stage.fleet;
    let browser = Browser::new("decide")?;
    let outcomes = two_unknown_outcomes(fleet).await?;
    let approvals = submit(fleet, three_held_calls()).await?;
    let waiting = submit(fleet, held_job()).await?;
    let input = json!({
        "console": stage.base, "approver": APPROVER, "operator": OPERATOR, "reader": READER,
        "approvals": approvals, "outcomes": outcomes, "waiting": waiting,
        "edited": "{\"expression\": \"20 + 2\"}", "result": "{\"charged\": 5}",
    });
    let seen = browser.run("decide", &input).await?;
    let at = |step: &str| seen[step].to_string();

    // The approver sees the calls held for approval (the waiting job's
    // too), not the outcomes an operator decides.
    let mut held: Vec<&str> = seen["approver_held"]["calls"]
        .as_array()
        .map(|calls| calls.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    held.sort_unstable();
    assert_eq!(
        held,
        ["math", "one", "three", "two"],
        "{}",
        at("approver_held")
    );
    let decided = |step: &str| {
        let page = &seen[step];
        page["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/approvals?decided="))
            && page["text"]
                .as_str()
                .is_some_and(|t| t.contains("Decided:"))
    };
    assert!(decided("approved"), "{}", at("approved"));
    // The edit is reviewed as a diff of the model's arguments before it
    // is sent.
    assert_eq!(
        seen["review"]["h1"],
        "Approve calculate with edited arguments?",
        "{}",
        at("review")
    );
    let diff = seen["diff"].as_array().cloned().unwrap_or_default();
    let line = |kind: &str, text: &str| {
        diff.iter()
            .any(|l| l["kind"] == kind && l["text"].as_str().is_some_and(|t| t.contains(text)))
    };
    assert!(
        line("removed", "\"2 + 2\"") && line("added", "\"20 + 2\""),
        "{diff:?}"
    );
    assert!(decided("confirmed"), "{}", at("confirmed"));
    assert!(decided("rejected"), "{}", at("rejected"));
    // The job ran exactly what was decided.
    assert_eq!(
        seen["approvals_job"]["status"],
        "succeeded",
        "{}",
        at("approvals_job")
    );
    assert!(
        at("approvals_job").contains("2 22 REJECTED_BY_APPROVER"),
        "{}",
        at("approvals_job")
    );

    // The operator sees the unknown outcomes, with what the worker said.
    // Oldest first: the two calls are given up in either order.
    let mut outcomes: Vec<&str> = seen["operator_held"]["calls"]
        .as_array()
        .map(|calls| calls.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    outcomes.sort_unstable();
    assert_eq!(outcomes, ["charge", "mail"], "{}", at("operator_held"));
    assert!(at("operator_held").contains("MAX_DELIVERIES_EXCEEDED"));
    assert!(decided("applied"), "{}", at("applied"));
    assert!(decided("failed"), "{}", at("failed"));
    assert_eq!(
        seen["outcomes_job"]["status"],
        "succeeded",
        "{}",
        at("outcomes_job")
    );
    assert!(
        at("outcomes_job").contains(
            "5 / FAILED_BY_OPERATOR: an operator failed the call: the mail server was down"
        ),
        "{}",
        at("outcomes_job")
    );

    // The reader: no held calls in the menu, none to open, no button on a
    // waiting job's page.
    assert_eq!(
        seen["reader_nav"],
        json!(["Jobs", "Tools"]),
        "{}",
        at("reader_nav")
    );
    assert!(
        at("reader_job").contains("waiting_for_approval"),
        "{}",
        at("reader_job")
    );
    assert_eq!(seen["reader_buttons"], json!([]));
    assert_eq!(
        seen["reader_approvals"]["status"],
        403,
        "{}",
        at("reader_approvals")
    );
    for person in ["approver", "operator", "reader"] {
        for list in ["dialogs", "csp", "errors"] {
            assert_eq!(seen["seen"][person][list], json!([]), "{person}: {list}");
        }
    }
    Ok(())
}

/// An Anthropic stream that writes "Part one:" and every payload, pauses
/// until the test releases it, then writes " Part two." and ends.
fn paused_stream() -> String {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let delta = |text: &str| {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": text}}),
        )
    };
    [
        event(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": "msg_live", "type": "message", "role": "assistant", "content": [],
                "model": "claude-test", "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 25, "output_tokens": 1}}}),
        ),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}}),
        ),
        delta("Part one: "),
        delta(&PAYLOADS.join(" ")),
        PAUSE.to_owned(),
        delta(" Part two."),
        event("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                   "usage": {"output_tokens": 15}}),
        ),
        event("message_stop", json!({"type": "message_stop"})),
    ]
    .concat()
}

/// The test's side of a live scenario, for the browser to call: `/submit`
/// submits a streamed job as the agent (its id), `/release` lets the
/// model's stream go on. Serves until dropped.
struct Control {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Control {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Control {
    async fn start(stage: &Stage) -> anyhow::Result<Self> {
        use axum::routing::get;
        let api = stage.fleet.api(0).await?;
        let claude = Arc::clone(&stage.claude);
        let app = axum::Router::new()
            .route(
                "/submit",
                get(move || {
                    let mut api = api.clone();
                    async move {
                        let job = bearer(AGENT, streamed_job("Say it in two parts."));
                        match api.submit_job(job).await {
                            Ok(submitted) => submitted.into_inner().job_id,
                            Err(status) => format!("refused: {status}"),
                        }
                    }
                }),
            )
            .route(
                "/release",
                get(move || {
                    claude.release_stream();
                    async { "released" }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, task })
    }
}

#[tokio::test]
async fn a_job_appears_streams_and_finishes_live() -> anyhow::Result<()> {
    let stage = Stage::start().await?;
    let browser = Browser::new("live")?;
    stage.claude.push(Reply::Stream(paused_stream()));
    let control = Control::start(&stage).await?;
    let input = json!({"console": stage.base, "token": AGENT, "control": control.url});
    let seen = browser.run("live", &input).await?;
    let at = |step: &str| seen[step].to_string();

    // Submitted while the jobs page was open: there without a reload.
    let id = seen["appeared"]["id"].as_str().unwrap_or_default();
    assert!(id.starts_with("ops-"), "{}", at("appeared"));
    assert_eq!(seen["appeared"]["stayed"], true, "{}", at("appeared"));
    assert!(at("appeared").contains("running"), "{}", at("appeared"));
    // Its page while the model writes: the first part, payloads as text.
    assert_eq!(seen["running"], "running");
    let answer = seen["streaming"]["answer"].as_str().unwrap_or_default();
    assert_eq!(answer, format!("Part one: {}", PAYLOADS.join(" ")));
    assert_eq!(seen["streaming"]["state"], "live", "{}", at("streaming"));
    // Finished: the page reloaded itself with the whole answer, the
    // transcript and the waterfall.
    let finished = &seen["finished"];
    assert_eq!(finished["status"], "succeeded", "{finished}");
    assert_eq!(finished["waterfall"], true, "{finished}");
    let text = finished["text"].as_str().unwrap_or_default();
    assert!(text.contains(&format!("{answer} Part two.")), "{text}");
    for step in ["appeared", "streaming", "finished"] {
        assert_eq!(seen[step]["xss"], false, "{step}: a payload ran");
        assert_eq!(seen[step]["markup"]["script"], 0, "{step}");
        assert_eq!(seen[step]["markup"]["img"], 0, "{step}");
    }
    for list in ["dialogs", "csp", "errors"] {
        assert_eq!(seen["seen"][list], json!([]), "{list}");
    }
    Ok(())
}

#[tokio::test]
async fn a_person_signs_in_through_the_company_openid_provider() -> anyhow::Result<()> {
    use toolfleet_tests::identity::Person;
    let ana = Person {
        name: "ana",
        tenant: "ops",
        roles: &["approver", "reader"],
    };
    let listen = free_loopback_address()?;
    let port = listen.rsplit(':').next().unwrap_or_default().to_owned();
    let callback = format!("http://localhost:{port}/oidc/callback");
    let sign_in = toolfleet_tests::console::openid_sign_in(&callback, ana).await?;
    let provider = &sign_in.provider;
    let env = [("TOOLFLEET_API__IDENTITY__ISSUERS", sign_in.issuers.as_str())];
    let stage = Stage::start_with(&env, &sign_in.flags(), listen).await?;
    let browser = Browser::new("oidc")?;
    let seen = browser
        .run("oidc", &json!({"console": stage.base, "account": "ana"}))
        .await?;
    let at = |step: &str| seen[step].to_string();
    assert_eq!(seen["offered"], true);
    assert_eq!(
        seen["provider"]["origin"],
        provider.issuer(),
        "{}",
        at("provider")
    );
    // Signed in as the provider's person, with the roles it gave.
    let landed = seen["landed"]["path"].as_str().unwrap_or_default();
    assert_eq!(landed, "/jobs", "{}", at("landed"));
    let who = seen["who"].as_str().unwrap_or_default();
    assert!(
        who.contains("ana") && who.contains("ops · approver, reader"),
        "{who}"
    );
    assert_eq!(
        seen["session_cookie"],
        json!({"http_only": true, "secure": true, "same_site": "Strict"})
    );
    // No address carried a credential: the provider's one-time code in
    // the callback's alone.
    for address in seen["documents"].as_array().cloned().unwrap_or_default() {
        let address = address.as_str().unwrap_or_default();
        assert!(
            !address.contains("token") && !address.contains("eyJ"),
            "{address}"
        );
    }
    for list in ["dialogs", "csp", "errors"] {
        assert_eq!(seen["seen"][list], json!([]), "{list}");
    }
    Ok(())
}

#[tokio::test]
async fn every_page_fits_a_laptop_and_a_phone_and_runs_nothing_it_shows() -> anyhow::Result<()> {
    let stage = Stage::start().await?;
    let (fleet, base) = (&stage.fleet, stage.base.as_str());
    let browser = Browser::new("pages")?;
    let sum = submit(fleet, sum_job()).await?;
    let held = submit(fleet, held_job()).await?;
    let hostile = submit(fleet, hostile_job()).await?;
    // The same payloads in the arguments of a call held for approval.
    let mut hostile_held = hostile_job();
    hostile_held.require_approval = vec!["echo".to_owned()];
    let hostile_held = submit(fleet, hostile_held).await?;
    wait_for_status(fleet, &sum, v1::JobStatus::Succeeded).await?;
    wait_for_status(fleet, &hostile, v1::JobStatus::Succeeded).await?;
    wait_for_status(fleet, &held, v1::JobStatus::WaitingForApproval).await?;
    wait_for_status(fleet, &hostile_held, v1::JobStatus::WaitingForApproval).await?;

    let signed_out = json!({"console": base, "pages": [{"name": "sign-in", "path": "/sign-in"}]});
    let agent = json!({
        "console": base, "token": AGENT,
        "pages": [
            {"name": "jobs", "path": "/jobs"},
            {"name": "job", "path": format!("/jobs/{sum}")},
            {"name": "held", "path": format!("/jobs/{held}")},
            {"name": "hostile", "path": format!("/jobs/{hostile}")},
            {"name": "not-found", "path": "/jobs/ops-0123456789abcdef0123456789ab"},
            {"name": "tools", "path": "/tools"},
        ],
    });
    let approver = json!({
        "console": base, "token": APPROVER,
        "pages": [{"name": "approvals", "path": "/approvals"}],
    });
    // An operator's tools page has the fleet's columns and MCP servers.
    let operator = json!({
        "console": base, "token": OPERATOR,
        "pages": [{"name": "tools-fleet", "path": "/tools"}],
    });
    let mut seen = browser.run("pages", &signed_out).await?;
    for person in [agent, approver, operator] {
        let more = browser.run("pages", &person).await?;
        if let (Some(all), Some(more)) = (seen["visits"].as_array_mut(), more["visits"].as_array())
        {
            all.extend(more.iter().cloned());
        }
    }
    let all = visits(&seen);
    assert_eq!(all.len(), 18, "nine pages at two widths: {seen}");
    let wrong: Vec<String> = all.iter().flat_map(|visit| harmless(visit)).collect();
    assert!(
        wrong.is_empty(),
        "{wrong:#?}\nscreenshots <page>-<width>.png in {}",
        browser.screenshots().display()
    );
    for visit in &all {
        let expected = if visit["name"] == "not-found" {
            404
        } else {
            200
        };
        assert_eq!(visit["status"], expected, "{}", visit["name"]);
        assert!(visit["screenshot"].is_string());
    }

    // Every payload is on the hostile job's page as the text it was: in
    // the input, the metadata, the call's arguments and its result (JSON,
    // so quotes are escaped there), and the answer.
    for visit in all.iter().filter(|v| v["name"] == "hostile") {
        let text = visit["text"].as_str().unwrap_or_default();
        for payload in PAYLOADS {
            let in_json = serde_json::to_string(payload)?;
            let in_json = &in_json[1..in_json.len() - 1];
            assert!(
                text.matches(payload).count() >= 3 && text.matches(in_json).count() >= 2,
                "{payload} as text at {} px in:\n{text}",
                visit["width"]
            );
        }
        assert!(
            text.contains("<svg onload=window.__xss=1>\ta key"),
            "{text}"
        );
    }
    // And as the text they were where an MCP server's tool describes
    // itself, and in the arguments of a held call.
    for visit in all.iter().filter(|v| {
        ["tools", "tools-fleet", "approvals"].contains(&v["name"].as_str().unwrap_or_default())
    }) {
        let text = visit["text"].as_str().unwrap_or_default();
        for payload in PAYLOADS {
            // Arguments are JSON, quotes escaped.
            let in_json = serde_json::to_string(payload)?;
            let in_json = &in_json[1..in_json.len() - 1];
            assert!(
                text.contains(if visit["name"] == "approvals" {
                    in_json
                } else {
                    payload
                }),
                "{payload} as text on {} at {} px in:\n{text}",
                visit["name"],
                visit["width"]
            );
        }
    }
    eprintln!("screenshots in {}", browser.screenshots().display());
    Ok(())
}

/// The checks above would catch a console that printed what it shows as
/// markup: a page that does, served with and without the console's
/// policy, trips them.
#[tokio::test]
async fn the_checks_catch_a_page_that_runs_what_it_shows() -> anyhow::Result<()> {
    use axum::http::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE};
    let page = format!(
        "<!doctype html><title>unsafe</title><main><h1>unsafe</h1><p>{}</p></main>",
        PAYLOADS.join(" ")
    );
    let unguarded = page.clone();
    let app = axum::Router::new()
        .route(
            "/guarded",
            axum::routing::get(move || async move {
                let csp = "default-src 'none'; script-src 'self'; img-src 'self'";
                (
                    [(CONTENT_SECURITY_POLICY, csp), (CONTENT_TYPE, "text/html")],
                    page,
                )
            }),
        )
        .route(
            "/unguarded",
            axum::routing::get(move || async move { ([(CONTENT_TYPE, "text/html")], unguarded) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://localhost:{}", listener.local_addr()?.port());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let browser = Browser::new("checks")?;
    let input = json!({
        "console": base, "widths": [1280], "screenshots": false,
        "pages": [{"name": "guarded", "path": "/guarded"}, {"name": "unguarded", "path": "/unguarded"}],
    });
    let report = browser.run("pages", &input).await?;
    server.abort();
    let [guarded, unguarded] = visits(&report)[..] else {
        anyhow::bail!("two visits: {report}");
    };
    // The policy stops the scripts and says so; the markup is still there.
    let caught = harmless(guarded);
    assert!(
        caught.iter().any(|w| w.contains("csp")) && caught.iter().any(|w| w.contains("script")),
        "{caught:#?}"
    );
    assert_eq!(guarded["xss"], false);
    // Without it, they run.
    let caught = harmless(unguarded);
    assert!(caught.iter().any(|w| w.contains("ran")), "{caught:#?}");
    Ok(())
}
