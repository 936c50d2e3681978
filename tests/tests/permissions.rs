//! Least privilege with the shipped users, on the bus
//! (`deploy/nats/toolfleet-users.conf`) and in Redis
//! (`deploy/redis/toolfleet-users.conf`): a fleet of two worker pools runs
//! jobs with them, and every action outside a user's part is refused by the
//! server itself. On NATS, once `toolfleet-orchestrator setup` has created
//! the streams, consumers and bucket (a pool started before waits for it,
//! saying so); in Redis, over TLS, where no pool can forge another pool's
//! result or read a job, and the console reaches only its sessions.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::jetstream;
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio::sync::mpsc;
use toolfleet_proto::{names, v1};
use toolfleet_tests::certificates::Certificates;
use toolfleet_tests::fleet::{Fleet, Nats, run_job, scripted_job, test_fleet};
use toolfleet_tests::{NatsServer, RedisConfig, RedisTls, ServerOptions, cargo_bin, wait_until};

/// The shipped users, exactly as deployed.
const USERS: &str = include_str!("../../deploy/nats/toolfleet-users.conf");
const NATS_CONF: &str = include_str!("../../deploy/nats/nats-server.conf");
const REDIS_USERS: &str = include_str!("../../deploy/redis/toolfleet-users.conf");
const REDIS_CONF: &str = include_str!("../../deploy/redis/redis.conf");

const GENERAL_TOOLS: &[&str] = &["calculate", "get_current_weather"];
const KNOWLEDGE_TOOLS: &[&str] = &["factual_qa", "trend_analysis"];

/// A password for the user `name`, random per run, so that no log line can
/// match it by luck.
fn random_password(name: &str) -> String {
    let random = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), name);
    format!("{name}-{random:016x}")
}

/// One user of the shipped configuration, with the password the test gives
/// it through the server's variables.
struct User {
    name: &'static str,
    variable: &'static str,
    password: String,
    /// The CA the server's certificate chains to.
    ca: String,
}

impl User {
    fn new(name: &'static str, variable: &'static str, ca: &str) -> Self {
        let password = random_password(name);
        Self {
            name,
            variable,
            password,
            ca: ca.to_owned(),
        }
    }

    /// A service's NATS settings as this user: its password, its own inbox
    /// prefix, nothing created on the fly, and for a pool the JetStream API
    /// as its account imports it.
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("TOOLFLEET_NATS__USER", self.name.to_owned()),
            ("TOOLFLEET_NATS__PASSWORD", self.password.clone()),
            (
                "TOOLFLEET_NATS__INBOX_PREFIX",
                names::inbox_prefix(self.name),
            ),
            ("TOOLFLEET_NATS__CREATE_MISSING", "false".to_owned()),
            ("TOOLFLEET_NATS__TLS__CA_FILE", self.ca.clone()),
        ];
        if self.name.starts_with("pool-") {
            env.push((
                "TOOLFLEET_NATS__API_PREFIX",
                names::POOL_API_PREFIX.to_owned(),
            ));
        }
        env
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
        .custom_inbox_prefix(names::inbox_prefix(self.name))
        .add_root_certificates(self.ca.clone().into())
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
    fn new(ca: &str) -> Self {
        Self {
            setup: User::new("setup", "TOOLFLEET_NATS_SETUP_PASSWORD_BCRYPT", ca),
            orchestrator: User::new(
                "orchestrator",
                "TOOLFLEET_NATS_ORCHESTRATOR_PASSWORD_BCRYPT",
                ca,
            ),
            general: User::new(
                "pool-general",
                "TOOLFLEET_NATS_POOL_GENERAL_PASSWORD_BCRYPT",
                ca,
            ),
            knowledge: User::new(
                "pool-knowledge",
                "TOOLFLEET_NATS_POOL_KNOWLEDGE_PASSWORD_BCRYPT",
                ca,
            ),
        }
    }

    /// The server's environment as a deployment sets it: each password's
    /// bcrypt hash, in the double quotes the users file asks for.
    fn server_env(&self) -> anyhow::Result<Vec<(String, String)>> {
        [
            &self.setup,
            &self.orchestrator,
            &self.general,
            &self.knowledge,
        ]
        .into_iter()
        .map(|user| {
            // The lowest cost: a test's every connection checks a hash.
            let hash = bcrypt::hash(&user.password, 4)?;
            Ok((user.variable.to_owned(), format!("\"{hash}\"")))
        })
        .collect()
    }
}

/// The shipped nats-server.conf and users file side by side in `etc`, the
/// config's paths under /etc/nats/ and /data/ moved there, and the test's certificates
/// (made in `certificates`) where it expects them. Returns the config file.
fn shipped_nats_config(etc: &Path, certificates: &Path) -> anyhow::Result<PathBuf> {
    install_certificates(etc, certificates)?;
    std::fs::write(etc.join("toolfleet-users.conf"), USERS)?;
    let config = etc.join("nats-server.conf");
    std::fs::write(
        &config,
        NATS_CONF
            .replace("/etc/nats/", &format!("{}/", etc.display()))
            .replace("/data/", &format!("{}/data/", etc.display())),
    )?;
    Ok(config)
}

/// The test's certificates (made in `certificates`) in `etc/tls`, named as
/// a cert-manager Secret names them, which is where the shipped
/// configurations expect them.
fn install_certificates(etc: &Path, certificates: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(etc.join("tls"))?;
    for (made, expected) in [
        ("server.pem", "tls.crt"),
        ("server.key", "tls.key"),
        ("ca.pem", "ca.crt"),
    ] {
        std::fs::copy(certificates.join(made), etc.join("tls").join(expected))?;
    }
    Ok(())
}

