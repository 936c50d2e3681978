//! The life of a parked job's held calls as a state machine (decision
//! 0036): a runner holds, parks and resumes the job, two people decide its
//! calls, the sweeper sweeps and wakes it, a client cancels it, NATS loses
//! its messages, and the runner or a decider dies between any two of its
//! steps, in any interleaving. Each transition runs the real step on a
//! real redis-server (the store's [`Steps`], the scripts its verbs run);
//! after each, what Redis holds and what each process holds are compared
//! with the model's, and the model's invariants are checked: a park never
//! hides a decision, a job nobody runs is where the sweeper finds it, and
//! an unfinished job is in an index. At the end every process dies, and
//! the sweeper and runners alone (no client's retry, no wake-up at an
//! expiry) must run every decided call: the bound docs/approvals.md gives.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use toolfleet_orchestrator::hold::{ApprovalChoice, Choice, Decision, Hold};
use toolfleet_orchestrator::job::{Ending, JobStatus, Lease, now_ms};
use toolfleet_orchestrator::store::{
    Acquired, ApprovalRequest, Decide, DecideStep, Decided, HeldCall, JobStore, ParkWrite, Parked,
    Place, Seen, Stamp, Unstored, Wake,
};
use toolfleet_proto::JobId;
use toolfleet_proto::names::RedisKeys;
use toolfleet_tests::{NatsServer, RedisServer};

/// A held call of the job: three a person may decide, and one whose
/// approval had expired when it was held (the round answers it itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Call {
    A,
    B,
    K,
    Expired,
}

impl Call {
    const ALL: [Call; 4] = [Call::A, Call::B, Call::K, Call::Expired];
    const DECIDABLE: [Call; 3] = [Call::A, Call::B, Call::K];

    fn key(self) -> &'static str {
        match self {
            Call::A => "wa",
            Call::B => "wb",
            Call::K => "wk",
            Call::Expired => "wx",
        }
    }

    /// Its hold: an approval.
    fn hold(self) -> Hold {
        Hold::approval(super::wire(self.key()))
    }
}

/// One step of one process.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// A runner takes a job message: the lease script.
    Acquire,
    /// The runner's round reads the held calls and their decisions.
    ReadApprovals,
    /// The round's calls that could run have settled: the park's script.
    Park,
    /// The park's move to the parked index; then the message is acked.
    PlaceParked,
    /// The round waits for nothing (or a cancel was asked): the job ends.
    Finish,
    /// kill -9 of the runner: its lease expires, its message comes again.
    RunnerDies,
    /// A person's `DecideCall` reads the job.
    Look {
        decider: usize,
        call: Call,
        choice: Choice,
    },
    /// The decider's move ahead of the decision.
    PlaceAhead { decider: usize },
    /// The decision's script.
    WriteDecision { decider: usize },
    /// The decider's move of the requeued job to the unfinished index.
    PlaceRequeued { decider: usize },
    /// The decider publishes the requeued job.
    Publish { decider: usize },
    /// kill -9 of the decider's orchestrator.
    DeciderDies { decider: usize },
    /// The sweeper looks at the unfinished index (`runner.sweep_after`
    /// has passed).
    Sweep,
    /// The sweeper wakes the parked job (its first expiry has passed).
    Wake,
    /// A client cancels the job.
    Cancel,
    /// NATS loses the job's messages (a stream lost with its server).
    LoseMessages,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Running,
    Parked,
    Ended,
}

/// Where the runner is.
#[derive(Debug, Clone, PartialEq)]
enum Run {
    /// It holds the lease, and reads the held calls next.
    Taken,
    /// Its round read these decided calls.
    Read(BTreeSet<Call>),
    /// Parked with this count of moves: its move to the parked index next.
    Parked(u64),
    /// It ends the job next (a cancel was asked).
    Ending,
}

/// Where a decider is.
#[derive(Debug, Clone, PartialEq)]
enum Deciding {
    /// It read the job.
    Looked(Seen),
    /// It moved the job ahead of the decision.
    Ahead(Seen),
    /// The job was requeued with this count of moves: the decider moves
    /// it, then publishes it if the decision was its own or repeats it.
    Requeued { moves: u64, publish: bool },
    /// It publishes next.
    Publishing,
}

/// A decider: who decides what, and where it is.
#[derive(Debug, Clone, PartialEq)]
struct Decider {
    call: Call,
    choice: Choice,
    at: Deciding,
}

/// How many times a decider tries a job that parks again in between, as
/// the store's `Decide` does.
const TRIES: u32 = 8;

