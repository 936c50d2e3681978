//! The job store against a real Redis: every verb of a job's life writes
//! what it says (status, counters, items, events in the wire format), a
//! runner whose lease was taken over cannot write any more, and nothing is
//! written after a job's end.

use std::time::Duration;

use toolfleet_orchestrator::approval::Rule;
use toolfleet_orchestrator::budget::Limit;
use toolfleet_orchestrator::hold::{ApprovalChoice, Choice, Decision, HeldFor, Hold};
use toolfleet_orchestrator::job::{
    Ending, FullResult, Item, JobErrorCode, JobEvent, JobSpec, JobStatus, JobTrace, Lease,
    ProviderKind, Spend, TurnCheckpoint,
};
use toolfleet_orchestrator::live::Live;
use toolfleet_orchestrator::store::{
    Acquired, DispatchedCall, Error, HeldCall, Idempotency, JobStore, Seen, SettledCall, Unstored,
};
use toolfleet_proto::names::RedisKeys;
use toolfleet_proto::{Envelope, ErrorCode, EventId, JobId, ToolManifest, WireId};
use toolfleet_tests::{NatsServer, RedisServer};

#[path = "store/budgets.rs"]
mod budgets;
#[path = "store/counts.rs"]
mod counts;
#[path = "store/held_calls.rs"]
mod held_calls;

/// The wire id `id`, for as long as the test runs (leaked: a test names a
/// few calls, and their records borrow the ids).
fn wire(id: &str) -> &'static WireId {
    Box::leak(Box::new(WireId::parse(id).expect("a wire id")))
}

/// The event id `id`, as [`wire`].
fn event(id: &str) -> &'static EventId {
    Box::leak(Box::new(EventId::parse(id).expect("an event id")))
}

fn spec() -> JobSpec {
    JobSpec {
        input: "hello".into(),
        instructions: String::new(),
        provider: ProviderKind::Scripted,
        model: String::new(),
        script: Some(r#"[{"message":"hi"}]"#.into()),
        max_tokens: None,
        stream: false,
        no_result_cache: false,
        call: None,
        tools: Vec::new(),
        max_tool_rounds: 8,
        parallel_tool_calls: true,
        deadline_ms: u64::MAX / 2,
        metadata: Default::default(),
        tenant: "default".into(),
        submitter: None,
        approval: Default::default(),
        limits: Default::default(),
        budget: Default::default(),
    }
}

async fn store(redis: &RedisServer, nats: &NatsServer) -> anyhow::Result<JobStore> {
    Ok(replica(redis, nats).await?.0)
}

/// What one orchestrator replica has: a store on `redis`, and what its
/// watchers hear through `nats`.
async fn replica(redis: &RedisServer, nats: &NatsServer) -> anyhow::Result<(JobStore, Live)> {
    let live = Live::new(nats.client().await?);
    let store = JobStore::new(
        redis.connection().await?.into(),
        live.clone(),
        RedisKeys::default(),
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    Ok((store, live))
}

/// A store on `redis`, one server or a cluster.
async fn store_on(
    redis: &toolfleet_tests::fleet::Redis,
    nats: &NatsServer,
) -> anyhow::Result<JobStore> {
    Ok(JobStore::new(
        redis.connection().await?,
        Live::new(nats.client().await?),
        RedisKeys::default(),
        Duration::from_secs(60),
        Duration::from_secs(60),
    ))
}

/// The lease of the queued job `job_id`, taken by `owner` for `ttl`.
async fn lease(
    store: &JobStore,
    job_id: &JobId,
    owner: &str,
    ttl: Duration,
) -> anyhow::Result<Lease> {
    match store.acquire_and_load(job_id, owner, ttl).await?.0 {
        Acquired::Lease(lease) => Ok(lease),
        other => anyhow::bail!("the lease of a queued job is free, but it was {other:?}"),
    }
}

/// The job's events, decoded: every stored event must be a known kind.
async fn events(store: &JobStore, job_id: &JobId) -> anyhow::Result<Vec<JobEvent>> {
    let stored = store.events(job_id, 0, 100).await?;
    for (offset, event) in stored.iter().enumerate() {
        assert_eq!(event.offset, offset as u64);
        assert_eq!(
            event.is_final,
            offset + 1 == stored.len() && JobEvent::decode(&event.kind, &event.data)?.is_final()
        );
    }
    stored
        .iter()
        .map(|e| Ok(JobEvent::decode(&e.kind, &e.data)?))
        .collect()
}

/// Empties Redis's script cache, as a restart does; returns a connection of
/// the test's own.
async fn forget_scripts(redis: &RedisServer) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let mut raw = redis::Client::open(redis.url())?
        .get_multiplexed_async_connection()
        .await?;
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await?;
    Ok(raw)
}

/// The call `c1` of tool `echo`, dispatched.
fn dispatched_c1() -> DispatchedCall<'static> {
    DispatchedCall {
        event_id: event("c1"),
        wire_id: wire("c1"),
        name: "echo",
        cost: 1,
        version: None,
    }
}

/// Submits a job in a client's trace, which its record keeps, and takes
/// its lease, which starts the run.
async fn start_a_traced_job(store: &JobStore) -> anyhow::Result<(JobId, Lease)> {
    let trace = JobTrace::from_fields(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "vendor=value",
    );
    let (job_id, _) = store.submit(&spec(), None, trace.as_ref()).await?;
    assert_eq!(store.get(&job_id).await?.unwrap().trace, trace);
    let lease = lease(store, &job_id, "replica-a", Duration::from_secs(5)).await?;
    assert!(!lease.resumed);
    assert_eq!(
        store.get(&job_id).await?.unwrap().status,
        JobStatus::Running
    );
    Ok((job_id, lease))
}

