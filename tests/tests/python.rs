//! The Python client (`clients/python`) against a real fleet: its runnable
//! example, and what the docs run through it (`toolfleet_tests::markdown`):
//! their grpcurl sessions, `python` and `pip` lines, and Python blocks.

use std::path::Path;

use tokio::process::Command;
use toolfleet_tests::certificates::{CLIENT_DNS_NAME, Certificates};
use toolfleet_tests::fleet::{Fleet, test_fleet};
use toolfleet_tests::identity::{OpenIdProvider, Service, issuers_setting, wait_for_tools};
use toolfleet_tests::markdown::{self, Runner};
use toolfleet_tests::messages::{MessagesServer, Reply};
use toolfleet_tests::{repo_root, venv_python};

async fn run(program: &Path, args: &[&str]) -> anyhow::Result<String> {
    run_as(program, args, None).await
}

/// [`run`] with `TOOLFLEET_TOKEN` set to `token`.
async fn run_as(program: &Path, args: &[&str], token: Option<&str>) -> anyhow::Result<String> {
    let mut command = Command::new(program);
    command.args(args).current_dir(repo_root());
    if let Some(token) = token {
        command.env("TOOLFLEET_TOKEN", token);
    }
    let output = command.output().await?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "{} {args:?} failed ({}):\n{stdout}\n{}",
        program.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

/// A streamed job through the Python client: `watch` yields the answer's
/// deltas, which spell the job's output, before its turn.
async fn streamed_through_python(
    python: &Path,
    address: &str,
    claude: &MessagesServer,
) -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt;
    let stream = toolfleet_tests::messages::hello_stream()?;
    claude.push(Reply::Stream(stream));
    let program = format!(
        "import sys\n\
         from toolfleet_client import Client\n\
         with Client({address:?}) as fleet:\n    \
         job = fleet.submit('Hello', provider='anthropic-messages', model='claude-test', stream=True)\n    \
         text = ''\n    \
         for event in fleet.watch(job.job_id):\n        \
         print(event.kind, flush=True)\n        \
         if event.kind == 'model_output_delta':\n            \
         text += event.data.get('text', '')\n        \
         if event.final:\n            \
         print('streamed', repr(text), 'output', repr(fleet.get(job.job_id).output_text))\n"
    );
    let mut child = Command::new(python)
        .args(["-c", &program])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut printed = Vec::new();
    while let Some(line) = lines.next_line().await? {
        let listening = line == "job_queued";
        printed.push(line);
        if listening {
            break;
        }
    }
    claude.release_stream();
    while let Some(line) = lines.next_line().await? {
        printed.push(line);
    }
    anyhow::ensure!(child.wait().await?.success(), "{printed:#?}");
    let last = printed.last().cloned().unwrap_or_default();
    let first_delta = printed.iter().position(|l| l == "model_output_delta");
    let turn = printed.iter().position(|l| l == "model_turn");
    assert!(first_delta.is_some() && first_delta < turn, "{printed:#?}");
    let (streamed, output) = last
        .strip_prefix("streamed ")
        .and_then(|rest| rest.split_once(" output "))
        .unwrap_or_else(|| panic!("{printed:#?}"));
    assert_eq!(streamed, output, "{printed:#?}");
    assert_ne!(streamed, "''");
    Ok(())
}

/// The client built from this checkout's .proto into the venv, so that it
/// matches the server.
async fn install_the_client(python: &Path) -> anyhow::Result<()> {
    let args = [
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-build-isolation",
        "--no-deps",
        "./clients/python",
    ];
    run(python, &args).await?;
    Ok(())
}

/// An orchestrator with reflection on (the document's session lists and
/// describes through it) and `claude`, faked, for the streamed job, and
/// `env`; its index.
async fn spawn_orchestrator_for_the_docs(
    fleet: &mut Fleet,
    claude: &MessagesServer,
    env: &[(&str, &str)],
) -> anyhow::Result<usize> {
    let claude_url = claude.base_url();
    let mut all = vec![
        ("TOOLFLEET_GRPC__REFLECTION", "true"),
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
        ("TOOLFLEET_ANTHROPIC__BASE_URL", claude_url.as_str()),
    ];
    all.extend_from_slice(env);
    fleet.spawn_orchestrator(&all).await
}

