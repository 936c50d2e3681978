//! The API's security through a real fleet: tokens, tenants and their
//! isolation, tool allow-lists, the tokens file reloaded, and an
//! orchestrator that refuses to start without a way to tell callers apart.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tonic::{Code, Request};
use toolfleet_orchestrator::auth::token_sha256;
use toolfleet_proto::names::RedisKeys;
use toolfleet_proto::{JobId, v1};
use toolfleet_tests::certificates::{CLIENT_DNS_NAME, CLIENT_SPIFFE_ID, Certificates};
use toolfleet_tests::fleet::{ApiClient, Fleet, as_tenant, scripted_job, test_fleet};
use toolfleet_tests::{cargo_bin, wait_until};

const SEARCH: &str = "tok-search-3f9a";
const ADS: &str = "tok-ads-77c1";

fn tokens_file(dir: &Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("tokens.toml");
    let text = format!(
        "[tenants.search]\ntoken_sha256 = [\"{}\"]\ntools = [\"calculate\"]\n\n\
         [tenants.ads]\ntoken_sha256 = [\"{}\"]\n{extra}",
        token_sha256(SEARCH),
        token_sha256(ADS)
    );
    std::fs::write(&path, text).expect("the tokens file is written");
    path
}

/// Waits until the orchestrator has reloaded its tokens file and accepts
/// `token`.
async fn until_the_token_works(api: &ApiClient, token: &str) -> anyhow::Result<()> {
    wait_until(
        "the tokens file to be reloaded",
        Duration::from_secs(10),
        || {
            let mut api = api.clone();
            async move {
                api.list_jobs(as_tenant(token, v1::ListJobsRequest::default()))
                    .await
            }
        },
    )
    .await
    .map(drop)
}

async fn secured_fleet(dir: &Path) -> anyhow::Result<(Fleet, ApiClient)> {
    fleet_with_tenants(dir, "").await
}

/// A fleet whose tokens file has the tenants `search` and `ads`, and
/// `extra` after them.
async fn fleet_with_tenants(dir: &Path, extra: &str) -> anyhow::Result<(Fleet, ApiClient)> {
    let path = tokens_file(dir, extra);
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let file = path.to_string_lossy().into_owned();
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_API__AUTH", "tokens"),
            ("TOOLFLEET_API__TOKENS_FILE", &file),
            ("TOOLFLEET_API__TOKENS_RELOAD_INTERVAL", "100ms"),
        ])
        .await?;
    let api = fleet.api(0).await?;
    // The harness's wait has no token: ask as a tenant.
    wait_until("the tools to go live", Duration::from_secs(30), || {
        let mut api = api.clone();
        async move {
            let tools = api
                .list_tools(as_tenant(ADS, v1::ListToolsRequest::default()))
                .await
                .map(|r| r.into_inner().tools)
                .unwrap_or_default();
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            names.contains(&"calculate") && names.contains(&"get_current_weather")
        }
    })
    .await?;
    Ok((fleet, api))
}

async fn finish(api: &mut ApiClient, token: &str, job_id: &str) -> anyhow::Result<v1::Job> {
    let mut events = api
        .watch_job(as_tenant(
            token,
            v1::WatchJobRequest {
                job_id: job_id.into(),
                from_offset: 0,
            },
        ))
        .await?
        .into_inner();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(event) = events.message().await? {
            if event.r#final {
                break;
            }
        }
        anyhow::Ok(())
    })
    .await??;
    Ok(api
        .get_job(as_tenant(
            token,
            v1::GetJobRequest {
                job_id: job_id.into(),
            },
        ))
        .await?
        .into_inner())
}

#[tokio::test]
async fn callers_without_a_known_token_are_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (_fleet, mut api) = secured_fleet(dir.path()).await?;
    let job = scripted_job("x", &json!([{"message": "m"}]));
    let none = api.submit_job(job.clone()).await.expect_err("no token");
    assert_eq!(none.code(), Code::Unauthenticated);
    let wrong = api
        .submit_job(as_tenant("tok-guessed", job.clone()))
        .await
        .expect_err("unknown token");
    assert_eq!(wrong.code(), Code::Unauthenticated);
    let hash = api
        .submit_job(as_tenant(&token_sha256(SEARCH), job.clone()))
        .await
        .expect_err("the stored hash is not a token");
    assert_eq!(hash.code(), Code::Unauthenticated);
    for status in [
        api.list_jobs(v1::ListJobsRequest::default())
            .await
            .expect_err("no token"),
        api.list_tools(v1::ListToolsRequest::default())
            .await
            .expect_err("no token"),
    ] {
        assert_eq!(status.code(), Code::Unauthenticated);
    }
    assert!(api.submit_job(as_tenant(SEARCH, job)).await.is_ok());
    Ok(())
}

