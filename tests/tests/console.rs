//! The web console (`toolfleet console`, decision 0050) against a real
//! fleet, read as a browser reads it: sign-in with a token, the session in
//! Redis, the jobs and a job's transcript as the person's own credential
//! sees them, cancel, sign-out; and what it refuses: a form without its
//! CSRF token, another tenant's job, a reader's cancel, markup in what a
//! model or a client wrote.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use serde_json::json;
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{Fleet, scripted_job, test_fleet};
use toolfleet_tests::identity::{bearer, wait_for_tools};
use toolfleet_tests::{ChildProcess, cargo_bin, free_loopback_address, wait_until};

const AGENT: &str = "tok-console-agent-41c2";
const READER: &str = "tok-console-reader-9e07";
const STRANGER: &str = "tok-console-other-55d1";
const APPROVER: &str = "tok-console-ana-7b33";

const WAIT: Duration = Duration::from_secs(30);

/// What a model might write to attack the page that shows it.
const XSS: &str = "<script>alert('xss')</script><img src=x onerror=alert(1)>";

/// A browser without a cookie jar: the test sends each cookie itself.
struct Browser {
    http: reqwest::Client,
    base: String,
}

/// One answer: its status, its cookies as `name=value`, where it
/// redirects, its body.
struct Page {
    status: StatusCode,
    cookies: Vec<String>,
    location: String,
    csp: String,
    body: String,
}