/// Records a turn of text and the call `c1`, offered `echo`: the commit
/// keeps what was offered and records the call's first attempt. Returns
/// the turn's items.
async fn record_a_turn_of_one_call(
    store: &JobStore,
    lease: &Lease,
    job_id: &JobId,
) -> anyhow::Result<Vec<Item>> {
    let turn = [
        Item::Assistant {
            text: "checking".into(),
            raw: None,
        },
        Item::ToolCall {
            call_id: "c1".into(),
            name: "echo".into(),
            arguments: "{}".into(),
            raw: None,
        },
    ];
    let echo = ToolManifest::new("echo", "Echoes.", serde_json::json!({"type": "object"}));
    // The turn's commit also records the first attempt of its call.
    store
        .record_turn(
            lease,
            TurnCheckpoint {
                results: &[],
                full: &[],
                items: &turn,
                turns: 1,
                rounds: 1,
                offered: std::slice::from_ref(&echo),
                usage: None,
                tokens: 120,
            },
            &[dispatched_c1()],
        )
        .await?;
    let start = store.load_run(job_id).await?.expect("the job");
    assert_eq!(start.offered, [echo]);
    // The job's spend: the turn's tokens, one call at its cost.
    let spent = (start.record.spent.tokens, start.record.spent.cost_units);
    assert_eq!((spent, start.record.spent.tool_calls), ((120, 1), 1));
    assert_eq!(store.attempts(job_id).await?.last(wire("c1")), Some(1));
    Ok(turn.to_vec())
}

/// `c1` (an error after one attempt, timed) and `w0` (ok after two) settle
/// together: one commit records both, in order. Returns `c1`'s result.
async fn settle_two_calls_in_one_commit(
    store: &JobStore,
    lease: &Lease,
    job_id: &JobId,
) -> anyhow::Result<Item> {
    let envelope = Envelope::terminal(ErrorCode::UNKNOWN_TOOL, "no");
    assert!(!store.attempts(job_id).await?.settled(wire("c1")));
    let settled = SettledCall {
        call_id: event("c1"),
        wire_id: wire("c1"),
        name: "echo",
        attempts: 1,
        round_trip: Some(Duration::from_micros(1500)),
        worked: Some(Duration::from_micros(400)),
        ran_on: None,
        envelope: &envelope,
        source: None,
        unchecked: None,
        budget_exceeded: Some(Limit::CostUnits),
    };
    // Calls that settle together are recorded in one commit, in order.
    let ok = Envelope::Ok(serde_json::json!("fine"));
    let other = SettledCall {
        call_id: event("c0"),
        wire_id: wire("w0"),
        name: "echo",
        attempts: 2,
        round_trip: None,
        worked: None,
        ran_on: None,
        envelope: &ok,
        source: None,
        unchecked: None,
        budget_exceeded: None,
    };
    store.record_call_results(lease, &[settled, other]).await?;
    // A call refused for a budget is stored with its budget: the job gets
    // no more turns, whoever runs it next.
    let record = store.get(job_id).await?.expect("the job");
    assert_eq!(record.budget_exceeded, Some(Limit::CostUnits));
    let attempts = store.attempts(job_id).await?;
    assert!(attempts.settled(wire("c1")) && attempts.settled(wire("w0")));
    Ok(Item::ToolResult {
        call_id: "c1".into(),
        name: "echo".into(),
        output: envelope.to_json(),
        attempts: 1,
    })
}

/// Ends the job on too many rounds: the round's results are stored with
/// the run's next commit, here the end, with the turn that ended the job
/// after them; the record counts the turns and rounds and keeps the error.
async fn end_on_too_many_rounds(
    store: &JobStore,
    lease: &Lease,
    job_id: &JobId,
    turn: &[Item],
    result: Item,
) -> anyhow::Result<()> {
    let over = [Item::ToolCall {
        call_id: "c2".into(),
        name: "echo".into(),
        arguments: "{}".into(),
        raw: None,
    }];
    let last_turn = TurnCheckpoint {
        results: std::slice::from_ref(&result),
        full: &[],
        items: &over,
        turns: 2,
        rounds: 2,
        offered: &[],
        usage: None,
        tokens: 0,
    };
    store
        .finish(
            lease,
            &Ending::failed(JobErrorCode::MaxToolRoundsExceeded, "too many"),
            Unstored::Turn(last_turn),
            None,
        )
        .await?;
    assert_eq!(
        store.items(job_id, 1).await?,
        [turn, &[result], &over[..]].concat()
    );
    let record = store.get(job_id).await?.unwrap();
    assert_eq!((record.turns, record.rounds), (2, 2));
    assert_eq!(record.status, JobStatus::Failed);
    let error = record.error.expect("a failed job has an error");
    assert_eq!(
        (error.code, error.message.as_str()),
        (JobErrorCode::MaxToolRoundsExceeded, "too many")
    );
    assert!(record.finished_at_ms >= record.created_at_ms);
    Ok(())
}

/// The job's events: each verb's, in order, in the wire format.
async fn the_events_say_each_verb(store: &JobStore, job_id: &JobId) -> anyhow::Result<()> {
    let kinds: Vec<&str> = events(store, job_id)
        .await?
        .iter()
        .map(JobEvent::kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "job_queued",
            "job_started",
            "model_turn",
            "tool_call_dispatched",
            "tool_call_dispatched",
            "tool_call_result",
            "tool_call_result",
            "model_turn",
            "job_failed"
        ]
    );
    let stored = store.events(job_id, 2, 1).await?;
    assert_eq!(
        stored[0].data,
        r#"{"round":1,"text":"checking","tool_calls":[{"call_id":"c1","name":"echo"}],"turn":0}"#
    );
    let stored = store.events(job_id, 4, 1).await?;
    assert_eq!(
        stored[0].data,
        r#"{"attempt":2,"call_id":"c1","name":"echo"}"#
    );
    let stored = store.events(job_id, 5, 1).await?;
    assert_eq!(
        stored[0].data,
        r#"{"attempts":1,"call_id":"c1","code":"UNKNOWN_TOOL","name":"echo","ok":false,"round_trip_us":1500,"worked_us":400}"#
    );
    let stored = store.events(job_id, 6, 1).await?;
    assert_eq!(
        stored[0].data,
        r#"{"attempts":2,"call_id":"c0","code":null,"name":"echo","ok":true,"round_trip_us":null}"#
    );
    Ok(())
}