/// Another tenant (ads): search's job `job_id` does not exist, exactly as
/// a missing one, whether the id is search's, a made-up one in ads' name
/// or one from before tenants, or not a job id at all, to get, watch or
/// cancel; and ads lists no job.
async fn ads_finds_nothing_of_search(api: &mut ApiClient, job_id: &str) -> anyhow::Result<()> {
    let in_ads_name = job_id.replacen("search-", "ads-", 1);
    let missing = "0123456789abcdef0123456789ab";
    for id in [
        job_id,
        &in_ads_name,
        missing,
        "ads-x}{y",
        "ads-0123456789abcdef0123456789ab\n",
    ] {
        not_found(api, ADS, id).await;
    }
    let listed = api
        .list_jobs(as_tenant(ADS, v1::ListJobsRequest::default()))
        .await?
        .into_inner();
    assert!(listed.jobs.is_empty(), "{listed:?}");
    Ok(())
}

/// Each tenant sees only its own jobs (their ids and Redis keys name the
/// tenant; to another tenant they are missing), keeps its own idempotency
/// keys, and is offered only its allow-list's tools.
#[tokio::test]
async fn tenants_see_only_their_own_jobs_and_tools() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, mut api) = secured_fleet(dir.path()).await?;
    let mut secret = scripted_job(
        "search's secret prompt",
        &json!([
            {"tool_calls": [{"name": "get_current_weather",
                             "arguments": {"location": "Boston, MA", "unit": "celsius"}},
                            {"name": "calculate", "arguments": {"expression": "2+2"}}]},
            {"delay_ms": 500, "message": "done"}
        ]),
    );
    secret.idempotency_key = "shared-key".into();
    let job_id = api
        .submit_job(as_tenant(SEARCH, secret.clone()))
        .await?
        .into_inner()
        .job_id;

    // The id, and so every Redis key of the job, names its tenant.
    assert!(job_id.starts_with("search-"), "{job_id}");
    let mut redis = fleet.redis.connection().await?;
    let job = JobId::parse(&job_id).expect("a job id");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(RedisKeys::default().job_keys_pattern(&job))
        .query_async(&mut redis)
        .await?;
    assert!(keys.len() >= 3, "{keys:?}");

    ads_finds_nothing_of_search(&mut api, &job_id).await?;
    // Idempotency keys are per tenant: ads' "shared-key" is its own.
    let theirs = api.submit_job(as_tenant(ADS, secret)).await?.into_inner();
    assert!(!theirs.duplicate);
    assert_ne!(theirs.job_id, job_id);

    // search's allow-list: calculate only.
    let job = finish(&mut api, SEARCH, &job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    let codes: Vec<String> = job
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            Some(v1::item::Kind::ToolResult(r)) => Some(r.output.clone()),
            _ => None,
        })
        .collect();
    assert!(codes[0].contains("UNKNOWN_TOOL"), "{codes:?}");
    assert!(codes[1].contains("\"result\":4"), "{codes:?}");
    let mut asks = scripted_job("x", &json!([{"message": "m"}]));
    asks.tools = vec!["get_current_weather".into()];
    let denied = api
        .submit_job(as_tenant(SEARCH, asks))
        .await
        .expect_err("not on search's list");
    assert_eq!(denied.code(), Code::PermissionDenied);
    let mine = api
        .list_jobs(as_tenant(SEARCH, v1::ListJobsRequest::default()))
        .await?
        .into_inner();
    let ids: Vec<&str> = mine.jobs.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(ids, [job_id.as_str()]);
    Ok(())
}

/// The tenant `desk`: two agents, an operator and a reader, each a token
/// with its roles.
const AGENT_A: &str = "tok-agent-a-51d2";
const AGENT_B: &str = "tok-agent-b-9e04";
const OPERATOR: &str = "tok-operator-c3a8";
const READER: &str = "tok-reader-d7f1";