impl Browser {
    fn new(address: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self {
            http,
            base: format!("http://{address}"),
        })
    }

    async fn read(response: reqwest::Response) -> anyhow::Result<Page> {
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (location, csp) = (header(LOCATION), header(CONTENT_SECURITY_POLICY));
        let cookies = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok()?.split(';').next().map(str::to_owned))
            .collect();
        Ok(Page {
            status: response.status(),
            cookies,
            location,
            csp,
            body: response.text().await?,
        })
    }

    async fn get(&self, path: &str, cookie: &str) -> anyhow::Result<Page> {
        let request = self.http.get(format!("{}{path}", self.base));
        Self::read(request.header("cookie", cookie).send().await?).await
    }

    async fn post(&self, path: &str, cookie: &str, form: &[(&str, &str)]) -> anyhow::Result<Page> {
        let body: Vec<String> = form
            .iter()
            .map(|(name, value)| format!("{}={}", form_value(name), form_value(value)))
            .collect();
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.join("&"));
        Self::read(request.send().await?).await
    }

    /// The server-sent events of `path` until they hold `until` (or 5 s
    /// pass), from after `last` if given.
    async fn events(
        &self,
        path: &str,
        cookie: &str,
        last: Option<u64>,
        until: &str,
    ) -> anyhow::Result<String> {
        let mut request = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", cookie);
        if let Some(last) = last {
            request = request.header("last-event-id", last.to_string());
        }
        let mut response = request.send().await?;
        anyhow::ensure!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                == Some("text/event-stream"),
            "{:?}",
            response.headers()
        );
        let mut seen = String::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !seen.contains(until) {
            match tokio::time::timeout_at(deadline, response.chunk()).await {
                Ok(Ok(Some(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                _ => break,
            }
        }
        Ok(seen)
    }

    /// Signs in with `token`: the session's cookie and its CSRF token.
    async fn sign_in(&self, token: &str) -> anyhow::Result<(String, String)> {
        let form = self.get("/sign-in", "").await?;
        let csrf = hidden_csrf(&form.body)?;
        let signed = self
            .post(
                "/sign-in",
                &form.cookies.join("; "),
                &[("csrf", &csrf), ("token", token)],
            )
            .await?;
        anyhow::ensure!(signed.status == StatusCode::SEE_OTHER, "{}", signed.body);
        let session = signed
            .cookies
            .iter()
            .find(|c| c.starts_with("__Host-toolfleet-session=") && c.len() > 30)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no session cookie: {:?}", signed.cookies))?;
        let landing = self.get(&signed.location, &session).await?;
        Ok((session, hidden_csrf(&landing.body)?))
    }
}

/// `value` as a form encodes it.
fn form_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The CSRF token of the first form of a page.
fn hidden_csrf(page: &str) -> anyhow::Result<String> {
    let at = page
        .find("name=\"csrf\" value=\"")
        .ok_or_else(|| anyhow::anyhow!("no csrf field in {page}"))?;
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    Ok(rest[..rest.find('"').unwrap_or(0)].to_owned())
}

/// A fleet whose tokens file has tenant `ops` (an agent, a reader and an
/// approver) and tenant `other`; the console in front of it. Returns them
/// and the console's address.
async fn fleet_and_console() -> anyhow::Result<(tempfile::TempDir, Fleet, ChildProcess, String)> {
    let traces = ["--trace-url", "https://traces.example/trace/{trace_id}"];
    // A tool's output past what a page shows (64 KiB) is in the transcript
    // whole: the orchestrator shapes none that small (docs/protection.md).
    let whole = [("TOOLFLEET_RESULTS__SHAPE_ABOVE_BYTES", "1048576")];
    fleet_and_console_with(&whole, &traces, free_loopback_address()?).await
}

/// [`fleet_and_console`], the orchestrator with `env` too and the console
/// with `flags`, listening on `listen`.
async fn fleet_and_console_with(
    env: &[(&str, &str)],
    flags: &[&str],
    listen: String,
) -> anyhow::Result<(tempfile::TempDir, Fleet, ChildProcess, String)> {
    fleet_and_console_serving(&[], env, flags, listen).await
}

/// [`fleet_and_console_with`], the worker with `worker_env` too.
async fn fleet_and_console_serving(
    worker_env: &[(&str, &str)],
    env: &[(&str, &str)],
    flags: &[&str],
    listen: String,
) -> anyhow::Result<(tempfile::TempDir, Fleet, ChildProcess, String)> {
    use toolfleet_orchestrator::auth::token_sha256;
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[tenants.ops]\ntoken_sha256 = [\"{}\", \"{}\", \"{}\"]\n\
             roles = {{ \"{}\" = [\"agent\"], \"{}\" = [\"reader\"], \"{}\" = [\"approver\"] }}\n\
             approvers = {{ \"{}\" = \"Ana Lima\" }}\n\
             [tenants.other]\ntoken_sha256 = [\"{}\"]\n",
            token_sha256(AGENT),
            token_sha256(READER),
            token_sha256(APPROVER),
            token_sha256(AGENT),
            token_sha256(READER),
            token_sha256(APPROVER),
            token_sha256(APPROVER),
            token_sha256(STRANGER),
        ),
    )?;
    let mut fleet = Fleet::start(test_fleet(1).worker_env(worker_env)).await?;
    let file = tokens.display().to_string();
    let mut all = vec![
        ("TOOLFLEET_API__AUTH", "tokens"),
        ("TOOLFLEET_API__TOKENS_FILE", file.as_str()),
    ];
    all.extend_from_slice(env);
    fleet.spawn_orchestrator(&all).await?;
    let api = fleet.api(0).await?;
    wait_for_tools(&api, AGENT, &["calculate", "echo"]).await?;
    let (addr, redis) = (fleet.grpc_url(0).await?, fleet.redis.url());
    let console = toolfleet_tests::console::start(&addr, &redis, &listen, flags).await?;
    Ok((dir, fleet, console, listen))
}

