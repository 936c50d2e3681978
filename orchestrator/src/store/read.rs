//! Reads of a job: its record, its run's start, its conversation, attempts
//! and stored results, and its events (the API's and the watchers').

use std::collections::HashMap;

use redis::AsyncCommands;

use crate::job::{Item, JobError, JobRecord, JobSpec, JobStatus, JobTrace, ToolManifest, WireIds};

use super::*;

impl JobStore {
    /// The job record, or `None` for an unknown (or expired) job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] when the record does not parse.
    pub async fn get(&self, job_id: &JobId) -> Result<Option<JobRecord>, Error> {
        let key = self.keys.job(job_id);
        let fields: HashMap<String, String> =
            read_with_retry(|| async { self.conn().hgetall(&key).await }).await?;
        parse_record(job_id, &fields)
    }

    /// The records of `job_ids`, in order, read in one round trip; `None`
    /// for an unknown (or expired) job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] when a record does not parse.
    pub(crate) async fn records(&self, job_ids: &[JobId]) -> Result<Vec<Option<JobRecord>>, Error> {
        let mut pipe = redis::pipe();
        for job_id in job_ids {
            pipe.hgetall(self.keys.job(job_id));
        }
        let fields: Vec<Fields> =
            read_with_retry(|| async { pipe.query_async(&mut self.conn()).await }).await?;
        job_ids
            .iter()
            .zip(&fields)
            .map(|(job_id, fields)| parse_record(job_id, fields))
            .collect()
    }

    /// What a run starts from, read in one round trip: the job record (`None`
    /// for an unknown or expired job), the manifests its model was offered
    /// and its conversation
    /// ([`items`](Self::items)).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for a record, manifest or item
    /// that does not parse.
    pub async fn load_run(&self, job_id: &JobId) -> Result<Option<RunStart>, Error> {
        let mut pipe = redis::pipe();
        self.load_run_commands(&mut pipe, job_id);
        let (fields, offered, items): (Fields, Fields, Vec<String>) =
            read_with_retry(|| async { pipe.query_async(&mut self.conn()).await }).await?;
        parse_run_start(job_id, &fields, &offered, &items)
    }

    /// The reads of [`load_run`](Self::load_run): the job, its offered
    /// tools, its items.
    pub(super) fn load_run_commands(&self, pipe: &mut redis::Pipeline, job_id: &JobId) {
        pipe.hgetall(self.keys.job(job_id))
            .hgetall(self.keys.job_tools(job_id))
            .lrange(self.keys.job_items(job_id), 0, -1);
    }

    /// The job's status alone, or `None` for an unknown (or expired) job:
    /// what a watcher needs, without reading and parsing the whole record.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for a status that does not
    /// parse.
    pub(crate) async fn status(&self, job_id: &JobId) -> Result<Option<JobStatus>, Error> {
        let key = self.keys.job(job_id);
        let status: Option<String> =
            read_with_retry(|| async { self.conn().hget(&key, "status").await }).await?;
        status
            .map(|status| {
                status.parse().map_err(|_| Error::Corrupt {
                    job_id: job_id.to_owned(),
                    detail: "status".to_owned(),
                })
            })
            .transpose()
    }