fn desk_tenant() -> String {
    let hash = token_sha256;
    format!(
        "\n[tenants.desk]\ntoken_sha256 = [\"{}\", \"{}\", \"{}\", \"{}\"]\n\
         roles = {{ \"{}\" = [\"agent\"], \"{}\" = [\"agent\"], \"{}\" = [\"operator\"], \
         \"{}\" = [\"reader\"] }}\n",
        hash(AGENT_A),
        hash(AGENT_B),
        hash(OPERATOR),
        hash(READER),
        hash(AGENT_A),
        hash(AGENT_B),
        hash(OPERATOR),
        hash(READER),
    )
}

/// What a job records of the token that submitted it: `token:` and the
/// first 16 hex digits of its SHA-256.
fn submitter_of(token: &str) -> String {
    format!("token:{}", &token_sha256(token)[..16])
}

/// The ids of the jobs `token` lists, sorted, each with its submitter.
async fn listed(api: &mut ApiClient, token: &str) -> anyhow::Result<Vec<(String, String)>> {
    let page = api
        .list_jobs(as_tenant(token, v1::ListJobsRequest::default()))
        .await?
        .into_inner();
    anyhow::ensure!(page.next_page_token.is_empty(), "one page: {page:?}");
    let mut jobs: Vec<(String, String)> = page
        .jobs
        .into_iter()
        .map(|job| (job.job_id, job.submitter))
        .collect();
    jobs.sort();
    Ok(jobs)
}

/// To `token`, the job `job_id` does not exist: getting, watching and
/// cancelling it are `NOT_FOUND`, word for word as for a job id no job has.
async fn as_missing(api: &mut ApiClient, token: &str, job_id: &str) -> anyhow::Result<()> {
    let missing = "desk-0123456789abcdef0123456789ab";
    for id in [job_id, missing] {
        not_found(api, token, id).await;
    }
    Ok(())
}

/// Getting, watching and cancelling `id` as `token` are each `NOT_FOUND`,
/// in the words a job id no job has gets.
async fn not_found(api: &mut ApiClient, token: &str, id: &str) {
    let get = api
        .get_job(as_tenant(token, v1::GetJobRequest { job_id: id.into() }))
        .await
        .expect_err("not the caller's job");
    let watch = api
        .watch_job(as_tenant(
            token,
            v1::WatchJobRequest {
                job_id: id.into(),
                from_offset: 0,
            },
        ))
        .await
        .expect_err("not the caller's job");
    let cancel = api
        .cancel_job(as_tenant(token, v1::CancelJobRequest { job_id: id.into() }))
        .await
        .expect_err("not the caller's job");
    for status in [get, watch, cancel] {
        assert_eq!(status.code(), Code::NotFound, "{id}: {status:?}");
        assert_eq!(
            status.message(),
            format!("job {id} not found (unknown or expired)")
        );
    }
}

/// `token` gets the job `job_id`, with its submitter, and watches it (its
/// first event comes).
async fn sees(
    api: &mut ApiClient,
    token: &str,
    job_id: &str,
    submitter: &str,
) -> anyhow::Result<()> {
    let job = api
        .get_job(as_tenant(
            token,
            v1::GetJobRequest {
                job_id: job_id.into(),
            },
        ))
        .await?
        .into_inner();
    assert_eq!(job.submitter, submitter, "{job_id} to {token}");
    let mut events = api
        .watch_job(as_tenant(
            token,
            v1::WatchJobRequest {
                job_id: job_id.into(),
                from_offset: 0,
            },
        ))
        .await?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), events.message())
        .await??
        .expect("a first event");
    assert_eq!((first.offset, first.kind.as_str()), (0, "job_queued"));
    Ok(())
}

/// Makes `job_id` a job stored before submitters were recorded: its spec,
/// which records `submitter`, without it.
async fn forget_submitter(fleet: &Fleet, job_id: &str, submitter: &str) -> anyhow::Result<()> {
    let mut redis = fleet.redis.connection().await?;
    let record = RedisKeys::default().job(&JobId::parse(job_id).expect("a job id"));
    let spec: String = redis::cmd("HGET")
        .arg(&record)
        .arg("spec")
        .query_async(&mut redis)
        .await?;
    let mut spec: serde_json::Value = serde_json::from_str(&spec)?;
    assert_eq!(spec["submitter"], json!(submitter), "the spec records it");
    spec.as_object_mut().expect("an object").remove("submitter");
    let () = redis::cmd("HSET")
        .arg(&record)
        .arg("spec")
        .arg(spec.to_string())
        .query_async(&mut redis)
        .await?;
    Ok(())
}