/// This job's entries in the sweeper's indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Indexes {
    unfinished: bool,
    parked: bool,
    /// The rank of the last move applied.
    rank: Option<u64>,
}

impl Indexes {
    /// A fenced move, as the store's `PLACE` script makes it.
    fn place(&mut self, moves: u64, ahead: bool, place: Place) {
        let rank = moves * 2 + u64::from(ahead);
        if self.rank.is_some_and(|seen| seen >= rank) {
            return;
        }
        self.rank = Some(rank);
        match place {
            Place::Parked { .. } => (self.unfinished, self.parked) = (false, true),
            Place::Unfinished => (self.unfinished, self.parked) = (true, false),
            Place::Both => self.unfinished = true,
        }
    }
}

/// The processes, as the model and the real test each keep them.
#[derive(Debug, Clone, PartialEq)]
struct Processes {
    runner: Option<Run>,
    deciders: [Option<Decider>; 2],
    /// Job messages in the queue.
    messages: u32,
    /// Calls a round answered before it parked or ended: from their
    /// decision, or expired.
    settled: BTreeSet<Call>,
}

impl Processes {
    fn start() -> Self {
        Self {
            runner: Some(Run::Taken),
            deciders: [None, None],
            messages: 0,
            settled: BTreeSet::new(),
        }
    }

    /// The calls a round that read the decided calls `read` waits for.
    fn waiting(&self, read: &BTreeSet<Call>) -> Vec<Call> {
        Call::DECIDABLE
            .into_iter()
            .filter(|call| !self.settled.contains(call) && !read.contains(call))
            .collect()
    }

    /// The round that read `read` has answered what it could.
    fn settle(&mut self, read: BTreeSet<Call>) {
        self.settled.extend(read);
        self.settled.insert(Call::Expired);
    }
}

/// The model: what Redis must hold, and where each process is.
#[derive(Debug, Clone)]
struct Model {
    status: Status,
    requeued: bool,
    moves: u64,
    /// The epoch of the last lease taken.
    epoch: u64,
    leased: bool,
    cancel_requested: bool,
    decided: BTreeMap<Call, Choice>,
    indexes: Indexes,
    processes: Processes,
    /// Each decider's tries that found the job parked again.
    tries: [u32; 2],
}

impl Model {
    /// The job as the test's setup leaves it: running, its three calls
    /// held, in the unfinished index since its submission.
    fn start() -> Self {
        Self {
            status: Status::Running,
            requeued: false,
            moves: 0,
            epoch: 1,
            leased: true,
            cancel_requested: false,
            decided: BTreeMap::new(),
            indexes: Indexes {
                unfinished: true,
                ..Indexes::default()
            },
            processes: Processes::start(),
            tries: [0, 0],
        }
    }

    /// The job ends (its `requeued` mark, if any, is left: nothing reads
    /// it once the job has ended).
    fn end(&mut self) {
        self.status = Status::Ended;
        self.leased = false;
        self.indexes = Indexes::default();
    }

    fn acquire(&mut self) {
        self.processes.messages -= 1;
        if self.status == Status::Ended || self.leased {
            return;
        }
        if self.status == Status::Parked && !self.requeued {
            self.moves += 1;
            self.indexes.place(self.moves, false, Place::Unfinished);
        }
        self.epoch += 1;
        self.leased = true;
        self.status = Status::Running;
        self.requeued = false;
        self.processes.runner = Some(Run::Taken);
    }

    fn park(&mut self) {
        let Some(Run::Read(read)) = self.processes.runner.clone() else {
            return;
        };
        if self.cancel_requested {
            self.processes.runner = Some(Run::Ending);
            return;
        }
        let waiting = self.processes.waiting(&read);
        if waiting.iter().any(|call| self.decided.contains_key(call)) {
            // A decision the round did not read: run on, and read again.
            self.processes.runner = Some(Run::Taken);
            return;
        }
        self.status = Status::Parked;
        self.requeued = false;
        self.moves += 1;
        self.leased = false;
        self.processes.settle(read);
        self.processes.runner = Some(Run::Parked(self.moves));
    }

    fn finish(&mut self) {
        if let Some(Run::Read(read)) = self.processes.runner.take() {
            self.processes.settle(read);
        }
        self.end();
    }

