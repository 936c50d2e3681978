//! The harness itself: servers come up on their own ports, keep their data across
//! restarts where they should, and failures say what went wrong.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use redis::AsyncCommands as _;
use toolfleet_tests::{
    ChildProcess, NatsServer, RedisConfig, RedisServer, ServerOptions, cargo_bin, wait_until,
};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn nats_jetstream_keeps_acked_messages_across_restart() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    assert_ne!(nats.port(), 4222, "must not be the machine's own server");
    assert_eq!(nats.url(), format!("nats://127.0.0.1:{}", nats.port()));

    let client = nats.client().await?;
    let js = jetstream::new(client.clone());
    js.create_stream(stream::Config {
        name: "HARNESS".into(),
        subjects: vec!["harness.>".into()],
        ..Default::default()
    })
    .await?;
    let ack = js.publish("harness.one", "first".into()).await?.await?;
    assert_eq!(ack.sequence, 1);
    assert!(
        nats.store_dir().join("jetstream").is_dir(),
        "store is in the scratch dir"
    );

    let port = nats.port();
    nats.restart().await?;
    assert_eq!(nats.port(), port);

    // The old client reconnects by itself, to the same port.
    wait_until("the first client to reconnect", WAIT, || async {
        client.connection_state() == async_nats::connection::State::Connected
    })
    .await?;
    let js = jetstream::new(nats.client().await?);
    let mut stream = js.get_stream("HARNESS").await?;
    assert_eq!(stream.info().await?.state.messages, 1);
    let message = stream.get_raw_message(1).await?;
    assert_eq!(message.payload, "first");

    // Killed and restarted twice over: still there, and still writable.
    nats.kill();
    assert!(!nats.process().is_running());
    nats.restart().await?;
    let ack = js.publish("harness.two", "second".into()).await?.await?;
    assert_eq!(ack.sequence, 2);

    nats.stop().await?;
    assert!(!nats.process().is_running());
    Ok(())
}

#[tokio::test]
async fn two_nats_servers_get_their_own_ports() -> anyhow::Result<()> {
    let (a, b) = tokio::try_join!(NatsServer::start(), NatsServer::start())?;
    assert_ne!(a.port(), b.port());
    assert_ne!(a.store_dir(), b.store_dir());

    // A message published on one server never reaches the other.
    let (client_a, client_b) = tokio::try_join!(a.client(), b.client())?;
    let mut on_b = client_b.subscribe("harness.ping").await?;
    client_b.flush().await?;
    client_a.publish("harness.ping", "a".into()).await?;
    client_b.publish("harness.ping", "b".into()).await?;
    let message = tokio::time::timeout(WAIT, futures::StreamExt::next(&mut on_b))
        .await?
        .expect("subscription open");
    assert_eq!(message.payload, "b");
    Ok(())
}

/// The threads of a nats-server's Go runtime are `GOMAXPROCS` when asked
/// for (the bench's `--threads`), Go's own choice otherwise, and a restart
/// keeps them.
#[tokio::test]
async fn nats_server_runs_on_the_threads_it_was_given() -> anyhow::Result<()> {
    let gomaxprocs = |pid: u32| -> anyhow::Result<Option<String>> {
        let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
        Ok(environ
            .split(|b| *b == 0)
            .filter_map(|entry| std::str::from_utf8(entry).ok())
            .find_map(|entry| entry.strip_prefix("GOMAXPROCS="))
            .map(str::to_owned))
    };
    let options = ServerOptions {
        nats_threads: Some(1),
        ..ServerOptions::default()
    };
    let (given, default) = tokio::try_join!(
        NatsServer::start_with_options(&options),
        NatsServer::start()
    )?;
    assert_eq!(gomaxprocs(given.process().pid())?.as_deref(), Some("1"));
    // Whatever this process has, the server inherits: none, usually.
    let inherited = std::env::var("GOMAXPROCS").ok();
    assert_eq!(gomaxprocs(default.process().pid())?, inherited);
    given.restart().await?;
    assert_eq!(gomaxprocs(given.process().pid())?.as_deref(), Some("1"));
    Ok(())
}