#[tokio::test]
async fn a_person_signs_in_with_a_token_and_sees_what_the_token_may() -> anyhow::Result<()> {
    let (_dir, fleet, _console, listen) = fleet_and_console().await?;
    let mut api = fleet.api(0).await?;
    // A finished job whose input and answer carry markup, and one whose
    // call waits for approval (still running, so it can be cancelled).
    let script = json!([
        {"tool_calls": [{"id": "math", "name": "calculate", "arguments": {"expression": "6 * 7"}}]},
        {"message": format!("{XSS} {{{{math.data.result}}}}")}
    ]);
    let mut finished = scripted_job(XSS, &script);
    finished.metadata.insert("team".into(), XSS.into());
    let mut finished = bearer(AGENT, finished);
    // The client's trace: the job's spans join it, and its id links to the
    // tracing UI.
    finished.metadata_mut().insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse()?,
    );
    let finished = api.submit_job(finished).await?.into_inner().job_id;
    let mut held = scripted_job("held", &script);
    held.require_approval = vec!["calculate".to_owned()];
    let held = api
        .submit_job(bearer(AGENT, held))
        .await?
        .into_inner()
        .job_id;
    wait_until("both jobs to settle", WAIT, || {
        let api = api.clone();
        let (finished, held) = (finished.clone(), held.clone());
        async move {
            let status = |id: String| {
                let mut api = api.clone();
                async move {
                    let job = api
                        .get_job(bearer(AGENT, v1::GetJobRequest { job_id: id }))
                        .await;
                    job.map(|j| j.into_inner().status()).ok()
                }
            };
            status(finished).await == Some(v1::JobStatus::Succeeded)
                && status(held).await == Some(v1::JobStatus::WaitingForApproval)
        }
    })
    .await?;

    let browser = Browser::new(&listen)?;
    // Not signed in: every page sends the browser to sign in.
    let page = browser.get("/jobs", "").await?;
    assert_eq!(
        (page.status, page.location.as_str()),
        (StatusCode::SEE_OTHER, "/sign-in")
    );
    let form = browser.get("/sign-in", "").await?;
    assert!(form.csp.contains("script-src 'self'") && !form.csp.contains("unsafe-inline"));
    // A form without its token, or with another's, is refused.
    let refused = browser
        .post("/sign-in", "", &[("csrf", "x"), ("token", AGENT)])
        .await?;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    // A token the orchestrator does not know: refused, with its reason,
    // and no session.
    let csrf = hidden_csrf(&form.body)?;
    let cookie = form.cookies.join("; ");
    let wrong = browser
        .post(
            "/sign-in",
            &cookie,
            &[("csrf", &csrf), ("token", "tok-nobody-at-all")],
        )
        .await?;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("refused this token"), "{}", wrong.body);
    assert!(!wrong.body.contains("tok-nobody-at-all"), "never the token");

    let (session, csrf) = browser.sign_in(AGENT).await?;
    let jobs = browser.get("/jobs", &session).await?;
    assert_eq!(jobs.status, StatusCode::OK);
    assert!(
        jobs.body.contains(&finished) && jobs.body.contains(&held),
        "{}",
        jobs.body
    );
    let running = browser
        .get("/jobs?status=waiting_for_approval", &session)
        .await?;
    assert!(running.body.contains(&held) && !running.body.contains(&finished));
    // The counts of every job the person sees, whatever the filter, and
    // the filters by creation time and metadata.
    assert!(
        jobs.body.contains("<a href=\"/jobs?status=succeeded\">succeeded</a> <strong>1</strong>")
            && jobs.body.contains("<a href=\"/jobs?status=waiting_for_approval\">waiting_for_approval</a> <strong>1</strong>"),
        "{}",
        jobs.body
    );
    let recent = browser.get("/jobs?since=1h", &session).await?;
    assert!(recent.body.contains(&finished) && recent.body.contains(&held));
    let tagged = browser
        .get(&format!("/jobs?meta=team%3D{}", form_value(XSS)), &session)
        .await?;
    assert!(
        tagged.body.contains(&finished) && !tagged.body.contains(&held),
        "{}",
        tagged.body
    );
    // The first page is live: a job submitted while it is open is sent
    // as the page's listing drawn anew, with the counts that include it.
    let live = jobs
        .body
        .split("<div id=\"listing\" data-events=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .ok_or_else(|| anyhow::anyhow!("no live listing: {}", jobs.body))?
        .replace("&amp;", "&")
        .replace("&#38;", "&");
    assert!(
        live.starts_with("/jobs/live?") && live.contains("shown="),
        "{live}"
    );
    let submitted = {
        let request = scripted_job("new", &json!([{"message": "done"}]));
        api.submit_job(bearer(AGENT, request))
            .await?
            .into_inner()
            .job_id
    };
    let update = browser.events(&live, &session, None, &submitted).await?;
    assert!(
        update.contains("event: jobs") && update.contains(&format!("/jobs/{submitted}")),
        "{update}"
    );
    // The transcript, escaped: what the model and the client wrote is
    // shown, never run.
    let job = browser.get(&format!("/jobs/{finished}"), &session).await?;
    assert_eq!(job.status, StatusCode::OK);
    assert!(job.body.contains("Call calculate (math)"), "{}", job.body);
    assert!(
        job.body.contains("&#34;result&#34;: 42") || job.body.contains("&quot;result&quot;: 42"),
        "{}",
        job.body
    );
    assert!(
        !job.body.contains("<script>alert") && !job.body.contains("<img src=x"),
        "{}",
        job.body
    );
    assert!(
        job.body.contains("&#60;script&#62;alert"),
        "shown as text: {}",
        job.body
    );
    assert!(
        job.body
            .contains("href=\"https://traces.example/trace/4bf92f3577b34da6a3ce929d0e0e4736\""),
        "{}",
        job.body
    );
    // Its waterfall: the turn and the call on one axis, as `toolfleet
    // trace` reads them.
    assert!(job.body.contains("<h2>Waterfall</h2>"), "{}", job.body);
    assert!(
        job.body.contains("<code>math calculate</code>")
            && job.body.contains("<code>turn 1</code>"),
        "{}",
        job.body
    );

    // A running job's page follows it live: its events as server-sent
    // events, from where a reconnecting browser left off.
    let live = browser.get(&format!("/jobs/{held}"), &session).await?;
    assert!(
        live.body
            .contains(&format!("data-events=\"/jobs/{held}/events\""))
    );
    assert!(
        !job.body.contains("data-events"),
        "a finished job is not followed"
    );
    let events = browser
        .events(
            &format!("/jobs/{held}/events"),
            &session,
            None,
            "tool_call_approval_requested",
        )
        .await?;
    assert!(
        events.contains("event: job") && events.contains("tool_call_approval_requested"),
        "{events}"
    );
    assert!(events.contains("id: 0\n"), "{events}");
    let resumed = browser
        .events(
            &format!("/jobs/{held}/events"),
            &session,
            Some(1),
            "tool_call_approval_requested",
        )
        .await?;
    assert!(
        !resumed.contains("id: 0\n") && !resumed.contains("id: 1\n") && resumed.contains("id: 2\n"),
        "{resumed}"
    );

    // The tools its jobs may use, with their live workers; a tool's
    // description is shown as text.
    let tools = browser.get("/tools", &session).await?;
    assert_eq!(tools.status, StatusCode::OK, "{}", tools.body);
    assert!(
        tools.body.contains("<code>calculate</code>") && tools.body.contains("read_only"),
        "{}",
        tools.body
    );
    // An agent is not told the fleet (decision 0052).
    assert!(!tools.body.contains("Calls waiting"), "{}", tools.body);

    // A tool's output past what a page shows: its start, and the whole as
    // a text file to save.
    let big = "x".repeat(100_000);
    let script = json!([
        {"tool_calls": [{"id": "big", "name": "echo", "arguments": {"text": big}}]},
        {"message": "done"}
    ]);
    let job_id = api
        .submit_job(bearer(AGENT, scripted_job("big", &script)))
        .await?
        .into_inner()
        .job_id;
    let page = wait_until("the big job to finish", WAIT, || async {
        let page = browser
            .get(&format!("/jobs/{job_id}"), &session)
            .await
            .ok()?;
        page.body.contains("status succeeded").then_some(page)
    })
    .await?;
    assert!(
        page.body.contains("Download the whole"),
        "{}",
        page.body.len()
    );
    assert!(
        page.body.len() < 200_000,
        "shown in part: {}",
        page.body.len()
    );
    let whole = browser
        .get(&format!("/jobs/{job_id}/items/2"), &session)
        .await?;
    assert_eq!(whole.status, StatusCode::OK);
    assert!(whole.body.contains(&big) && whole.body.contains("\"ok\": true"));

    // Another tenant sees none of it: the same NOT_FOUND as no job.
    let (stranger, _) = browser.sign_in(STRANGER).await?;
    let foreign = browser.get(&format!("/jobs/{finished}"), &stranger).await?;
    let missing = browser
        .get("/jobs/other-0123456789abcdef0123456789ab", &stranger)
        .await?;
    assert_eq!(
        (foreign.status, missing.status),
        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
    );
    assert!(
        !browser
            .get("/jobs", &stranger)
            .await?
            .body
            .contains(&finished)
    );

    // A reader sees the held job without a cancel button, and its cancel
    // is refused; the agent's goes through.
    let (reader, reader_csrf) = browser.sign_in(READER).await?;
    let seen = browser.get(&format!("/jobs/{held}"), &reader).await?;
    assert!(seen.body.contains(&held) && !seen.body.contains("Cancel this job"));
    let path = format!("/jobs/{held}/cancel");
    let refused = browser
        .post(&path, &reader, &[("csrf", &reader_csrf)])
        .await?;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(
        browser
            .get(&format!("/jobs/{held}"), &session)
            .await?
            .body
            .contains("Cancel this job")
    );
    let stale = browser
        .post(&path, &session, &[("csrf", &reader_csrf)])
        .await?;
    assert_eq!(
        stale.status,
        StatusCode::FORBIDDEN,
        "another session's CSRF token"
    );
    let cancelled = browser.post(&path, &session, &[("csrf", &csrf)]).await?;
    assert_eq!(
        cancelled.status,
        StatusCode::SEE_OTHER,
        "{}",
        cancelled.body
    );
    wait_until("the held job to be cancelled", WAIT, || async {
        let page = browser.get(&format!("/jobs/{held}"), &session).await.ok()?;
        page.body.contains("status cancelled").then_some(())
    })
    .await?;

    // Signing out ends the session for every replica: the cookie is dead.
    let out = browser
        .post("/sign-out", &session, &[("csrf", &csrf)])
        .await?;
    assert_eq!(
        (out.status, out.location.as_str()),
        (StatusCode::SEE_OTHER, "/sign-in")
    );
    let after = browser.get("/jobs", &session).await?;
    assert_eq!(after.location, "/sign-in?expired=1");
    Ok(())
}

