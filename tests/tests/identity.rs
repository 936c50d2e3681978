//! Signing in with the company's identity (docs/security.md, "Identity and
//! roles"), against a real, certified OpenID provider (tests/identity): a
//! service by client credentials and a person by authorization code with
//! PKCE reach the API with JWT access tokens, whose claims say the tenant,
//! the person and the roles; the provider rotates its key while a job
//! waits; every token that should not pass is refused by the check it
//! fails.

use std::time::Duration;

use serde_json::{Value, json};
use tonic::Code;
use toolfleet_proto::v1;
use toolfleet_tests::certificates::{Certificates, GATEWAY_DNS_NAME};
use toolfleet_tests::fleet::{ApiClient, Fleet, scripted_job, test_fleet};
use toolfleet_tests::identity::{
    OpenIdProvider, Person, Service, bearer, issuers_setting, wait_for_tools,
};
use toolfleet_tests::{cargo_bin, repo_root, venv_python, wait_until};

/// The API's own audience, and the gateway's (another resource).
const API: &str = "urn:toolfleet:api";
const GATEWAY: &str = "http://127.0.0.1:9/mcp";

const BOT: Service<'static> = Service {
    client_id: "billing-bot",
    secret: "billing-bot-secret-5b2f1c9e0d7a4e63",
    tenant: "billing",
    roles: &["agent"],
};

const ANA: Person<'static> = Person {
    name: "ana",
    tenant: "billing",
    roles: &["approver"],
};

/// A person who calls tools, through the MCP gateway.
const ANA_AGENT: Person<'static> = Person {
    name: "ana",
    tenant: "ide",
    roles: &["agent"],
};

/// A person the provider knows, to whom it gives no role of ours.
const EVE: Person<'static> = Person {
    name: "eve",
    tenant: "billing",
    roles: &["admin"],
};

const WAIT: Duration = Duration::from_secs(30);

/// An orchestrator trusting only `provider` (no tokens file): tenants from
/// the `tenant` claim, people from `sub`, roles from `roles`; unknown key
/// ids fetch the keys again after a second. Ready once `token` lists the
/// test tools.
async fn fleet_trusting(
    provider: &OpenIdProvider,
    token: &str,
) -> anyhow::Result<(Fleet, ApiClient)> {
    let issuers = issuers_setting(provider, API);
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_API__AUTH", "tokens"),
            ("TOOLFLEET_API__IDENTITY__ISSUERS", &issuers),
            ("TOOLFLEET_API__IDENTITY__KEYS_REFETCH_INTERVAL", "1s"),
        ])
        .await?;
    let api = fleet.api(0).await?;
    wait_for_tools(&api, token, &["calculate", "echo"]).await?;
    Ok((fleet, api))
}

async fn who_am_i(api: &mut ApiClient, token: &str) -> Result<v1::WhoAmIResponse, tonic::Status> {
    Ok(api
        .who_am_i(bearer(token, v1::WhoAmIRequest {}))
        .await?
        .into_inner())
}

/// A job whose `calculate` call waits for a person's approval.
fn held_calculation() -> v1::SubmitJobRequest {
    let script = json!([
        {"tool_calls": [{"id": "math", "name": "calculate", "arguments": {"expression": "6 * 7"}}]},
        {"message": "{{math.data.result}}"}
    ]);
    let mut request = scripted_job("multiply", &script);
    request.require_approval = vec!["calculate".to_owned()];
    request
}

async fn status(api: &ApiClient, token: &str, job_id: &str) -> anyhow::Result<v1::JobStatus> {
    let request = v1::GetJobRequest {
        job_id: job_id.to_owned(),
    };
    let job = api
        .clone()
        .get_job(bearer(token, request))
        .await?
        .into_inner();
    Ok(job.status())
}

async fn wait_for(
    api: &ApiClient,
    token: &str,
    job_id: &str,
    wanted: v1::JobStatus,
) -> anyhow::Result<()> {
    let what = format!("job {job_id} to be {}", wanted.as_str_name());
    wait_until(&what, WAIT, || async {
        status(api, token, job_id).await.is_ok_and(|s| s == wanted)
    })
    .await
}