#[tokio::test]
async fn redis_keeps_keys_across_restart_only_with_aof() -> anyhow::Result<()> {
    let (durable, plain) = tokio::try_join!(
        RedisServer::start_with(RedisConfig {
            append_only: true,
            ..Default::default()
        }),
        RedisServer::start(),
    )?;
    assert_ne!(durable.port(), plain.port());
    assert!(
        ![durable.port(), plain.port()].contains(&6379),
        "must not be the machine's own"
    );
    assert_eq!(
        durable.url(),
        format!("redis://127.0.0.1:{}/", durable.port())
    );

    for redis in [&durable, &plain] {
        let mut con = redis.connection().await?;
        let () = con.set("harness:key", "value").await?;
        let value: String = con.get("harness:key").await?;
        assert_eq!(value, "value");
    }

    // SIGKILL, not a clean shutdown: the append-only file alone keeps the key.
    durable.kill();
    assert!(!durable.process().is_running());
    let port = durable.port();
    tokio::try_join!(durable.restart(), plain.restart())?;
    assert_eq!(durable.port(), port);
    let mut con = durable.connection().await?;
    let value: Option<String> = con.get("harness:key").await?;
    assert_eq!(value.as_deref(), Some("value"));
    let value: Option<String> = plain.connection().await?.get("harness:key").await?;
    assert_eq!(value, None);

    durable.flush_all().await?;
    let value: Option<String> = con.get("harness:key").await?;
    assert_eq!(value, None);

    durable.stop().await?;
    Ok(())
}

#[tokio::test]
async fn child_process_logs_can_be_waited_on() -> anyhow::Result<()> {
    let script = r#"echo "started $GREETING"; echo "oops" >&2; exec sleep 60"#;
    let child = ChildProcess::spawn("sleeper", "sh", ["-c", script], [("GREETING", "hi")])?;
    let line = child.wait_for_log("started", WAIT).await?;
    assert_eq!(line, "started hi");
    child.wait_for_log("oops", WAIT).await?;
    assert!(child.dir().is_dir());
    assert!(child.log_tail(1).contains("oops"));

    // A line that never comes: the error names it and shows the log.
    let err = child
        .wait_for_log("never", Duration::from_millis(200))
        .await
        .unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("timed out") && err.contains("\"never\""),
        "{err}"
    );
    assert!(
        err.contains("started hi"),
        "the log tail is in the error: {err}"
    );

    // After a respawn only the new run's lines count.
    let first_pid = child.pid();
    let mark = child.log_mark();
    child.respawn()?;
    assert_ne!(child.pid(), first_pid);
    child.wait_for_log_after(mark, "started hi", WAIT).await?;

    child.terminate()?;
    let status = child.wait_exit(WAIT).await?;
    assert!(!status.success());
    assert!(!child.is_running());

    // A process that exits fails the wait at once, not at the deadline.
    let quitter = ChildProcess::spawn("quitter", "sh", ["-c", "echo bye; exit 3"], [("", ""); 0])?;
    let started = std::time::Instant::now();
    let err = quitter
        .wait_for_log("never", Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("exited"), "{err:#}");
    assert!(started.elapsed() < Duration::from_secs(10));
    Ok(())
}

#[tokio::test]
async fn missing_binaries_and_timeouts_say_what_they_were_about() {
    let err = cargo_bin("no-such-binary").unwrap_err().to_string();
    assert!(err.contains("build it first"), "{err}");

    let err = wait_until("the impossible", Duration::from_millis(50), || async {
        Err::<(), _>("still impossible")
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("waiting for the impossible"), "{err}");
    assert!(err.contains("still impossible"), "{err}");

    let found = wait_until("a value", WAIT, || async { Some(7) })
        .await
        .unwrap();
    assert_eq!(found, 7);
}