/// A round of three parallel calls held for approval: the approver
/// approves one as it is, another with edited arguments, and rejects the
/// third, each from the held calls' page; the job goes on with exactly
/// those, and the decisions name the signed-in person.
#[tokio::test]
async fn an_approver_decides_held_calls_from_the_console() -> anyhow::Result<()> {
    let (_dir, fleet, _console, listen) = fleet_and_console().await?;
    let mut api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [
            {"id": "one", "name": "calculate", "arguments": {"expression": "1 + 1"}},
            {"id": "two", "name": "calculate", "arguments": {"expression": "2 + 2"}},
            {"id": "three", "name": "calculate", "arguments": {"expression": "3 + 3"}}]},
        {"message": "{{one.data.result}} {{two.data.result}} {{three.error.code}}"}
    ]);
    let mut request = scripted_job("three sums", &script);
    request.require_approval = vec!["calculate".to_owned()];
    let job_id = api
        .submit_job(bearer(AGENT, request))
        .await?
        .into_inner()
        .job_id;
    let browser = Browser::new(&listen)?;
    let (agent, _) = browser.sign_in(AGENT).await?;
    assert!(
        !browser
            .get("/jobs", &agent)
            .await?
            .body
            .contains("Held calls"),
        "an agent has no held calls' page to go to"
    );
    let (ana, csrf) = browser.sign_in(APPROVER).await?;
    let held = wait_until("the three calls to be held", WAIT, || async {
        let page = browser.get("/approvals", &ana).await.ok()?;
        (page
            .body
            .matches("name=\"decision\" value=\"approve\"")
            .count()
            == 3)
            .then_some(page)
    })
    .await?;
    assert!(
        held.body.contains("&#34;expression&#34;: &#34;2 + 2&#34;"),
        "{}",
        held.body
    );
    let decide = |call: &'static str, fields: Vec<(&'static str, String)>| {
        let (browser, ana, csrf, job_id) = (&browser, &ana, &csrf, &job_id);
        async move {
            let mut form = vec![
                ("csrf", csrf.clone()),
                ("job_id", job_id.clone()),
                ("call_id", call.to_owned()),
            ];
            form.extend(fields);
            let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
            browser.post("/approvals/decide", ana, &form).await
        }
    };
    let original = "{\n  \"expression\": \"1 + 1\"\n}".to_owned();
    let approved = decide(
        "one",
        vec![
            ("decision", "approve".into()),
            ("arguments", "{\"expression\":\"1 + 1\"}".into()),
            ("original", original),
        ],
    )
    .await?;
    assert_eq!(approved.status, StatusCode::SEE_OTHER, "{}", approved.body);
    // An edit the tool's schema refuses is said on the page, and nothing
    // is decided; a good one runs.
    // An edit is first shown as a diff against the model's arguments,
    // and sent only once confirmed; one the tool's schema refuses is said
    // on the page, and nothing is decided.
    let original = "{\n  \"expression\": \"2 + 2\"\n}".to_owned();
    let edit = |arguments: &str, confirmed: bool| {
        let mut fields = vec![
            ("decision", "approve".to_owned()),
            ("arguments", arguments.to_owned()),
            ("original", original.clone()),
            ("tool", "calculate".to_owned()),
        ];
        if confirmed {
            fields.push(("confirmed", "yes".to_owned()));
        }
        fields
    };
    let review = decide("two", edit("{\"expression\": \"5 + 5\"}", false)).await?;
    assert_eq!(review.status, StatusCode::OK, "{}", review.body);
    assert!(
        review.body.contains("What the edit changes"),
        "{}",
        review.body
    );
    assert!(
        review
            .body
            .contains("<span class=\"removed\">-   &#34;expression&#34;: &#34;2 + 2&#34;</span>")
            && review
                .body
                .contains("<span class=\"added\">+   &#34;expression&#34;: &#34;5 + 5&#34;</span>"),
        "{}",
        review.body
    );
    let bad = decide("two", edit("{\"expr\": 5}", true)).await?;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.body);
    assert!(bad.body.contains("Not decided"), "{}", bad.body);
    let edited = decide("two", edit("{\"expression\": \"5 + 5\"}", true)).await?;
    assert_eq!(edited.status, StatusCode::SEE_OTHER, "{}", edited.body);
    let rejected = decide(
        "three",
        vec![
            ("decision", "reject".into()),
            ("reason", "not today".into()),
        ],
    )
    .await?;
    assert_eq!(rejected.status, StatusCode::SEE_OTHER, "{}", rejected.body);

    let job = wait_until("the job to finish", WAIT, || {
        let mut api = api.clone();
        let request = v1::GetJobRequest {
            job_id: job_id.clone(),
        };
        async move {
            let job = api.get_job(bearer(AGENT, request)).await.ok()?.into_inner();
            (job.status() == v1::JobStatus::Succeeded).then_some(job)
        }
    })
    .await?;
    assert_eq!(job.output_text, "2 10 REJECTED_BY_APPROVER", "{job:?}");
    for call in &job.held_calls {
        assert_eq!(call.approver, "Ana Lima", "{call:?}");
    }
    Ok(())
}