    /// Whether a client asked to cancel the job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn cancel_requested(&self, job_id: &JobId) -> Result<bool, Error> {
        let flag: Option<String> = self
            .conn()
            .hget(self.keys.job(job_id), "cancel_requested")
            .await?;
        Ok(flag.as_deref() == Some("1"))
    }

    /// The conversation items from index `from` on.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for an item that does not parse.
    pub async fn items(&self, job_id: &JobId, from: usize) -> Result<Vec<Item>, Error> {
        let start = isize::try_from(from).unwrap_or(isize::MAX);
        let key = self.keys.job_items(job_id);
        let texts: Vec<String> =
            read_with_retry(|| async { self.conn().lrange(&key, start, -1).await }).await?;
        parse_items(job_id, &texts)
    }

    /// The envelope a worker stored for one attempt of a call to `tool`.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn call_result(
        &self,
        job_id: &JobId,
        tool: &str,
        call_id: &str,
        attempt: u32,
    ) -> Result<Option<String>, Error> {
        Ok(self
            .conn()
            .get(self.keys.call_result(job_id, tool, call_id, attempt))
            .await?)
    }

    /// What the job holds of its shaped results for `read_result`
    /// (docs/protection.md): whether it holds any, and the whole data of
    /// `call`'s, read in one round trip.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn shaped_result(
        &self,
        job_id: &JobId,
        call: &str,
    ) -> Result<(bool, Option<String>), Error> {
        let key = self.keys.job_shaped(job_id);
        let mut pipe = redis::pipe();
        pipe.exists(&key).hget(&key, call);
        Ok(read_with_retry(|| async { pipe.query_async(&mut self.conn()).await }).await?)
    }

    /// What a watch of `job_id` from `offset` starts from, read in one
    /// round trip: who owns the job, its trace, and its first `count`
    /// events from `offset` on. `None` for an unknown or expired job. Reads
    /// of the job's spec only its tenant, submitter and whether it streams:
    /// the rest is not a watch's.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for a spec without a tenant.
    pub(crate) async fn watch_start(
        &self,
        job_id: &JobId,
        offset: u64,
        count: usize,
    ) -> Result<Option<WatchStart>, Error> {
        /// The fields of a spec a watch needs; serde skips the others.
        #[derive(serde::Deserialize)]
        struct Owner {
            tenant: String,
            #[serde(default)]
            submitter: Option<String>,
            #[serde(default)]
            stream: bool,
        }
        let mut pipe = redis::pipe();
        pipe.hmget(
            self.keys.job(job_id),
            &["spec", "traceparent", "tracestate"],
        )
        .xrange_count(
            self.keys.job_events(job_id),
            events_start(offset),
            "+",
            count,
        );
        /// The spec, `traceparent` and `tracestate` fields of the job.
        type JobFields = (Option<String>, Option<String>, Option<String>);
        let ((spec, traceparent, tracestate), events): (
            JobFields,
            redis::streams::StreamRangeReply,
        ) = read_with_retry(|| async { pipe.query_async(&mut self.conn()).await }).await?;
        let Some(spec) = spec else {
            return Ok(None);
        };
        let owner: Owner = serde_json::from_str(&spec).map_err(|_| Error::Corrupt {
            job_id: job_id.to_owned(),
            detail: "spec".to_owned(),
        })?;
        Ok(Some(WatchStart {
            tenant: owner.tenant,
            submitter: owner.submitter,
            stream: owner.stream,
            trace: JobTrace::from_fields(
                traceparent.as_deref().unwrap_or_default(),
                tracestate.as_deref().unwrap_or_default(),
            ),
            events: events.ids.iter().filter_map(parse_event).collect(),
        }))
    }

    /// The submitter `job_id`'s record names (`JobSpec::submitter`), read
    /// alone of its spec; `None` when it names none or the job is gone.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for a spec that does not
    /// parse.
    pub(super) async fn recorded_submitter(&self, job_id: &JobId) -> Result<Option<String>, Error> {
        /// The one field read; serde skips the others.
        #[derive(serde::Deserialize)]
        struct Submitted {
            #[serde(default)]
            submitter: Option<String>,
        }
        let key = self.keys.job(job_id);
        let spec: Option<String> =
            read_with_retry(|| async { self.conn().hget(&key, "spec").await }).await?;
        let Some(spec) = spec else {
            return Ok(None);
        };
        let submitted: Submitted = serde_json::from_str(&spec).map_err(|_| Error::Corrupt {
            job_id: job_id.to_owned(),
            detail: "spec".to_owned(),
        })?;
        Ok(submitted.submitter)
    }

    /// Events from `offset` on, at most `count`.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn events(
        &self,
        job_id: &JobId,
        offset: u64,
        count: usize,
    ) -> Result<Vec<Event>, Error> {
        let key = self.keys.job_events(job_id);
        let start = events_start(offset);
        let reply: redis::streams::StreamRangeReply =
            read_with_retry(|| async { self.conn().xrange_count(&key, &start, "+", count).await })
                .await?;
        Ok(reply.ids.iter().filter_map(parse_event).collect())
    }

    /// The last event of `job_id`'s log, if it has any: for a finished job,
    /// its final event.
    ///
    /// # Errors
    ///
    /// Redis is unreachable.
    pub async fn last_event(&self, job_id: &JobId) -> Result<Option<Event>, Error> {
        let key = self.keys.job_events(job_id);
        let reply: redis::streams::StreamRangeReply =
            read_with_retry(|| async { self.conn().xrevrange_count(&key, "+", "-", 1).await })
                .await?;
        Ok(reply.ids.iter().find_map(parse_event))
    }
}