/// A job's life through every verb (submit in a trace, lease, a turn with
/// its call's attempt, a retry, two results in one commit, the end with
/// the last turn) writes what each says, its events in the wire format,
/// and nothing is written after the end, even with the lease that ended it.
#[tokio::test]
async fn every_verb_writes_what_it_says_and_nothing_follows_the_end() -> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = store(&redis, &nats).await?;
    let (job_id, lease) = start_a_traced_job(&store).await?;
    let turn = record_a_turn_of_one_call(&store, &lease, &job_id).await?;
    // A retry records its attempt on its own.
    store.record_dispatch(&lease, &[dispatched_c1()], 2).await?;
    assert_eq!(store.attempts(&job_id).await?.last(wire("c1")), Some(2));
    let result = settle_two_calls_in_one_commit(&store, &lease, &job_id).await?;
    end_on_too_many_rounds(&store, &lease, &job_id, &turn, result).await?;

    // Nothing is written after the end, even with the lease that ended it.
    assert!(matches!(
        store.record_dispatch(&lease, &[dispatched_c1()], 3).await,
        Err(Error::LeaseLost(_))
    ));
    assert!(matches!(
        store
            .finish(&lease, &Ending::Cancelled, Unstored::Nothing, None)
            .await,
        Err(Error::LeaseLost(_))
    ));
    the_events_say_each_verb(&store, &job_id).await
}

#[tokio::test]
async fn a_commit_longer_than_one_command_takes_is_stored_whole_and_in_order() -> anyhow::Result<()>
{
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = store(&redis, &nats).await?;
    let (job_id, _) = store.submit(&spec(), None, None).await?;
    let lease = lease(&store, &job_id, "r", Duration::from_secs(5)).await?;
    // The commit script writes its lists in chunks (512 values per
    // command): 1,300 items, 700 attempts (1,400 values) and 701 events
    // take several each.
    let results: Vec<Item> = (0..1300)
        .map(|n| Item::ToolResult {
            call_id: format!("r{n}"),
            name: "echo".into(),
            output: Envelope::Ok(serde_json::json!(n)).to_json(),
            attempts: 1,
        })
        .collect();
    let ids: Vec<(EventId, WireId)> = (0..700)
        .map(|n| format!("w{n}"))
        .map(|id| (EventId::parse(&id).unwrap(), WireId::parse(&id).unwrap()))
        .collect();
    let dispatched: Vec<DispatchedCall<'_>> = ids
        .iter()
        .map(|(event_id, wire_id)| DispatchedCall {
            event_id,
            wire_id,
            name: "echo",
            cost: 1,
            version: None,
        })
        .collect();
    let turn = [Item::Assistant {
        text: "many".into(),
        raw: None,
    }];
    let checkpoint = TurnCheckpoint {
        results: &results,
        full: &[],
        items: &turn,
        turns: 1,
        rounds: 1,
        offered: &[],
        usage: None,
        tokens: 0,
    };
    store.record_turn(&lease, checkpoint, &dispatched).await?;
    // The user message, then the results in order, then the turn.
    let items = store.items(&job_id, 1).await?;
    assert_eq!(items, [&results[..], &turn[..]].concat());
    let attempts = store.attempts(&job_id).await?;
    assert_eq!(attempts.dispatched_calls(), 700);
    assert!(ids.iter().all(|(_, id)| attempts.last(id) == Some(1)));
    // job_queued, job_started, model_turn, then a dispatch per call,
    // numbered on.
    let stored = store.events(&job_id, 0, 1000).await?;
    assert_eq!(stored.len(), 703);
    for (offset, event) in stored.iter().enumerate() {
        assert_eq!(event.offset, offset as u64);
    }
    assert!(
        stored[702].data.contains(r#""call_id":"w699""#),
        "{:?}",
        stored[702]
    );
    // The next commit numbers its events after them.
    store
        .finish(&lease, &Ending::Cancelled, Unstored::Nothing, None)
        .await?;
    let last = store.last_event(&job_id).await?.expect("the final event");
    assert_eq!((last.offset, last.is_final), (703, true));
    Ok(())
}

#[tokio::test]
async fn a_submission_after_redis_lost_its_scripts_is_whole_and_indexed() -> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = store(&redis, &nats).await?;
    store.submit(&spec(), None, None).await?;
    // As after a restart: the script cache is empty, and a submission
    // without an idempotency key creates and indexes its job in one
    // pipeline, which must load the script and run again.
    let mut raw = forget_scripts(&redis).await?;
    let (job_id, duplicate) = store.submit(&spec(), None, None).await?;
    assert!(!duplicate);
    let record = store.get(&job_id).await?.expect("the job was created");
    assert_eq!(record.status, JobStatus::Queued);
    assert_eq!(
        events(&store, &job_id).await?.len(),
        1,
        "one job_queued event"
    );
    let unfinished = store.unfinished_before(u64::MAX, 10).await?;
    assert!(unfinished.contains(&job_id), "{unfinished:?}");
    let listed: Vec<String> = redis::cmd("ZRANGE")
        .arg(RedisKeys::default().tenant_jobs(&spec().tenant))
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await?;
    assert!(listed.contains(&job_id.to_string()), "{listed:?}");
    Ok(())
}

#[tokio::test]
async fn taking_a_lease_reads_the_run_s_start_only_for_its_holder() -> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = store(&redis, &nats).await?;
    let (job_id, _) = store.submit(&spec(), None, None).await?;
    // Also after Redis lost its scripts: the pipeline loads it and runs again.
    forget_scripts(&redis).await?;
    let ttl = Duration::from_secs(5);
    let (taken, start) = store.acquire_and_load(&job_id, "a", ttl).await?;
    let Acquired::Lease(lease) = taken else {
        panic!("the lease is free: {taken:?}");
    };
    assert_eq!((lease.epoch, lease.resumed), (1, false));
    let start = start.expect("the holder reads where the run starts");
    // Taking the lease started the run, and the holder reads it so.
    assert_eq!(start.record.status, JobStatus::Running);
    assert_eq!(
        start.items,
        [Item::User {
            text: "hello".into()
        }]
    );
    assert!(start.offered.is_empty());
    // Another runner gets neither the lease nor the job's state.
    let other = r#"replica "b""#;
    let (held, start) = store.acquire_and_load(&job_id, other, ttl).await?;
    assert!(
        matches!(held, Acquired::Held) && start.is_none(),
        "{held:?}"
    );
    // Once the lease is free, it resumes the run (any replica id goes into
    // the event's data as JSON).
    store.release(&lease).await?;
    let (taken, _) = store.acquire_and_load(&job_id, other, ttl).await?;
    let Acquired::Lease(lease) = taken else {
        panic!("the lease was released: {taken:?}");
    };
    assert_eq!((lease.epoch, lease.resumed), (2, true));
    assert_eq!(
        events(&store, &job_id).await?[1..],
        [
            JobEvent::JobStarted {
                epoch: 1,
                owner: "a".into()
            },
            JobEvent::JobResumed {
                epoch: 2,
                owner: other.into()
            }
        ]
    );
    store
        .finish(&lease, &Ending::Cancelled, Unstored::Nothing, None)
        .await?;
    let (finished, start) = store.acquire_and_load(&job_id, other, ttl).await?;
    assert!(matches!(finished, Acquired::Finished) && start.is_none());
    let (missing, start) = store
        .acquire_and_load(&JobId::new("acme", 0, 0), "b", ttl)
        .await?;
    assert!(matches!(missing, Acquired::Missing) && start.is_none());
    Ok(())
}

