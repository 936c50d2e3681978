//! MCP Tasks through the fleet (docs/tools/mcp.md, "Tasks"): a server that
//! answers a call with a task (tests/mcp/tasks_server.py, on FastMCP's
//! `fastmcp-tasks`, the extension's first server) has its task followed to
//! its end, and by the next worker when the first dies or drains: the tool
//! runs once.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{
    ApiClient, FAST_REDELIVERY, Fleet, call_results, scripted_job, wait_finished,
};
use toolfleet_tests::mcp::fleet_with_env;
use toolfleet_tests::{repo_root, venv_python, wait_until};

/// The tasks server on `address`, writing what its tools do in `scratch`.
fn start_tasks_server(scratch: &Path, address: &str) -> anyhow::Result<tokio::process::Child> {
    let port = address.rsplit(':').next().unwrap_or_default().to_owned();
    let server = repo_root().join("tests/mcp/tasks_server.py");
    Ok(tokio::process::Command::new(venv_python()?)
        .args([server.display().to_string(), port])
        .env("MCP_TEST_DIR", scratch)
        .kill_on_drop(true)
        .spawn()?)
}

/// The tools the fleet serves of the tasks server.
const TOOLS: [&str; 2] = ["jobs__book", "jobs__lookup"];

/// A fleet whose worker serves the tasks server at `address` as `jobs`,
/// with `extra` lines in its table, redelivering within a second and
/// handing calls in flight back a second into a drain.
async fn fleet_of_tasks(address: &str, extra: &str) -> anyhow::Result<Fleet> {
    let config = format!(
        "[[mcp.servers]]\nname = \"jobs\"\nurl = \"http://{address}/mcp\"\n\
         tools = [\"book\", \"lookup\"]\n{extra}\n"
    );
    let env = [
        FAST_REDELIVERY,
        &[("TOOLFLEET_RUNTIME__DRAIN_TIMEOUT", "1s")],
    ]
    .concat();
    fleet_with_env(&config, &TOOLS, &env).await
}