/// The client's example against `address`, run from the repository's root
/// without a token in its environment.
fn example(python: &Path, address: &str) -> Command {
    let mut command = Command::new(python);
    command
        .args([
            "clients/python/examples/parallel_calls.py",
            "--addr",
            address,
        ])
        .current_dir(repo_root())
        .env_remove("TOOLFLEET_TOKEN");
    command
}

/// The example makes two parallel calls and prints the job's answer.
async fn the_example_runs_its_parallel_calls(python: &Path, address: &str) -> anyhow::Result<()> {
    let args = [
        "clients/python/examples/parallel_calls.py",
        "--addr",
        address,
    ];
    let example = run(python, &args).await?;
    assert_eq!(
        example.matches("tool_call_dispatched").count(),
        2,
        "two parallel calls: {example}"
    );
    assert!(example.contains("job_succeeded"), "{example}");
    assert!(
        example.contains("answer: In Boston it is 8.0 °C, and 23 * 19 = 437."),
        "{example}"
    );
    Ok(())
}

/// A call job: one call, its envelope back.
async fn a_call_returns_its_envelope(python: &Path, address: &str) -> anyhow::Result<()> {
    let program = format!(
        "from toolfleet_client import Client\n\
         with Client({address:?}) as fleet:\n    \
         print(fleet.call('calculate', {{'expression': '6*7'}})['data']['result'])\n"
    );
    let called = run(python, &["-c", &program]).await?;
    assert_eq!(called.trim(), "42", "{called}");
    Ok(())
}

/// The grpcurl lines of each document, as one session per document: 9 in
/// docs/api.md, 1 in README.md, every RPC, a final event.
async fn the_docs_grpcurl_sessions_run(
    python: &Path,
    address: &str,
    token: &str,
) -> anyhow::Result<()> {
    let mut sessions = String::new();
    for doc in markdown::RUN_DOCS {
        let text = std::fs::read_to_string(repo_root().join(doc))?;
        let commands = markdown::commands_for(&text, Runner::Python, address);
        if commands
            .iter()
            .any(|command| command.starts_with("grpcurl "))
        {
            let args = ["-m", "toolfleet_client.api_doc", doc, "--addr", address];
            sessions.push_str(&run_as(python, &args, Some(token)).await?);
        }
    }
    assert!(
        sessions.contains("ran 9 grpcurl commands"),
        "docs/api.md: {sessions}"
    );
    assert!(
        sessions.contains("ran 1 grpcurl commands"),
        "README.md: {sessions}"
    );
    for rpc in [
        "SubmitJob",
        "WatchJob",
        "GetJob",
        "ListJobs",
        "CancelJob",
        "ListTools",
    ] {
        assert!(
            sessions.contains(&format!("AgentService/{rpc}")),
            "{rpc}: {sessions}"
        );
    }
    assert!(sessions.contains("\"final\": true"), "{sessions}");
    Ok(())
}