/// A job that runs long enough to be cancelled, submitted with `token` and
/// the idempotency key `key` (none when empty).
fn slow(token: &str, key: &str) -> Request<v1::SubmitJobRequest> {
    let mut job = scripted_job("wait", &json!([{"delay_ms": 60_000, "message": "late"}]));
    job.idempotency_key = key.into();
    as_tenant(token, job)
}

/// In a tenant whose credentials have roles, an agent sees and cancels
/// only the jobs it submitted: another agent's job is, to it, a job that
/// does not exist, and its list holds its own; an operator and a reader
/// see every job with who submitted it, and only the operator cancels
/// another's. An idempotency key never names another agent's job, and a
/// job that records no submitter (stored before submitters were) is no
/// agent's.
#[tokio::test]
async fn an_agent_sees_and_cancels_only_the_jobs_it_submitted() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, mut api) = fleet_with_tenants(dir.path(), &desk_tenant()).await?;
    let a1 = api
        .submit_job(slow(AGENT_A, "order-1"))
        .await?
        .into_inner()
        .job_id;
    let a2 = api.submit_job(slow(AGENT_A, "")).await?.into_inner().job_id;
    let b1 = api.submit_job(slow(AGENT_B, "")).await?.into_inner().job_id;
    // A's key names A's job to A, and nothing to B.
    let again = api.submit_job(slow(AGENT_A, "order-1")).await?.into_inner();
    assert_eq!(
        (again.job_id.as_str(), again.duplicate),
        (a1.as_str(), true)
    );
    let refused = api
        .submit_job(slow(AGENT_B, "order-1"))
        .await
        .expect_err("another agent's key");
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
    assert!(!refused.message().contains(&a1), "{refused:?}");

    let (a, b) = (submitter_of(AGENT_A), submitter_of(AGENT_B));
    let mut all = vec![
        (a1.clone(), a.clone()),
        (a2.clone(), a.clone()),
        (b1.clone(), b.clone()),
    ];
    all.sort();
    let mut only_a = vec![(a1.clone(), a.clone()), (a2.clone(), a.clone())];
    only_a.sort();
    assert_eq!(listed(&mut api, AGENT_A).await?, only_a);
    assert_eq!(listed(&mut api, AGENT_B).await?, [(b1.clone(), b.clone())]);
    assert_eq!(listed(&mut api, OPERATOR).await?, all);
    assert_eq!(listed(&mut api, READER).await?, all);
    sees(&mut api, AGENT_A, &a1, &a).await?;
    sees(&mut api, AGENT_B, &b1, &b).await?;
    for token in [OPERATOR, READER] {
        sees(&mut api, token, &a1, &a).await?;
        sees(&mut api, token, &b1, &b).await?;
    }
    as_missing(&mut api, AGENT_A, &b1).await?;
    as_missing(&mut api, AGENT_B, &a1).await?;

    // The reader cancels nothing; the operator any job, an agent its own.
    let cancel = |token: &str, job_id: &str| {
        as_tenant(
            token,
            v1::CancelJobRequest {
                job_id: job_id.into(),
            },
        )
    };
    let refused = api
        .cancel_job(cancel(READER, &b1))
        .await
        .expect_err("a reader cancels nothing");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    api.cancel_job(cancel(OPERATOR, &b1)).await?;
    api.cancel_job(cancel(AGENT_A, &a1)).await?;

    // A job stored before submitters were recorded is no agent's.
    forget_submitter(&fleet, &a2, &a).await?;
    as_missing(&mut api, AGENT_A, &a2).await?;
    assert_eq!(listed(&mut api, AGENT_A).await?, [(a1.clone(), a.clone())]);
    sees(&mut api, OPERATOR, &a2, "").await?;
    Ok(())
}