/// A cancel, and a lost job, end jobs with their own events; a runner's
/// end stores its last round's results, and the whole of a shaped one
/// with them: the record says the job holds one, and the key expires with
/// the job's others.
#[tokio::test]
async fn cancel_and_loss_end_jobs_with_their_own_events() -> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = store(&redis, &nats).await?;

    // A queued job nobody runs is cancelled at once.
    let (queued, _) = store.submit(&spec(), None, None).await?;
    assert_eq!(store.cancel(&queued).await?, Some(JobStatus::Cancelled));
    let record = store.get(&queued).await?.unwrap();
    assert_eq!(record.error.map(|e| e.code), Some(JobErrorCode::Cancelled));
    assert_eq!(
        events(&store, &queued).await?.last(),
        Some(&JobEvent::JobCancelled {
            code: JobErrorCode::Cancelled,
            spent: None,
        })
    );

    // A running job is only asked; its runner ends it.
    let (running, _) = store.submit(&spec(), None, None).await?;
    let lease = lease(&store, &running, "r", Duration::from_secs(5)).await?;
    assert_eq!(store.cancel(&running).await?, Some(JobStatus::Running));
    assert!(store.cancel_requested(&running).await?);
    let results = [Item::ToolResult {
        call_id: "c1".into(),
        name: "echo".into(),
        output: Envelope::Ok(serde_json::json!(1)).to_json(),
        attempts: 1,
    }];
    let full = [FullResult {
        call: EventId::parse("c1").unwrap(),
        data: "[1,2,3]".into(),
    }];
    assert!(!store.get(&running).await?.unwrap().shaped);
    store
        .finish(
            &lease,
            &Ending::Cancelled,
            Unstored::Results {
                items: &results,
                full: &full,
            },
            Some(Spend {
                tokens: 7,
                ..Spend::default()
            }),
        )
        .await?;
    let last = events(&store, &running).await?.pop();
    assert!(
        matches!(last, Some(JobEvent::JobCancelled { spent: Some(spent), .. }) if spent.tokens == 7),
        "the final event says what the run spent: {last:?}"
    );
    assert_eq!(store.items(&running, 1).await?, results);
    let record = store.get(&running).await?.unwrap();
    assert_eq!(record.status, JobStatus::Cancelled);
    assert!(record.shaped, "the record says it holds a shaped result");
    {
        use redis::AsyncCommands;
        let mut raw = redis::Client::open(redis.url())?
            .get_multiplexed_async_connection()
            .await?;
        let shaped = RedisKeys::default().job_shaped(&running);
        let whole: Option<String> = raw.hget(&shaped, "c1").await?;
        assert_eq!(whole.as_deref(), Some("[1,2,3]"));
        let ttl: i64 = raw.pttl(&shaped).await?;
        assert!(ttl > 0, "the whole expires with the job: {ttl}");
    }

    // A job whose state vanished is recorded as failed, with no message in its event.
    let lost = JobId::new("search", 0, 0xbeef);
    assert_eq!(store.cancel(&lost).await?, None);
    store.record_lost(&lost, "search").await?;
    let record = store.get(&lost).await?.unwrap();
    assert_eq!(record.status, JobStatus::Failed);
    assert_eq!(record.spec.tenant, "search", "reported to its owner");
    assert_eq!(
        record.error.map(|e| e.code),
        Some(JobErrorCode::JobStateLost)
    );
    assert_eq!(
        events(&store, &lost).await?,
        [JobEvent::JobFailed {
            code: JobErrorCode::JobStateLost,
            message: None,
            spent: None,
        }]
    );
    Ok(())
}

#[tokio::test]
async fn a_zombie_runner_cannot_write_after_a_takeover() -> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = store(&redis, &nats).await?;
    let (job_id, duplicate) = store
        .submit(
            &spec(),
            Some(Idempotency {
                key: "key-1",
                fingerprint: "fp",
            }),
            None,
        )
        .await?;
    assert!(!duplicate);
    assert_eq!(
        store
            .submit(
                &spec(),
                Some(Idempotency {
                    key: "key-1",
                    fingerprint: "fp"
                }),
                None,
            )
            .await?,
        (job_id.clone(), true)
    );

    let zombie = lease(&store, &job_id, "replica-a", Duration::from_millis(200)).await?;
    assert_eq!(
        store
            .acquire_and_load(&job_id, "replica-b", Duration::from_secs(5))
            .await?
            .0,
        Acquired::Held
    );
    // replica-a stalls past its lease; replica-b takes over with a higher epoch.
    let taker =
        toolfleet_tests::wait_until("the lease to expire", Duration::from_secs(5), || async {
            match store
                .acquire_and_load(&job_id, "replica-b", Duration::from_secs(5))
                .await
            {
                Ok((Acquired::Lease(lease), _)) => Some(lease),
                _ => None,
            }
        })
        .await?;
    assert!(taker.epoch > zombie.epoch);

    let late = [Item::Assistant {
        text: "from the zombie".into(),
        raw: None,
    }];
    let turn = TurnCheckpoint {
        results: &[],
        full: &[],
        items: &late,
        turns: 1,
        rounds: 0,
        offered: &[],
        usage: None,
        tokens: 0,
    };
    let write = store.record_turn(&zombie, turn, &[]).await;
    assert!(matches!(write, Err(Error::LeaseLost(_))), "{write:?}");
    assert!(matches!(
        store.renew(&zombie, Duration::from_secs(1)).await,
        Err(Error::LeaseLost(_))
    ));

    let ok = [Item::Assistant {
        text: "from the owner".into(),
        raw: None,
    }];
    let turn = TurnCheckpoint {
        results: &[],
        full: &[],
        items: &ok,
        turns: 1,
        rounds: 0,
        offered: &[],
        usage: None,
        tokens: 0,
    };
    store.record_turn(&taker, turn, &[]).await?;
    let items = store.items(&job_id, 0).await?;
    assert_eq!(
        items.len(),
        2,
        "the user message and the owner's item only: {items:?}"
    );
    assert_eq!(items[1], ok[0]);
    Ok(())
}