/// The `tool_call_decided` event of a finished job.
async fn decision(api: &mut ApiClient, token: &str, job_id: &str) -> anyhow::Result<Value> {
    let request = v1::WatchJobRequest {
        job_id: job_id.to_owned(),
        from_offset: 0,
    };
    let mut events = api.watch_job(bearer(token, request)).await?.into_inner();
    while let Some(event) = events.message().await? {
        if event.kind == "tool_call_decided" {
            return Ok(serde_json::from_str(&event.data)?);
        }
    }
    anyhow::bail!("no tool_call_decided event")
}

#[tokio::test]
async fn a_service_and_a_person_sign_in_and_each_does_what_its_roles_say() -> anyhow::Result<()> {
    let mut provider = OpenIdProvider::start(&[API, GATEWAY], &[BOT], &[ANA, EVE]).await?;
    let bot = provider.service_token(&BOT, API, "agent").await?;
    let (_fleet, mut api) = fleet_trusting(&provider, &bot).await?;
    let ana = provider.sign_in(ANA.name, API, "approver").await?;

    // Who each is comes from the provider's claims, nothing else.
    let me = who_am_i(&mut api, &bot).await?;
    assert_eq!(
        (me.tenant.as_str(), me.person.as_str(), me.roles.as_slice()),
        ("billing", "billing-bot", &["agent".to_owned()][..])
    );
    let me = who_am_i(&mut api, &ana).await?;
    assert_eq!(
        (me.person.as_str(), me.roles.as_slice()),
        ("ana", &["approver".to_owned()][..])
    );

    // The service submits; its call waits for a person.
    let job_id = api
        .submit_job(bearer(&bot, held_calculation()))
        .await?
        .into_inner()
        .job_id;
    assert!(job_id.starts_with("billing-"), "{job_id}");
    let request = v1::GetJobRequest {
        job_id: job_id.clone(),
    };
    let job = api.get_job(bearer(&bot, request)).await?.into_inner();
    assert_eq!(job.submitter, "billing-bot", "the token's person");
    wait_for(&api, &bot, &job_id, v1::JobStatus::WaitingForApproval).await?;
    let refused = api
        .decide_call(bearer(&bot, approve(&job_id)))
        .await
        .expect_err("a service with the agent role approves nothing");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("needs the role approver"),
        "{refused:?}"
    );

    // The provider rotates its signing key while the job waits: the
    // person's next token is signed with a key the orchestrator has not
    // seen, and is let in once the keys are fetched again (at most once a
    // keys_refetch_interval, 1 s here: a token that comes sooner is
    // refused as of an unknown key, and a retry gets in); the service's
    // token of the old key still is.
    provider.rotate_keys().await?;
    let ana_again = provider.sign_in(ANA.name, API, "approver").await?;
    assert_ne!(kid(&ana_again)?, kid(&ana)?, "signed with the new key");
    let pending = wait_until("the provider's new key to be fetched", WAIT, || {
        let mut api = api.clone();
        let request = v1::ListPendingApprovalsRequest {
            page_size: 0,
            page_token: String::new(),
        };
        let token = ana_again.clone();
        async move {
            match api.list_pending_approvals(bearer(&token, request)).await {
                Ok(page) => Some(Ok(page.into_inner())),
                Err(refused) if refused.message().contains("its key id (kid)") => None,
                Err(other) => Some(Err(other)),
            }
        }
    })
    .await??;
    assert_eq!(
        who_am_i(&mut api, &bot).await?.person,
        "billing-bot",
        "the old key's"
    );
    assert_eq!(pending.approvals.len(), 1, "{pending:?}");
    api.decide_call(bearer(&ana_again, approve(&job_id)))
        .await?;
    wait_for(&api, &bot, &job_id, v1::JobStatus::Succeeded).await?;
    // The person recorded is the token's, never a name the client sends.
    let decided = decision(&mut api, &bot, &job_id).await?;
    assert_eq!(decided["approver"], "ana", "{decided}");
    assert_eq!(decided["tenant"], "billing", "{decided}");

    Ok(())
}