fn as_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// What the server at `url` says of itself when a client connects (its
/// first line, `INFO {...}`), before any TLS.
async fn server_info(url: &str) -> anyhow::Result<serde_json::Value> {
    use tokio::io::AsyncBufReadExt;
    let address = url.trim_start_matches("nats://");
    let stream = tokio::net::TcpStream::connect(address).await?;
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::BufReader::new(stream).read_line(&mut line),
    )
    .await??;
    let json = line
        .strip_prefix("INFO ")
        .ok_or_else(|| anyhow::anyhow!("not an INFO line: {line:?}"))?;
    Ok(serde_json::from_str(json.trim())?)
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

/// A job that needs both pools: `calculate` (general) and `factual_qa`
/// (knowledge), answered `<2+2> / <the facts>`. Fails unless it succeeded.
async fn run_two_pool_job(fleet: &Fleet) -> anyhow::Result<v1::Job> {
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
    anyhow::ensure!(
        job.status == v1::JobStatus::Succeeded as i32,
        "the job did not succeed: {job:?}"
    );
    Ok(job)
}

/// Runs [`run_two_pool_job`] a few times; returns the last job and the
/// median time a job took, submission to end.
async fn time_two_pool_jobs(fleet: &Fleet) -> anyhow::Result<(v1::Job, Duration)> {
    const RUNS: usize = 5;
    let mut times = Vec::with_capacity(RUNS);
    let mut last = None;
    for _ in 0..RUNS {
        let started = std::time::Instant::now();
        last = Some(run_two_pool_job(fleet).await?);
        times.push(started.elapsed());
    }
    times.sort();
    let job = last.expect("RUNS > 0");
    Ok((job, times[RUNS / 2]))
}

/// Runs `toolfleet-orchestrator setup` as `user` for `tools`.
async fn run_setup(
    nats_url: &str,
    user: &User,
    tools: &[&str],
) -> anyhow::Result<std::process::Output> {
    Ok(
        tokio::process::Command::new(cargo_bin("toolfleet-orchestrator")?)
            .args(["setup", "--nats-url", nats_url, "--tools", &tools.join(",")])
            .envs(user.env())
            .kill_on_drop(true)
            .output()
            .await?,
    )
}

/// Runs `toolfleet-orchestrator setup` as `user` for `tools`; returns what
/// it printed.
async fn set_up(nats_url: &str, user: &User, tools: &[&str]) -> anyhow::Result<String> {
    let output = run_setup(nats_url, user, tools).await?;
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "setup failed: {printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(printed)
}

/// The shipped NATS and Redis users, with random passwords, the test's
/// certificates, and the dir that holds both configurations.
struct Shipped {
    dir: tempfile::TempDir,
    ca: String,
    nats: Users,
    redis: RedisUsers,
}

impl Shipped {
    fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        Certificates::generate(dir.path())?;
        let ca = dir.path().join("nats/tls/ca.crt").display().to_string();
        Ok(Self {
            nats: Users::new(&ca),
            redis: RedisUsers::new(),
            ca,
            dir,
        })
    }

    /// A nats-server on exactly the shipped configuration.
    async fn start_nats(&self) -> anyhow::Result<NatsServer> {
        let config = shipped_nats_config(&self.dir.path().join("nats"), self.dir.path())?;
        let options = ServerOptions {
            nats_env: self.nats.server_env()?,
            ..ServerOptions::default()
        };
        let store_dir = self.dir.path().join("nats/data/jetstream");
        NatsServer::start_from_file(&options, &config, &store_dir).await
    }

    /// A fleet without services on `nats` and a Redis on the shipped
    /// configuration, its harness connected to NATS as `admin`.
    async fn start_fleet(
        &self,
        nats: NatsServer,
        admin: async_nats::Client,
    ) -> anyhow::Result<Fleet> {
        let redis = shipped_redis(
            &self.dir.path().join("redis"),
            self.dir.path(),
            self.redis.all(),
        )?;
        let builder = test_fleet(0)
            .on_nats(Nats::Server(nats.into()))
            .redis(redis);
        Fleet::start_as(builder, admin).await
    }

    /// A service's environment as its NATS user and its Redis user.
    fn env(&self, nats: &User, redis: &RedisUser) -> Vec<(&'static str, String)> {
        let mut env = nats.env();
        env.extend([
            ("TOOLFLEET_REDIS__USER", redis.name.to_owned()),
            ("TOOLFLEET_REDIS__PASSWORD", redis.password.clone()),
            ("TOOLFLEET_REDIS__TLS__CA_FILE", self.ca.clone()),
        ]);
        env
    }

    /// Starts pool `general` before the setup step: it waits for it, and
    /// says which. Returns the worker's index.
    async fn start_general_before_setup(&self, fleet: &mut Fleet) -> anyhow::Result<usize> {
        let env = self.env(&self.nats.general, &self.redis.general);
        let general = fleet.start_pool_worker(GENERAL_TOOLS, &as_refs(&env))?;
        fleet
            .worker(general)
            .wait_for_log("toolfleet-orchestrator setup", Duration::from_secs(20))
            .await?;
        Ok(general)
    }

    /// Once set up: pool `general` ready, pool `knowledge` and an
    /// orchestrator started as their users, every tool announced.
    async fn start_the_rest(&self, fleet: &mut Fleet, general: usize) -> anyhow::Result<()> {
        fleet
            .worker(general)
            .wait_for_log("worker ready", Duration::from_secs(30))
            .await?;
        let env = self.env(&self.nats.knowledge, &self.redis.knowledge);
        let knowledge = fleet.start_pool_worker(KNOWLEDGE_TOOLS, &as_refs(&env))?;
        fleet
            .worker(knowledge)
            .wait_for_log("worker ready", Duration::from_secs(30))
            .await?;
        let env = self.env(&self.nats.orchestrator, &self.redis.orchestrator);
        fleet.spawn_orchestrator(&as_refs(&env)).await?;
        fleet.wait_for_tools(0, &all_tools(), 1).await
    }
}