/// A commit wakes the job's watchers in the writer's own process directly,
/// and those of other replicas (another store) through NATS; with the bus
/// gone, the local ones are still woken.
#[tokio::test]
async fn a_commit_wakes_the_watchers_of_its_process_and_of_the_others() -> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let (store, live_here) = replica(&redis, &nats).await?;
    let (_, live_there) = replica(&redis, &nats).await?;
    let (job_id, _) = store.submit(&spec(), None, None).await?;
    let lease = lease(&store, &job_id, "replica-a", Duration::from_secs(30)).await?;
    let mut here = live_here.wake_ups(&job_id).await?;
    let mut there = live_there.wake_ups(&job_id).await?;
    let dispatched = DispatchedCall {
        event_id: event("c1"),
        wire_id: wire("c1"),
        name: "echo",
        cost: 1,
        version: None,
    };
    let woken = Duration::from_secs(10);
    // The job had two events (job_queued, job_started); the commit adds one.
    store.record_dispatch(&lease, &[dispatched], 1).await?;
    tokio::time::timeout(woken, here.past(2)).await?;
    tokio::time::timeout(woken, there.past(2)).await?;
    nats.kill();
    store.record_dispatch(&lease, &[dispatched], 2).await?;
    tokio::time::timeout(woken, here.past(3))
        .await
        .map_err(|_| anyhow::anyhow!("the watcher in the writer's process was not woken"))?;
    assert_eq!(store.events(&job_id, 0, 10).await?.len(), 4);
    Ok(())
}

/// A result that came with a worker's reply is recorded only if Redis holds
/// exactly that text for its call; otherwise the commit, and every result
/// grouped in it, writes nothing.
#[tokio::test]
async fn a_result_from_a_reply_is_recorded_only_as_redis_holds_it() -> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = store(&redis, &nats).await?;
    let (job_id, _) = store.submit(&spec(), None, None).await?;
    let lease = lease(&store, &job_id, "replica-a", Duration::from_secs(30)).await?;
    let stored = r#"{"tool":"echo","arguments_sha256":"x","envelope":{"ok":true,"data":1}}"#;
    let key = RedisKeys::default().call_result(&job_id, "echo", "w1", 1);
    let mut raw = redis::Client::open(redis.url())?
        .get_multiplexed_async_connection()
        .await?;
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(stored)
        .query_async(&mut raw)
        .await?;
    let ok = Envelope::Ok(serde_json::json!(1));
    fn result<'a>(wire_id: &'a str, unchecked: &'a str, envelope: &'a Envelope) -> SettledCall<'a> {
        SettledCall {
            call_id: event(wire_id),
            wire_id: wire(wire_id),
            name: "echo",
            attempts: 1,
            round_trip: None,
            worked: None,
            ran_on: None,
            envelope,
            source: None,
            unchecked: Some(unchecked),
            budget_exceeded: None,
        }
    }
    let events_before = store.events(&job_id, 0, 100).await?.len();
    // A forged text, and a result no worker stored, each with an honest one.
    let forged = stored.replace(r#""data":1"#, r#""data":2"#);
    for wrong in [result("w1", &forged, &ok), result("w2", stored, &ok)] {
        let batch = [result("w1", stored, &ok), wrong];
        assert!(matches!(
            store.record_call_results(&lease, &batch).await,
            Err(Error::ResultMismatch(_))
        ));
        assert_eq!(store.events(&job_id, 0, 100).await?.len(), events_before);
        assert!(!store.attempts(&job_id).await?.settled(wire("w1")));
    }
    // The text Redis holds is recorded.
    store
        .record_call_results(&lease, &[result("w1", stored, &ok)])
        .await?;
    assert_eq!(
        store.events(&job_id, 0, 100).await?.len(),
        events_before + 1
    );
    assert!(store.attempts(&job_id).await?.settled(wire("w1")));
    Ok(())
}