/// What the server's tools did, a line each.
fn effects(scratch: &Path) -> Vec<String> {
    std::fs::read_to_string(scratch.join("effects"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits until the server's tools did `line`.
async fn wait_effect(scratch: &Path, line: &str) -> anyhow::Result<()> {
    wait_until(line, Duration::from_secs(30), || async move {
        effects(scratch).iter().any(|l| l == line).then_some(())
    })
    .await
}

/// Submits a job that calls `tool` (`jobs__<tool>`) with `key` for
/// `seconds`, as call `key`.
async fn submit(api: &ApiClient, tool: &str, key: &str, seconds: f64) -> anyhow::Result<String> {
    let script = json!([
        {"tool_calls": [{"id": key, "name": format!("jobs__{tool}"),
                         "arguments": {"key": key, "seconds": seconds}}]},
        {"message": "done"}
    ]);
    let submitted = api.clone().submit_job(scripted_job(key, &script)).await?;
    Ok(submitted.into_inner().job_id)
}

/// The answer to call `key` of the finished job `job_id`.
async fn answer(api: &ApiClient, job_id: &str, key: &str) -> anyhow::Result<serde_json::Value> {
    let job = wait_finished(api, job_id).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{:?}", job.error);
    Ok(call_results(&job)[key].clone())
}

/// A worker killed (SIGKILL) while its call waits on the server's task,
/// and one drained (SIGTERM, a drain shorter than the task) are each
/// followed by a worker that polls the same task: the tool, which is not
/// idempotent, runs once, and its result reaches the model.
#[tokio::test]
async fn a_task_outlives_the_worker_that_waits_on_it_and_the_tool_runs_once() -> anyhow::Result<()>
{
    let scratch = tempfile::tempdir()?;
    let address = toolfleet_tests::free_loopback_address()?;
    let _server = start_tasks_server(scratch.path(), &address)?;
    let fleet = fleet_of_tasks(&address, "").await?;
    let api = fleet.api(0).await?;
    for (key, stop) in [("killed", "kill"), ("drained", "drain")] {
        let following = fleet.count_in_worker_logs("following the MCP server's task");
        let job_id = submit(&api, "book", key, 6.0).await?;
        wait_effect(scratch.path(), &format!("start {key}")).await?;
        let worker = fleet.worker(0);
        wait_until("the task saved", Duration::from_secs(10), || async {
            (fleet.count_in_worker_logs("following the MCP server's task") > following)
                .then_some(())
        })
        .await?;
        if stop == "kill" {
            worker.kill();
        } else {
            worker.terminate()?;
            worker.wait_exit(Duration::from_secs(30)).await?;
        }
        worker.respawn()?;
        let result = answer(&api, &job_id, key).await?;
        assert_eq!(result["data"], json!({"booked": key}), "{stop}: {result}");
        let lines: Vec<String> = effects(scratch.path())
            .into_iter()
            .filter(|line| line.ends_with(&format!(" {key}")))
            .collect();
        assert_eq!(
            lines,
            [format!("start {key}"), format!("done {key}")],
            "{stop}"
        );
    }
    assert_eq!(
        fleet.count_in_worker_logs("resuming the call: following the MCP server's task"),
        2,
        "each successor followed the task its predecessor saved"
    );
    Ok(())
}

/// A server restarted while a call waits on its task has forgotten the
/// task (its tasks lived in its memory): the side effect's outcome is
/// unknown, and is not run again; the read-only call is run again, as a
/// new task.
#[tokio::test]
async fn a_task_the_server_forgot_is_an_unknown_outcome_or_run_again_when_harmless()
-> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let address = toolfleet_tests::free_loopback_address()?;
    let mut server = start_tasks_server(scratch.path(), &address)?;
    let fleet = fleet_of_tasks(&address, "call_timeout = \"60s\"").await?;
    let api = fleet.api(0).await?;
    let jobs = book_and_look_up(&fleet, scratch.path(), "lost", "again").await?;
    server.kill().await?;
    let _server = start_tasks_server(scratch.path(), &address)?;
    assert_forgotten(&api, scratch.path(), jobs, "lost", "again").await
}

/// Submits a job that books `book` and one that looks `lookup` up, 8 s
/// each, and waits until the worker of `fleet` follows both tasks; the
/// jobs' ids.
async fn book_and_look_up(
    fleet: &Fleet,
    scratch: &Path,
    book: &str,
    lookup: &str,
) -> anyhow::Result<(String, String)> {
    let api = fleet.api(0).await?;
    let booked = submit(&api, "book", book, 8.0).await?;
    let looked = submit(&api, "lookup", lookup, 8.0).await?;
    wait_effect(scratch, &format!("start {book}")).await?;
    wait_effect(scratch, &format!("lookup {lookup}")).await?;
    wait_until("both tasks saved", Duration::from_secs(10), || async {
        (fleet.count_in_worker_logs("following the MCP server's task") == 2).then_some(())
    })
    .await?;
    Ok((booked, looked))
}

/// What the `jobs` of [`book_and_look_up`] end with once the server forgot
/// their tasks: the booking an unknown outcome, never run again; the
/// lookup run again.
async fn assert_forgotten(
    api: &ApiClient,
    scratch: &Path,
    (booked, looked): (String, String),
    book: &str,
    lookup: &str,
) -> anyhow::Result<()> {
    let unknown = answer(api, &booked, book).await?;
    assert_eq!(unknown["error"]["code"], "OUTCOME_UNKNOWN", "{unknown}");
    assert_eq!(unknown["error"]["retryable"], false, "{unknown}");
    let again = answer(api, &looked, lookup).await?;
    assert_eq!(again["data"], json!({"found": lookup}), "{again}");
    let done = effects(scratch);
    let count = |line: String| done.iter().filter(|l| **l == line).count();
    assert_eq!(count(format!("start {book}")), 1, "{done:?}");
    assert_eq!(count(format!("lookup {lookup}")), 2, "{done:?}");
    Ok(())
}

/// A call past its timeout cancels its task on the server (`tasks/cancel`),
/// and a side effect stopped midway is an unknown outcome.
#[tokio::test]
async fn a_call_past_its_timeout_cancels_its_task() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let address = toolfleet_tests::free_loopback_address()?;
    let _server = start_tasks_server(scratch.path(), &address)?;
    let fleet = fleet_of_tasks(&address, "call_timeout = \"3s\"").await?;
    let api = fleet.api(0).await?;
    let job_id = submit(&api, "book", "late", 60.0).await?;
    let late = answer(&api, &job_id, "late").await?;
    assert_eq!(late["error"]["code"], "OUTCOME_UNKNOWN", "{late}");
    wait_effect(scratch.path(), "cancelled late").await?;
    assert_eq!(effects(scratch.path()), ["start late", "cancelled late"]);
    Ok(())
}

/// A stdio server is lost with its worker (kill -9), and its tasks with
/// it: the worker that takes the calls over starts the server anew, which
/// does not know them. The side effect is an unknown outcome, never run
/// again (FastMCP's server, its input closed, still ends the tasks it
/// runs before it exits: the effect may well happen, once); the read-only
/// call runs again.
#[tokio::test]
async fn a_stdio_servers_tasks_are_lost_with_its_worker_and_the_calls_answered_by_their_effects()
-> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = format!(
        "[[mcp.servers]]\nname = \"jobs\"\ncommand = {python:?}\nargs = [{server:?}, \"stdio\"]\n\
         env = {{ MCP_TEST_DIR = {dir:?} }}\ntools = [\"book\", \"lookup\"]\ncall_timeout = \"60s\"\n",
        python = venv_python()?.display().to_string(),
        server = repo_root()
            .join("tests/mcp/tasks_server.py")
            .display()
            .to_string(),
        dir = scratch.path().display().to_string(),
    );
    let fleet = fleet_with_env(&config, &TOOLS, FAST_REDELIVERY).await?;
    let api = fleet.api(0).await?;
    let jobs = book_and_look_up(&fleet, scratch.path(), "gone", "rerun").await?;
    fleet.worker(0).kill();
    fleet.worker(0).respawn()?;
    assert_forgotten(&api, scratch.path(), jobs, "gone", "rerun").await
}

/// A job cancelled while its call waits on the server's task: the
/// orchestrator tells the workers, the worker that runs the call stops it
/// at its next renewal, and the task is cancelled on the server.
#[tokio::test]
async fn a_cancelled_jobs_task_is_cancelled_on_the_server() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let address = toolfleet_tests::free_loopback_address()?;
    let _server = start_tasks_server(scratch.path(), &address)?;
    let fleet = fleet_of_tasks(&address, "call_timeout = \"60s\"").await?;
    let api = fleet.api(0).await?;
    let job_id = submit(&api, "book", "stop", 60.0).await?;
    wait_effect(scratch.path(), "start stop").await?;
    wait_until("the task followed", Duration::from_secs(10), || async {
        (fleet.count_in_worker_logs("following the MCP server's task") == 1).then_some(())
    })
    .await?;
    api.clone()
        .cancel_job(v1::CancelJobRequest {
            job_id: job_id.clone(),
        })
        .await?;
    wait_effect(scratch.path(), "cancelled stop").await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status(), v1::JobStatus::Cancelled);
    assert_eq!(effects(scratch.path()), ["start stop", "cancelled stop"]);
    assert_eq!(
        fleet.count_in_worker_logs("the call's job was cancelled; the call is stopped"),
        1
    );
    Ok(())
}