/// What [`JobStore::load_run`] read, parsed; `None` for a job with no record.
pub(super) fn parse_run_start(
    job_id: &JobId,
    fields: &Fields,
    offered: &Fields,
    items: &[String],
) -> Result<Option<RunStart>, Error> {
    let Some(record) = parse_record(job_id, fields)? else {
        return Ok(None);
    };
    Ok(Some(RunStart {
        record,
        offered: parse_manifests(job_id, offered)?,
        items: parse_items(job_id, items)?,
    }))
}

/// What a watch starts from (`JobStore::watch_start`).
#[derive(Debug)]
pub struct WatchStart {
    /// The tenant that submitted the job: only it may watch it.
    pub tenant: String,
    /// Which of its credentials submitted it (`JobSpec::submitter`).
    pub submitter: Option<String>,
    /// Whether its turns are streamed to its watchers.
    pub stream: bool,
    /// The job's trace, when it is traced.
    pub trace: Option<JobTrace>,
    /// The first events from the watch's offset on.
    pub events: Vec<Event>,
}

/// What a run starts from ([`JobStore::load_run`]).
#[derive(Debug)]
pub struct RunStart {
    /// The job record.
    pub record: JobRecord,
    /// The manifests the job's model was offered so far.
    pub offered: Vec<ToolManifest>,
    /// The conversation.
    pub items: Vec<Item>,
}

/// A job record from its hash's `fields`; `None` when there are none.
fn parse_record(
    job_id: &JobId,
    fields: &HashMap<String, String>,
) -> Result<Option<JobRecord>, Error> {
    if fields.is_empty() {
        return Ok(None);
    }
    let corrupt = |detail: &str| Error::Corrupt {
        job_id: job_id.to_owned(),
        detail: detail.to_owned(),
    };
    toolfleet_proto::format::read("the job", fields.get("format").map(String::as_str)).map_err(
        |unreadable| Error::Unreadable {
            job_id: job_id.to_owned(),
            unreadable,
        },
    )?;
    let field = |name: &str| fields.get(name).map(String::as_str).unwrap_or_default();
    let number = |name: &str| field(name).parse::<u64>().unwrap_or_default();
    let mut spec: JobSpec = serde_json::from_str(field("spec")).map_err(|_| corrupt("spec"))?;
    // The deadline does not run while the job is parked for an approval
    // (decision 0036): it moves by the time parked so far, which the lease
    // adds up each time a runner takes the job again.
    spec.deadline_ms = spec.deadline_ms.saturating_add(number("parked_ms"));
    let status: JobStatus = field("status").parse().map_err(|_| corrupt("status"))?;
    let error = match fields.get("error_code") {
        Some(code) => Some(JobError {
            code: code.parse().map_err(|_| corrupt("error_code"))?,
            message: field("error_message").to_owned(),
        }),
        None => None,
    };
    Ok(Some(JobRecord {
        job_id: job_id.to_owned(),
        spec,
        status,
        output_text: field("output_text").to_owned(),
        error,
        rounds: u32::try_from(number("rounds")).unwrap_or(u32::MAX),
        turns: u32::try_from(number("turns")).unwrap_or(u32::MAX),
        created_at_ms: number("created_at_ms"),
        finished_at_ms: number("finished_at_ms"),
        cancel_requested: field("cancel_requested") == "1",
        moves: number("moves"),
        requeued: field("requeued") == "1",
        events: number("events"),
        wire_ids: WireIds::from_secret(field("call_secret")),
        trace: JobTrace::from_fields(field("traceparent"), field("tracestate")),
        shaped: field("shaped") == "1",
        spent: Spend {
            tokens: number(SPENT_TOKENS),
            cost_units: number(SPENT_COST_UNITS),
            tool_calls: number(SPENT_TOOL_CALLS),
        },
        budget_exceeded: Limit::parse(field(BUDGET_EXCEEDED)),
    }))
}