/// The counts `token` gets with a page, as `(status, jobs)` pairs of the
/// statuses that have any.
async fn counted(api: &ApiClient, token: &str) -> anyhow::Result<Vec<(v1::JobStatus, u64)>> {
    let request = v1::ListJobsRequest {
        page_size: 1,
        with_counts: true,
        ..Default::default()
    };
    let page = api
        .clone()
        .list_jobs(as_tenant(token, request))
        .await?
        .into_inner();
    anyhow::ensure!(page.counts.len() == 6, "every status: {:?}", page.counts);
    Ok(page
        .counts
        .iter()
        .filter(|c| c.jobs > 0)
        .map(|c| (c.status(), c.jobs))
        .collect())
}

/// An agent that sees only the jobs it submitted counts only those: the
/// counts say nothing of another agent's jobs, and an operator's and a
/// reader's are the tenant's; another tenant's are its own.
#[tokio::test]
async fn an_agent_counts_only_the_jobs_it_submitted() -> anyhow::Result<()> {
    use v1::JobStatus::{Cancelled, Running};
    let dir = tempfile::tempdir()?;
    let (_fleet, mut api) = fleet_with_tenants(dir.path(), &desk_tenant()).await?;
    let a1 = api.submit_job(slow(AGENT_A, "")).await?.into_inner().job_id;
    api.submit_job(slow(AGENT_A, "")).await?;
    api.submit_job(slow(AGENT_B, "")).await?;
    api.cancel_job(as_tenant(AGENT_A, v1::CancelJobRequest { job_id: a1 }))
        .await?;
    let expected: [(&str, &[(v1::JobStatus, u64)]); 5] = [
        (AGENT_A, &[(Running, 1), (Cancelled, 1)]),
        (AGENT_B, &[(Running, 1)]),
        (OPERATOR, &[(Running, 2), (Cancelled, 1)]),
        (READER, &[(Running, 2), (Cancelled, 1)]),
        (ADS, &[]),
    ];
    for (token, counts) in expected {
        let what = format!("the counts of {token} to be {counts:?}");
        let reached = wait_until(&what, Duration::from_secs(20), || {
            let api = api.clone();
            async move { counted(&api, token).await.is_ok_and(|c| c == counts) }
        })
        .await;
        if let Err(err) = reached {
            anyhow::bail!("{err:#}; they are {:?}", counted(&api, token).await?);
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_changed_tokens_file_takes_effect_without_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, mut api) = secured_fleet(dir.path()).await?;
    let late = "tok-late-19d2";
    let list = || as_tenant(late, v1::ListJobsRequest::default());
    assert_eq!(
        api.list_jobs(list()).await.expect_err("not yet").code(),
        Code::Unauthenticated
    );
    tokens_file(
        dir.path(),
        &format!(
            "\n[tenants.late]\ntoken_sha256 = [\"{}\"]\n",
            token_sha256(late)
        ),
    );
    until_the_token_works(&api, late).await?;
    // A broken file keeps the tokens in force: once the orchestrator has
    // read and rejected it, the token still works.
    let mark = fleet.orchestrator(0).log_mark();
    std::fs::write(dir.path().join("tokens.toml"), "[tenants.late\n")?;
    fleet
        .orchestrator(0)
        .wait_for_log_after(mark, "do not load", Duration::from_secs(10))
        .await?;
    assert!(api.list_jobs(list()).await.is_ok());
    Ok(())
}

#[tokio::test]
async fn an_orchestrator_without_tokens_or_auth_none_does_not_start() -> anyhow::Result<()> {
    let output = tokio::process::Command::new(cargo_bin("toolfleet-orchestrator")?)
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("TOOLFLEET_API__AUTH")
        .env_remove("TOOLFLEET_API__TOKENS_FILE")
        .output()
        .await?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        format!("{stderr}{stdout}").contains("no api.tokens_file"),
        "{stderr}{stdout}"
    );
    Ok(())
}

#[tokio::test]
async fn the_cli_sends_the_token_from_its_flag_or_the_environment() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, _api) = secured_fleet(dir.path()).await?;
    let url = fleet.grpc_url(0).await?;
    let toolfleet = |args: &[&str], env: Option<&str>| {
        let mut command = tokio::process::Command::new(cargo_bin("toolfleet").expect("built"));
        command.args(args).env_remove("TOOLFLEET_TOKEN");
        if let Some(token) = env {
            command.env("TOOLFLEET_TOKEN", token);
        }
        command.output()
    };
    let refused = toolfleet(&["jobs", "--addr", &url], None).await?;
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("Unauthenticated") && stderr.contains("--token"),
        "{stderr}"
    );
    let flag = toolfleet(&["jobs", "--addr", &url, "--token", SEARCH], None).await?;
    assert!(
        flag.status.success(),
        "{}",
        String::from_utf8_lossy(&flag.stderr)
    );
    let env = toolfleet(&["jobs", "--addr", &url], Some(ADS)).await?;
    assert!(
        env.status.success(),
        "{}",
        String::from_utf8_lossy(&env.stderr)
    );
    let help = toolfleet(&["jobs", "--help"], Some(ADS)).await?;
    assert!(
        !String::from_utf8_lossy(&help.stdout).contains(ADS),
        "the help never shows the token"
    );
    Ok(())
}