/// A submission with an idempotency key is three steps: the key's record
/// (the tenant's slot), the job (the job's slot), the job's index entries
/// (the sweeper's and the tenant's slots; the tenant's and its submitter's
/// indexes share one). Builds the state a crash leaves after each step, on
/// `redis`, and checks that the client's retry with the same key completes
/// the job the record promised, once, at its first submission time, in
/// both its tenant's and its submitter's index.
async fn a_retry_completes_a_submission_that_died_between_its_steps(
    redis: toolfleet_tests::fleet::Redis,
) -> anyhow::Result<()> {
    use redis::AsyncCommands;
    let nats = NatsServer::start().await?;
    let store = store_on(&redis, &nats).await?;
    let mut raw = redis.connection().await?;
    let keys = RedisKeys::default();
    let spec = JobSpec {
        submitter: Some("token:0123456789abcdef".into()),
        ..spec()
    };
    let idempotency = || {
        Some(Idempotency {
            key: "order-7",
            fingerprint: "print",
        })
    };
    let (job_id, duplicate) = store.submit(&spec, idempotency(), None).await?;
    assert!(!duplicate);
    let tenant_index = keys.tenant_jobs(&spec.tenant);
    let submitter_index = keys.submitter_jobs(&spec.tenant, "token:0123456789abcdef");
    let ttl: i64 = raw.pttl(&submitter_index).await?;
    assert!(
        ttl > 60_000,
        "a submitter's index expires once it is all stale: {ttl}"
    );
    let unindex = |mut raw: toolfleet_service::connect::RedisConnection| {
        let (tenant_index, submitter_index, shard, job_id) = (
            tenant_index.clone(),
            submitter_index.clone(),
            keys.unfinished_jobs(&job_id),
            job_id.clone(),
        );
        async move {
            let _: i64 = raw.zrem(&tenant_index, job_id.as_str()).await?;
            let _: i64 = raw.zrem(&submitter_index, job_id.as_str()).await?;
            let _: i64 = raw.zrem(&shard, job_id.as_str()).await?;
            anyhow::Ok(())
        }
    };
    let indexed = |mut raw: toolfleet_service::connect::RedisConnection| {
        let (tenant_index, submitter_index, job_id) = (
            tenant_index.clone(),
            submitter_index.clone(),
            job_id.clone(),
        );
        let store = &store;
        async move {
            let score: Option<u64> = raw.zscore(&tenant_index, job_id.as_str()).await?;
            let mine: Option<u64> = raw.zscore(&submitter_index, job_id.as_str()).await?;
            assert_eq!(
                mine, score,
                "the submitter's index holds what the tenant's does"
            );
            let unfinished = store.unfinished_before(u64::MAX, 1000).await?;
            anyhow::Ok((score, unfinished.contains(&job_id)))
        }
    };

    // Died after the record, before the job: the retry creates the job.
    let () = raw
        .del(&[
            keys.job(&job_id),
            keys.job_items(&job_id),
            keys.job_events(&job_id),
        ])
        .await?;
    unindex(raw.clone()).await?;
    assert!(store.get(&job_id).await?.is_none());
    assert_eq!(
        store.submit(&spec, idempotency(), None).await?,
        (job_id.clone(), true)
    );
    let recreated = store
        .get(&job_id)
        .await?
        .expect("the retry created the job");
    assert_eq!(recreated.status, JobStatus::Queued);
    assert_eq!(
        events(&store, &job_id).await?.len(),
        1,
        "one job_queued event"
    );
    let (score, unfinished) = indexed(raw.clone()).await?;
    assert_eq!(
        score,
        Some(recreated.created_at_ms),
        "listed at its creation"
    );
    assert!(unfinished, "the sweeper finds it");

    // Died after the job, before its indexes: the retry indexes it, at the
    // time it was created, and creates nothing.
    unindex(raw.clone()).await?;
    assert_eq!(
        store.submit(&spec, idempotency(), None).await?,
        (job_id.clone(), true)
    );
    assert_eq!(events(&store, &job_id).await?.len(), 1, "not created again");
    assert_eq!(
        indexed(raw.clone()).await?,
        (Some(recreated.created_at_ms), true)
    );

    // A retry after the job ended lists it again, and does not hand it
    // to the sweeper.
    assert_eq!(store.cancel(&job_id).await?, Some(JobStatus::Cancelled));
    unindex(raw.clone()).await?;
    assert_eq!(
        store.submit(&spec, idempotency(), None).await?,
        (job_id.clone(), true)
    );
    assert_eq!(
        indexed(raw.clone()).await?,
        (Some(recreated.created_at_ms), false)
    );
    assert_eq!(
        store.get(&job_id).await?.map(|r| r.status),
        Some(JobStatus::Cancelled)
    );

    // Another credential's retry with the key (a request the API then
    // refuses, when it may not see the job) indexes the job as its record
    // says: under its first submitter, not under the other.
    let someone_else = JobSpec {
        submitter: Some("token:fedcba9876543210".into()),
        ..spec.clone()
    };
    unindex(raw.clone()).await?;
    assert_eq!(
        store.submit(&someone_else, idempotency(), None).await?,
        (job_id.clone(), true)
    );
    assert_eq!(
        indexed(raw.clone()).await?,
        (Some(recreated.created_at_ms), false)
    );
    let theirs: Option<u64> = raw
        .clone()
        .zscore(
            keys.submitter_jobs(&spec.tenant, "token:fedcba9876543210"),
            job_id.as_str(),
        )
        .await?;
    assert_eq!(theirs, None, "not the other's job");

    // The key still refuses a different request.
    let other = Some(Idempotency {
        key: "order-7",
        fingerprint: "another print",
    });
    assert!(matches!(
        store.submit(&spec, other, None).await,
        Err(Error::IdempotencyConflict(_))
    ));
    Ok(())
}

#[tokio::test]
async fn a_retry_completes_a_submission_that_died_between_its_steps_on_one_server()
-> anyhow::Result<()> {
    let redis = toolfleet_tests::fleet::Redis::Server(Box::new(RedisServer::start().await?));
    a_retry_completes_a_submission_that_died_between_its_steps(redis).await
}

#[tokio::test]
async fn cluster_a_retry_completes_a_submission_that_died_between_its_steps() -> anyhow::Result<()>
{
    let cluster =
        toolfleet_tests::RedisCluster::start(3, 0, toolfleet_tests::RedisConfig::default()).await?;
    a_retry_completes_a_submission_that_died_between_its_steps(
        toolfleet_tests::fleet::Redis::Cluster(cluster),
    )
    .await
}

/// A primary with a replica behind one address (what a Service that
/// follows the primary gives) is one server to toolfleet, and
/// `redis.wait_replicas` works there as on a cluster: a submission is
/// acknowledged only once the replica holds the job, and refused while the
/// replica does not answer.
#[tokio::test]
async fn on_a_primary_with_a_replica_a_write_counts_once_the_replica_holds_it() -> anyhow::Result<()>
{
    use redis::AsyncCommands;
    use toolfleet_service::connect::{RedisConnection, ReplicaAcks};
    let (primary, replica, nats) = (
        RedisServer::start().await?,
        RedisServer::start().await?,
        NatsServer::start().await?,
    );
    let mut on_replica = replica.connection().await?;
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port())
        .query_async(&mut on_replica)
        .await?;
    toolfleet_tests::wait_until(
        "the replica to copy the primary",
        Duration::from_secs(30),
        || async {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut replica.connection().await?)
                .await?;
            anyhow::ensure!(info.contains("master_link_status:up"), "{info}");
            anyhow::Ok(())
        },
    )
    .await?;
    let connection: RedisConnection = primary.connection().await?.into();
    let store = JobStore::new(
        connection.with_replica_acks(Some(ReplicaAcks {
            replicas: 1,
            timeout: Duration::from_millis(300),
        })),
        Live::new(nats.client().await?),
        RedisKeys::default(),
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    let (job_id, _) = store.submit(&spec(), None, None).await?;
    // Read at once from the replica: it had the job before the answer.
    let status: Option<String> = on_replica
        .hget(RedisKeys::default().job(&job_id), "status")
        .await?;
    assert_eq!(status.as_deref(), Some("queued"));

    replica.process().freeze()?;
    let refused = store.submit(&spec(), None, None).await;
    replica.process().thaw()?;
    let Err(err) = refused else {
        anyhow::bail!("a write the replica does not hold was acknowledged");
    };
    let err = format!("{:#}", anyhow::Error::new(err));
    assert!(err.contains("0 of the 1 replicas"), "{err}");
    Ok(())
}