    /// The decision's script, for `decider`.
    fn write_decision(&mut self, at: usize, decider: &Decider, seen: Seen) -> Option<Deciding> {
        let parked = self.status == Status::Parked;
        if let Some(first) = self.decided.get(&decider.call) {
            return (parked && self.requeued).then_some(Deciding::Requeued {
                moves: self.moves,
                publish: *first == decider.choice,
            });
        }
        if self.status == Status::Ended || decider.call == Call::Expired {
            return None;
        }
        let mut next = None;
        if parked && !self.requeued {
            if self.moves != seen.moves {
                self.tries[at] += 1;
                return (self.tries[at] < TRIES).then_some(Deciding::Looked(Seen {
                    parked: true,
                    moves: self.moves,
                }));
            }
            self.requeued = true;
            self.moves += 1;
            next = Some(Deciding::Requeued {
                moves: self.moves,
                publish: true,
            });
        }
        self.decided.insert(decider.call, decider.choice);
        next
    }

    fn decide(&mut self, at: usize, step: &Step) {
        let Some(decider) = self.processes.deciders[at].clone() else {
            return;
        };
        let next = match (&decider.at, step) {
            (Deciding::Looked(seen), Step::PlaceAhead { .. }) => {
                self.indexes.place(seen.moves, true, Place::Both);
                Some(Deciding::Ahead(*seen))
            }
            (Deciding::Looked(seen) | Deciding::Ahead(seen), Step::WriteDecision { .. }) => {
                self.write_decision(at, &decider, *seen)
            }
            (Deciding::Requeued { moves, publish }, Step::PlaceRequeued { .. }) => {
                self.indexes.place(*moves, false, Place::Unfinished);
                publish.then_some(Deciding::Publishing)
            }
            (Deciding::Publishing, Step::Publish { .. }) => {
                self.processes.messages += 1;
                None
            }
            _ => unreachable!("the preconditions admit no other step"),
        };
        self.processes.deciders[at] = next.map(|at| Decider { at, ..decider });
    }

    fn sweep(&mut self) {
        if !self.indexes.unfinished {
            return;
        }
        if self.status == Status::Ended {
            self.indexes = Indexes::default();
        } else if !self.leased {
            self.processes.messages += 1;
        }
    }

    fn wake(&mut self) {
        if self.status == Status::Ended {
            self.indexes = Indexes::default();
            return;
        }
        let queued = !self.leased;
        if queued && self.status == Status::Parked && !self.requeued {
            self.requeued = true;
            self.moves += 1;
        }
        self.indexes.place(self.moves, false, Place::Unfinished);
        if queued {
            self.processes.messages += 1;
        }
    }

    fn cancel(&mut self) {
        match self.status {
            Status::Parked if !self.leased => self.end(),
            Status::Running | Status::Parked => self.cancel_requested = true,
            // Told that the job ended, the cancel drops it from the indexes.
            Status::Ended => self.indexes = Indexes::default(),
        }
    }
}

/// The reference state machine.
struct Life;

fn decider() -> impl Strategy<Value = usize> {
    0..2usize
}