/// The docs' grpcurl sessions, and the client, with a JWT access token of a
/// real OpenID provider (docs/security.md, "Identity and roles").
async fn signed_in_with_a_jwt(
    python: &Path,
    fleet: &mut Fleet,
    claude: &MessagesServer,
) -> anyhow::Result<()> {
    const API: &str = "urn:toolfleet:api";
    let service = Service {
        client_id: "python-docs",
        secret: "python-docs-secret-8c1d2e7f4a9b",
        tenant: "docs",
        roles: &["agent", "approver", "operator", "reader"],
    };
    let provider = OpenIdProvider::start(&[API], &[service], &[]).await?;
    let token = provider
        .service_token(&service, API, "agent reader")
        .await?;
    let issuers = issuers_setting(&provider, API);
    let env = [
        ("TOOLFLEET_API__AUTH", "tokens"),
        ("TOOLFLEET_API__IDENTITY__ISSUERS", issuers.as_str()),
    ];
    let signed_in = spawn_orchestrator_for_the_docs(fleet, claude, &env).await?;
    let api = fleet.api(signed_in).await?;
    wait_for_tools(&api, &token, &["calculate", "get_current_weather"]).await?;
    let url = fleet.grpc_url(signed_in).await?;
    let address = url.trim_start_matches("http://");
    the_docs_grpcurl_sessions_run(python, address, &token).await?;
    let who = "import toolfleet_client as t, sys; me = t.Client(sys.argv[1]).who_am_i(); \
               print(me.tenant, me.person, ','.join(me.roles))";
    let me = run_as(python, &["-c", who, address], Some(&token)).await?;
    assert_eq!(me.trim(), "docs python-docs agent,approver,operator,reader");
    Ok(())
}