/// A call held in `job` for `tool`, expiring `ttl` from now.
fn held<'a>(call_id: &'a str, tool: &'a str, ttl: Duration) -> HeldCall<'a> {
    HeldCall {
        wire_id: wire(call_id),
        held_for: HeldFor::Approval(Rule::Job { every_tool: true }),
        call_id: event(call_id),
        tool,
        version: None,
        arguments: "{}",
        expires_at_ms: toolfleet_orchestrator::job::now_ms() + ttl.as_millis() as u64,
    }
}

/// An approval by the tenant `default`, made now.
fn approved() -> Decision {
    Decision {
        choice: Choice::Approval(ApprovalChoice::Approved),
        reason: String::new(),
        arguments: None,
        result: None,
        tenant: "default".into(),
        approver: None,
        at_ms: toolfleet_orchestrator::job::now_ms(),
    }
}

/// The gauge's tally, as (tool, calls) sorted.
async fn tallied(store: &JobStore) -> anyhow::Result<Vec<(String, u64)>> {
    let mut tally: Vec<(String, u64)> = store
        .pending_tally()
        .await?
        .into_iter()
        .map(|t| (t.tool, t.calls))
        .collect();
    tally.sort();
    Ok(tally)
}

/// A day, long enough for a hold that must not expire in a test.
const DAY: Duration = Duration::from_secs(86_400);

/// An approval decided with the job running (neither parked nor moved).
const RUNNING: Seen = Seen {
    parked: false,
    moves: 0,
};

/// Three running jobs holding calls for approval: `a` holds `pay`
/// (transfer) and `say` (echo), `b` `pay` (transfer), `c` `say` (echo)
/// for 300 ms. Returns their leases.
async fn hold_calls_in_three_jobs(store: &JobStore) -> anyhow::Result<[Lease; 3]> {
    let mut leases = Vec::new();
    for _ in 0..3 {
        let (job_id, _) = store.submit(&spec(), None, None).await?;
        leases.push(lease(store, &job_id, "r", Duration::from_secs(60)).await?);
    }
    let Ok([a, b, c]) = <[Lease; 3]>::try_from(leases) else {
        unreachable!()
    };
    store
        .hold(
            &a,
            "default",
            &[held("pay", "transfer", DAY), held("say", "echo", DAY)],
        )
        .await?;
    store
        .hold(&b, "default", &[held("pay", "transfer", DAY)])
        .await?;
    store
        .hold(
            &c,
            "default",
            &[held("say", "echo", Duration::from_millis(300))],
        )
        .await?;
    Ok([a, b, c])
}

/// The tally counts each tool's held calls, with the oldest's time.
async fn the_tally_counts_each_tools_calls(store: &JobStore, a: &Lease) -> anyhow::Result<()> {
    let oldest =
        store.approvals(&a.job_id).await?.requests[&Hold::approval(wire("pay"))].requested_at_ms;
    let tally = store.pending_tally().await?;
    let transfer = tally.iter().find(|t| t.tool == "transfer").unwrap();
    assert_eq!((transfer.calls, transfer.oldest_held_at_ms), (2, oldest));
    assert_eq!(
        tallied(store).await?,
        [("echo".into(), 2), ("transfer".into(), 2)]
    );
    Ok(())
}

/// The approval of `a`'s `pay`, made by the tenant and stored: gone from
/// the count, and from ListPendingApprovals.
async fn a_decided_call_is_counted_no_more(store: &JobStore, a: &Lease) -> anyhow::Result<()> {
    let request = store.approvals(&a.job_id).await?.requests[&Hold::approval(wire("pay"))].clone();
    store
        .decide(
            &a.job_id,
            &Hold::approval(wire("pay")),
            &request,
            &approved(),
            RUNNING,
        )
        .await?;
    assert_eq!(
        tallied(store).await?,
        [("echo".into(), 2), ("transfer".into(), 1)]
    );
    // A page holds only what its caller wants (a role sees approvals or
    // verdicts), and is full whatever came before it: one of these two
    // pages of one skips the older call of the other tool.
    for tool in ["echo", "transfer"] {
        let (page, _) = store
            .pending("default", None, 1, |p| p.request.tool == tool)
            .await?;
        let tools: Vec<&str> = page.iter().map(|p| p.request.tool.as_str()).collect();
        assert_eq!(tools, [tool]);
    }
    Ok(())
}

/// `b` ends holding its call (cancelled): gone, and so is the tool; `c`'s
/// call expires: dropped by the next refresh. Only `a`'s `say` is listed.
async fn ended_and_expired_calls_are_counted_no_more(
    store: &JobStore,
    [a, b, c]: &[Lease; 3],
) -> anyhow::Result<()> {
    store
        .finish(b, &Ending::Cancelled, Unstored::Nothing, None)
        .await?;
    // Expired: dropped by the next refresh.
    let expires =
        store.approvals(&c.job_id).await?.requests[&Hold::approval(wire("say"))].expires_at_ms;
    toolfleet_tests::wait_until("the call to expire", Duration::from_secs(5), || async {
        (toolfleet_orchestrator::job::now_ms() > expires).then_some(())
    })
    .await?;
    assert_eq!(tallied(store).await?, [("echo".into(), 1)]);
    let (page, _) = store.pending("default", None, 10, |_| true).await?;
    let listed: Vec<(&JobId, &str)> = page
        .iter()
        .map(|p| (&p.job_id, p.request.call_id.as_str()))
        .collect();
    assert_eq!(listed, [(&a.job_id, "say")]);
    Ok(())
}