impl ReferenceStateMachine for Life {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model::start()).boxed()
    }

    fn transitions(_: &Model) -> BoxedStrategy<Step> {
        let call = prop_oneof![
            Just(Call::A),
            Just(Call::B),
            Just(Call::K),
            Just(Call::Expired)
        ];
        let choice = prop_oneof![
            Just(Choice::Approval(ApprovalChoice::Approved)),
            Just(Choice::Approval(ApprovalChoice::Rejected))
        ];
        prop_oneof![
            3 => Just(Step::Acquire),
            3 => Just(Step::ReadApprovals),
            3 => Just(Step::Park),
            3 => Just(Step::PlaceParked),
            1 => Just(Step::Finish),
            1 => Just(Step::RunnerDies),
            4 => (decider(), call, choice)
                .prop_map(|(decider, call, choice)| Step::Look { decider, call, choice }),
            3 => decider().prop_map(|decider| Step::PlaceAhead { decider }),
            4 => decider().prop_map(|decider| Step::WriteDecision { decider }),
            3 => decider().prop_map(|decider| Step::PlaceRequeued { decider }),
            3 => decider().prop_map(|decider| Step::Publish { decider }),
            1 => decider().prop_map(|decider| Step::DeciderDies { decider }),
            2 => Just(Step::Sweep),
            1 => Just(Step::Wake),
            1 => Just(Step::Cancel),
            1 => Just(Step::LoseMessages),
        ]
        .boxed()
    }

    fn preconditions(model: &Model, step: &Step) -> bool {
        let processes = &model.processes;
        let at = |decider: &usize| processes.deciders[*decider].as_ref().map(|d| &d.at);
        match step {
            Step::Acquire => processes.messages > 0 && processes.runner.is_none(),
            Step::ReadApprovals => processes.runner == Some(Run::Taken),
            Step::Park => {
                matches!(&processes.runner, Some(Run::Read(read)) if !processes.waiting(read).is_empty())
            }
            Step::PlaceParked => matches!(processes.runner, Some(Run::Parked(_))),
            Step::Finish => match &processes.runner {
                Some(Run::Read(read)) => processes.waiting(read).is_empty(),
                Some(Run::Ending) => true,
                _ => false,
            },
            Step::RunnerDies => processes.runner.is_some(),
            Step::Look { decider, .. } => processes.deciders[*decider].is_none(),
            Step::PlaceAhead { decider } => {
                matches!(at(decider), Some(Deciding::Looked(seen)) if seen.parked)
            }
            Step::WriteDecision { decider } => match at(decider) {
                Some(Deciding::Looked(seen)) => !seen.parked,
                Some(Deciding::Ahead(_)) => true,
                _ => false,
            },
            Step::PlaceRequeued { decider } => {
                matches!(at(decider), Some(Deciding::Requeued { .. }))
            }
            Step::Publish { decider } => matches!(at(decider), Some(Deciding::Publishing)),
            Step::DeciderDies { decider } => processes.deciders[*decider].is_some(),
            Step::Sweep | Step::Cancel => true,
            Step::Wake => model.indexes.parked,
            Step::LoseMessages => processes.messages > 0,
        }
    }

    fn apply(mut model: Model, step: &Step) -> Model {
        match step {
            Step::Acquire => model.acquire(),
            Step::ReadApprovals => {
                let read = model.decided.keys().copied().collect();
                model.processes.runner = Some(Run::Read(read));
            }
            Step::Park => model.park(),
            Step::PlaceParked => {
                if let Some(Run::Parked(moves)) = model.processes.runner.take() {
                    model
                        .indexes
                        .place(moves, false, Place::Parked { wake_at_ms: 0 });
                }
            }
            Step::Finish => model.finish(),
            Step::RunnerDies => {
                // Its lease expires, and its message, never acked (a park
                // acks it after the move), comes again.
                model.processes.runner = None;
                model.leased = false;
                model.processes.messages += 1;
            }
            Step::Look {
                decider,
                call,
                choice,
            } => {
                let seen = Seen {
                    parked: model.status == Status::Parked && !model.requeued,
                    moves: model.moves,
                };
                model.processes.deciders[*decider] = Some(Decider {
                    call: *call,
                    choice: *choice,
                    at: Deciding::Looked(seen),
                });
                model.tries[*decider] = 0;
            }
            Step::PlaceAhead { decider }
            | Step::WriteDecision { decider }
            | Step::PlaceRequeued { decider }
            | Step::Publish { decider } => model.decide(*decider, step),
            Step::DeciderDies { decider } => model.processes.deciders[*decider] = None,
            Step::Sweep => model.sweep(),
            Step::Wake => model.wake(),
            Step::Cancel => model.cancel(),
            Step::LoseMessages => model.processes.messages = 0,
        }
        model
    }
}

/// The invariants of a held call's life, on a state the comparison found
/// in Redis.
fn check(model: &Model) {
    let nobody_runs = !model.leased && model.status != Status::Ended;
    if nobody_runs && (model.status == Status::Running || model.requeued) {
        assert!(
            model.indexes.unfinished,
            "a job that waits for a runner is in the unfinished index: {model:#?}"
        );
    }
    if model.status == Status::Parked && !model.requeued {
        let decided: BTreeSet<Call> = model.decided.keys().copied().collect();
        assert!(
            decided.is_subset(&model.processes.settled),
            "a parked job hides no decision: {model:#?}"
        );
    }
    if model.status != Status::Ended {
        assert!(
            model.indexes.unfinished || model.indexes.parked,
            "an unfinished job is in an index: {model:#?}"
        );
    }
}

/// The servers and the runtime the test runs in, for the system under
/// test, which proptest builds with no arguments of its own.
struct Env {
    runtime: tokio::runtime::Runtime,
    store: JobStore,
    raw: redis::aio::MultiplexedConnection,
}

thread_local! {
    static ENV: RefCell<Option<Rc<Env>>> = const { RefCell::new(None) };
}

