//! A tenant's period budgets (decision 0055) against a real Redis, on a
//! clock the test moves: what is taken fits the window's limit, the window
//! moves a minute at a time, a refusal says when there is room again, and
//! the sums kept beside the counters move with it, and a replica of the
//! release before (which adds to the counters only, not to the sums) is
//! taken in within an hour.

use redis::AsyncCommands as _;
use toolfleet_orchestrator::budget::tenant::{Entry, Kind, TenantExceeded, Window};
use toolfleet_orchestrator::store::JobStore;
use toolfleet_proto::names::RedisKeys;
use toolfleet_tests::{NatsServer, RedisServer};

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;

/// A moment well inside a minute and an hour, so that the test's steps
/// land where it says.
const START: u64 = 29_000_000 * MINUTE + 10_000;

/// A request that takes `calls` tool calls within `per_hour` and
/// `per_day`, and checks nothing else.
fn take_calls(calls: u64, per_hour: Option<u64>, per_day: Option<u64>) -> [Entry; 4] {
    Kind::ALL.map(|kind| match kind {
        Kind::ToolCalls => Entry {
            add: 0,
            take: calls,
            hour: per_hour,
            day: per_day,
            check: true,
        },
        _ => Entry::default(),
    })
}

async fn spend(
    store: &JobStore,
    entries: &[Entry; 4],
    at: u64,
) -> anyhow::Result<Option<TenantExceeded>> {
    Ok(store.spend_tenant_at("acme", entries, at).await?)
}

#[tokio::test]
async fn a_tenants_hour_fills_moves_by_the_minute_and_says_when_it_has_room() -> anyhow::Result<()>
{
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = super::store(&redis, &nats).await?;
    let ten_an_hour = |calls| take_calls(calls, Some(10), None);
    assert!(spend(&store, &ten_an_hour(6), START).await?.is_none());
    assert!(
        spend(&store, &ten_an_hour(4), START + 30 * MINUTE)
            .await?
            .is_none()
    );
    // Full: the next call is refused, and told to come back when the first
    // minute's 6 leave the hour.
    let refused = spend(&store, &ten_an_hour(1), START + 30 * MINUTE + 5_000)
        .await?
        .expect("the hour is full");
    assert_eq!(
        (refused.kind, refused.window),
        (Kind::ToolCalls, Window::Hour)
    );
    assert_eq!((refused.spent, refused.limit), (10, 10));
    let first_minute = START / MINUTE;
    let room_at = (first_minute + 60) * MINUTE;
    assert_eq!(
        u64::try_from(refused.retry_after.as_millis())?,
        room_at - (START + 30 * MINUTE + 5_000)
    );
    // A millisecond before, still full; then room for exactly 6.
    assert!(spend(&store, &ten_an_hour(1), room_at - 1).await?.is_some());
    assert!(spend(&store, &ten_an_hour(7), room_at).await?.is_some());
    assert!(spend(&store, &ten_an_hour(6), room_at).await?.is_none());
    assert!(spend(&store, &ten_an_hour(1), room_at + 1).await?.is_some());
    Ok(())
}

#[tokio::test]
async fn a_tenants_day_counts_its_hours_and_the_release_before_within_an_hour() -> anyhow::Result<()>
{
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = super::store(&redis, &nats).await?;
    let five_a_day = |calls| take_calls(calls, None, Some(5));
    assert!(spend(&store, &five_a_day(3), START).await?.is_none());
    assert!(
        spend(&store, &five_a_day(2), START + 5 * HOUR)
            .await?
            .is_none()
    );
    let refused = spend(&store, &five_a_day(1), START + 6 * HOUR)
        .await?
        .expect("the day is full");
    assert_eq!((refused.window, refused.spent), (Window::Day, 5));
    // The first hour's 3 leave the day: room for 3, of which 2 are taken.
    let room_at = (START / HOUR + 24) * HOUR;
    assert!(spend(&store, &five_a_day(4), room_at).await?.is_some());
    assert!(spend(&store, &five_a_day(2), room_at).await?.is_none());

    // A replica of the release before adds to the counters alone. Within
    // the hour the sums do not know of it; from the next they do.
    let now = room_at + MINUTE + 1_000;
    assert!(spend(&store, &five_a_day(0), now).await?.is_none());
    let mut redis = redis.connection().await?;
    let budget = RedisKeys::default().tenant_budget("acme");
    let () = redis
        .hincr(&budget, format!("tool_calls:m:{}", now / MINUTE), 2)
        .await?;
    let () = redis
        .hincr(&budget, format!("tool_calls:h:{}", now / HOUR), 2)
        .await?;
    assert!(spend(&store, &five_a_day(1), now + 1_000).await?.is_none());
    assert!(
        spend(&store, &five_a_day(1), now + 30 * MINUTE)
            .await?
            .is_some()
    );
    let refused = spend(&store, &five_a_day(1), now + HOUR)
        .await?
        .expect("the day holds what the release before spent");
    assert_eq!(
        refused.spent, 7,
        "2 + 2 + 1 of this release, 2 of the one before"
    );
    Ok(())
}

#[tokio::test]
async fn a_tenants_hour_sum_moves_exactly_minute_by_minute_across_hours() -> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = super::store(&redis, &nats).await?;
    let sixty_an_hour = |calls| take_calls(calls, Some(60), None);
    // One call a minute for 150 minutes, through two changes of the hour
    // and minutes skipped: the hour always holds exactly its last minutes'
    // calls, so each minute's call fits and a second one does not.
    let mut taken_at = Vec::new();
    for step in 0..150_u64 {
        let at = START + step * MINUTE;
        if step % 7 == 3 {
            continue; // a minute without a check: its move waits for the next
        }
        let full = taken_at.iter().filter(|t| at - **t < HOUR).count();
        assert!(
            spend(&store, &sixty_an_hour(1), at).await?.is_none(),
            "step {step}: the hour holds {full} calls"
        );
        taken_at.push(at);
        if full + 1 == 60 {
            assert!(spend(&store, &sixty_an_hour(1), at + 1).await?.is_some());
        } else {
            let room = u64::try_from(59 - full)?;
            assert!(
                spend(&store, &sixty_an_hour(room + 1), at + 1)
                    .await?
                    .is_some(),
                "step {step}: {room} left, not {}",
                room + 1
            );
        }
    }
    Ok(())
}