/// A person signs in with the company's OpenID provider (a real one), by
/// the authorization code flow with PKCE, the console as the client: the
/// provider's code comes back to the console, which exchanges it for the
/// person's token and keeps that in the session; the browser never sees
/// it. A code is good once, and only in the browser that started the
/// flow.
#[tokio::test]
async fn a_person_signs_in_with_the_company_identity() -> anyhow::Result<()> {
    use toolfleet_tests::identity::{Person, authorize};
    let ana = Person {
        name: "ana",
        tenant: "ops",
        roles: &["approver", "reader"],
    };
    let listen = free_loopback_address()?;
    let callback = format!("http://{listen}/oidc/callback");
    let sign_in = toolfleet_tests::console::openid_sign_in(&callback, ana).await?;
    let provider = &sign_in.provider;
    let env = [("TOOLFLEET_API__IDENTITY__ISSUERS", sign_in.issuers.as_str())];
    let (_dir, _fleet, _console, listen) =
        fleet_and_console_with(&env, &sign_in.flags(), listen).await?;
    let browser = Browser::new(&listen)?;
    let page = browser.get("/sign-in", "").await?;
    assert!(
        page.body.contains("Sign in with your company account"),
        "{}",
        page.body
    );

    let started = browser.get("/sign-in/oidc?login_hint=ana", "").await?;
    assert_eq!(started.status, StatusCode::SEE_OTHER, "{}", started.body);
    assert!(
        started.location.starts_with(provider.issuer()),
        "{}",
        started.location
    );
    assert!(started.location.contains("code_challenge_method=S256"));
    let flow = started.cookies.join("; ");
    let back = authorize(&started.location, &callback).await?;
    let path = back.trim_start_matches(&format!("http://{listen}"));
    // Only the browser that started the flow finishes it.
    let elsewhere = browser.get(path, "").await?;
    assert_eq!(elsewhere.status, StatusCode::FORBIDDEN);
    // Signed in by a page of the console's own that moves on to the jobs:
    // the browser would not send the session's SameSite=Strict cookie
    // along a redirect that began at the provider.
    let signed = browser.get(path, &flow).await?;
    assert_eq!(signed.status, StatusCode::OK, "{}", signed.body);
    assert!(
        signed
            .body
            .contains("<meta http-equiv=\"refresh\" content=\"0; url=/jobs\">"),
        "{}",
        signed.body
    );
    let session = signed
        .cookies
        .iter()
        .find(|c| c.starts_with("__Host-toolfleet-session=") && c.len() > 30)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no session: {:?}", signed.cookies))?;
    let jobs = browser.get("/jobs", &session).await?;
    assert_eq!(jobs.status, StatusCode::OK, "{}", jobs.body);
    assert!(
        jobs.body.contains("ana") && jobs.body.contains("approver, reader"),
        "{}",
        jobs.body
    );
    assert!(browser.get("/approvals", &session).await?.status == StatusCode::OK);
    // The code was spent: replaying the redirect opens nothing.
    let replayed = browser.get(path, &flow).await?;
    assert_eq!(
        replayed.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        replayed.body
    );
    assert!(
        replayed
            .cookies
            .iter()
            .all(|c| !c.starts_with("__Host-toolfleet-session=") || c.ends_with('='))
    );
    Ok(())
}