/// The real job, and what each process holds.
struct Job {
    env: Rc<Env>,
    job_id: JobId,
    held: HashMap<Call, ApprovalRequest>,
    /// The lease of the runner's run.
    lease: Option<Lease>,
    /// The deciders' decisions in progress, and whether each is to be
    /// published once done.
    deciding: [Option<(Decide, Decision)>; 2],
    processes: Processes,
}

/// What the comparison reads back of the job.
#[derive(Debug, PartialEq)]
struct Observed {
    status: Status,
    requeued: bool,
    moves: u64,
    /// The epoch of the last lease taken.
    epoch: u64,
    leased: bool,
    cancel_requested: bool,
    decided: BTreeSet<Call>,
    indexes: Indexes,
    processes: Processes,
}

impl Observed {
    fn of(model: &Model) -> Self {
        Self {
            status: model.status,
            requeued: model.requeued,
            moves: model.moves,
            epoch: model.epoch,
            leased: model.leased,
            cancel_requested: model.cancel_requested,
            decided: model.decided.keys().copied().collect(),
            indexes: model.indexes,
            processes: model.processes.clone(),
        }
    }
}

impl Job {
    fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.env.runtime.block_on(future)
    }

    fn store(&self) -> &JobStore {
        &self.env.store
    }

    /// What Redis and the processes hold, in the model's terms.
    fn observed(&self) -> Observed {
        let keys = RedisKeys::default();
        let id = &self.job_id;
        let mut raw = self.env.raw.clone();
        type Read = (
            HashMap<String, String>,
            bool,
            Vec<String>,
            Option<f64>,
            Option<f64>,
            Option<u64>,
        );
        let (job, leased, approvals, unfinished, parked, rank): Read = self
            .block_on(
                redis::pipe()
                    .hgetall(keys.job(id))
                    .exists(keys.job_lease(id))
                    .hkeys(keys.job_approvals(id))
                    .zscore(keys.unfinished_jobs(id), id.as_str())
                    .zscore(keys.parked_jobs(id), id.as_str())
                    .hget(keys.index_moves(id), id.as_str())
                    .query_async(&mut raw),
            )
            .expect("redis answers");
        let field = |name: &str| job.get(name).map_or("", String::as_str);
        let status = match field("status").parse::<JobStatus>() {
            Ok(JobStatus::Running) => Status::Running,
            Ok(JobStatus::WaitingForApproval) => Status::Parked,
            Ok(status) if status.is_final() => Status::Ended,
            other => panic!("a status the model does not know: {other:?}"),
        };
        Observed {
            status,
            requeued: field("requeued") == "1",
            moves: field("moves").parse().unwrap_or_default(),
            epoch: field("epoch").parse().unwrap_or_default(),
            leased,
            cancel_requested: field("cancel_requested") == "1",
            decided: Call::ALL
                .into_iter()
                .filter(|call| approvals.contains(&format!("decided:{}", call.key())))
                .collect(),
            indexes: Indexes {
                unfinished: unfinished.is_some(),
                parked: parked.is_some(),
                rank,
            },
            processes: self.processes.clone(),
        }
    }

    /// Runs `step` on the real job, as the process that takes it would.
    fn run(&mut self, step: &Step) {
        let id = self.job_id.clone();
        match step {
            Step::Acquire => {
                self.processes.messages -= 1;
                let store = self.store();
                let taken =
                    self.block_on(store.acquire_and_load(&id, "r", Duration::from_secs(600)));
                if let Acquired::Lease(lease) = taken.expect("redis answers").0 {
                    self.lease = Some(lease);
                    self.processes.runner = Some(Run::Taken);
                }
            }
            Step::ReadApprovals => {
                let approvals = self
                    .block_on(self.store().approvals(&id))
                    .expect("redis answers");
                let read = Call::ALL
                    .into_iter()
                    .filter(|call| approvals.decisions.contains_key(&call.hold()))
                    .collect();
                self.processes.runner = Some(Run::Read(read));
            }
            Step::Park => self.park(),
            Step::PlaceParked => {
                if let Some(Run::Parked(moves)) = self.processes.runner.take() {
                    let parked = Place::Parked {
                        wake_at_ms: now_ms() + 86_400_000,
                    };
                    let placed = self.store().steps().place(&id, Stamp::after(moves), parked);
                    self.block_on(placed).expect("redis answers");
                }
            }
            Step::Finish => self.finish(),
            Step::RunnerDies => self.runner_dies(),
            Step::Look {
                decider,
                call,
                choice,
            } => {
                let record = self.block_on(self.store().get(&id)).expect("redis answers");
                let record = record.expect("the job is kept while the test runs");
                let decision = Decision {
                    choice: *choice,
                    reason: "because".into(),
                    arguments: None,
                    result: None,
                    tenant: "default".into(),
                    // The same person on two clients: the second decider
                    // repeats the first when it chooses the same.
                    approver: Some("ana".into()),
                    at_ms: now_ms(),
                };
                let held = &self.held[call];
                let deciding = Decide::new(&id, &call.hold(), held, &decision, Seen::of(&record));
                self.deciding[*decider] = Some((deciding, decision));
                self.processes.deciders[*decider] = Some(Decider {
                    call: *call,
                    choice: *choice,
                    at: Deciding::Looked(Seen::of(&record)),
                });
            }
            Step::PlaceAhead { decider }
            | Step::WriteDecision { decider }
            | Step::PlaceRequeued { decider }
            | Step::Publish { decider } => self.decide(*decider),
            Step::DeciderDies { decider } => self.processes.deciders[*decider] = None,
            Step::Sweep => self.sweep(),
            Step::Wake => {
                if self
                    .block_on(self.store().wake(&id))
                    .expect("redis answers")
                    == Wake::Queued
                {
                    self.processes.messages += 1;
                }
            }
            Step::Cancel => {
                self.block_on(self.store().cancel(&id))
                    .expect("redis answers");
            }
            Step::LoseMessages => self.processes.messages = 0,
        }
    }

    fn park(&mut self) {
        let (Some(lease), Some(Run::Read(read))) =
            (self.lease.clone(), self.processes.runner.clone())
        else {
            unreachable!("a park follows a read under a lease");
        };
        let waiting = self.processes.waiting(&read);
        let keys: Vec<(&str, &str)> = waiting.iter().map(|c| (c.key(), c.key())).collect();
        let written = self.block_on(self.store().steps().write_park(&lease, &keys));
        self.processes.runner = match written.expect("the runner holds its lease") {
            ParkWrite::Parked { moves, .. } => {
                self.processes.settle(read);
                self.lease = None;
                Some(Run::Parked(moves))
            }
            ParkWrite::Not(Parked::Decided) => Some(Run::Taken),
            ParkWrite::Not(Parked::CancelRequested) => Some(Run::Ending),
            ParkWrite::Not(Parked::Parked) => unreachable!("a park that wrote says so"),
        };
    }

    fn finish(&mut self) {
        let lease = self.lease.take().expect("a run ends under its lease");
        let ending = match &self.processes.runner {
            Some(Run::Ending) => Ending::Cancelled,
            _ => Ending::Succeeded("done".into()),
        };
        let finish = self
            .store()
            .finish(&lease, &ending, Unstored::Nothing, None);
        self.block_on(finish).expect("the runner holds its lease");
        if let Some(Run::Read(read)) = self.processes.runner.take() {
            self.processes.settle(read);
        }
    }

    fn runner_dies(&mut self) {
        self.processes.runner = None;
        self.processes.messages += 1;
        if self.lease.take().is_some() {
            // The lease expires.
            let mut raw = self.env.raw.clone();
            let key = RedisKeys::default().job_lease(&self.job_id);
            let () = self
                .block_on(redis::cmd("DEL").arg(key).query_async(&mut raw))
                .map(|_: i64| ())
                .expect("redis answers");
        }
    }

    /// The next step of `at`'s `DecideCall`: the store's, or the API's
    /// publish.
    fn decide(&mut self, at: usize) {
        let Some(decider) = self.processes.deciders[at].clone() else {
            unreachable!("a decider decides");
        };
        if decider.at == Deciding::Publishing {
            self.processes.messages += 1;
            self.deciding[at] = None;
            self.processes.deciders[at] = None;
            return;
        }
        let (mut deciding, decision) = self.deciding[at].take().expect("a decision in progress");
        self.block_on(deciding.step(self.store()))
            .expect("redis answers");
        let publish = |decided: &Decided| match decided {
            Decided::Recorded { requeued } => *requeued,
            Decided::Already { first, requeued } => *requeued && decision.repeats(first),
            _ => false,
        };
        let next = match deciding.at().clone() {
            DecideStep::Seen(seen) => Some(Deciding::Looked(seen)),
            DecideStep::Ahead(seen) => Some(Deciding::Ahead(seen)),
            DecideStep::Requeued { moves, decided } => Some(Deciding::Requeued {
                moves,
                publish: publish(&decided),
            }),
            DecideStep::Done(decided) => publish(&decided).then_some(Deciding::Publishing),
        };
        // Once done, the store has nothing more to do.
        if deciding.done().is_none() {
            self.deciding[at] = Some((deciding, decision));
        }
        self.processes.deciders[at] = next.map(|at| Decider { at, ..decider });
    }

    /// The sweeper's look at the job in the unfinished index
    /// (`runner/sweep.rs`'s `sweep_one`).
    fn sweep(&mut self) {
        let keys = RedisKeys::default();
        let mut raw = self.env.raw.clone();
        let listed: Option<f64> = self
            .block_on(
                redis::cmd("ZSCORE")
                    .arg(keys.unfinished_jobs(&self.job_id))
                    .arg(self.job_id.as_str())
                    .query_async(&mut raw),
            )
            .expect("redis answers");
        if listed.is_none() {
            return;
        }
        let store = self.store();
        let record = self
            .block_on(store.get(&self.job_id))
            .expect("redis answers");
        match record {
            Some(record) if !record.status.is_final() => {
                let held = self.block_on(store.lease_held(&self.job_id));
                if !held.expect("redis answers") {
                    self.processes.messages += 1;
                }
            }
            _ => self.block_on(store.forget_place(&self.job_id)),
        }
    }
}