/// Every tool of both pools.
fn all_tools() -> Vec<&'static str> {
    [GENERAL_TOOLS, KNOWLEDGE_TOOLS].concat()
}

/// TLS on the client port, and only hashes of the passwords (the server
/// does not warn of plaintext ones); the monitoring endpoint, which lists
/// every connection unauthenticated, on the loopback only; no anonymous
/// client.
async fn the_bus_takes_only_tls_and_hashed_passwords(
    nats: &NatsServer,
    ca: &str,
) -> anyhow::Result<()> {
    let url = nats.url();
    let info = server_info(&url).await?;
    assert_eq!(info["tls_required"], true, "{info}");
    let log = nats.process().log_tail(10_000);
    assert!(!log.contains("Plaintext passwords"), "{log}");
    // The harness's own -a 127.0.0.1 would hide a missing host, so the
    // file itself is read.
    assert!(
        NATS_CONF
            .lines()
            .any(|line| line.trim() == "http: 127.0.0.1:8222"),
        "the monitoring endpoint is not bound to the loopback"
    );
    let anonymous = async_nats::ConnectOptions::new()
        .add_root_certificates(ca.to_owned().into())
        .connect(&url)
        .await;
    assert!(anonymous.is_err(), "an anonymous client got in");
    Ok(())
}

/// Setup as a user that may not (the orchestrator): the server drops its
/// requests, and setup tells that from a JetStream not ready yet (which it
/// would wait out for minutes) by the server's refusal, and stops without
/// printing the password. Setup as `setup` creates each pool's consumer
/// before its first worker starts.
async fn only_the_setup_user_sets_up(
    url: &str,
    users: &Users,
    admin: &async_nats::Client,
) -> anyhow::Result<()> {
    let all_tools = all_tools();
    let not_allowed = tokio::time::timeout(
        Duration::from_secs(60),
        run_setup(url, &users.orchestrator, &all_tools),
    )
    .await
    .map_err(|_| anyhow::anyhow!("setup as a user that may not waited instead of failing"))??;
    let said = String::from_utf8_lossy(&not_allowed.stderr);
    assert!(!not_allowed.status.success(), "{said}");
    assert!(said.contains("the NATS user may not"), "{said}");
    assert!(said.contains("Permissions Violation"), "{said}");
    assert!(
        !said.contains(&users.orchestrator.password),
        "the password reached the output"
    );
    let printed = set_up(url, &users.setup, &all_tools).await?;
    assert!(
        printed.contains("set up consumer tool_factual_qa"),
        "{printed}"
    );
    jetstream::new(admin.clone())
        .get_stream(names::CALL_STREAM)
        .await?
        .consumer_info("tool_factual_qa")
        .await?;
    Ok(())
}