/// Offered manifests from the job's tools hash.
fn parse_manifests(
    job_id: &JobId,
    stored: &HashMap<String, String>,
) -> Result<Vec<ToolManifest>, Error> {
    stored
        .values()
        .map(|text| {
            serde_json::from_str(text).map_err(|e| Error::Corrupt {
                job_id: job_id.to_owned(),
                detail: format!("offered tool: {e}"),
            })
        })
        .collect()
}

/// Conversation items from their stored JSON texts.
fn parse_items(job_id: &JobId, texts: &[String]) -> Result<Vec<Item>, Error> {
    texts
        .iter()
        .map(|t| {
            serde_json::from_str(t).map_err(|e| Error::Corrupt {
                job_id: job_id.to_owned(),
                detail: format!("item: {e}"),
            })
        })
        .collect()
}

/// The stream id of event `offset`, the first an `XRANGE` from it reads.
/// Saturating: `from_offset = u64::MAX` reads nothing, never wraps to 0.
fn events_start(offset: u64) -> String {
    format!("0-{}", offset.saturating_add(1))
}

fn parse_event(entry: &redis::streams::StreamId) -> Option<Event> {
    let seq: u64 = entry.id.strip_prefix("0-")?.parse().ok()?;
    let text = |name: &str| -> Option<String> { entry.get(name) };
    Some(Event {
        offset: seq.checked_sub(1)?,
        kind: text("kind")?,
        data: text("data").unwrap_or_default(),
        timestamp_ms: text("ts").and_then(|t| t.parse().ok()).unwrap_or_default(),
        is_final: text("final").is_some_and(|f| f == "1"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobErrorCode, ProviderKind};

    fn job() -> JobId {
        JobId::new("acme", 1, 2)
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
            tools: vec!["echo".into()],
            max_tool_rounds: 8,
            parallel_tool_calls: true,
            deadline_ms: 99,
            metadata: Default::default(),
            tenant: "acme".into(),
            submitter: None,
            approval: Default::default(),
            limits: Default::default(),
            budget: Default::default(),
        }
    }

    fn fields(pairs: &[(&str, &str)]) -> Fields {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn corrupt_detail(err: Error) -> String {
        match err {
            Error::Corrupt { job_id, detail } => {
                assert_eq!(job_id, job(), "names the job");
                detail
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_record_reads_back_from_its_hash() {
        let spec_json = serde_json::to_string(&spec()).unwrap();
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let hash = fields(&[
            ("spec", &spec_json),
            ("status", "failed"),
            ("error_code", "MODEL_REJECTED"),
            ("error_message", "no"),
            ("rounds", "2"),
            ("turns", "3"),
            ("created_at_ms", "5"),
            ("finished_at_ms", "9"),
            ("cancel_requested", "1"),
            ("call_secret", "s3cret"),
            ("traceparent", traceparent),
            ("parked_ms", "1000"),
        ]);
        let record = parse_record(&job(), &hash).unwrap().unwrap();
        assert_eq!(
            record.spec.deadline_ms,
            99 + 1000,
            "moved by the time parked"
        );
        assert_eq!(record.job_id, job());
        assert_eq!(record.spec.tools, ["echo"]);
        assert_eq!(record.status, JobStatus::Failed);
        let error = record.error.unwrap();
        assert_eq!(
            (error.code, error.message.as_str()),
            (JobErrorCode::ModelRejected, "no")
        );
        assert_eq!((record.rounds, record.turns), (2, 3));
        assert_eq!((record.created_at_ms, record.finished_at_ms), (5, 9));
        assert!(record.cancel_requested);
        assert_eq!(record.wire_ids, WireIds::from_secret("s3cret"));
        assert_eq!(
            record.trace.map(|t| t.trace_id()),
            Some("0af7651916cd43dd8448eb211c80319c".to_owned())
        );
    }

    #[test]
    fn a_hash_that_is_not_there_is_no_job() {
        assert!(parse_record(&job(), &Fields::new()).unwrap().is_none());
        let run = parse_run_start(&job(), &Fields::new(), &Fields::new(), &[]).unwrap();
        assert!(run.is_none());
    }

    #[test]
    fn an_unreadable_field_names_the_job_and_the_field() {
        let spec_json = serde_json::to_string(&spec()).unwrap();
        for (hash, field) in [
            (fields(&[("status", "queued")]), "spec"),
            (fields(&[("spec", "{"), ("status", "queued")]), "spec"),
            (
                fields(&[("spec", &spec_json), ("status", "paused")]),
                "status",
            ),
            (
                fields(&[
                    ("spec", &spec_json),
                    ("status", "failed"),
                    ("error_code", "OOPS"),
                ]),
                "error_code",
            ),
        ] {
            let err = parse_record(&job(), &hash).unwrap_err();
            assert_eq!(corrupt_detail(err), field);
        }
        // Counters are the store's own numbers: one that does not read is 0.
        let hash = fields(&[("spec", &spec_json), ("status", "running"), ("rounds", "x")]);
        assert_eq!(parse_record(&job(), &hash).unwrap().unwrap().rounds, 0);
    }

    #[test]
    fn items_and_offered_tools_read_back_or_name_what_is_corrupt() {
        let item = Item::User { text: "hi".into() };
        let items = parse_items(&job(), &[item.stored_json()]).unwrap();
        assert_eq!(items, [item]);
        let err = parse_items(&job(), &["{\"kind\":".to_owned()]).unwrap_err();
        assert!(corrupt_detail(err).starts_with("item: "));
        let manifest = ToolManifest::new(
            "echo",
            "says it back",
            serde_json::json!({"type": "object"}),
        );
        let offered = fields(&[("echo", &serde_json::to_string(&manifest).unwrap())]);
        assert_eq!(parse_manifests(&job(), &offered).unwrap(), [manifest]);
        let err = parse_manifests(&job(), &fields(&[("echo", "[]")])).unwrap_err();
        assert!(corrupt_detail(err).starts_with("offered tool: "));
    }

    #[test]
    fn event_offsets_map_to_stream_ids_and_back() {
        assert_eq!(events_start(0), "0-1");
        assert_eq!(events_start(41), "0-42");
        assert_eq!(
            events_start(u64::MAX),
            format!("0-{}", u64::MAX),
            "never wraps to 0"
        );
        let entry = |id: &str, pairs: &[(&str, &str)]| redis::streams::StreamId {
            id: id.to_owned(),
            map: pairs
                .iter()
                .map(|(k, v)| {
                    (
                        (*k).to_owned(),
                        redis::Value::BulkString(v.as_bytes().to_vec()),
                    )
                })
                .collect(),
            ..Default::default()
        };
        let event = parse_event(&entry(
            "0-3",
            &[
                ("kind", "job_succeeded"),
                ("data", "{}"),
                ("ts", "7"),
                ("final", "1"),
            ],
        ))
        .unwrap();
        assert_eq!(
            (
                event.offset,
                event.kind.as_str(),
                event.timestamp_ms,
                event.is_final
            ),
            (2, "job_succeeded", 7, true)
        );
        assert!(
            parse_event(&entry("0-0", &[("kind", "k")])).is_none(),
            "no offset -1"
        );
        assert!(
            parse_event(&entry("1-3", &[("kind", "k")])).is_none(),
            "not ours"
        );
        assert!(
            parse_event(&entry("0-3", &[("data", "{}")])).is_none(),
            "no kind"
        );
    }

    fn entry(id: &str, pairs: &[(&str, &[u8])]) -> redis::streams::StreamId {
        redis::streams::StreamId {
            id: id.to_owned(),
            map: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), redis::Value::BulkString(v.to_vec())))
                .collect(),
            ..Default::default()
        }
    }

    /// A job as submission writes it (`CREATE` in `submit`): queued, no
    /// outcome, no turn yet, and no trace when the client sent none.
    #[test]
    fn a_submitted_record_reads_back_queued_with_no_outcome_or_trace() {
        let spec_json = serde_json::to_string(&spec()).unwrap();
        let hash = fields(&[
            ("spec", &spec_json),
            ("status", JobStatus::Queued.as_str()),
            ("created_at_ms", "1700000000123"),
            ("rounds", "0"),
            ("epoch", "0"),
            ("events", "1"),
            ("call_secret", "s3cret"),
            ("traceparent", ""),
            ("tracestate", ""),
        ]);
        let record = parse_record(&job(), &hash).unwrap().unwrap();
        assert_eq!(record.spec, spec());
        assert_eq!(record.status, JobStatus::Queued);
        assert_eq!((record.output_text.as_str(), record.error), ("", None));
        assert_eq!((record.rounds, record.turns), (0, 0));
        assert_eq!(
            (record.created_at_ms, record.finished_at_ms),
            (1_700_000_000_123, 0)
        );
        assert!(!record.cancel_requested);
        assert_eq!(record.wire_ids, WireIds::from_secret("s3cret"));
        assert!(record.trace.is_none());
    }

    /// Each way a job ends, as its writer stores it (a run's last commit,
    /// a cancel before it started, a lost job), reads back as that outcome.
    #[test]
    fn each_ending_reads_back_as_its_outcome() {
        let spec_json = serde_json::to_string(&spec()).unwrap();
        let succeeded = fields(&[
            ("spec", &spec_json),
            ("status", "succeeded"),
            ("output_text", "42"),
            ("finished_at_ms", "9"),
        ]);
        let record = parse_record(&job(), &succeeded).unwrap().unwrap();
        assert_eq!(record.status, JobStatus::Succeeded);
        assert_eq!((record.output_text.as_str(), record.error), ("42", None));
        assert_eq!(record.finished_at_ms, 9);
        for (status, code, message) in [
            (
                JobStatus::Cancelled,
                JobErrorCode::Cancelled,
                "the job was cancelled before it started",
            ),
            (JobStatus::Failed, JobErrorCode::JobStateLost, "lost"),
            (JobStatus::Failed, JobErrorCode::ModelRejected, ""),
        ] {
            let mut hash = fields(&[
                ("spec", &spec_json),
                ("status", status.as_str()),
                ("error_code", code.as_str()),
            ]);
            if !message.is_empty() {
                hash.insert("error_message".into(), message.into());
            }
            let record = parse_record(&job(), &hash).unwrap().unwrap();
            assert_eq!(record.status, status);
            assert_eq!(
                record.error,
                Some(JobError {
                    code,
                    message: message.into()
                })
            );
        }
    }

    #[test]
    fn counters_out_of_range_saturate_and_only_1_is_a_cancel_request() {
        let spec_json = serde_json::to_string(&spec()).unwrap();
        for (rounds, expected) in [
            ("4294967295", u32::MAX),
            ("4294967296", u32::MAX),
            ("18446744073709551615", u32::MAX),
            ("-1", 0),
            ("", 0),
        ] {
            let hash = fields(&[
                ("spec", &spec_json),
                ("status", "running"),
                ("rounds", rounds),
            ]);
            let record = parse_record(&job(), &hash).unwrap().unwrap();
            assert_eq!(record.rounds, expected, "{rounds:?}");
        }
        for (flag, requested) in [("1", true), ("0", false), ("true", false), ("", false)] {
            let hash = fields(&[
                ("spec", &spec_json),
                ("status", "running"),
                ("cancel_requested", flag),
            ]);
            let record = parse_record(&job(), &hash).unwrap().unwrap();
            assert_eq!(record.cancel_requested, requested, "{flag:?}");
        }
    }

    /// Whatever a hash holds, reading it answers a record or names what
    /// is corrupt: it never panics.
    #[test]
    fn a_hostile_hash_is_corrupt_not_a_panic() {
        let deep = "[".repeat(100_000);
        for (spec, status, field) in [
            ("null", "queued", "spec"),
            ("[]", "queued", "spec"),
            ("{}", "queued", "spec"),
            (deep.as_str(), "queued", "spec"),
            ("\u{0}", "queued", "spec"),
        ] {
            let hash = fields(&[("spec", spec), ("status", status)]);
            let err = parse_record(&job(), &hash).unwrap_err();
            assert_eq!(corrupt_detail(err), field, "{spec:.20}");
        }
        let spec_json = serde_json::to_string(&spec()).unwrap();
        for status in ["", "QUEUED", " queued", "queued\0"] {
            let hash = fields(&[("spec", &spec_json), ("status", status)]);
            let err = parse_record(&job(), &hash).unwrap_err();
            assert_eq!(corrupt_detail(err), "status", "{status:?}");
        }
        let err = parse_items(&job(), std::slice::from_ref(&deep)).unwrap_err();
        assert!(corrupt_detail(err).starts_with("item: "));
        let err = parse_manifests(&job(), &fields(&[("echo", &deep)])).unwrap_err();
        assert!(corrupt_detail(err).starts_with("offered tool: "));
    }

    #[test]
    fn a_run_start_reads_back_its_record_offered_tools_and_conversation() {
        let spec_json = serde_json::to_string(&spec()).unwrap();
        let record = fields(&[("spec", &spec_json), ("status", "running"), ("turns", "2")]);
        let manifests = [
            ToolManifest::new("echo", "says it back", serde_json::json!({})),
            ToolManifest::new("sleep", "waits", serde_json::json!({})),
        ];
        let offered: Fields = manifests
            .iter()
            .map(|m| (m.name.clone(), serde_json::to_string(m).unwrap()))
            .collect();
        let items = [
            Item::User { text: "hi".into() },
            Item::Reasoning {
                raw: serde_json::json!({"id": "rs_1"}),
            },
            Item::ToolCall {
                call_id: "call_1".into(),
                name: "echo".into(),
                arguments: "{\"text\":\"hi\"}".into(),
                raw: Some(serde_json::json!({"id": "fc_1"})),
            },
            Item::ToolResult {
                call_id: "call_1".into(),
                name: "echo".into(),
                output: "{\"ok\":true}".into(),
                attempts: 2,
            },
            Item::Assistant {
                text: "hi".into(),
                raw: None,
            },
        ];
        let texts: Vec<String> = items.iter().map(Item::stored_json).collect();
        let run = parse_run_start(&job(), &record, &offered, &texts)
            .unwrap()
            .unwrap();
        assert_eq!((run.record.job_id.clone(), run.record.turns), (job(), 2));
        assert_eq!(run.items, items, "in order");
        let mut read = run.offered;
        read.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(read, manifests);
    }

    /// A run never starts from part of its state: a corrupt record,
    /// offered tool or item fails the whole read, named.
    #[test]
    fn a_run_start_with_a_corrupt_part_names_it() {
        let spec_json = serde_json::to_string(&spec()).unwrap();
        let record = fields(&[("spec", &spec_json), ("status", "running")]);
        let item = Item::User { text: "hi".into() }.stored_json();
        let err = parse_run_start(
            &job(),
            &fields(&[("spec", "{"), ("status", "running")]),
            &Fields::new(),
            std::slice::from_ref(&item),
        )
        .unwrap_err();
        assert_eq!(corrupt_detail(err), "spec");
        let err = parse_run_start(
            &job(),
            &record,
            &fields(&[("echo", "{")]),
            std::slice::from_ref(&item),
        )
        .unwrap_err();
        assert!(corrupt_detail(err).starts_with("offered tool: "));
        let err =
            parse_run_start(&job(), &record, &Fields::new(), &[item, "{".into()]).unwrap_err();
        assert!(corrupt_detail(err).starts_with("item: "));
    }

    #[test]
    fn an_event_reads_back_at_the_offset_its_stream_id_stands_for() {
        for offset in [0, 1, 41, u64::MAX - 1] {
            let read = parse_event(&entry(&events_start(offset), &[("kind", b"k")])).unwrap();
            assert_eq!(read.offset, offset);
        }
        // What the scripts always write, and only they: without it an
        // event reads with no data, no time, and not final.
        let bare = parse_event(&entry("0-1", &[("kind", b"model_turn")])).unwrap();
        assert_eq!(
            bare,
            Event {
                offset: 0,
                kind: "model_turn".into(),
                data: String::new(),
                timestamp_ms: 0,
                is_final: false,
            }
        );
        let odd = parse_event(&entry(
            "0-1",
            &[("kind", b"k"), ("ts", b"soon"), ("final", b"true")],
        ))
        .unwrap();
        assert_eq!((odd.timestamp_ms, odd.is_final), (0, false), "final is 1");
    }

    /// An entry this store did not write is skipped, never a panic.
    #[test]
    fn a_foreign_stream_entry_is_no_event() {
        for id in [
            "",
            "0-",
            "0",
            "0-x",
            "0--1",
            "0-3-1",
            "00-3",
            "0-99999999999999999999999",
            "1700000000000-0",
        ] {
            assert!(
                parse_event(&entry(id, &[("kind", b"k")])).is_none(),
                "{id:?}"
            );
        }
        assert!(
            parse_event(&entry("0-1", &[("kind", &[0xff, 0xfe])])).is_none(),
            "a kind that is not text"
        );
    }
}