/// The `python` and `pip` lines of the docs' shell blocks (at least two),
/// as pasted, with the venv's programs first on the PATH, all succeed.
async fn the_docs_python_and_pip_lines_run(python: &Path, address: &str) -> anyhow::Result<()> {
    let venv_bin = python.parent().map(Path::to_owned).unwrap_or_default();
    let path = format!("{}:{}", venv_bin.display(), std::env::var("PATH")?);
    let mut pasted = 0;
    for doc in markdown::RUN_DOCS {
        let text = std::fs::read_to_string(repo_root().join(doc))?;
        for command in markdown::commands_for(&text, Runner::Python, address) {
            if command.starts_with("grpcurl ") {
                continue;
            }
            pasted += 1;
            let output = Command::new("sh")
                .args(["-c", &command])
                .current_dir(repo_root())
                .env("PATH", &path)
                .env_remove("TOOLFLEET_TOKEN")
                .output()
                .await?;
            assert!(
                output.status.success(),
                "{doc}: `{command}` ended with {}:\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    assert!(pasted >= 2, "the docs' python and pip lines: {pasted}");
    Ok(())
}

/// Every Python block of the docs (at least two) runs as a reader would
/// paste it, against the address `toolfleet dev --serve` tells them to
/// export, and its job succeeds.
async fn the_docs_python_blocks_run(python: &Path, url: &str) -> anyhow::Result<()> {
    let mut blocks = 0;
    for doc in markdown::RUN_DOCS {
        let text = std::fs::read_to_string(repo_root().join(doc))?;
        let python_blocks = markdown::blocks(&text)
            .into_iter()
            .filter(|block| block.language == "python" && block.not_run.is_none());
        for block in python_blocks {
            let block = block.lines.join("\n");
            blocks += 1;
            let output = Command::new(python)
                .args(["-c", &block])
                .env("TOOLFLEET_ADDR", url)
                .env_remove("TOOLFLEET_TOKEN")
                .output()
                .await?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success() && stdout.contains("job_succeeded"),
                "{doc}: the block\n{block}\nfailed:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    assert!(blocks >= 2, "the Python blocks of the docs: {blocks}");
    Ok(())
}

/// With authentication on, the example without a token is
/// `UNAUTHENTICATED`, and with `TOOLFLEET_TOKEN` gets its answer.
async fn the_client_sends_its_token(
    python: &Path,
    fleet: &mut Fleet,
    dir: &Path,
) -> anyhow::Result<()> {
    let tokens = dir.join("tokens.toml");
    let hash = toolfleet_orchestrator::auth::token_sha256("tok-python-5e2b");
    std::fs::write(
        &tokens,
        format!("[tenants.py]\ntoken_sha256 = [\"{hash}\"]\n"),
    )?;
    let tokens = tokens.to_string_lossy().into_owned();
    let secured = fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_API__AUTH", "tokens"),
            ("TOOLFLEET_API__TOKENS_FILE", &tokens),
        ])
        .await?;
    let address = fleet.grpc_url(secured).await?.replace("http://", "");
    let refused = example(python, &address).output().await?;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("UNAUTHENTICATED"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let output = example(python, &address)
        .env("TOOLFLEET_TOKEN", "tok-python-5e2b")
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("answer: "),
        "{stdout}"
    );
    // The token's tenant, and every role (the tokens file gives none).
    let who = "import toolfleet_client as t, sys; me = t.Client(sys.argv[1]).who_am_i(); \
               print(me.tenant, ','.join(me.roles))";
    let output = Command::new(python)
        .args(["-c", who, &address])
        .env("TOOLFLEET_TOKEN", "tok-python-5e2b")
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.trim(),
        "py agent,approver,operator,reader",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Over mutual TLS, the client certificate from TOOLFLEET_TLS_* names the
/// tenant and the example gets its answer; without one the handshake is
/// refused.
async fn mutual_tls_names_the_tenant(
    python: &Path,
    fleet: &mut Fleet,
    dir: &Path,
) -> anyhow::Result<()> {
    let certificates = Certificates::generate(dir)?;
    std::fs::write(
        dir.join("tls-tokens.toml"),
        format!("[tenants.py]\ntoken_sha256 = []\nclient_names = [\"{CLIENT_DNS_NAME}\"]\n"),
    )?;
    let tls_tokens = certificates.path("tls-tokens.toml");
    let mut env: Vec<(&str, &str)> = vec![
        ("TOOLFLEET_API__AUTH", "tokens"),
        ("TOOLFLEET_API__TOKENS_FILE", &tls_tokens),
    ];
    let tls_env = certificates.mutual_tls_env();
    env.extend(tls_env.iter().map(|(key, value)| (*key, value.as_str())));
    let tls = fleet.spawn_orchestrator(&env).await?;
    let address = fleet.grpc_url(tls).await?.replace("http://", "https://");
    let ca = certificates.path("ca.pem");
    let anonymous = example(python, &address)
        .env("TOOLFLEET_TLS_CA_FILE", &ca)
        .output()
        .await?;
    assert!(
        !anonymous.status.success(),
        "a client without a certificate got through"
    );
    let output = example(python, &address)
        .env("TOOLFLEET_TLS_CA_FILE", &ca)
        .env("TOOLFLEET_TLS_CERT_FILE", certificates.path("client.pem"))
        .env("TOOLFLEET_TLS_KEY_FILE", certificates.path("client.key"))
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("answer: "),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// The Python client against a fleet: its example, a call job, a streamed
/// job, the docs' grpcurl sessions, `python` and `pip` lines and Python
/// blocks; then its token with authentication on, and its certificate over
/// mutual TLS.
#[tokio::test]
async fn the_python_client_runs_its_example_and_the_api_docs_session() -> anyhow::Result<()> {
    let python = venv_python()?;
    install_the_client(&python).await?;
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let claude = MessagesServer::start("sk-ant-test").await?;
    spawn_orchestrator_for_the_docs(&mut fleet, &claude, &[]).await?;
    fleet
        .wait_for_tools(0, &["calculate", "get_current_weather"], 1)
        .await?;
    let url = fleet.grpc_url(0).await?;
    let address = url.trim_start_matches("http://");

    the_example_runs_its_parallel_calls(&python, address).await?;
    a_call_returns_its_envelope(&python, address).await?;
    streamed_through_python(&python, address, &claude).await?;
    the_docs_python_and_pip_lines_run(&python, address).await?;
    the_docs_python_blocks_run(&python, &url).await?;
    signed_in_with_a_jwt(&python, &mut fleet, &claude).await?;

    let dir = tempfile::tempdir()?;
    the_client_sends_its_token(&python, &mut fleet, dir.path()).await?;
    mutual_tls_names_the_tenant(&python, &mut fleet, dir.path()).await
}
