//! The message bus secured: both services reach a nats-server that requires
//! TLS with client certificates and authenticated users (a password for the
//! orchestrator, an NKey for the worker), run a job end to end, and never
//! log a secret; anonymous and certificate-less clients are refused; a
//! token works as well; and a missing file or two ways of authenticating
//! stop start-up with a message.

use std::time::Duration;

use serde_json::json;
use toolfleet_proto::v1;
use toolfleet_tests::certificates::Certificates;
use toolfleet_tests::fleet::{Fleet, Nats, run_job, scripted_job, test_fleet};
use toolfleet_tests::{ChildProcess, NatsServer, cargo_bin};
use toolfleet_tests::{ServerOptions, wait_until};

const ORCHESTRATOR_PASSWORD: &str = "pw-orchestrator-5c1e9f";

/// A server config: TLS verifying client certificates, and two users.
fn config(certificates: &Certificates, worker_nkey: &str) -> String {
    format!(
        r#"
tls {{
  cert_file: "{server_cert}"
  key_file: "{server_key}"
  ca_file: "{ca}"
  verify: true
}}
authorization {{
  users = [
    {{ user: "orchestrator", password: "{ORCHESTRATOR_PASSWORD}" }}
    {{ nkey: "{worker_nkey}" }}
  ]
}}
"#,
        server_cert = certificates.path("server.pem"),
        server_key = certificates.path("server.key"),
        ca = certificates.path("ca.pem"),
    )
}

#[tokio::test]
async fn both_services_run_jobs_over_an_authenticated_tls_bus() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let certificates = Certificates::generate(dir.path())?;
    let worker_key = nkeys::KeyPair::new_user();
    let seed_file = dir.path().join("worker.nk");
    std::fs::write(&seed_file, worker_key.seed()?)?;
    let nats = NatsServer::start_with_config(
        &ServerOptions::default(),
        &config(&certificates, &worker_key.public_key()),
    )
    .await?;
    let tls = |options: async_nats::ConnectOptions| {
        options
            .add_root_certificates(certificates.path("ca.pem").into())
            .add_client_certificate(
                certificates.path("client.pem").into(),
                certificates.path("client.key").into(),
            )
            .require_tls(true)
    };

    // Refused: no user, and a user without a client certificate.
    let anonymous = tls(async_nats::ConnectOptions::new())
        .connect(nats.url())
        .await;
    assert!(anonymous.is_err(), "an anonymous client got in");
    let no_certificate = async_nats::ConnectOptions::with_user_and_password(
        "orchestrator".into(),
        ORCHESTRATOR_PASSWORD.into(),
    )
    .add_root_certificates(certificates.path("ca.pem").into())
    .require_tls(true)
    .connect(nats.url())
    .await;
    assert!(
        no_certificate.is_err(),
        "a client without a certificate got in"
    );

    let client = tls(async_nats::ConnectOptions::with_user_and_password(
        "orchestrator".into(),
        ORCHESTRATOR_PASSWORD.into(),
    ))
    .connect(nats.url())
    .await?;
    let (ca, cert, key) = (
        certificates.path("ca.pem"),
        certificates.path("client.pem"),
        certificates.path("client.key"),
    );
    let seed = seed_file.to_string_lossy().into_owned();
    let tls_env = [
        ("TOOLFLEET_NATS__TLS__CA_FILE", ca.as_str()),
        ("TOOLFLEET_NATS__TLS__CERT_FILE", cert.as_str()),
        ("TOOLFLEET_NATS__TLS__KEY_FILE", key.as_str()),
    ];
    let mut worker_env = vec![("TOOLFLEET_NATS__NKEY_SEED_FILE", seed.as_str())];
    worker_env.extend(tls_env);
    let mut fleet = Fleet::start_as(
        test_fleet(1)
            .on_nats(Nats::Server(nats.into()))
            .worker_env(&worker_env),
        client,
    )
    .await?;
    let mut orchestrator_env = vec![
        ("TOOLFLEET_NATS__USER", "orchestrator"),
        ("TOOLFLEET_NATS__PASSWORD", ORCHESTRATOR_PASSWORD),
    ];
    orchestrator_env.extend(tls_env);
    fleet.spawn_orchestrator(&orchestrator_env).await?;
    fleet.wait_for_tools(0, &["calculate"], 1).await?;

    calculate_through(&fleet).await?;

    // No secret in any log: the password, the seed.
    let seed_text = worker_key.seed()?;
    for log in [
        fleet.orchestrator(0).log_tail(100_000),
        fleet.worker(0).log_tail(100_000),
    ] {
        assert!(
            !log.contains(ORCHESTRATOR_PASSWORD),
            "a password was logged"
        );
        assert!(!log.contains(&seed_text), "a seed was logged");
    }
    Ok(())
}

