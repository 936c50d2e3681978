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
    pub async fn status(&self, job_id: &JobId) -> Result<Option<JobStatus>, Error> {
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

    /// The last attempt dispatched for each call of the job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn attempts(&self, job_id: &JobId) -> Result<HashMap<String, u32>, Error> {
        Ok(self.conn().hgetall(self.keys.job_attempts(job_id)).await?)
    }

    /// The envelope a worker stored for one attempt of a call to `tool`.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn call_result(
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

    /// What a watch of `job_id` from `offset` starts from, read in one
    /// round trip: who owns the job, its trace, and its first `count`
    /// events from `offset` on. `None` for an unknown or expired job. Reads
    /// of the job's spec only its tenant: the rest is not a watch's.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for a spec without a tenant.
    pub async fn watch_start(
        &self,
        job_id: &JobId,
        offset: u64,
        count: usize,
    ) -> Result<Option<WatchStart>, Error> {
        /// The one field of a spec a watch needs; serde skips the others.
        #[derive(serde::Deserialize)]
        struct Owner {
            tenant: String,
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
            trace: JobTrace::from_fields(
                traceparent.as_deref().unwrap_or_default(),
                tracestate.as_deref().unwrap_or_default(),
            ),
            events: events.ids.iter().filter_map(parse_event).collect(),
        }))
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

    /// Subscribes to the wake-ups sent whenever `job_id` gets new events.
    /// Redis stays the source of truth: a wake-up only says "read again".
    ///
    /// # Errors
    ///
    /// NATS refused the subscription.
    pub async fn subscribe_events(
        &self,
        job_id: &JobId,
    ) -> Result<WakeUps, async_nats::SubscribeError> {
        WakeUps::subscribe(&self.nats, self.watchers.clone(), job_id).await
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

/// What a watch starts from ([`JobStore::watch_start`]).
#[derive(Debug)]
pub struct WatchStart {
    /// Who submitted the job: only they may watch it.
    pub tenant: String,
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
    let field = |name: &str| fields.get(name).map(String::as_str).unwrap_or_default();
    let number = |name: &str| field(name).parse::<u64>().unwrap_or_default();
    let spec: JobSpec = serde_json::from_str(field("spec")).map_err(|_| corrupt("spec"))?;
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
        wire_ids: WireIds::from_secret(field("call_secret")),
        trace: JobTrace::from_fields(field("traceparent"), field("tracestate")),
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
            tools: vec!["echo".into()],
            max_tool_rounds: 8,
            parallel_tool_calls: true,
            deadline_ms: 99,
            metadata: Default::default(),
            tenant: "acme".into(),
            limits: Default::default(),
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
        ]);
        let record = parse_record(&job(), &hash).unwrap().unwrap();
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
}