/// A call of the other pool's tool in pool `general`'s queue (the
/// orchestrator is the only one left who may publish there): general's
/// worker drops it before it claims it, so Redis (where the claim would be
/// refused) is never asked, and it is terminated, never redelivered.
async fn a_misrouted_call_is_dropped_unclaimed(
    fleet: &Fleet,
    general: usize,
    orchestrator: &User,
    js: &jetstream::Context,
    job_id: &str,
) -> anyhow::Result<()> {
    let (orchestrator, _) = orchestrator.connect(&fleet.nats.url()).await?;
    let misrouted =
        toolfleet_tests::fleet::call(job_id, "c0misrouted", "factual_qa", r#"{"entity":"AMD"}"#);
    jetstream::new(orchestrator)
        .publish(
            names::call_subject("calculate"),
            serde_json::to_vec(&misrouted)?.into(),
        )
        .await?
        .await?;
    fleet
        .worker(general)
        .wait_for_log(
            "call for a tool this worker does not serve here dropped unanswered",
            Duration::from_secs(20),
        )
        .await?;
    wait_until("the misrouted call gone", Duration::from_secs(10), || {
        let js = js.clone();
        async move {
            let stream = js.get_stream(names::CALL_STREAM).await;
            stream.is_ok_and(|stream| stream.cached_info().state.messages == 0)
        }
    })
    .await?;
    assert_eq!(fleet.count_in_worker_logs("redis unavailable"), 0);
    Ok(())
}

/// Redis refused the fleet nothing (the ACL log is empty).
async fn redis_refused_nothing(
    admin: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<()> {
    let refusals: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query_async(admin).await?;
    assert!(
        refusals.is_empty(),
        "Redis refused the fleet {} times: {refusals:?}",
        refusals.len()
    );
    Ok(())
}

/// A pool on the bus: reading every call, pulling another pool's calls,
/// creating a consumer of its own to read them, reading another user's
/// inbox, publishing a call, writing another tool's registry key are all
/// refused; nothing lands in the registry, the pool may not even open it
/// (its stream's state would list every pool's keys), and a rollup on its
/// own key (which would erase every pool's announcements) is refused by the
/// registry's stream.
async fn a_pool_is_refused_on_the_bus(
    pool_user: &User,
    url: &str,
    js: &jetstream::Context,
) -> anyhow::Result<()> {
    let (pool, mut errors) = pool_user.connect(url).await?;
    let _every_call = pool.subscribe("toolfleet.call.>").await?;
    refused(&mut errors, "Subscription to \"toolfleet.call.>\"").await?;
    let _inbox = pool.subscribe("_INBOX.orchestrator.>").await?;
    refused(&mut errors, "Subscription to \"_INBOX.orchestrator.>\"").await?;
    publishes_are_refused(
        &pool,
        &mut errors,
        &[
            "$JS.API.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_factual_qa",
            "JS.toolfleet.API.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_factual_qa",
            "JS.toolfleet.API.STREAM.INFO.KV_toolfleet_registry",
            "$JS.API.CONSUMER.CREATE.TOOLFLEET_CALLS",
            "$JS.API.STREAM.MSG.GET.TOOLFLEET_CALLS",
            "toolfleet.call.calculate",
            "toolfleet.job.run",
            "$KV.toolfleet_registry.factual_qa.worker-x",
        ],
    )
    .await?;
    let mut pool_js = jetstream::new(pool.clone());
    pool_js.set_timeout(Duration::from_secs(2));
    assert!(
        pool_js.get_key_value("toolfleet_registry").await.is_err(),
        "a pool read the registry's stream"
    );
    let admin_registry = js.get_key_value("toolfleet_registry").await?;
    assert_eq!(admin_registry.get("factual_qa.worker-x").await?, None);
    let announced = |registry: async_nats::jetstream::kv::Store| async move {
        let keys: Vec<String> = registry.keys().await?.try_collect().await?;
        anyhow::Ok(keys)
    };
    let before = announced(admin_registry.clone()).await?;
    assert!(
        before.iter().any(|key| key.starts_with("factual_qa.")),
        "{before:?}"
    );
    let mut rollup = async_nats::HeaderMap::new();
    rollup.insert("Nats-Rollup", "all");
    let rolled = pool_js
        .publish_with_headers(
            "$KV.toolfleet_registry.calculate.worker-x",
            rollup,
            "{}".into(),
        )
        .await?
        .await;
    assert!(rolled.is_err(), "the registry took a rollup: {rolled:?}");
    assert_eq!(announced(admin_registry).await?, before);
    Ok(())
}

/// Publishes to each of `subjects` as `client`; the server refuses each.
async fn publishes_are_refused(
    client: &async_nats::Client,
    errors: &mut mpsc::UnboundedReceiver<String>,
    subjects: &[&'static str],
) -> anyhow::Result<()> {
    for subject in subjects {
        client.publish(*subject, "{}".into()).await?;
        client.flush().await?;
        refused(errors, &format!("Publish to \"{subject}\"")).await?;
    }
    Ok(())
}

/// A fleet of two pools on exactly the shipped NATS and Redis configuration
/// (TLS, accounts, ACL users), attacked with the credentials of pool
/// `general`, as someone who took over one of its workers would: every
/// probe of issue 32, and those of the issues before it. Each is refused by
/// the server itself, or its effect stays inside the pool's own part.
#[tokio::test]
async fn a_compromised_pool_on_the_shipped_configuration_reaches_nothing_of_another()
-> anyhow::Result<()> {
    let shipped = Shipped::new()?;
    let nats = shipped.start_nats().await?;
    let url = nats.url();
    the_bus_takes_only_tls_and_hashed_passwords(&nats, &shipped.ca).await?;
    let (admin, _) = shipped.nats.setup.connect(&url).await?;
    let mut fleet = shipped.start_fleet(nats, admin.clone()).await?;
    let general = shipped.start_general_before_setup(&mut fleet).await?;
    only_the_setup_user_sets_up(&url, &shipped.nats, &admin).await?;
    shipped.start_the_rest(&mut fleet, general).await?;

    let job = run_two_pool_job(&fleet).await?;
    assert!(
        job.output_text.starts_with("4 / ") && job.output_text.contains("LAUNCHED"),
        "{}",
        job.output_text
    );
    let js = jetstream::new(admin);
    let orchestrator = &shipped.nats.orchestrator;
    a_misrouted_call_is_dropped_unclaimed(&fleet, general, orchestrator, &js, &job.job_id).await?;
    // Redis refused the fleet nothing, that call's claim included.
    let mut admin_redis = fleet
        .redis
        .server()
        .client()
        .get_multiplexed_async_connection()
        .await?;
    redis_refused_nothing(&mut admin_redis).await?;

    a_pool_is_refused_on_the_bus(&shipped.nats.general, &url, &js).await?;
    reply_subjects_stay_in_the_pools_account(&js, &shipped.nats, &url).await?;
    // In Redis: another pool's result, the job, key names, FLUSHALL.
    let redis_url = fleet.redis.url();
    a_pool_is_refused_in_redis(
        &shipped.redis.general,
        &redis_url,
        &shipped.ca,
        &mut admin_redis,
        &job.job_id,
    )
    .await?;
    the_console_reaches_only_its_sessions(
        &shipped.redis.console,
        &redis_url,
        &shipped.ca,
        &job.job_id,
    )
    .await?;
    // And the other pool still serves: a job through both pools succeeds.
    run_two_pool_job(&fleet).await?;

    // The orchestrators may not take calls, nor create anything.
    let (orchestrator, mut errors) = shipped.nats.orchestrator.connect(&url).await?;
    publishes_are_refused(
        &orchestrator,
        &mut errors,
        &[
            "$JS.API.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_calculate",
            "$JS.API.STREAM.CREATE.TOOLFLEET_EVIL",
            "$KV.toolfleet_registry.calculate.worker-x",
        ],
    )
    .await
}

/// The last sequence `stream` ever stored: it grows with every message,
/// whoever consumes it afterwards.
async fn last_seq(js: &jetstream::Context, stream: &str) -> anyhow::Result<u64> {
    Ok(js
        .get_stream(stream)
        .await?
        .info()
        .await?
        .state
        .last_sequence)
}

/// nats-server checks a publisher's right to a message's subject, never to
/// its reply subject, and JetStream answers on the reply subject the
/// requester chose. A pool's own JetStream requests (a consumer's state, a
/// pull) with another pool's call subject, the job queue, a registry key or
/// another user's inbox as their reply subject must write nothing there:
/// the answers stay in the pool's own account. Each probe is made by a pool
/// first, then once by the orchestrator (in the streams' account), whose
/// answer does land: the control shows that the probe would have been seen.
async fn reply_subjects_stay_in_the_pools_account(
    js: &jetstream::Context,
    users: &Users,
    url: &str,
) -> anyhow::Result<()> {
    let (pool, _) = users.general.connect(url).await?;
    let (orchestrator, _) = users.orchestrator.connect(url).await?;
    let pull = r#"{"batch":1,"no_wait":true}"#;
    let pool_requests = [
        (
            format!(
                "{}.CONSUMER.INFO.TOOLFLEET_CALLS.tool_calculate",
                names::POOL_API_PREFIX
            ),
            "",
        ),
        (
            format!(
                "{}.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_calculate",
                names::POOL_API_PREFIX
            ),
            pull,
        ),
    ];
    // Which stream a leaked answer would land in, and the reply subject.
    let targets = [
        (names::CALL_STREAM, "toolfleet.call.factual_qa"),
        (names::CALL_STREAM, "toolfleet.call.nobody"),
        (names::JOB_STREAM, names::JOB_SUBJECT),
        (
            names::REGISTRY_STREAM,
            "$KV.toolfleet_registry.factual_qa.forged",
        ),
    ];
    for (stream, reply) in targets {
        let before = last_seq(js, stream).await?;
        for (subject, body) in &pool_requests {
            pool.publish_with_reply(subject.clone(), reply, (*body).into())
                .await?;
        }
        pool.flush().await?;
        // The pool's own answer, on its own inbox, after its probes: the
        // server has handled them.
        let answered = pool.request(pool_requests[0].0.clone(), "".into()).await?;
        assert!(
            String::from_utf8_lossy(&answered.payload).contains("tool_calculate"),
            "the pool's consumer state: {answered:?}"
        );
        orchestrator
            .publish_with_reply(
                "$JS.API.CONSUMER.INFO.TOOLFLEET_CALLS.tool_calculate",
                reply,
                "".into(),
            )
            .await?;
        orchestrator.flush().await?;
        wait_until(
            &format!("the control answer in {stream}"),
            Duration::from_secs(10),
            || async { last_seq(js, stream).await.is_ok_and(|seq| seq > before) },
        )
        .await?;
        assert_eq!(
            last_seq(js, stream).await?,
            before + 1,
            "a pool's answer on {reply} landed in {stream}"
        );
    }
    // Another user's inbox: the control's answer is the first to arrive.
    let mut inbox = orchestrator.subscribe("_INBOX.orchestrator.probe").await?;
    orchestrator.flush().await?;
    for (subject, body) in &pool_requests {
        pool.publish_with_reply(subject.clone(), "_INBOX.orchestrator.probe", (*body).into())
            .await?;
    }
    pool.flush().await?;
    pool.request(pool_requests[0].0.clone(), "".into()).await?;
    orchestrator
        .publish_with_reply(
            "$JS.API.STREAM.INFO.TOOLFLEET_JOBS",
            "_INBOX.orchestrator.probe",
            "".into(),
        )
        .await?;
    let first = tokio::time::timeout(Duration::from_secs(10), inbox.next())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the inbox closed"))?;
    let first = String::from_utf8_lossy(&first.payload);
    assert!(
        first.contains("stream_info_response"),
        "a pool's answer reached the orchestrator's inbox: {first}"
    );
    Ok(())
}

/// A user of the shipped Redis users, with a random password.
struct RedisUser {
    name: &'static str,
    placeholder: &'static str,
    password: String,
}

impl RedisUser {
    fn new(name: &'static str, placeholder: &'static str) -> Self {
        Self {
            name,
            placeholder,
            password: random_password(name),
        }
    }

    /// The hash the shipped file wants in place of its placeholder, as its
    /// comment says to make it (`printf %s "$PASSWORD" | sha256sum`).
    fn sha256(&self) -> String {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(self.password.as_bytes()))
    }

    /// A client as this user, over TLS trusting `ca`.
    fn client(&self, url: &str, ca: &str) -> anyhow::Result<redis::Client> {
        use redis::IntoConnectionInfo;
        let info = url.into_connection_info()?;
        let settings = info
            .redis_settings()
            .clone()
            .set_username(self.name)
            .set_password(&self.password);
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(ca)?),
        };
        Ok(redis::Client::build_with_tls(
            info.set_redis_settings(settings),
            certificates,
        )?)
    }
}

