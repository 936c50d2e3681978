//! Least privilege on the bus, with the shipped users
//! (`deploy/nats/toolfleet-users.conf`): a fleet of two worker pools runs
//! jobs on it once `toolfleet-orchestrator setup` has created the streams,
//! consumers and bucket (a pool started before waits for it, saying so),
//! and every action outside a user's part is refused by nats-server itself.

use std::time::Duration;

use async_nats::jetstream;
use serde_json::json;
use tokio::sync::mpsc;
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{Fleet, run_job, scripted_job};
use toolfleet_tests::{NatsServer, RedisConfig, ServerOptions, cargo_bin};

/// The shipped users, exactly as deployed.
const USERS: &str = include_str!("../../deploy/nats/toolfleet-users.conf");

const GENERAL_TOOLS: &[&str] = &["calculate", "get_current_weather"];
const KNOWLEDGE_TOOLS: &[&str] = &["factual_qa", "trend_analysis"];

/// One user of the shipped configuration, with the password the test gives
/// it through the server's variables.
struct User {
    name: &'static str,
    variable: &'static str,
    password: String,
}

impl User {
    fn new(name: &'static str, variable: &'static str) -> Self {
        // Random per run, so that no log line can match by luck.
        let random = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), name);
        let password = format!("{name}-{random:016x}");
        Self {
            name,
            variable,
            password,
        }
    }

    /// A service's NATS settings as this user: its password, its own inbox
    /// prefix, and nothing created on the fly.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("TOOLFLEET_NATS__USER", self.name.to_owned()),
            ("TOOLFLEET_NATS__PASSWORD", self.password.clone()),
            (
                "TOOLFLEET_NATS__INBOX_PREFIX",
                format!("_INBOX.{}", self.name),
            ),
            ("TOOLFLEET_NATS__CREATE_MISSING", "false".to_owned()),
        ]
    }

    /// A connection as this user whose server errors (the permission
    /// violations) arrive on the receiver.
    async fn connect(
        &self,
        url: &str,
    ) -> anyhow::Result<(async_nats::Client, mpsc::UnboundedReceiver<String>)> {
        let (errors, received) = mpsc::unbounded_channel();
        let client = async_nats::ConnectOptions::with_user_and_password(
            self.name.into(),
            self.password.clone(),
        )
        .custom_inbox_prefix(format!("_INBOX.{}", self.name))
        .event_callback(move |event| {
            let errors = errors.clone();
            async move {
                if let async_nats::Event::ServerError(err) = event {
                    let _ = errors.send(err.to_string());
                }
            }
        })
        .connect(url)
        .await?;
        Ok((client, received))
    }
}

struct Users {
    setup: User,
    orchestrator: User,
    general: User,
    knowledge: User,
}

impl Users {
    fn new() -> Self {
        Self {
            setup: User::new("setup", "TOOLFLEET_NATS_SETUP_PASSWORD"),
            orchestrator: User::new("orchestrator", "TOOLFLEET_NATS_ORCHESTRATOR_PASSWORD"),
            general: User::new("pool-general", "TOOLFLEET_NATS_POOL_GENERAL_PASSWORD"),
            knowledge: User::new("pool-knowledge", "TOOLFLEET_NATS_POOL_KNOWLEDGE_PASSWORD"),
        }
    }

    /// The shipped users, with the passwords as the variables it reads
    /// (where a deployment sets them in the server's environment).
    fn server_config(&self) -> String {
        let mut config = String::new();
        for user in [
            &self.setup,
            &self.orchestrator,
            &self.general,
            &self.knowledge,
        ] {
            config.push_str(&format!("{}: \"{}\"\n", user.variable, user.password));
        }
        config + USERS
    }
}

fn as_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Waits for the server to refuse something: the error naming `needle`.
async fn refused(errors: &mut mpsc::UnboundedReceiver<String>, needle: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, errors.recv()).await {
            Ok(Some(error))
                if error.contains("Permissions Violation") && error.contains(needle) =>
            {
                return Ok(());
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => anyhow::bail!("the server did not refuse {needle}"),
        }
    }
}

/// Runs `toolfleet-orchestrator setup` as `user` for `tools`; returns what
/// it printed.
async fn set_up(nats_url: &str, user: &User, tools: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(cargo_bin("toolfleet-orchestrator")?)
        .args(["setup", "--nats-url", nats_url, "--tools", &tools.join(",")])
        .envs(user.env())
        .output()
        .await?;
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "setup failed: {printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(printed)
}