#[tokio::test]
async fn quotas_refuse_with_retry_info_and_free_up() -> anyhow::Result<()> {
    use tonic_types::StatusExt as _;
    let dir = tempfile::tempdir()?;
    let (_fleet, mut api) = secured_fleet(dir.path()).await?;
    let (burst, single) = ("tok-burst-81aa", "tok-single-4c0e");
    tokens_file(
        dir.path(),
        &format!(
            "\n[tenants.burst]\ntoken_sha256 = [\"{}\"]\nsubmissions_per_second = 1\n\
             \n[tenants.single]\ntoken_sha256 = [\"{}\"]\nmax_active_jobs = 1\n",
            token_sha256(burst),
            token_sha256(single)
        ),
    );
    until_the_token_works(&api, single).await?;
    let quick = || scripted_job("x", &json!([{"message": "m"}]));

    // One submission per second: the second at once is refused, with when.
    api.submit_job(as_tenant(burst, quick())).await?;
    let refused = api
        .submit_job(as_tenant(burst, quick()))
        .await
        .expect_err("over the rate");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("submissions_per_second"),
        "{}",
        refused.message()
    );
    let delay = refused
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .expect("RetryInfo in the status details");
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_secs(1),
        "{delay:?}"
    );

    // One active job: a second waits for the first to finish.
    let slow = scripted_job("x", &json!([{"delay_ms": 60000, "message": "never"}]));
    let first = api
        .submit_job(as_tenant(single, slow))
        .await?
        .into_inner()
        .job_id;
    let refused = api
        .submit_job(as_tenant(single, quick()))
        .await
        .expect_err("over the active jobs");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_active_jobs"),
        "{}",
        refused.message()
    );
    assert!(refused.get_details_retry_info().is_some());
    api.cancel_job(as_tenant(
        single,
        v1::CancelJobRequest {
            job_id: first.clone(),
        },
    ))
    .await?;
    finish(&mut api, single, &first).await?;
    assert!(api.submit_job(as_tenant(single, quick())).await.is_ok());
    Ok(())
}

/// Submits as `narrow` five parallel calls, each counting how many run at
/// once; the worker has slots for all five. Returns the job's id.
async fn submit_five_measured_calls(api: &mut ApiClient, narrow: &str) -> anyhow::Result<String> {
    let calls: Vec<_> = (0..5)
        .map(|_| {
            json!({"name": "measure_concurrency",
                        "arguments": {"key": "narrow-calls", "ms": 1500}})
        })
        .collect();
    Ok(api
        .submit_job(as_tenant(
            narrow,
            scripted_job("x", &json!([{"tool_calls": calls}, {"message": "done"}])),
        ))
        .await?
        .into_inner()
        .job_id)
}