/// Runs a job whose one call is `calculate` `2+2` through `fleet`, and
/// checks that it answered 4.
async fn calculate_through(fleet: &Fleet) -> anyhow::Result<()> {
    let job = run_job(
        &fleet.api(0).await?,
        scripted_job(
            "2+2?",
            &json!([
                {"tool_calls": [{"name": "calculate", "arguments": {"expression": "2+2"}}]},
                {"message": "{{call_0_0.data.result}}"}
            ]),
        ),
    )
    .await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "4");
    Ok(())
}

/// Starts the orchestrator with `env` against an unreachable NATS and
/// returns what it printed before exiting.
async fn refused_start(name: &str, env: &[(&str, &str)]) -> anyhow::Result<String> {
    let mut env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env.push(("TOOLFLEET_API__AUTH".into(), "none".into()));
    let process = ChildProcess::spawn(
        name,
        cargo_bin("toolfleet-orchestrator")?,
        [
            "--nats-url",
            "nats://127.0.0.1:1",
            "--redis-url",
            "redis://127.0.0.1:1/",
            "--listen",
            "127.0.0.1:0",
        ]
        .map(str::to_owned),
        env,
    )?;
    wait_until(
        "the orchestrator to exit",
        Duration::from_secs(20),
        || async { !process.is_running() },
    )
    .await?;
    Ok(process.log_tail(200))
}

#[tokio::test]
async fn a_missing_file_or_two_ways_to_authenticate_stop_start_up_for_nats_and_redis()
-> anyhow::Result<()> {
    // (name, settings, what the refusal says). Redis settings are checked
    // before any server is waited for, like NATS's.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case<'_>; 6] = [
        (
            "missing-ca",
            &[("TOOLFLEET_NATS__TLS__CA_FILE", "/nonexistent/ca.pem")],
            "nats.tls.ca_file /nonexistent/ca.pem",
        ),
        (
            "two-ways",
            &[
                ("TOOLFLEET_NATS__TOKEN", "tok-secret-aa91"),
                ("TOOLFLEET_NATS__USER", "u"),
                ("TOOLFLEET_NATS__PASSWORD", "p"),
            ],
            "set one of",
        ),
        (
            "missing-creds",
            &[("TOOLFLEET_NATS__CREDENTIALS_FILE", "/nonexistent/x.creds")],
            "nats.credentials_file /nonexistent/x.creds",
        ),
        (
            "missing-redis-password",
            &[("TOOLFLEET_REDIS__PASSWORD_FILE", "/nonexistent/redis.pw")],
            "cannot read redis.password_file /nonexistent/redis.pw",
        ),
        (
            "two-redis-passwords",
            &[
                ("TOOLFLEET_REDIS__PASSWORD", "redis-secret-5b0c"),
                ("TOOLFLEET_REDIS__PASSWORD_FILE", "/etc/hostname"),
            ],
            "not both",
        ),
        (
            "redis-tls-without-rediss",
            &[("TOOLFLEET_REDIS__TLS__CA_FILE", "/etc/hostname")],
            "needs a rediss:// URL",
        ),
    ];
    for (name, settings, says) in cases {
        let log = refused_start(name, settings).await?;
        assert!(log.contains(says), "{name}: {log}");
        for secret in ["tok-secret-aa91", "redis-secret-5b0c"] {
            assert!(!log.contains(secret), "{name} logged a secret: {log}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn both_services_authenticate_with_a_token() -> anyhow::Result<()> {
    const TOKEN: &str = "tok-bus-7e21c0d9";
    let nats = NatsServer::start_with_config(
        &ServerOptions::default(),
        &format!("authorization {{ token: \"{TOKEN}\" }}\n"),
    )
    .await?;
    let wrong = async_nats::ConnectOptions::with_token("tok-wrong".into())
        .connect(nats.url())
        .await;
    assert!(wrong.is_err(), "a wrong token got in");
    let client = async_nats::ConnectOptions::with_token(TOKEN.into())
        .connect(nats.url())
        .await?;
    let env = [("TOOLFLEET_NATS__TOKEN", TOKEN)];
    let mut fleet = Fleet::start_as(
        test_fleet(1)
            .on_nats(Nats::Server(nats.into()))
            .worker_env(&env),
        client,
    )
    .await?;
    fleet.spawn_orchestrator(&env).await?;
    fleet.wait_for_tools(0, &["calculate"], 1).await?;
    let job = run_job(
        &fleet.api(0).await?,
        scripted_job("hi", &json!([{"message": "hello"}])),
    )
    .await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    for log in [
        fleet.orchestrator(0).log_tail(100_000),
        fleet.worker(0).log_tail(100_000),
    ] {
        assert!(!log.contains(TOKEN), "the token was logged");
    }
    Ok(())
}

/// NATS JWTs as `nsc` makes them (nats-io/jwt v2): a header, the claims and
/// an Ed25519 signature by the issuer's NKey, each base64url. Written here
/// because no maintained Rust crate makes operator JWTs; only the test needs
/// them.
mod operator_mode {
    use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
    use serde_json::{Value, json};
    use sha2::{Digest, Sha256};

    /// A signed JWT of `kind` (`operator`, `account`, `user`) for `subject`,
    /// with `nats` as the kind's own claims.
    pub(crate) fn jwt(
        issuer: &nkeys::KeyPair,
        subject: &str,
        name: &str,
        kind: &str,
        nats: Value,
    ) -> anyhow::Result<String> {
        let mut nats = nats;
        nats["type"] = json!(kind);
        nats["version"] = json!(2);
        let mut claims = json!({
            "jti": "",
            "iat": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs(),
            "iss": issuer.public_key(),
            "name": name,
            "sub": subject,
            "nats": nats,
        });
        // The id is the hash of the claims without it, as the Go library makes it.
        let id = Sha256::digest(serde_json::to_vec(&claims)?);
        claims["jti"] = json!(BASE32_NOPAD.encode(&id));
        let header = BASE64URL_NOPAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
        let body = BASE64URL_NOPAD.encode(&serde_json::to_vec(&claims)?);
        let signed = format!("{header}.{body}");
        let signature = issuer.sign(signed.as_bytes())?;
        Ok(format!("{signed}.{}", BASE64URL_NOPAD.encode(&signature)))
    }

    /// An account that may use everything, JetStream included.
    pub(crate) fn unlimited_account() -> Value {
        json!({
            "limits": {
                "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                "wildcards": true, "conn": -1, "leaf": -1,
                "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1
            },
            "default_permissions": {"pub": {}, "sub": {}}
        })
    }

    /// A user of an account, with no limits of its own.
    pub(crate) fn user() -> Value {
        json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1})
    }

    /// A `.creds` file's text: the user's JWT and its seed.
    pub(crate) fn creds(user_jwt: &str, seed: &str) -> String {
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        )
    }
}