#[tokio::test]
async fn the_shipped_nats_users_run_a_fleet_and_may_do_nothing_else() -> anyhow::Result<()> {
    let users = Users::new();
    let nats =
        NatsServer::start_with_config(&ServerOptions::default(), &users.server_config()).await?;
    let url = nats.url();
    let anonymous = async_nats::connect(&url).await;
    assert!(anonymous.is_err(), "an anonymous client got in");
    let (admin, _) = users.setup.connect(&url).await?;
    let mut fleet = Fleet::start_on(nats, admin.clone(), RedisConfig::default(), 0, &[]).await?;

    // A pool started before the setup step waits for it, and says which.
    let general_env = users.general.env();
    let general = fleet.start_pool_worker(GENERAL_TOOLS, &as_refs(&general_env))?;
    fleet
        .worker(general)
        .wait_for_log("toolfleet-orchestrator setup", Duration::from_secs(20))
        .await?;
    let all_tools = [GENERAL_TOOLS, KNOWLEDGE_TOOLS].concat();
    let printed = set_up(&url, &users.setup, &all_tools).await?;
    assert!(
        printed.contains("set up consumer tool_factual_qa"),
        "{printed}"
    );
    // Each pool's consumer exists before its first worker starts.
    let js = jetstream::new(admin.clone());
    let calls = js.get_stream("TOOLFLEET_CALLS").await?;
    calls.consumer_info("tool_factual_qa").await?;
    fleet
        .worker(general)
        .wait_for_log("worker ready", Duration::from_secs(30))
        .await?;
    let knowledge_env = users.knowledge.env();
    let knowledge = fleet.start_pool_worker(KNOWLEDGE_TOOLS, &as_refs(&knowledge_env))?;
    fleet
        .worker(knowledge)
        .wait_for_log("worker ready", Duration::from_secs(30))
        .await?;
    fleet
        .spawn_orchestrator(&as_refs(&users.orchestrator.env()))
        .await?;
    fleet.wait_for_tools(0, &all_tools, 1).await?;

    let job = run_job(
        &fleet.api(0).await?,
        scripted_job(
            "2+2, and what did AMD launch?",
            &json!([
                {"tool_calls": [
                    {"name": "calculate", "arguments": {"expression": "2+2"}},
                    {"name": "factual_qa", "arguments": {
                        "entity": "AMD", "start_date_range": "2016-01-01",
                        "end_date_range": "2020-12-31", "predicate": "LAUNCHED"}}
                ]},
                {"message": "{{call_0_0.data.result}} / {{call_0_1.data.text}}"}
            ]),
        ),
    )
    .await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert!(
        job.output_text.starts_with("4 / ") && job.output_text.contains("LAUNCHED"),
        "{}",
        job.output_text
    );

    // A pool: reading every call, pulling another pool's calls, creating a
    // consumer of its own to read them, reading another user's inbox,
    // publishing a call, writing another tool's registry key.
    let (pool, mut errors) = users.general.connect(&url).await?;
    let _every_call = pool.subscribe("toolfleet.call.>").await?;
    refused(&mut errors, "Subscription to \"toolfleet.call.>\"").await?;
    let _inbox = pool.subscribe("_INBOX.orchestrator.>").await?;
    refused(&mut errors, "Subscription to \"_INBOX.orchestrator.>\"").await?;
    for subject in [
        "$JS.API.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_factual_qa",
        "$JS.API.CONSUMER.CREATE.TOOLFLEET_CALLS",
        "$JS.API.STREAM.MSG.GET.TOOLFLEET_CALLS",
        "toolfleet.call.calculate",
        "toolfleet.job.run",
        "$KV.toolfleet_registry.factual_qa.worker-x",
    ] {
        pool.publish(subject, "{}".into()).await?;
        pool.flush().await?;
        refused(&mut errors, &format!("Publish to \"{subject}\"")).await?;
    }
    // Through the KV API too: the write is refused, and nothing lands.
    let mut pool_js = jetstream::new(pool.clone());
    pool_js.set_timeout(Duration::from_secs(2));
    let registry = pool_js.get_key_value("toolfleet_registry").await?;
    let forged = registry.put("factual_qa.worker-x", "{}".into()).await;
    assert!(forged.is_err(), "a pool wrote another tool's registry key");
    let admin_registry = js.get_key_value("toolfleet_registry").await?;
    assert_eq!(admin_registry.get("factual_qa.worker-x").await?, None);

    // The orchestrators may not take calls, nor create anything.
    let (orchestrator, mut errors) = users.orchestrator.connect(&url).await?;
    for subject in [
        "$JS.API.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_calculate",
        "$JS.API.STREAM.CREATE.TOOLFLEET_EVIL",
        "$KV.toolfleet_registry.calculate.worker-x",
    ] {
        orchestrator.publish(subject, "{}".into()).await?;
        orchestrator.flush().await?;
        refused(&mut errors, &format!("Publish to \"{subject}\"")).await?;
    }
    Ok(())
}