/// The users of the shipped Redis users file, with random passwords.
struct RedisUsers {
    orchestrator: RedisUser,
    general: RedisUser,
    knowledge: RedisUser,
    console: RedisUser,
}

impl RedisUsers {
    fn new() -> Self {
        Self {
            orchestrator: RedisUser::new("orchestrator", "@ORCHESTRATOR_PASSWORD_SHA256@"),
            general: RedisUser::new("pool-general", "@POOL_GENERAL_PASSWORD_SHA256@"),
            knowledge: RedisUser::new("pool-knowledge", "@POOL_KNOWLEDGE_PASSWORD_SHA256@"),
            console: RedisUser::new("console", "@CONSOLE_PASSWORD_SHA256@"),
        }
    }

    fn all(&self) -> [&RedisUser; 4] {
        [
            &self.orchestrator,
            &self.general,
            &self.knowledge,
            &self.console,
        ]
    }
}

/// The shipped redis.conf and users file (with `users`' hashes, and a
/// user `harness` for the harness itself) in `etc`, their paths under
/// /etc/redis/ moved there, and the test's certificates (made in
/// `certificates`) where the file expects them.
fn shipped_redis(
    etc: &Path,
    certificates: &Path,
    users: [&RedisUser; 4],
) -> anyhow::Result<RedisConfig> {
    let mut file = REDIS_USERS.to_owned();
    for user in users {
        file = file.replace(user.placeholder, &user.sha256());
    }
    anyhow::ensure!(!file.contains("#@"), "a password placeholder is left");
    // The harness's own user, to read what the fleet wrote.
    file.push_str("user harness on >harness-pw ~* &* +@all\n");
    install_certificates(etc, certificates)?;
    std::fs::write(etc.join("toolfleet-users.conf"), file)?;
    let config_file = etc.join("redis.conf");
    std::fs::write(
        &config_file,
        REDIS_CONF.replace("/etc/redis/", &format!("{}/", etc.display())),
    )?;
    Ok(RedisConfig {
        tls: Some(RedisTls {
            cert_file: etc.join("tls/tls.crt"),
            key_file: etc.join("tls/tls.key"),
            ca_file: etc.join("tls/ca.crt"),
        }),
        config_file: Some(config_file),
        admin: Some(("harness".into(), "harness-pw".into())),
        ..Default::default()
    })
}