/// Under `api.auth = "none"` nobody signs in and every page says so in a
/// banner. The console, started while its orchestrator is down, waits for
/// it to say whether it needs a sign-in rather than guessing.
#[tokio::test]
async fn without_authentication_there_is_no_sign_in_and_every_page_says_so() -> anyhow::Result<()> {
    let fleet = Fleet::start(test_fleet(1)).await?;
    let grpc = free_loopback_address()?;
    let (addr, listen) = (format!("http://{grpc}"), free_loopback_address()?);
    let redis = fleet.redis.url();
    let console = toolfleet_tests::console::spawn(&addr, &redis, &listen, &[])?;
    console
        .wait_for_log("waiting for the orchestrator", WAIT)
        .await?;
    // On the address the console waits at (the fleet's own would pick a
    // free port as it starts).
    let nats = fleet.nats.url();
    let _orchestrator = ChildProcess::spawn(
        "orchestrator",
        cargo_bin("toolfleet-orchestrator")?,
        [
            "--nats-url",
            &nats,
            "--redis-url",
            &redis,
            "--listen",
            &grpc,
        ],
        [("TOOLFLEET_API__AUTH", "none")],
    )?;
    let browser = Browser::new(&listen)?;
    let jobs = wait_until("the console to serve", WAIT, || async {
        browser.get("/jobs", "").await.ok()
    })
    .await?;
    assert_eq!(jobs.status, StatusCode::OK, "{}", jobs.body);
    let banner = "Authentication is off (<code>api.auth = \"none\"</code>)";
    for path in ["/jobs", "/approvals", "/tools"] {
        let page = browser.get(path, "").await?;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
        assert!(
            page.body.contains(banner) && !page.body.contains("Sign out"),
            "{path}: {}",
            page.body
        );
    }
    let sign_in = browser.get("/sign-in", "").await?;
    assert_eq!(
        (sign_in.status, sign_in.location.as_str()),
        (StatusCode::SEE_OTHER, "/jobs")
    );
    Ok(())
}