fn approve(job_id: &str) -> v1::DecideCallRequest {
    toolfleet_tests::fleet::approval(job_id, "math")
}

/// The key id in a token's header.
fn kid(token: &str) -> anyhow::Result<String> {
    let header = token.split('.').next().unwrap_or_default();
    let header = data_encoding::BASE64URL_NOPAD.decode(header.as_bytes())?;
    let header: Value = serde_json::from_slice(&header)?;
    Ok(header["kid"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn tokens_that_should_not_pass_are_refused_by_the_check_they_fail() -> anyhow::Result<()> {
    let provider = OpenIdProvider::start(&[API, GATEWAY], &[BOT], &[ANA, EVE]).await?;
    let bot = provider.service_token(&BOT, API, "agent").await?;
    let (_fleet, mut api) = fleet_trusting(&provider, &bot).await?;
    let for_the_gateway = provider.service_token(&BOT, GATEWAY, "agent").await?;
    let eve = provider.sign_in(EVE.name, API, "reader").await?;
    let tampered = {
        let parts: Vec<&str> = bot.split('.').collect();
        let claims = data_encoding::BASE64URL_NOPAD.decode(parts[1].as_bytes())?;
        let mut claims: Value = serde_json::from_slice(&claims)?;
        claims["roles"] = json!(["agent", "operator"]);
        let claims = data_encoding::BASE64URL_NOPAD.encode(claims.to_string().as_bytes());
        format!("{}.{claims}.{}", parts[0], parts[2])
    };
    let unsigned = {
        let header = data_encoding::BASE64URL_NOPAD.encode(br#"{"alg":"none"}"#);
        let claims = bot.split('.').nth(1).unwrap_or_default();
        format!("{header}.{claims}.")
    };
    for (token, expected) in [
        (
            for_the_gateway.as_str(),
            "its audience (aud) is not this API's",
        ),
        (eve.as_str(), "it gives no role (claims roles"),
        (tampered.as_str(), "its signature does not verify"),
        (unsigned.as_str(), "it is not a JWT (header)"),
        ("a.b.c", "it is not a JWT (header)"),
    ] {
        let refused = who_am_i(&mut api, token).await.expect_err(expected);
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
        assert!(
            refused.message().contains(expected),
            "{expected}: {refused:?}"
        );
        assert!(!refused.message().contains(token), "never the token");
    }
    // An oversized header is refused before it is read.
    let huge = format!("{bot}{}", "A".repeat(9000));
    let refused = who_am_i(&mut api, &huge).await.expect_err("too long");
    assert!(refused.message().contains("over 8192 bytes"), "{refused:?}");
    // The good one still passes.
    assert_eq!(who_am_i(&mut api, &bot).await?.tenant, "billing");
    Ok(())
}

/// An orchestrator over mutual TLS trusting `provider`, whose tokens file
/// lists the test's gateway certificate as a gateway's with the resource
/// `gateway_url`; its https address.
async fn orchestrator_behind_an_oauth_gateway(
    scratch: &std::path::Path,
    certificates: &Certificates,
    provider: &OpenIdProvider,
    gateway_url: &str,
) -> anyhow::Result<(Fleet, String)> {
    let tokens = scratch.join("tokens.toml");
    // The file needs a tenant; this one's token is never used.
    let unused = toolfleet_orchestrator::auth::token_sha256("tok-unused-6f1e");
    std::fs::write(
        &tokens,
        format!(
            "[gateways.mcp]\nclient_names = [\"{GATEWAY_DNS_NAME}\"]\nresource = \"{gateway_url}\"\n\n\
             [tenants.other]\ntoken_sha256 = [\"{unused}\"]\n"
        ),
    )?;
    let tokens = tokens.display().to_string();
    let mut env = vec![
        ("TOOLFLEET_API__AUTH", "tokens".to_owned()),
        ("TOOLFLEET_API__TOKENS_FILE", tokens),
        (
            "TOOLFLEET_API__IDENTITY__ISSUERS",
            issuers_setting(provider, API),
        ),
    ];
    env.extend(certificates.mutual_tls_env());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet.spawn_orchestrator(&env).await?;
    let addr = fleet.grpc_url(0).await?.replace("http://", "https://");
    Ok((fleet, addr))
}

/// The official MCP Python SDK's OAuth client adds the gateway by its URL
/// and signs a person in through the provider: it finds the provider in the
/// gateway's protected resource metadata, gets a token for the gateway's
/// resource, and calls a tool as the person's tenant. A token minted for
/// the API itself is not passed through the gateway.
#[tokio::test]
async fn an_mcp_client_signs_in_to_the_gateway_through_the_provider() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let certificates = Certificates::generate(scratch.path())?;
    let listen = toolfleet_tests::free_loopback_address()?;
    let gateway_url = format!("http://{listen}/mcp");
    let provider = OpenIdProvider::start(&[API, &gateway_url], &[BOT], &[ANA_AGENT]).await?;
    let (_fleet, addr) = orchestrator_behind_an_oauth_gateway(
        scratch.path(),
        &certificates,
        &provider,
        &gateway_url,
    )
    .await?;
    let _gateway = tokio::process::Command::new(cargo_bin("toolfleet")?)
        .args(["mcp-serve", "--addr", &addr, "--listen", &listen])
        .args(certificates.gateway_tls_args())
        .args(["--resource-url", &gateway_url])
        .args([
            "--authorization-server",
            provider.issuer(),
            "--scope",
            "agent",
        ])
        .kill_on_drop(true)
        .spawn()?;
    wait_until("mcp-serve to listen", WAIT, || async {
        tokio::net::TcpStream::connect(&listen).await.ok()
    })
    .await?;

    // What a client sees before it signs in: where to go.
    let (status, metadata) =
        toolfleet_tests::http_get(&listen, "/.well-known/oauth-protected-resource/mcp").await?;
    assert_eq!(status, 200, "{metadata}");
    let metadata: Value = serde_json::from_str(&metadata)?;
    assert_eq!(metadata["resource"], gateway_url.as_str());
    assert_eq!(
        metadata["authorization_servers"],
        json!([provider.issuer()])
    );
    let (status, head) = http_head_of(&listen, "/mcp", None).await?;
    assert_eq!(status, 401);
    assert!(
        head.contains(&format!(
            "resource_metadata=\"http://{listen}/.well-known/oauth-protected-resource/mcp\""
        )),
        "{head}"
    );

    // The SDK's OAuth client does the rest.
    let output = tokio::process::Command::new(venv_python()?)
        .arg(repo_root().join("tests/identity/mcp_oauth_client.py"))
        .args([gateway_url.as_str(), ANA_AGENT.name])
        .output()
        .await?;
    let seen: Value = serde_json::from_slice(&output.stdout)
        .map_err(|err| anyhow::anyhow!("{err}: {}", String::from_utf8_lossy(&output.stderr)))?;
    assert!(seen.get("refused").is_none(), "{seen}");
    assert_eq!(seen["calculate"]["result"], 42, "{seen}");
    assert_eq!(seen["claims"]["aud"], gateway_url.as_str(), "{seen}");
    assert_eq!(seen["claims"]["sub"], "ana", "{seen}");

    // A token for the API, not the gateway, is refused at the gateway's
    // door, which says why, never the token.
    let for_the_api = provider.service_token(&BOT, API, "agent").await?;
    let (status, head) = http_head_of(&listen, "/mcp", Some(&for_the_api)).await?;
    assert_eq!(status, 401, "{head}");
    assert!(head.contains("error=\"invalid_token\""), "{head}");
    assert!(head.contains("not the gateway's resource URL"), "{head}");
    assert!(!head.contains(&for_the_api), "never the token");
    Ok(())
}

/// The status and the whole answer (head and body) of a GET of `path` at
/// `address`, with `token` as its bearer token if given.
async fn http_head_of(
    address: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n");
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no HTTP response: {response}"))?;
    Ok((status, response))
}