/// Every call of `job_id` ran, ok, never more than two at once.
async fn every_call_ran_never_more_than_two_at_once(
    api: &mut ApiClient,
    redis: &mut toolfleet_service::connect::RedisConnection,
    narrow: &str,
    job_id: &str,
) -> anyhow::Result<()> {
    let job = finish(api, narrow, job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    let outputs: Vec<&str> = job
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            Some(v1::item::Kind::ToolResult(r)) => Some(r.output.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(outputs.len(), 5);
    assert!(
        outputs.iter().all(|o| o.contains("\"ok\":true")),
        "{outputs:?}"
    );
    let most: Option<u32> = redis::cmd("GET")
        .arg(toolfleet_worker::tools::testing::MeasureConcurrency::most_key("narrow-calls"))
        .query_async(redis)
        .await?;
    assert_eq!(most, Some(2));
    Ok(())
}

/// A tenant whose quota is two calls in flight runs five parallel calls
/// never more than two at once; at the quota a submission is refused with
/// `RetryInfo`; the slots are given back, and it may submit again.
#[tokio::test]
async fn a_tenants_calls_in_flight_are_capped_and_hold_back_submissions() -> anyhow::Result<()> {
    use tonic_types::StatusExt as _;
    let dir = tempfile::tempdir()?;
    let (fleet, mut api) = secured_fleet(dir.path()).await?;
    let narrow = "tok-narrow-5d21";
    tokens_file(
        dir.path(),
        &format!(
            "\n[tenants.narrow]\ntoken_sha256 = [\"{}\"]\nmax_calls_in_flight = 2\n",
            token_sha256(narrow)
        ),
    );
    until_the_token_works(&api, narrow).await?;
    let mut redis = fleet.redis.connection().await?;
    let in_flight_key = toolfleet_proto::names::RedisKeys::default().tenant_calls("narrow");
    let in_flight = |mut redis: toolfleet_service::connect::RedisConnection| {
        let key = in_flight_key.clone();
        async move {
            let n: u32 = redis::cmd("ZCARD")
                .arg(&key)
                .query_async(&mut redis)
                .await?;
            anyhow::Ok(n)
        }
    };

    let job_id = submit_five_measured_calls(&mut api, narrow).await?;
    wait_until("two calls to take a slot", Duration::from_secs(20), || {
        let count = in_flight(redis.clone());
        // Ready only at two: `Ok(false)` would count as ready.
        async move {
            let n = count.await?;
            anyhow::ensure!(n >= 2, "{n} calls in flight");
            anyhow::Ok(())
        }
    })
    .await?;
    // At the quota, a submission is refused with when to come back. (The
    // two calls hold their slots for 1.5 s; a call that finished before
    // this request hands its slot to a waiting one at once.)
    let refused = api
        .submit_job(as_tenant(
            narrow,
            scripted_job("x", &json!([{"message": "m"}])),
        ))
        .await
        .expect_err("at the calls-in-flight quota");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("max_calls_in_flight"),
        "{}",
        refused.message()
    );
    assert!(refused.get_details_retry_info().is_some());

    every_call_ran_never_more_than_two_at_once(&mut api, &mut redis, narrow, &job_id).await?;
    // The slots are given back, and the tenant may submit again.
    wait_until(
        "the slots to be given back",
        Duration::from_secs(10),
        || {
            let count = in_flight(redis.clone());
            async move {
                let n = count.await?;
                anyhow::ensure!(n == 0, "{n} calls still in flight");
                anyhow::Ok(())
            }
        },
    )
    .await?;
    api.submit_job(as_tenant(
        narrow,
        scripted_job("x", &json!([{"message": "m"}])),
    ))
    .await?;
    Ok(())
}

/// A fleet whose orchestrator serves gRPC over mutual TLS only, search
/// named by the client certificate's DNS name and ads by its SPIFFE id.
/// Returns it and its gRPC URL.
async fn fleet_over_mutual_tls(
    dir: &Path,
    certificates: &Certificates,
) -> anyhow::Result<(Fleet, String)> {
    let path = |name: &str| certificates.path(name);
    let tokens = tokens_file(dir, &format!("client_names = [\"{CLIENT_SPIFFE_ID}\"]\n"));
    // search's entry gains a client name: rewrite it with one.
    let text = std::fs::read_to_string(&tokens)?.replace(
        "tools = [\"calculate\"]",
        &format!("tools = [\"calculate\"]\nclient_names = [\"{CLIENT_DNS_NAME}\"]"),
    );
    std::fs::write(&tokens, text)?;
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let (tokens, cert, key, ca) = (
        tokens.to_string_lossy().into_owned(),
        path("server.pem"),
        path("server.key"),
        path("ca.pem"),
    );
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_API__AUTH", "tokens"),
            ("TOOLFLEET_API__TOKENS_FILE", &tokens),
            ("TOOLFLEET_GRPC__TLS__CERT_FILE", &cert),
            ("TOOLFLEET_GRPC__TLS__KEY_FILE", &key),
            ("TOOLFLEET_GRPC__TLS__CLIENT_CA_FILE", &ca),
        ])
        .await?;
    let url = fleet.grpc_url(0).await?;
    Ok((fleet, url))
}