/// A later hold of a call keeps its entry when the earlier hold's
/// decision drops what it indexed.
async fn a_later_hold_outlives_the_earlier_ones_decision(
    store: &JobStore,
    a: &Lease,
) -> anyhow::Result<()> {
    let first = held("again", "echo", DAY);
    store.hold(a, "default", &[first]).await?;
    let first = store.approvals(&a.job_id).await?.requests[&Hold::approval(wire("again"))].clone();
    // The later hold is held at a later millisecond, as in a real run.
    toolfleet_tests::wait_until(
        "the clock to pass the first hold",
        Duration::from_secs(5),
        || async { (toolfleet_orchestrator::job::now_ms() > first.requested_at_ms).then_some(()) },
    )
    .await?;
    let envelope = Envelope::terminal(ErrorCode::OUTCOME_UNKNOWN, "the worker died");
    let verdict = HeldCall {
        wire_id: wire("again"),
        held_for: HeldFor::Verdict {
            attempt: 1,
            answered: &envelope,
        },
        ..held("again", "echo", DAY)
    };
    store.hold(a, "default", &[verdict]).await?;
    store
        .decide(
            &a.job_id,
            &Hold::approval(wire("again")),
            &first,
            &approved(),
            RUNNING,
        )
        .await?;
    assert_eq!(tallied(store).await?, [("echo".into(), 2)]);
    Ok(())
}

/// A crash left entries of `a`'s job, which is gone: the heal drops them,
/// and every index of the tenant is empty.
async fn the_heal_leaves_no_entry(
    store: &JobStore,
    redis: &RedisServer,
    a: &Lease,
) -> anyhow::Result<()> {
    let mut raw = redis.connection().await?;
    let keys = RedisKeys::default();
    let () = redis::cmd("DEL")
        .arg(keys.job(&a.job_id))
        .query_async(&mut raw)
        .await?;
    let mut at = store.heal_pending(None).await?;
    while at.is_some() {
        at = store.heal_pending(at).await?;
    }
    assert_eq!(tallied(store).await?, []);
    let left: i64 = redis::cmd("EXISTS")
        .arg(keys.tenant_approvals("default"))
        .arg(keys.tenant_approvals_expiry("default"))
        .arg(keys.tenant_approval_tools("default"))
        .arg(keys.tenant_tool_approvals("default", "echo"))
        .arg(keys.tenant_tool_approvals("default", "transfer"))
        .query_async(&mut raw)
        .await?;
    assert_eq!(left, 0, "every index of the tenant is empty");
    Ok(())
}

/// The pending gauges are counted from indexes that Redis keeps per tenant
/// and tool, so no refresh reads a job; an entry leaves every index when
/// its call is decided, expires, or its job ends holding it, and what a
/// crash leaves behind is dropped by the heal. Nothing is left at the end.
#[tokio::test]
async fn pending_calls_are_counted_without_reading_jobs_and_leave_no_entry_behind()
-> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = store(&redis, &nats).await?;
    let jobs = hold_calls_in_three_jobs(&store).await?;
    let a = &jobs[0];
    the_tally_counts_each_tools_calls(&store, a).await?;
    a_decided_call_is_counted_no_more(&store, a).await?;
    ended_and_expired_calls_are_counted_no_more(&store, &jobs).await?;
    a_later_hold_outlives_the_earlier_ones_decision(&store, a).await?;
    the_heal_leaves_no_entry(&store, &redis, a).await
}

/// On a Redis Cluster, a job's moves between the sweeper's indexes run as
/// on one server: each one script on its shard's slot (the parked index,
/// the unfinished one and their moves share it), around the park's and
/// the decision's scripts on the job's own slot.
#[tokio::test]
async fn cluster_a_decision_moves_a_parked_job_between_slots_as_on_one_server() -> anyhow::Result<()>
{
    let cluster =
        toolfleet_tests::RedisCluster::start(3, 0, toolfleet_tests::RedisConfig::default()).await?;
    let redis = toolfleet_tests::fleet::Redis::Cluster(cluster);
    let nats = NatsServer::start().await?;
    let store = store_on(&redis, &nats).await?;
    let mut raw = redis.connection().await?;
    let keys = RedisKeys::default();
    let (job_id, _) = store.submit(&spec(), None, None).await?;
    let lease = lease(&store, &job_id, "r", Duration::from_secs(60)).await?;
    let day = Duration::from_secs(86_400);
    store
        .hold(&lease, "default", &[held("pay", "transfer", day)])
        .await?;
    let mut placed = async || -> anyhow::Result<(bool, bool)> {
        let unfinished: Option<f64> = redis::cmd("ZSCORE")
            .arg(keys.unfinished_jobs(&job_id))
            .arg(job_id.as_str())
            .query_async(&mut raw)
            .await?;
        let parked: Option<f64> = redis::cmd("ZSCORE")
            .arg(keys.parked_jobs(&job_id))
            .arg(job_id.as_str())
            .query_async(&mut raw)
            .await?;
        Ok((unfinished.is_some(), parked.is_some()))
    };
    let parked = store.park(&lease, &[("pay", "pay")], u64::MAX / 4).await?;
    assert_eq!(parked, toolfleet_orchestrator::store::Parked::Parked);
    assert_eq!(placed().await?, (false, true), "parked");
    let record = store.get(&job_id).await?.expect("the job");
    let request = store.approvals(&job_id).await?.requests[&Hold::approval(wire("pay"))].clone();
    let decision = approved();
    let decided = store
        .decide(
            &job_id,
            &Hold::approval(wire("pay")),
            &request,
            &decision,
            Seen::of(&record),
        )
        .await?;
    assert_eq!(
        decided,
        toolfleet_orchestrator::store::Decided::Recorded { requeued: true }
    );
    assert_eq!(placed().await?, (true, false), "queued again");
    let record = store.get(&job_id).await?.expect("the job");
    assert!(record.requeued && record.moves == 2, "{record:?}");
    let retried = store
        .decide(
            &job_id,
            &Hold::approval(wire("pay")),
            &request,
            &decision,
            Seen::of(&record),
        )
        .await?;
    assert!(
        matches!(
            retried,
            toolfleet_orchestrator::store::Decided::Already { requeued: true, .. }
        ),
        "{retried:?}"
    );
    store.cancel(&job_id).await?;
    assert_eq!(placed().await?, (false, false), "forgotten once it ended");
    Ok(())
}
