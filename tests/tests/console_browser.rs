//! The web console (`toolfleet console`, decision 0050) in a real browser,
//! Debian's Chromium driven by the scenarios of tests/console
//! (`toolfleet_tests::browser`), against a real fleet: a person signs in
//! by keyboard, reads a job, cancels another and signs out; another
//! tenant sees none of it; every page fits a laptop and a phone; and what
//! a job carries (its input, metadata, a tool's arguments and output, the
//! answer) is shown as text and never runs. Each page is screenshotted at
//! each width (docs/console.md says how to refresh its pictures).

use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_proto::v1;
use toolfleet_tests::browser::Browser;
use toolfleet_tests::fleet::{Fleet, scripted_job, test_fleet};
use toolfleet_tests::identity::{bearer, wait_for_tools};
use toolfleet_tests::{ChildProcess, cargo_bin, free_loopback_address, wait_until};

const AGENT: &str = "tok-browser-agent-7a31";
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

/// A fleet whose tokens file has an agent of tenant `ops` and a token of
/// tenant `other`, and the console in front of it (as tests/tests/console.rs
/// starts them). Returns them and the console's base URL.
async fn fleet_and_console() -> anyhow::Result<(tempfile::TempDir, Fleet, ChildProcess, String)> {
    use toolfleet_orchestrator::auth::token_sha256;
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[tenants.ops]\ntoken_sha256 = [\"{}\"]\nroles = {{ \"{}\" = [\"agent\"] }}\n\
             [tenants.other]\ntoken_sha256 = [\"{}\"]\n",
            token_sha256(AGENT),
            token_sha256(AGENT),
            token_sha256(STRANGER),
        ),
    )?;
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let file = tokens.display().to_string();
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_API__AUTH", "tokens"),
            ("TOOLFLEET_API__TOKENS_FILE", file.as_str()),
        ])
        .await?;
    let api = fleet.api(0).await?;
    wait_for_tools(&api, AGENT, &["calculate", "echo"]).await?;
    let listen = free_loopback_address()?;
    let console = ChildProcess::spawn(
        "console",
        cargo_bin("toolfleet")?,
        [
            "console",
            "--addr",
            &fleet.grpc_url(0).await?,
            "--listen",
            &listen,
            "--redis-url",
            &fleet.redis.url(),
        ],
        std::iter::empty::<(&str, &str)>(),
    )?;
    console
        .wait_for_log("toolfleet console: http://", WAIT)
        .await?;
    // By name: a browser keeps the console's `Secure` cookies over plain
    // HTTP only for localhost.
    let port = listen.rsplit(':').next().unwrap_or_default();
    Ok((dir, fleet, console, format!("http://localhost:{port}")))
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
            || (request.starts_with("eventsource ") && request.ends_with("/events"))
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
    let (_dir, fleet, _console, base) = fleet_and_console().await?;
    let browser = Browser::new("session")?;
    let finished = submit(&fleet, sum_job()).await?;
    let held = submit(&fleet, held_job()).await?;
    wait_for_status(&fleet, &finished, v1::JobStatus::Succeeded).await?;
    wait_for_status(&fleet, &held, v1::JobStatus::WaitingForApproval).await?;

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

#[tokio::test]
async fn every_page_fits_a_laptop_and_a_phone_and_runs_nothing_it_shows() -> anyhow::Result<()> {
    let (_dir, fleet, _console, base) = fleet_and_console().await?;
    let browser = Browser::new("pages")?;
    let sum = submit(&fleet, sum_job()).await?;
    let held = submit(&fleet, held_job()).await?;
    let hostile = submit(&fleet, hostile_job()).await?;
    wait_for_status(&fleet, &sum, v1::JobStatus::Succeeded).await?;
    wait_for_status(&fleet, &hostile, v1::JobStatus::Succeeded).await?;
    wait_for_status(&fleet, &held, v1::JobStatus::WaitingForApproval).await?;

    let signed_out = json!({"console": base, "pages": [{"name": "sign-in", "path": "/sign-in"}]});
    let signed_in = json!({
        "console": base, "token": AGENT,
        "pages": [
            {"name": "jobs", "path": "/jobs"},
            {"name": "job", "path": format!("/jobs/{sum}")},
            {"name": "held", "path": format!("/jobs/{held}")},
            {"name": "hostile", "path": format!("/jobs/{hostile}")},
            {"name": "not-found", "path": "/jobs/ops-0123456789abcdef0123456789ab"},
        ],
    });
    let mut seen = browser.run("pages", &signed_out).await?;
    let signed_in = browser.run("pages", &signed_in).await?;
    if let (Some(all), Some(more)) = (
        seen["visits"].as_array_mut(),
        signed_in["visits"].as_array(),
    ) {
        all.extend(more.iter().cloned());
    }
    let all = visits(&seen);
    assert_eq!(all.len(), 12, "six pages at two widths: {seen}");
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