/// A client's TLS trusting the test's CA, presenting the certificate and
/// key of file stem `certificate` in `dir` if given.
fn client_tls(
    dir: &Path,
    certificate: Option<&str>,
) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let ca_pem = std::fs::read(dir.join("ca.pem"))?;
    let mut config = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(&ca_pem));
    if let Some(stem) = certificate {
        config = config.identity(Identity::from_pem(
            std::fs::read(dir.join(format!("{stem}.pem")))?,
            std::fs::read(dir.join(format!("{stem}.key")))?,
        ));
    }
    Ok(config)
}

/// The CLI over mutual TLS lists the job `job_id`.
async fn the_cli_lists_over_mutual_tls(
    url: &str,
    certificates: &Certificates,
    job_id: &str,
) -> anyhow::Result<()> {
    let (ca, path) = (certificates.path("ca.pem"), |name: &str| {
        certificates.path(name)
    });
    let output = tokio::process::Command::new(cargo_bin("toolfleet")?)
        .args([
            "jobs",
            "--json",
            "--addr",
            &url.replace("http://", "https://"),
        ])
        .args(["--tls-ca-file", &ca])
        .args(["--tls-cert-file", &path("client.pem")])
        .args(["--tls-key-file", &path("client.key")])
        .env_remove("TOOLFLEET_TOKEN")
        .output()
        .await?;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains(job_id));
    Ok(())
}

/// gRPC over TLS refuses plaintext and, with mutual TLS required, clients
/// without a certificate; a client certificate's DNS name or SPIFFE id
/// names the tenant (not a token sent beside it); the CLI works over it.
#[tokio::test]
async fn tls_and_mutual_tls_name_the_tenant_and_refuse_plaintext() -> anyhow::Result<()> {
    use tonic::transport::Endpoint;
    let dir = tempfile::tempdir()?;
    let certificates = Certificates::generate(dir.path())?;
    let (_fleet, url) = fleet_over_mutual_tls(dir.path(), &certificates).await?;
    let tls_url = url.replace("http://", "https://");
    let client_tls = |certificate| client_tls(dir.path(), certificate);
    let job = || scripted_job("x", &json!([{"message": "m"}]));

    // Plaintext is refused: the port speaks TLS only.
    let plaintext = async {
        let channel = Endpoint::from_shared(url.clone())?.connect().await?;
        ApiClient::new(channel).submit_job(job()).await?;
        anyhow::Ok(())
    };
    assert!(plaintext.await.is_err(), "a plaintext client got through");
    // TLS without a client certificate is refused: mutual TLS is required.
    let anonymous = async {
        let channel = Endpoint::from_shared(tls_url.clone())?
            .tls_config(client_tls(None)?)?
            .connect()
            .await?;
        ApiClient::new(channel)
            .submit_job(as_tenant(SEARCH, job()))
            .await?;
        anyhow::Ok(())
    };
    assert!(
        anonymous.await.is_err(),
        "a client without a certificate got through"
    );

    // The client certificate names the tenant: no token needed.
    let channel = Endpoint::from_shared(tls_url.clone())?
        .tls_config(client_tls(Some("client"))?)?
        .connect()
        .await?;
    let mut api = ApiClient::new(channel);
    let job_id = api.submit_job(job()).await?.into_inner().job_id;
    assert!(job_id.starts_with("search-"), "{job_id}");
    let mine = api
        .list_jobs(v1::ListJobsRequest::default())
        .await?
        .into_inner();
    assert_eq!(mine.jobs.len(), 1);
    assert_eq!(mine.jobs[0].job_id, job_id);
    let with_token = api
        .list_jobs(as_tenant(ADS, v1::ListJobsRequest::default()))
        .await?
        .into_inner();
    let ids: Vec<&str> = with_token.jobs.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(
        ids,
        [job_id.as_str()],
        "the certificate decides the tenant, not a token sent beside it"
    );

    // A URI name (a SPIFFE id) names a tenant too.
    let channel = Endpoint::from_shared(tls_url)?
        .tls_config(client_tls(Some("spiffe"))?)?
        .connect()
        .await?;
    let ads_job = ApiClient::new(channel)
        .submit_job(job())
        .await?
        .into_inner()
        .job_id;
    assert!(ads_job.starts_with("ads-"), "{ads_job}");

    the_cli_lists_over_mutual_tls(&url, &certificates, &job_id).await?;
    Ok(())
}