/// Operator mode, as `nsc` deploys it: the server trusts an operator, the
/// account is signed by the operator, and each service connects with a
/// credentials file (its user's JWT, signed by the account, and its seed).
#[tokio::test]
async fn both_services_run_jobs_with_credentials_files_in_operator_mode() -> anyhow::Result<()> {
    use operator_mode::{creds, jwt, unlimited_account, user};
    let dir = tempfile::tempdir()?;
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "toolfleet-test",
        "operator",
        json!({}),
    )?;
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "TOOLFLEET",
        "account",
        unlimited_account(),
    )?;
    // JetStream needs the server's own account.
    let system = nkeys::KeyPair::new_account();
    let system_jwt = jwt(&operator, &system.public_key(), "SYS", "account", json!({}))?;
    let mut creds_files = Vec::new();
    for name in ["harness", "orchestrator", "worker"] {
        let key = nkeys::KeyPair::new_user();
        let user_jwt = jwt(&account, &key.public_key(), name, "user", user())?;
        let path = dir.path().join(format!("{name}.creds"));
        std::fs::write(&path, creds(&user_jwt, &key.seed()?))?;
        creds_files.push(path.to_string_lossy().into_owned());
    }
    let config = format!(
        "operator: \"{operator_jwt}\"\nsystem_account: {system}\nresolver: MEMORY\n\
         resolver_preload: {{\n  {account}: \"{account_jwt}\"\n  {system}: \"{system_jwt}\"\n}}\n",
        account = account.public_key(),
        system = system.public_key(),
    );
    let nats = NatsServer::start_with_config(&ServerOptions::default(), &config).await?;
    let anonymous = async_nats::connect(nats.url()).await;
    assert!(anonymous.is_err(), "an anonymous client got in");
    let client = async_nats::ConnectOptions::with_credentials_file(&creds_files[0])
        .await?
        .connect(nats.url())
        .await?;
    let worker_env = [("TOOLFLEET_NATS__CREDENTIALS_FILE", creds_files[2].as_str())];
    let mut fleet = Fleet::start_as(
        test_fleet(1)
            .on_nats(Nats::Server(nats.into()))
            .worker_env(&worker_env),
        client,
    )
    .await?;
    fleet
        .spawn_orchestrator(&[("TOOLFLEET_NATS__CREDENTIALS_FILE", creds_files[1].as_str())])
        .await?;
    fleet.wait_for_tools(0, &["calculate"], 1).await?;
    calculate_through(&fleet).await?;
    Ok(())
}