/// The pool "general" (`pool_user`), with its own credentials, in the
/// shipped Redis at `url` after `job_id` ran: its own tools' ledger is
/// writable; another pool's result, a job's record and conversation, key
/// names, and every command outside reads, writes and scripts are refused.
/// `admin` reads what is there.
async fn a_pool_is_refused_in_redis(
    pool_user: &RedisUser,
    url: &str,
    ca: &str,
    admin: &mut redis::aio::MultiplexedConnection,
    job_id: &str,
) -> anyhow::Result<()> {
    // The pool "general", with its own credentials: its own tools' ledger
    // is writable; another pool's result, a job's record and conversation,
    // and every command outside reads, writes and scripts are refused.
    let keys = toolfleet_proto::names::RedisKeys::default();
    let job = toolfleet_proto::JobId::parse(job_id)
        .ok_or_else(|| anyhow::anyhow!("not a job id: {job_id}"))?;
    let mut pool = pool_user
        .client(url, ca)?
        .get_multiplexed_async_connection()
        .await?;
    let own: redis::RedisResult<()> = redis::cmd("SET")
        .arg(keys.call_result(job_id, "calculate", "probe", 9))
        .arg("{}")
        .query_async(&mut pool)
        .await;
    own?;
    // The factual_qa call's result, where another pool would forge it.
    let pattern = keys.call_result(job_id, "factual_qa", "*", 1);
    let found: Vec<String> = redis::cmd("KEYS").arg(&pattern).query_async(admin).await?;
    let [result_key] = found.as_slice() else {
        anyhow::bail!("one factual_qa result, not {found:?}");
    };
    let stored: Option<String> = redis::cmd("GET").arg(result_key).query_async(admin).await?;
    assert!(stored.is_some(), "no factual_qa result at {result_key}");
    let refusals: [(&str, redis::Cmd); 8] = [
        ("forging another pool's result", {
            let mut cmd = redis::cmd("SET");
            cmd.arg(result_key).arg("{}");
            cmd
        }),
        ("forging it in a script", {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg("return redis.call('SET', KEYS[1], 'x')")
                .arg(1)
                .arg(format!("{}:2", result_key.trim_end_matches(":1")));
            cmd
        }),
        ("reading the job's conversation", {
            let mut cmd = redis::cmd("LRANGE");
            cmd.arg(keys.job_items(&job)).arg(0).arg(-1);
            cmd
        }),
        ("rewriting the job record", {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(keys.job(&job)).arg("status").arg("succeeded");
            cmd
        }),
        ("listing every key", {
            let mut cmd = redis::cmd("KEYS");
            cmd.arg("*");
            cmd
        }),
        ("flushing everything", redis::cmd("FLUSHALL")),
        // Key patterns do not filter the names these return: they would
        // list other pools' call ids.
        ("scanning the key names", {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(0).arg("COUNT").arg(1000);
            cmd
        }),
        ("sampling a key name", redis::cmd("RANDOMKEY")),
    ];
    for (what, cmd) in refusals {
        let refused: redis::RedisResult<redis::Value> = cmd.query_async(&mut pool).await;
        let code = refused.as_ref().err().and_then(|e| e.code());
        assert_eq!(code, Some("NOPERM"), "{what} was not refused: {refused:?}");
    }
    let after: Option<String> = redis::cmd("GET").arg(result_key).query_async(admin).await?;
    assert_eq!(after, stored, "another pool's result changed");
    Ok(())
}