/// The system under test: the real job's steps.
struct LifeTest;

impl StateMachineTest for LifeTest {
    type SystemUnderTest = Job;
    type Reference = Life;

    fn init_test(_: &Model) -> Job {
        let env = ENV
            .with(|env| env.borrow().clone())
            .expect("the test set the servers up");
        let store = &env.store;
        let (job_id, lease, held) = env
            .runtime
            .block_on(async {
                let (job_id, _) = store.submit(&super::spec(), None, None).await?;
                let lease = super::lease(store, &job_id, "r", Duration::from_secs(600)).await?;
                let far = now_ms() + 86_400_000;
                let calls: Vec<HeldCall<'_>> = Call::ALL
                    .into_iter()
                    .map(|call| HeldCall {
                        expires_at_ms: if call == Call::Expired { 1 } else { far },
                        ..super::held(call.key(), "transfer", Duration::ZERO)
                    })
                    .collect();
                store.hold(&lease, "default", &calls).await?;
                let requests = store.approvals(&job_id).await?.requests;
                let held = Call::ALL
                    .into_iter()
                    .map(|call| (call, requests[&call.hold()].clone()))
                    .collect();
                anyhow::Ok((job_id, lease, held))
            })
            .expect("the job is set up");
        Job {
            env,
            job_id,
            held,
            lease: Some(lease),
            deciding: [None, None],
            processes: Processes::start(),
        }
    }