/// The texts of the cells of the first table row of `page` that holds
/// `needle`, markup removed.
fn row_of(page: &str, needle: &str) -> Vec<String> {
    let Some(at) = page.find(needle) else {
        return Vec::new();
    };
    let start = page[..at].rfind("<tr>").unwrap_or(at);
    let end = page[at..].find("</tr>").map_or(page.len(), |end| at + end);
    let tags = regex::Regex::new("<[^>]*>").expect("a regex");
    page[start..end]
        .split("<td>")
        .skip(1)
        .map(|cell| tags.replace_all(cell, "").trim().to_owned())
        .collect()
}

/// The tools page tells a reader the fleet (decision 0052): per tool its
/// live workers, those that cannot run it, its pools and its calls
/// waiting; and the MCP servers the tools come from, up, then down once
/// the server dies, its tool still listed (withdrawn) with the call that
/// waits for it.
#[tokio::test]
async fn the_tools_page_shows_pools_calls_waiting_and_a_down_mcp_server() -> anyhow::Result<()> {
    use toolfleet_tests::mcp::{http_config, start_http_server, worker_config_path};
    let scratch = tempfile::tempdir()?;
    let address = free_loopback_address()?;
    let mut http = start_http_server(scratch.path(), &address)?;
    let config = worker_config_path()?;
    std::fs::write(&config, http_config("web", &address, "")?)?;
    let config = config.display().to_string();
    let worker_env = [
        ("TOOLFLEET_CONFIG", config.as_str()),
        ("TOOLFLEET_POOL", "general"),
    ];
    let listen = free_loopback_address()?;
    let (_dir, fleet, _console, listen) =
        fleet_and_console_serving(&worker_env, &[], &[], listen).await?;
    let api = fleet.api(0).await?;
    wait_for_tools(&api, READER, &["web__add"]).await?;
    let browser = Browser::new(&listen)?;
    let (reader, _) = browser.sign_in(READER).await?;
    let (browser, reader) = (&browser, &reader);
    let page = || async move {
        let page = browser.get("/tools", reader).await.ok()?;
        (page.status == StatusCode::OK).then_some(page.body)
    };

    // Up: workers 1, none unavailable, the pool, an empty queue once read.
    let up = wait_until("the queue read", WAIT, || async move {
        let body = page().await?;
        (row_of(&body, "<code>web__add</code>").get(4)? == "0").then_some(body)
    })
    .await?;
    let add = row_of(&up, "<code>web__add</code>");
    assert_eq!(add[..5], ["web__add", "1", "0", "general", "0"], "{up}");
    assert_eq!(row_of(&up, "<code>web</code>")[..2], ["web", "up"], "{up}");
    assert!(up.contains("From the MCP server <code>web</code>."), "{up}");

    // Down: the tool withdrawn, its worker unable, the call published
    // meanwhile waiting; the server said down, in words.
    http.kill().await?;
    wait_until("web__add withdrawn", WAIT, || async move {
        let body = page().await?;
        body.contains("(withdrawn: no live worker can run it)")
            .then_some(())
    })
    .await?;
    // A pull request the worker opened while the tool was up takes calls
    // until it expires; after that the worker pulls nothing for it.
    fleet.wait_no_pull_requests("web__add", WAIT).await?;
    let waiting = toolfleet_tests::fleet::call("job-page", "add_1", "web__add", r#"{"a": 1}"#);
    fleet.publish_call(&waiting).await?;
    let down = wait_until("the call counted", WAIT, || async move {
        let body = page().await?;
        (row_of(&body, "<code>web__add</code>").get(4)? == "1").then_some(body)
    })
    .await?;
    let add = row_of(&down, "<code>web__add</code>");
    assert_eq!(
        add[..5],
        [
            "web__add (withdrawn: no live worker can run it)",
            "0",
            "1",
            "general",
            "1"
        ],
        "{down}"
    );
    assert_eq!(
        row_of(&down, "<code>web</code>")[..2],
        ["web", "down"],
        "{down}"
    );
    let calculate = row_of(&down, "<code>calculate</code>");
    assert_eq!(
        calculate[..5],
        ["calculate", "1", "0", "general", "0"],
        "{down}"
    );
    Ok(())
}