/// The console's user in the shipped Redis at `url` after `job_id` ran:
/// what its sessions and sign-ins take (console/src/session.rs, oidc.rs)
/// passes on its own keys; a job's keys, any other command and its own
/// commands on another key are refused.
async fn the_console_reaches_only_its_sessions(
    console: &RedisUser,
    url: &str,
    ca: &str,
    job_id: &str,
) -> anyhow::Result<()> {
    let keys = toolfleet_proto::names::RedisKeys::default();
    let job = toolfleet_proto::JobId::parse(job_id)
        .ok_or_else(|| anyhow::anyhow!("not a job id: {job_id}"))?;
    let mut redis = console
        .client(url, ca)?
        .get_multiplexed_async_connection()
        .await?;
    // A session: stored with its time to live in one transaction, read,
    // and ended; a sign-in's verifier, stored for a while and taken once.
    let session = "tf:console:session:probe";
    redis::pipe()
        .atomic()
        .hset_multiple(session, &[("token", "t"), ("tenant", "team")])
        .ignore()
        .expire(session, 60)
        .ignore()
        .query_async::<()>(&mut redis)
        .await?;
    let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(session)
        .query_async(&mut redis)
        .await?;
    assert_eq!(fields.get("tenant").map(String::as_str), Some("team"));
    redis::cmd("DEL")
        .arg(session)
        .query_async::<()>(&mut redis)
        .await?;
    let flow = "tf:console:sign-in:probe";
    redis::cmd("SETEX")
        .arg(flow)
        .arg(60)
        .arg("verifier")
        .query_async::<()>(&mut redis)
        .await?;
    let taken: Option<String> = redis::cmd("GETDEL")
        .arg(flow)
        .query_async(&mut redis)
        .await?;
    assert_eq!(taken.as_deref(), Some("verifier"));
    let (record, items) = (keys.job(&job), keys.job_items(&job));
    let refusals: [(&str, &[&str]); 9] = [
        ("reading a job record", &["HGETALL", &record]),
        ("deleting a job record", &["DEL", &record]),
        (
            "reading a job's conversation",
            &["LRANGE", &items, "0", "-1"],
        ),
        (
            "a session key outside its own",
            &["SETEX", "tf:consoles", "60", "x"],
        ),
        ("a command it never sends", &["SET", session, "x"]),
        ("a script", &["EVAL", "return 1", "0"]),
        ("listing every key", &["KEYS", "*"]),
        ("scanning the key names", &["SCAN", "0"]),
        ("flushing everything", &["FLUSHALL"]),
    ];
    for (what, args) in refusals {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        let refused: redis::RedisResult<redis::Value> = cmd.query_async(&mut redis).await;
        let code = refused.as_ref().err().and_then(|e| e.code());
        assert_eq!(code, Some("NOPERM"), "{what} was not refused: {refused:?}");
    }
    Ok(())
}

/// Pools `general` and `knowledge` as their Redis users, each reading its
/// password from a file in `dir`, trusting `ca`; returns once both are
/// ready.
async fn start_pools_with_password_files(
    fleet: &mut Fleet,
    dir: &Path,
    users: &RedisUsers,
    ca: &str,
) -> anyhow::Result<()> {
    for (user, tools) in [
        (&users.general, GENERAL_TOOLS),
        (&users.knowledge, KNOWLEDGE_TOOLS),
    ] {
        let password_file = dir.join(format!("{}.password", user.name));
        std::fs::write(&password_file, format!("{}\n", user.password))?;
        let password_file = password_file.to_string_lossy().into_owned();
        let env = [
            ("TOOLFLEET_REDIS__USER", user.name),
            ("TOOLFLEET_REDIS__PASSWORD_FILE", password_file.as_str()),
            ("TOOLFLEET_REDIS__TLS__CA_FILE", ca),
        ];
        start_ready_pool(fleet, tools, &env).await?;
    }
    Ok(())
}

/// A worker of a pool serving `tools` with `env`, once it is ready.
/// `calculate`'s results are cached (docs/protection.md), so that the
/// orchestrator's reads and writes of its tenant's result cache run too.
async fn start_ready_pool(
    fleet: &mut Fleet,
    tools: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<()> {
    let mut env = env.to_vec();
    env.push(("TOOLFLEET_RUNTIME__TOOL_CACHE_TTL__CALCULATE", "1m"));
    let index = fleet.start_pool_worker(tools, &env)?;
    fleet
        .worker(index)
        .wait_for_log("worker ready", Duration::from_secs(30))
        .await?;
    Ok(())
}

/// The orchestrator as its Redis user, its password from its environment,
/// also presenting a client certificate, which the server checks against
/// its CA.
async fn start_orchestrator_with_a_certificate(
    fleet: &mut Fleet,
    user: &RedisUser,
    certificates: &Certificates,
) -> anyhow::Result<()> {
    let ca = certificates.path("ca.pem");
    let (client_cert, client_key) = (
        certificates.path("client.pem"),
        certificates.path("client.key"),
    );
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_REDIS__USER", user.name),
            ("TOOLFLEET_REDIS__PASSWORD", user.password.as_str()),
            ("TOOLFLEET_REDIS__TLS__CA_FILE", ca.as_str()),
            ("TOOLFLEET_REDIS__TLS__CERT_FILE", client_cert.as_str()),
            ("TOOLFLEET_REDIS__TLS__KEY_FILE", client_key.as_str()),
        ])
        .await?;
    Ok(())
}

/// On a Redis Cluster each service's client first learns where the slots
/// are, with CLUSTER SLOTS (redis-rs): every service's user may ask (not
/// the console's: it speaks to one server, the chart's schema says so).
async fn every_user_may_ask_for_the_slots(
    admin: &mut redis::aio::MultiplexedConnection,
    users: &RedisUsers,
) -> anyhow::Result<()> {
    for user in [&users.orchestrator, &users.general, &users.knowledge] {
        let allowed: redis::RedisResult<String> = redis::cmd("ACL")
            .arg("DRYRUN")
            .arg(user.name)
            .arg("CLUSTER")
            .arg("SLOTS")
            .query_async(admin)
            .await;
        assert_eq!(allowed.ok().as_deref(), Some("OK"), "{}", user.name);
    }
    Ok(())
}