    fn apply(mut job: Job, model: &Model, step: Step) -> Job {
        job.run(&step);
        assert_eq!(
            job.observed(),
            Observed::of(model),
            "after {step:?}, Redis and the processes hold what the model says"
        );
        job
    }

    fn check_invariants(_: &Job, model: &Model) {
        check(model);
    }

    /// Every process dies; the sweeper and runners alone must run every
    /// decided call, without a wake-up at an expiry.
    fn teardown(mut job: Job, mut model: Model) {
        for dies in [
            Step::DeciderDies { decider: 0 },
            Step::DeciderDies { decider: 1 },
        ] {
            if Life::preconditions(&model, &dies) {
                model = Life::apply(model, &dies);
                job = LifeTest::apply(job, &model, dies);
            }
        }
        if model.processes.runner.is_some() {
            model = Life::apply(model, &Step::RunnerDies);
            job = LifeTest::apply(job, &model, Step::RunnerDies);
        }
        // Each queued message costs a run at most four steps (acquire,
        // read, park, move): the sweeps of a long case may have queued many.
        let bound = 8 + 4 * model.processes.messages;
        for _ in 0..bound {
            let Some(step) = recovery(&model) else {
                break;
            };
            model = Life::apply(model, &step);
            job = LifeTest::apply(job, &model, step);
            check(&model);
        }
        assert_eq!(recovery(&model), None, "recovery ends: {model:#?}");
        if model.status != Status::Ended {
            let decided: BTreeSet<Call> = model.decided.keys().copied().collect();
            assert!(
                model.status == Status::Parked && !model.requeued,
                "a job nobody runs after recovery is parked: {model:#?}"
            );
            assert!(
                decided.is_subset(&model.processes.settled),
                "every decided call ran: {model:#?}"
            );
        }
    }
}

