//! The job store's fencing against a real Redis: a runner whose lease was
//! taken over cannot write any more.

use std::time::Duration;

use toolfleet_orchestrator::model::Item;
use toolfleet_orchestrator::store::{
    Acquired, Commit, Error, JobSpec, JobStore, NewEvent, ProviderKind,
};
use toolfleet_proto::names::RedisKeys;
use toolfleet_tests::{NatsServer, RedisServer};

fn spec() -> JobSpec {
    JobSpec {
        input: "hello".into(),
        instructions: String::new(),
        provider: ProviderKind::Scripted,
        model: String::new(),
        script: Some(r#"[{"message":"hi"}]"#.into()),
        tools: Vec::new(),
        max_tool_rounds: 8,
        parallel_tool_calls: true,
        deadline_ms: u64::MAX / 2,
        metadata: Default::default(),
        tenant: "default".into(),
    }
}

#[tokio::test]
async fn a_zombie_runner_cannot_write_after_a_takeover() -> anyhow::Result<()> {
    let redis = RedisServer::start().await?;
    let nats = NatsServer::start().await?;
    let store = JobStore::new(
        redis.connection().await?,
        nats.client().await?,
        RedisKeys::default(),
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    let (job_id, duplicate) = store.submit(&spec(), Some("key-1")).await?;
    assert!(!duplicate);
    assert_eq!(
        store.submit(&spec(), Some("key-1")).await?,
        (job_id.clone(), true)
    );

    let Acquired::Lease(zombie) = store
        .acquire(&job_id, "replica-a", Duration::from_millis(200))
        .await?
    else {
        panic!("the first runner gets the lease");
    };
    assert_eq!(
        store
            .acquire(&job_id, "replica-b", Duration::from_secs(5))
            .await?,
        Acquired::Held
    );
    // replica-a stalls past its lease; replica-b takes over with a higher epoch.
    let taker =
        toolfleet_tests::wait_until("the lease to expire", Duration::from_secs(5), || async {
            match store
                .acquire(&job_id, "replica-b", Duration::from_secs(5))
                .await
            {
                Ok(Acquired::Lease(lease)) => Some(lease),
                _ => None,
            }
        })
        .await?;
    assert!(taker.epoch > zombie.epoch);

    let late = [Item::Assistant {
        text: "from the zombie".into(),
        raw: None,
    }];
    let write = store
        .commit(
            &zombie,
            Commit {
                items: &late,
                events: vec![NewEvent::new("model_turn", serde_json::json!({}))],
                ..Commit::default()
            },
        )
        .await;
    assert!(matches!(write, Err(Error::LeaseLost(_))), "{write:?}");
    assert!(matches!(
        store.renew(&zombie, Duration::from_secs(1)).await,
        Err(Error::LeaseLost(_))
    ));

    let ok = [Item::Assistant {
        text: "from the owner".into(),
        raw: None,
    }];
    store
        .commit(
            &taker,
            Commit {
                items: &ok,
                ..Commit::default()
            },
        )
        .await?;
    let items = store.items(&job_id, 0).await?;
    assert_eq!(
        items.len(),
        2,
        "the user message and the owner's item only: {items:?}"
    );
    assert_eq!(items[1], ok[0]);
    Ok(())
}