/// The tenants' period budgets (docs/protection.md, "Budgets"): every
/// command of their script is the orchestrator's right on their key
/// family, and no pool's.
async fn only_the_orchestrator_keeps_the_tenants_budgets(
    admin: &mut redis::aio::MultiplexedConnection,
    users: &RedisUsers,
) -> anyhow::Result<()> {
    let key = toolfleet_proto::names::RedisKeys::default().tenant_budget("default");
    let commands: [&[&str]; 5] = [
        &["HINCRBY", &key, "tool_calls:m:1", "1"],
        &["HMGET", &key, "tool_calls:m:1"],
        &["HKEYS", &key],
        &["HDEL", &key, "tool_calls:m:1"],
        &["PEXPIRE", &key, "1000"],
    ];
    for command in commands {
        for user in [&users.orchestrator, &users.general] {
            let answer: redis::RedisResult<String> = redis::cmd("ACL")
                .arg("DRYRUN")
                .arg(user.name)
                .arg(command)
                .query_async(admin)
                .await;
            let allowed = answer.as_deref() == Ok("OK");
            let expected = user.name == users.orchestrator.name;
            assert_eq!(allowed, expected, "{} {command:?}: {answer:?}", user.name);
        }
    }
    Ok(())
}

/// The median time of the same two-pool jobs on a fleet without ACLs or
/// TLS.
async fn median_without_acls() -> anyhow::Result<Duration> {
    let mut plain = Fleet::start(test_fleet(0)).await?;
    for tools in [GENERAL_TOOLS, KNOWLEDGE_TOOLS] {
        start_ready_pool(&mut plain, tools, &[]).await?;
    }
    plain.spawn_orchestrator(&[]).await?;
    plain.wait_for_tools(0, &all_tools(), 1).await?;
    Ok(time_two_pool_jobs(&plain).await?.1)
}

/// Nobody at `url` gets an answer without a user, nor without TLS.
async fn nobody_gets_in_without_a_user_or_tls(url: &str, ca: &str) -> anyhow::Result<()> {
    let anonymous = redis::Client::build_with_tls(
        url,
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(ca)?),
        },
    )?;
    let mut anonymous = anonymous.get_multiplexed_async_connection().await;
    if let Ok(connection) = anonymous.as_mut() {
        let ping: redis::RedisResult<String> = redis::cmd("PING").query_async(connection).await;
        assert!(ping.is_err(), "an anonymous client got an answer");
    }
    let plain = format!("redis://{}", url.trim_start_matches("rediss://"));
    let plain: redis::RedisResult<String> = async {
        let mut connection = redis::Client::open(plain.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        redis::cmd("PING").query_async(&mut connection).await
    }
    .await;
    assert!(plain.is_err(), "a plaintext client got an answer");
    Ok(())
}

/// No service logged any of `users`' passwords.
fn no_password_is_logged(fleet: &Fleet, users: &RedisUsers) {
    for log in fleet
        .workers()
        .iter()
        .chain(fleet.orchestrators())
        .map(|process| process.log_tail(100_000))
    {
        for user in users.all() {
            assert!(
                !log.contains(&user.password),
                "{}'s password was logged",
                user.name
            );
        }
    }
}

/// Two pools and an orchestrator on the shipped Redis users over TLS (the
/// plaintext port closed, the workers in without a certificate, the
/// orchestrator with one) run jobs, and Redis refused them nothing; every
/// user may ask for a cluster's slots; pool `general` is refused everything
/// outside its part; nobody gets in without a user or TLS; no password is
/// logged. Prints the jobs' median time against a fleet without ACLs.
#[tokio::test]
async fn the_shipped_redis_users_run_a_fleet_over_tls_and_no_pool_can_forge_another_pools_result()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let certificates = Certificates::generate(dir.path())?;
    let users = RedisUsers::new();
    let redis = shipped_redis(&dir.path().join("etc"), dir.path(), users.all())?;
    let mut fleet = Fleet::start(test_fleet(0).redis(redis)).await?;
    let url = fleet.redis.url();
    assert!(url.starts_with("rediss://"), "{url}");
    let ca = certificates.path("ca.pem");
    start_pools_with_password_files(&mut fleet, dir.path(), &users, &ca).await?;
    start_orchestrator_with_a_certificate(&mut fleet, &users.orchestrator, &certificates).await?;
    fleet.wait_for_tools(0, &all_tools(), 1).await?;
    let (job, with_acls) = time_two_pool_jobs(&fleet).await?;
    assert!(job.output_text.starts_with("4 / "), "{}", job.output_text);
    // The last job's `calculate` was answered from the result cache.
    let attempts: Vec<u32> = job
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            Some(v1::item::Kind::ToolResult(result)) => Some(result.attempts),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, [0, 1], "calculate from the cache, factual_qa run");

    // The plaintext port is closed, and the workers, which present no
    // certificate, got in (tls-auth-clients optional).
    let harness = fleet.redis.server().client();
    let mut admin = harness.get_multiplexed_async_connection().await?;
    let port: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query_async(&mut admin)
        .await?;
    assert_eq!(port, ["port", "0"], "the plaintext port is open");
    // Every command and script the fleet ran was within its users' rights:
    // a refusal that a retry hides (a commit refused, then the job resumed)
    // still leaves an entry in the ACL log.
    redis_refused_nothing(&mut admin).await?;
    every_user_may_ask_for_the_slots(&mut admin, &users).await?;
    only_the_orchestrator_keeps_the_tenants_budgets(&mut admin, &users).await?;
    // For the reader, not an assertion (timings belong in benchmarks).
    let without_acls = median_without_acls().await?;
    println!(
        "a two-pool job's median time: {with_acls:?} with the shipped ACLs over TLS, \
         {without_acls:?} without ({:.2}x)",
        with_acls.as_secs_f64() / without_acls.as_secs_f64().max(1e-9)
    );

    a_pool_is_refused_in_redis(&users.general, &url, &ca, &mut admin, &job.job_id).await?;
    nobody_gets_in_without_a_user_or_tls(&url, &ca).await?;
    no_password_is_logged(&fleet, &users);
    Ok(())
}