/// The next step of recovery by the sweeper and runners alone.
fn recovery(model: &Model) -> Option<Step> {
    [
        Step::ReadApprovals,
        Step::Finish,
        Step::Park,
        Step::PlaceParked,
        Step::Acquire,
    ]
    .into_iter()
    .find(|step| Life::preconditions(model, step))
    .or_else(|| {
        let swept = Life::apply(model.clone(), &Step::Sweep);
        (swept.processes.messages > model.processes.messages || swept.indexes != model.indexes)
            .then_some(Step::Sweep)
    })
}

/// Runs `test` with the servers up.
fn with_servers(test: impl FnOnce()) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (redis, nats, store, raw) = runtime.block_on(async {
        let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
        let store = super::store(&redis, &nats).await?;
        let raw = redis::Client::open(redis.url())?
            .get_multiplexed_async_connection()
            .await?;
        anyhow::Ok((redis, nats, store, raw))
    })?;
    let env = Rc::new(Env {
        runtime,
        store,
        raw,
    });
    ENV.with(|cell| *cell.borrow_mut() = Some(env));
    test();
    ENV.with(|cell| cell.borrow_mut().take());
    drop((redis, nats));
    Ok(())
}

/// Plays `steps` from the start, each checked as in the random cases.
fn play(steps: &[Step]) {
    let mut model = Model::start();
    for step in steps {
        assert!(
            Life::preconditions(&model, step),
            "{step:?} can be taken: {model:#?}"
        );
        model = Life::apply(model, step);
    }
    LifeTest::test_sequential(Config::default(), Model::start(), steps.to_vec(), None);
}

#[test]
fn every_interleaving_of_parks_decisions_sweeps_and_deaths_runs_each_decided_call()
-> anyhow::Result<()> {
    with_servers(|| {
        let config = Config {
            cases: 192,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config.clone());
        let result = runner.run(&Life::sequential_strategy(1..48), |(start, steps, seen)| {
            LifeTest::test_sequential(config.clone(), start, steps, seen);
            Ok(())
        });
        if let Err(failure) = result {
            panic!("{failure}");
        }
    })
}

/// The two races of issue 49, step by step.
#[test]
fn a_decision_during_a_resume_and_a_decider_killed_mid_decision_strand_nothing()
-> anyhow::Result<()> {
    let approve = |decider, call| Step::Look {
        decider,
        call,
        choice: Choice::Approval(ApprovalChoice::Approved),
    };
    // The job parks waiting for A, B and K, and A's decision is written.
    let a_decided = [
        Step::ReadApprovals,
        Step::Park,
        Step::PlaceParked,
        approve(0, Call::A),
        Step::PlaceAhead { decider: 0 },
        Step::WriteDecision { decider: 0 },
    ];
    with_servers(|| {
        // The job resumes for A; B is approved while the resumed round
        // runs (it read A only): the park, for B and K, must not hide B.
        play(
            &[
                &a_decided[..],
                &[
                    Step::PlaceRequeued { decider: 0 },
                    Step::Publish { decider: 0 },
                    Step::Acquire,
                    Step::ReadApprovals,
                    approve(1, Call::B),
                    Step::WriteDecision { decider: 1 },
                    Step::Park,
                    Step::ReadApprovals,
                    Step::Park,
                    Step::PlaceParked,
                ],
            ]
            .concat(),
        );
        // The decider dies right after the decision, before its move and
        // publish; the sweeper alone finds the job (the teardown checks).
        play(&[&a_decided[..], &[Step::DeciderDies { decider: 0 }]].concat());
        // The same, its retry on another replica: the same decision moves
        // and publishes the job again.
        play(
            &[
                &a_decided[..],
                &[
                    Step::DeciderDies { decider: 0 },
                    approve(1, Call::A),
                    Step::WriteDecision { decider: 1 },
                    Step::PlaceRequeued { decider: 1 },
                    Step::Publish { decider: 1 },
                    Step::Acquire,
                ],
            ]
            .concat(),
        );
        // The sweeper queued the job many times while nobody ran it (a CI
        // case): every message is taken, and the job parks again each time.
        play(&[vec![Step::RunnerDies], vec![Step::Sweep; 7]].concat());
        // A park's move that lands after a decision queued the job again
        // is dropped: it would hide the job from the sweeper.
        play(&[
            Step::ReadApprovals,
            Step::Park,
            approve(0, Call::A),
            Step::PlaceAhead { decider: 0 },
            Step::WriteDecision { decider: 0 },
            Step::PlaceRequeued { decider: 0 },
            Step::PlaceParked,
        ]);
    })
}
