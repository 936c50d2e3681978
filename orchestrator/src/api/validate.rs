//! What the API accepts, as data: each check of a request names the field it
//! refuses and why, and runs before anything is stored or counted. A
//! submission's own fields are checked first ([`SUBMISSION_CHECKS`], in
//! order), then its model, then the tools its tenant may use; the tenant's
//! limits come after, in [`crate::quota`].

use std::collections::HashMap;
use std::time::Duration;

use tonic::Status;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::manifest::{is_tool_pattern, is_valid_tool_name};
use toolfleet_proto::v1;

use super::ECHO_CHARS;
use super::convert::{invalid, not_found};
use super::options::ApiOptions;
use crate::auth::Caller;
use crate::budget::Budget;
use crate::job::{
    ApprovalPolicy, CallSpec, JobId, JobLimits, JobRecord, JobSpec, JobStatus, ProviderKind,
    UnknownOutcome, now_ms,
};
use crate::model::scripted::Scripted;
use crate::store::{CreatedWindow, ListCursor, MAX_SUBMITTED_MS};

/// What a request is checked against: the API's options, and whether the
/// real providers have an API key.
#[derive(Clone, Copy)]
pub(super) struct Rules<'a> {
    pub(super) options: &'a ApiOptions,
    /// Which providers' API keys this orchestrator has.
    pub(super) keys: ApiKeys,
}

/// Which providers' API keys an orchestrator has.
#[derive(Debug, Clone, Copy)]
pub(super) struct ApiKeys {
    pub(super) openai: bool,
    pub(super) anthropic: bool,
}

impl ApiKeys {
    /// Whether `provider` can be called, and if not, the variable to set.
    fn missing(self, provider: &ProviderKind) -> Option<&'static str> {
        match provider {
            ProviderKind::OpenaiResponses | ProviderKind::OpenaiChat => {
                (!self.openai).then_some("OPENAI_API_KEY (or openai.api_key_file)")
            }
            ProviderKind::AnthropicMessages => {
                (!self.anthropic).then_some("ANTHROPIC_API_KEY (or anthropic.api_key_file)")
            }
            ProviderKind::Scripted | ProviderKind::Call => None,
        }
    }
}

/// One check of a submission's own fields: the field its error names, and
/// what is wrong with the request, if anything.
struct FieldCheck {
    field: &'static str,
    problem: fn(&v1::SubmitJobRequest, &ApiOptions) -> Option<String>,
}

/// Every check of a submission's own fields, in the order they run.
const SUBMISSION_CHECKS: &[FieldCheck] = &[
    FieldCheck {
        field: "input",
        problem: |r, _| {
            (r.call.is_none() && r.input.trim().is_empty()).then(|| "must not be empty".into())
        },
    },
    FieldCheck {
        field: "input",
        problem: |r, o| over_bytes(&r.input, o.max_input_bytes),
    },
    FieldCheck {
        field: "instructions",
        problem: |r, o| over_bytes(&r.instructions, o.max_input_bytes),
    },
    FieldCheck {
        field: "tools",
        problem: |r, o| {
            (r.tools.len() > o.max_tools).then(|| {
                format!(
                    "names {} tools; the limit is {}",
                    r.tools.len(),
                    o.max_tools
                )
            })
        },
    },
    FieldCheck {
        field: "tools",
        problem: |r, _| {
            let name = r.tools.iter().find(|name| !is_valid_tool_name(name))?;
            Some(format!(
                "{:?} is not a valid tool name",
                excerpt(name, ECHO_CHARS)
            ))
        },
    },
    FieldCheck {
        field: "require_approval",
        problem: |r, o| {
            (r.require_approval.len() > o.max_tools).then(|| {
                format!(
                    "names {} tools; the limit is {}",
                    r.require_approval.len(),
                    o.max_tools
                )
            })
        },
    },
    FieldCheck {
        field: "require_approval",
        problem: |r, _| {
            let name = r.require_approval.iter().find(|p| !is_tool_pattern(p))?;
            Some(format!(
                "{:?} is neither a tool name nor \"*\"",
                excerpt(name, ECHO_CHARS)
            ))
        },
    },
    FieldCheck {
        field: "on_unknown_outcome",
        problem: |r, _| {
            UnknownOutcome::parse(&r.on_unknown_outcome)
                .is_none()
                .then(|| {
                    format!(
                        "{:?} is neither \"report\" nor \"ask\"",
                        excerpt(&r.on_unknown_outcome, ECHO_CHARS)
                    )
                })
        },
    },
    FieldCheck {
        field: "metadata",
        problem: |r, o| {
            (r.metadata.len() > o.max_metadata_entries).then(|| {
                format!(
                    "has {} entries; the limit is {}",
                    r.metadata.len(),
                    o.max_metadata_entries
                )
            })
        },
    },
    FieldCheck {
        field: "metadata",
        problem: |r, o| {
            let limit = o.max_metadata_key_bytes;
            let key = r
                .metadata
                .keys()
                .find(|key| key.is_empty() || key.len() > limit)?;
            Some(format!(
                "key {:?} must be 1 to {limit} bytes",
                excerpt(key, ECHO_CHARS)
            ))
        },
    },
    FieldCheck {
        field: "metadata",
        problem: |r, o| {
            let limit = o.max_metadata_value_bytes;
            let (key, value) = r.metadata.iter().find(|(_, value)| value.len() > limit)?;
            Some(format!(
                "the value of {:?} is {} bytes; the limit is {limit}",
                excerpt(key, ECHO_CHARS),
                value.len()
            ))
        },
    },
    FieldCheck {
        field: "idempotency_key",
        problem: |r, o| {
            let key = &r.idempotency_key;
            let chars = key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:/=+".contains(&b));
            (key.len() > o.max_idempotency_key_bytes || !chars).then(|| {
                format!(
                    "must be at most {} bytes of letters, digits and -_.:/=+",
                    o.max_idempotency_key_bytes
                )
            })
        },
    },
    FieldCheck {
        field: "budget",
        problem: |r, _| {
            let (field, problem) = r.budget.as_ref().map(budget).and_then(|b| b.problem())?;
            Some(format!("{field}: {problem}"))
        },
    },
    FieldCheck {
        field: "max_tool_rounds",
        problem: |r, o| {
            (r.max_tool_rounds > o.max_tool_rounds_limit)
                .then(|| format!("the limit is {}", o.max_tool_rounds_limit))
        },
    },
    FieldCheck {
        field: "deadline_ms",
        problem: |r, o| {
            (deadline(r, o) > o.max_deadline)
                .then(|| format!("the limit is {} ms", o.max_deadline.as_millis()))
        },
    },
];

fn over_bytes(text: &str, limit: usize) -> Option<String> {
    (text.len() > limit).then(|| format!("is {} bytes; the limit is {limit}", text.len()))
}

/// The job's deadline from now: the request's, else `api.default_deadline`.
fn deadline(request: &v1::SubmitJobRequest, options: &ApiOptions) -> Duration {
    match request.deadline_ms {
        0 => options.default_deadline,
        ms => Duration::from_millis(ms),
    }
}

/// The model a job runs, checked.
#[derive(Debug, PartialEq)]
struct ModelChoice {
    provider: ProviderKind,
    name: String,
    /// The scripted model's script.
    script: Option<String>,
    /// `model.max_tokens`, when set.
    max_tokens: Option<u32>,
}

/// A model spec with nothing set: the same as none (proto3 cannot tell).
fn is_unset(model: &v1::ModelSpec) -> bool {
    model.provider.is_empty()
        && model.name.is_empty()
        && model.script.is_empty()
        && model.base_url.is_empty()
}

/// `api.default_model`, for a request that names no model.
fn default_model(options: &ApiOptions) -> Result<v1::ModelSpec, Status> {
    let default = &options.default_model;
    if default.provider.is_empty() {
        return Err(invalid(
            "model",
            "is required: set model.provider to \"scripted\" (with model.script), \
             \"openai-responses\", \"openai-chat\" or \"anthropic-messages\" (with \
             model.name); or configure api.default_model on the orchestrator",
        ));
    }
    Ok(v1::ModelSpec {
        provider: default.provider.clone(),
        name: default.name.clone(),
        ..v1::ModelSpec::default()
    })
}

/// The provider, model name and script a request asks for (the default
/// model when it names none; the scripted model when it gives a script but
/// no provider), checked.
fn model_choice(model: Option<v1::ModelSpec>, rules: Rules<'_>) -> Result<ModelChoice, Status> {
    let model = match model {
        Some(model) if !is_unset(&model) => model,
        _ => default_model(rules.options)?,
    };
    let provider_name = if model.provider.is_empty() {
        ProviderKind::Scripted.as_str()
    } else {
        model.provider.as_str()
    };
    let provider = ProviderKind::parse(provider_name).ok_or_else(|| {
        let known: Vec<&str> = ProviderKind::ALL.iter().map(ProviderKind::as_str).collect();
        invalid(
            "model.provider",
            format!(
                "unknown provider {:?}; use {}",
                excerpt(provider_name, ECHO_CHARS),
                known.join(", ")
            ),
        )
    })?;
    if !model.base_url.is_empty() {
        return Err(invalid(
            "model.base_url",
            "per-job base URLs are disabled; configure openai.base_url on the orchestrator",
        ));
    }
    // Every provider's name is stored with the job: bounded for all.
    let limit = rules.options.max_model_name_bytes;
    if model.name.len() > limit {
        return Err(invalid(
            "model.name",
            format!("is {} bytes; the limit is {limit}", model.name.len()),
        ));
    }
    let max_tokens = (model.max_tokens > 0).then_some(model.max_tokens);
    let mut choice = if provider == ProviderKind::Scripted {
        scripted(model, rules.options)?
    } else {
        real_model(provider, model.name, rules)?
    };
    choice.max_tokens = max_tokens;
    Ok(choice)
}

/// The scripted model, when this orchestrator plays scripts, with its
/// script parsed.
fn scripted(model: v1::ModelSpec, options: &ApiOptions) -> Result<ModelChoice, Status> {
    if !options.allow_scripted {
        return Err(Status::failed_precondition(
            "model.provider: the scripted model is off on this orchestrator \
             (api.allow_scripted = false; it plays client-supplied scripts, for \
             demos and tests); name a real model",
        ));
    }
    if model.script.len() > options.max_script_bytes {
        return Err(invalid("model.script", "is over the size limit"));
    }
    Scripted::parse(&model.script).map_err(|e| invalid("model.script", e))?;
    Ok(ModelChoice {
        provider: ProviderKind::Scripted,
        name: model.name,
        script: Some(model.script),
        max_tokens: None,
    })
}

/// A real provider's model, named, when the orchestrator can call it.
fn real_model(
    provider: ProviderKind,
    name: String,
    rules: Rules<'_>,
) -> Result<ModelChoice, Status> {
    let provider_name = provider.as_str();
    if name.is_empty() {
        return Err(invalid(
            "model.name",
            format!("is required for {provider_name}"),
        ));
    }
    if let Some(variable) = rules.keys.missing(&provider) {
        return Err(Status::failed_precondition(format!(
            "model.provider: {provider_name} needs an API key; set {variable} on the orchestrator"
        )));
    }
    Ok(ModelChoice {
        provider,
        name,
        script: None,
        max_tokens: None,
    })
}

/// The tools a job may use: those it names, within its tenant's allow-list
/// (all of the allow-list when it names none).
fn allowed_tools(named: Vec<String>, caller: &Caller) -> Result<Vec<String>, Status> {
    let Some(allowed) = &caller.tools else {
        return Ok(named);
    };
    if named.is_empty() {
        return Ok(allowed.clone());
    }
    if let Some(name) = named.iter().find(|name| !caller.may_use(name)) {
        return Err(Status::permission_denied(format!(
            "tools: {:?} is not allowed for tenant {:?}",
            excerpt(name, ECHO_CHARS),
            caller.tenant
        )));
    }
    Ok(named)
}

/// The job a submission asks for, checked and with the defaults applied;
/// an error names the field.
/// A request's budget as a job keeps it.
fn budget(budget: &v1::Budget) -> Budget {
    Budget {
        max_tokens: budget.max_tokens,
        max_cost_units: budget.max_cost_units,
        max_tool_calls: budget.max_tool_calls,
    }
}

pub(super) fn job_spec(
    mut request: v1::SubmitJobRequest,
    caller: &Caller,
    rules: Rules<'_>,
) -> Result<JobSpec, Status> {
    let options = rules.options;
    if let Some((field, problem)) = SUBMISSION_CHECKS
        .iter()
        .find_map(|check| Some((check.field, (check.problem)(&request, options)?)))
    {
        return Err(invalid(field, problem));
    }
    let (model, call) = match request.call.take() {
        Some(call) => {
            let call = call_job(call, &request, options)?;
            request.tools = vec![call.tool.clone()];
            // One turn with a call, the one that answers it.
            request.max_tool_rounds = 1;
            request.parallel_tool_calls = Some(false);
            request.input = format!("call {}", call.tool);
            let model = ModelChoice {
                provider: ProviderKind::Call,
                name: String::new(),
                script: None,
                max_tokens: None,
            };
            (model, Some(call))
        }
        None => (model_choice(request.model.take(), rules)?, None),
    };
    let tools = allowed_tools(std::mem::take(&mut request.tools), caller)?;
    let deadline = toolfleet_service::clock::millis(deadline(&request, options));
    Ok(JobSpec {
        input: request.input,
        instructions: request.instructions,
        provider: model.provider,
        model: model.name,
        script: model.script,
        max_tokens: model.max_tokens,
        stream: request.stream.unwrap_or(caller.stream) && call.is_none(),
        no_result_cache: request.result_cache == Some(false),
        call,
        tools,
        max_tool_rounds: match request.max_tool_rounds {
            0 => options.default_max_tool_rounds,
            n => n,
        },
        parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
        deadline_ms: now_ms().saturating_add(deadline),
        metadata: request.metadata.into_iter().collect(),
        tenant: caller.tenant.clone(),
        // From the credential alone: nothing in the request names it.
        submitter: caller.submitter(),
        approval: ApprovalPolicy {
            tenant: caller.require_approval.clone(),
            job: request.require_approval,
            timeout_ms: caller
                .approval_timeout
                .map(toolfleet_service::clock::millis),
            on_unknown_outcome: UnknownOutcome::parse(&request.on_unknown_outcome)
                .unwrap_or_default(),
        },
        limits: JobLimits {
            max_calls_per_turn: options.max_calls_per_turn,
            max_scripted_answer_bytes: options.max_scripted_answer_bytes,
            max_active_jobs: caller.quotas.max_active_jobs,
            max_calls_in_flight: caller.quotas.max_calls_in_flight,
            tenant_budget: caller.quotas.budget,
        },
        budget: request.budget.as_ref().map(budget).unwrap_or_default(),
    })
}

/// The call of a call job (`SubmitJobRequest.call`), checked: a tool name,
/// arguments that are a JSON object within the input limit, and none of the
/// fields that only a model's job has.
fn call_job(
    call: v1::ToolCallRequest,
    request: &v1::SubmitJobRequest,
    options: &ApiOptions,
) -> Result<CallSpec, Status> {
    if !is_valid_tool_name(&call.tool) {
        return Err(invalid(
            "call.tool",
            format!(
                "{:?} is not a valid tool name",
                excerpt(&call.tool, ECHO_CHARS)
            ),
        ));
    }
    if let Some(problem) = over_bytes(&call.arguments, options.max_input_bytes) {
        return Err(invalid("call.arguments", problem));
    }
    if !serde_json::from_str::<serde_json::Value>(&call.arguments).is_ok_and(|a| a.is_object()) {
        return Err(invalid("call.arguments", "must be a JSON object"));
    }
    let model_only = [
        ("input", !request.input.is_empty()),
        ("instructions", !request.instructions.is_empty()),
        (
            "model",
            request.model.as_ref().is_some_and(|m| !is_unset(m)),
        ),
        ("tools", !request.tools.is_empty()),
        ("max_tool_rounds", request.max_tool_rounds != 0),
        ("parallel_tool_calls", request.parallel_tool_calls.is_some()),
    ];
    if let Some((field, _)) = model_only.iter().find(|(_, set)| *set) {
        return Err(invalid(
            field,
            "must be unset in a call job (`call` is set)",
        ));
    }
    Ok(CallSpec {
        tool: call.tool,
        arguments: call.arguments,
    })
}

/// The job id a client sent, read; refuses, before Redis is asked, an id
/// that is not a job id or names another tenant than the caller's: the same
/// `NOT_FOUND` as for a missing job.
pub(super) fn may_own(job_id: &str, caller: &Caller) -> Result<JobId, Status> {
    JobId::parse(job_id)
        .filter(|id| id.may_belong_to(&caller.tenant))
        .ok_or_else(|| not_found(job_id))
}

/// `ListJobs` page size when a request gives 0.
const DEFAULT_PAGE_SIZE: usize = 50;
/// Largest `ListJobs` page.
const MAX_PAGE_SIZE: usize = 500;
/// Most metadata pairs one `ListJobs` filter may name.
const MAX_METADATA_FILTERS: usize = 16;

/// A `ListJobs` request, checked.
#[derive(Debug)]
pub(super) struct ListQuery {
    /// Jobs on the page, at most.
    pub(super) limit: usize,
    /// Where the page starts: after the previous page's last job.
    pub(super) before: Option<ListCursor>,
    /// When the listed jobs were created.
    pub(super) window: CreatedWindow,
    /// Whether to answer the caller's counts too.
    pub(super) with_counts: bool,
    status: Option<JobStatus>,
    metadata: HashMap<String, String>,
}

impl ListQuery {
    /// The query a request asks for; an error names the field.
    pub(super) fn parse(request: v1::ListJobsRequest) -> Result<Self, Status> {
        let limit = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n if n as usize > MAX_PAGE_SIZE => {
                return Err(invalid(
                    "page_size",
                    format!("the limit is {MAX_PAGE_SIZE}"),
                ));
            }
            n => n as usize,
        };
        let before = match request.page_token.as_str() {
            "" => None,
            token => Some(ListCursor::from_token(token).ok_or_else(|| {
                invalid(
                    "page_token",
                    "is not a token from an earlier page; pass next_page_token as it came",
                )
            })?),
        };
        let status = match v1::JobStatus::try_from(request.status) {
            Ok(v1::JobStatus::Unspecified) => None,
            Ok(status) => {
                Some(JobStatus::try_from(status).map_err(|_| invalid("status", "unknown"))?)
            }
            Err(_) => return Err(invalid("status", "unknown")),
        };
        if request.metadata.len() > MAX_METADATA_FILTERS {
            return Err(invalid(
                "metadata",
                format!("at most {MAX_METADATA_FILTERS} pairs"),
            ));
        }
        Ok(Self {
            limit,
            before,
            window: created_window(request.created_after_ms, request.created_before_ms)?,
            with_counts: request.with_counts,
            status,
            metadata: request.metadata,
        })
    }

    /// Whether `record` passes the query's filters.
    pub(super) fn keeps(&self, record: &JobRecord) -> bool {
        self.status.is_none_or(|s| record.status == s)
            && self
                .metadata
                .iter()
                .all(|(key, value)| record.spec.metadata.get(key) == Some(value))
    }
}

/// The window of creation times a `ListJobs` request asks for: 0 is no
/// bound; a bound is a time a job id can carry (Unix ms, up to the year
/// 10889), and the start is not after the end.
fn created_window(after_ms: u64, before_ms: u64) -> Result<CreatedWindow, Status> {
    let bound = |field: &str, ms: u64| match ms {
        0 => Ok(None),
        ms if ms > MAX_SUBMITTED_MS => Err(invalid(
            field,
            format!(
                "{ms} is not a time in Unix milliseconds (at most {MAX_SUBMITTED_MS}, the year \
                 10889; 0 for no bound)"
            ),
        )),
        ms => Ok(Some(ms)),
    };
    let window = CreatedWindow {
        after_ms: bound("created_after_ms", after_ms)?,
        before_ms: bound("created_before_ms", before_ms)?,
    };
    if let CreatedWindow {
        after_ms: Some(after),
        before_ms: Some(before),
    } = window
        && after > before
    {
        return Err(invalid(
            "created_after_ms",
            format!("{after} is after created_before_ms ({before}): the window is empty"),
        ));
    }
    Ok(window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quotas;
    use tonic::Code;

    fn options() -> ApiOptions {
        ApiOptions {
            allow_scripted: true,
            ..ApiOptions::default()
        }
    }

    fn rules(options: &ApiOptions) -> Rules<'_> {
        Rules {
            options,
            keys: ApiKeys {
                openai: true,
                anthropic: true,
            },
        }
    }

    const SCRIPT: &str = r#"[{"message": "four"}]"#;

    fn valid() -> v1::SubmitJobRequest {
        v1::SubmitJobRequest {
            input: "what is 2 + 2?".into(),
            model: Some(v1::ModelSpec {
                provider: "scripted".into(),
                script: SCRIPT.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn caller(tools: Option<&[&str]>) -> Caller {
        Caller {
            tools: tools.map(|tools| tools.iter().map(|t| (*t).to_owned()).collect()),
            quotas: Quotas {
                max_calls_in_flight: Some(5),
                ..Quotas::default()
            },
            ..Caller::anonymous()
        }
    }

    fn check(request: v1::SubmitJobRequest) -> Result<JobSpec, Status> {
        job_spec(request, &caller(None), rules(&options()))
    }

    #[test]
    fn a_job_keeps_its_tenants_and_its_own_approval_lists() {
        let mut request = valid();
        request.require_approval = vec!["calculate".into()];
        // A label that says otherwise names no submitter.
        request.metadata = [("submitter".to_owned(), "Eve".to_owned())].into();
        let caller = Caller {
            require_approval: vec!["*".into()],
            approval_timeout: Some(Duration::from_secs(7200)),
            stream: true,
            principal: Some("token:0123456789abcdef".into()),
            ..caller(None)
        };
        let spec = job_spec(request.clone(), &caller, rules(&options())).expect("a valid request");
        assert_eq!(spec.submitter.as_deref(), Some("token:0123456789abcdef"));
        assert_eq!(check(valid()).unwrap().submitter, None, "no authentication");
        assert!(spec.stream, "the tenant's default");
        let mut quiet = request.clone();
        quiet.stream = Some(false);
        let quiet = job_spec(quiet, &caller, rules(&options())).expect("a valid request");
        assert!(!quiet.stream, "the request's word wins");
        assert_eq!(
            spec.approval,
            ApprovalPolicy {
                tenant: vec!["*".into()],
                job: vec!["calculate".into()],
                timeout_ms: Some(7_200_000),
                on_unknown_outcome: UnknownOutcome::Report,
            }
        );
    }

    type Change = fn(&mut v1::SubmitJobRequest);

    /// Every check of the table refuses what it should, naming its field;
    /// each row here breaks one rule of a valid request.
    #[test]
    fn each_field_check_refuses_its_field() {
        let cases: &[(&str, Change)] = &[
            ("input: must not be empty", |r| r.input = " \n".into()),
            ("input: is 262145 bytes; the limit is 262144", |r| {
                r.input = "x".repeat(262_145);
            }),
            ("instructions: is 262145 bytes", |r| {
                r.instructions = "x".repeat(262_145);
            }),
            ("tools: names 129 tools; the limit is 128", |r| {
                r.tools = (0..129).map(|i| format!("t{i}")).collect();
            }),
            ("tools: \"no spaces\" is not a valid tool name", |r| {
                r.tools = vec!["echo".into(), "no spaces".into()];
            }),
            ("require_approval: names 129 tools; the limit is 128", |r| {
                r.require_approval = (0..129).map(|i| format!("t{i}")).collect();
            }),
            (
                "require_approval: \"trans fer\" is neither a tool name nor \"*\"",
                |r| r.require_approval = vec!["*".into(), "trans fer".into()],
            ),
            (
                "on_unknown_outcome: \"retry\" is neither \"report\" nor \"ask\"",
                |r| r.on_unknown_outcome = "retry".into(),
            ),
            ("metadata: has 33 entries; the limit is 32", |r| {
                r.metadata = (0..33).map(|i| (format!("k{i}"), String::new())).collect();
            }),
            ("metadata: key \"\" must be 1 to 64 bytes", |r| {
                r.metadata.insert(String::new(), "v".into());
            }),
            ("must be 1 to 64 bytes", |r| {
                r.metadata.insert("k".repeat(65), "v".into());
            }),
            (
                "metadata: the value of \"team\" is 513 bytes; the limit is 512",
                |r| {
                    r.metadata.insert("team".into(), "v".repeat(513));
                },
            ),
            (
                "budget: max_tool_calls: must be at least 1; leave it unset for no limit",
                |r| {
                    r.budget = Some(v1::Budget {
                        max_tool_calls: Some(0),
                        ..Default::default()
                    });
                },
            ),
            (
                "budget: max_tokens: 1000000000001 is above the largest budget",
                |r| {
                    r.budget = Some(v1::Budget {
                        max_tokens: Some(1_000_000_000_001),
                        max_cost_units: Some(5),
                        ..Default::default()
                    });
                },
            ),
            ("idempotency_key: must be at most 128 bytes", |r| {
                r.idempotency_key = "a".repeat(129);
            }),
            ("idempotency_key: must be at most", |r| {
                r.idempotency_key = "a b".into();
            }),
            ("max_tool_rounds: the limit is 64", |r| {
                r.max_tool_rounds = 65
            }),
            ("deadline_ms: the limit is 86400000 ms", |r| {
                r.deadline_ms = 86_400_001;
            }),
        ];
        for (expected, change) in cases {
            let mut request = valid();
            change(&mut request);
            let status = check(request).expect_err(expected);
            assert_eq!(status.code(), Code::InvalidArgument, "{expected}");
            assert!(
                status.message().contains(expected),
                "{expected:?} in {:?}",
                status.message()
            );
            assert!(status.message().len() < 300, "a bounded echo");
        }
        // Every row of the table is exercised by a case above.
        for check in SUBMISSION_CHECKS {
            assert!(
                cases
                    .iter()
                    .any(|(expected, _)| expected.starts_with(check.field)),
                "{}",
                check.field
            );
        }
    }

    #[test]
    fn limits_at_their_edge_pass_and_defaults_apply() {
        let mut request = valid();
        request.input = "x".repeat(262_144);
        request.tools = (0..128).map(|i| format!("t{i}")).collect();
        request.idempotency_key = "a".repeat(128);
        request.deadline_ms = 86_400_000;
        request.max_tool_rounds = 64;
        let spec = check(request).expect("at the limits");
        assert_eq!(spec.max_tool_rounds, 64);
        let spec = check(valid()).unwrap();
        assert_eq!(spec.max_tool_rounds, 8, "api.default_max_tool_rounds");
        assert!(spec.parallel_tool_calls);
        let left = spec.deadline_ms.saturating_sub(now_ms());
        assert!((590_000..=600_000).contains(&left), "{left}");
        assert_eq!(spec.limits.max_calls_in_flight, Some(5), "the tenant's");
        assert_eq!(spec.script.as_deref(), Some(SCRIPT));
    }

    fn model(provider: &str, name: &str, script: &str, base_url: &str) -> v1::ModelSpec {
        v1::ModelSpec {
            provider: provider.into(),
            name: name.into(),
            script: script.into(),
            base_url: base_url.into(),
            max_tokens: 0,
        }
    }

    /// A model the request spells wrong is `INVALID_ARGUMENT` naming the
    /// field: no provider, an unknown one, a base URL it may not set, a
    /// missing or too long name, a script that does not parse or is too big.
    #[test]
    fn the_model_is_checked_by_its_provider() {
        let cases = [
            (
                model("", "", "", ""),
                Code::InvalidArgument,
                "model: is required",
            ),
            (
                model("gemini", "", "", ""),
                Code::InvalidArgument,
                "model.provider: unknown provider \"gemini\"",
            ),
            (
                model("openai-chat", "m", "", "http://x"),
                Code::InvalidArgument,
                "model.base_url",
            ),
            (
                model("openai-chat", "", "", ""),
                Code::InvalidArgument,
                "model.name: is required for openai-chat",
            ),
            (
                model("openai-responses", &"m".repeat(129), "", ""),
                Code::InvalidArgument,
                "model.name: is 129 bytes; the limit is 128",
            ),
            (
                model("scripted", &"m".repeat(3_000_000), "[]", ""),
                Code::InvalidArgument,
                "model.name: is 3000000 bytes; the limit is 128",
            ),
            (
                model("", "", "nonsense {{", ""),
                Code::InvalidArgument,
                "model.script",
            ),
            (
                model("scripted", "", &"x".repeat(1_048_577), ""),
                Code::InvalidArgument,
                "model.script: is over the size limit",
            ),
        ];
        for (spec, code, expected) in cases {
            let mut request = valid();
            request.model = Some(spec);
            let status = check(request).expect_err(expected);
            assert_eq!(status.code(), code, "{expected}");
            assert!(
                status.message().starts_with(expected),
                "{:?}",
                status.message()
            );
        }
    }

    /// What the orchestrator cannot run is a precondition, not the request's
    /// fault: a scripted model it does not allow, a provider without its key
    /// (OpenAI, Anthropic); with the key the spec names the provider, the
    /// model and the request's `max_tokens`.
    #[test]
    fn a_model_the_orchestrator_cannot_run_is_a_precondition() {
        let options = ApiOptions::default();
        let status = job_spec(valid(), &caller(None), rules(&options)).unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().contains("api.allow_scripted"));
        let mut request = valid();
        request.model = Some(model("openai-chat", "gpt", "", ""));
        let no_key = Rules {
            options: &options,
            keys: ApiKeys {
                openai: false,
                anthropic: true,
            },
        };
        let status = job_spec(request.clone(), &caller(None), no_key).unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().contains("OPENAI_API_KEY"));
        let mut claude = request.clone();
        claude.model = Some(model("anthropic-messages", "claude", "", ""));
        let spec = job_spec(claude.clone(), &caller(None), no_key).unwrap();
        assert_eq!(spec.provider, ProviderKind::AnthropicMessages);
        assert_eq!(spec.max_tokens, None);
        let no_anthropic = Rules {
            options: &options,
            keys: ApiKeys {
                openai: true,
                anthropic: false,
            },
        };
        let status = job_spec(claude.clone(), &caller(None), no_anthropic).unwrap_err();
        assert!(status.message().contains("ANTHROPIC_API_KEY"), "{status:?}");
        claude.model.as_mut().unwrap().max_tokens = 512;
        let spec = job_spec(claude, &caller(None), rules(&options)).unwrap();
        assert_eq!(spec.max_tokens, Some(512));
        let spec = job_spec(request, &caller(None), rules(&options)).unwrap();
        assert_eq!(
            (spec.provider, spec.model.as_str()),
            (ProviderKind::OpenaiChat, "gpt")
        );
    }

    #[test]
    fn the_default_model_serves_a_request_that_names_none() {
        let mut options = options();
        options.default_model.provider = "openai-responses".into();
        options.default_model.name = "gpt-4.1-mini".into();
        let mut request = valid();
        request.model = Some(v1::ModelSpec::default());
        let spec = job_spec(request, &caller(None), rules(&options)).unwrap();
        assert_eq!(spec.provider, ProviderKind::OpenaiResponses);
        assert_eq!(spec.model, "gpt-4.1-mini");
        assert_eq!(spec.script, None);
    }

    #[test]
    fn a_tenants_allow_list_bounds_its_jobs_tools() {
        let options = options();
        let allowed = caller(Some(&["echo", "calculate"]));
        let spec = job_spec(valid(), &allowed, rules(&options)).unwrap();
        assert_eq!(spec.tools, ["echo", "calculate"], "all of the list");
        let mut request = valid();
        request.tools = vec!["echo".into()];
        let spec = job_spec(request, &allowed, rules(&options)).unwrap();
        assert_eq!(spec.tools, ["echo"]);
        let mut request = valid();
        request.tools = vec!["echo".into(), "shell".into()];
        let status = job_spec(request, &allowed, rules(&options)).unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied);
        assert_eq!(
            status.message(),
            "tools: \"shell\" is not allowed for tenant \"default\""
        );
    }

    #[test]
    fn a_list_query_is_checked_field_by_field() {
        let request = |change: fn(&mut v1::ListJobsRequest)| {
            let mut request = v1::ListJobsRequest::default();
            change(&mut request);
            request
        };
        let query = ListQuery::parse(request(|_| {})).unwrap();
        assert_eq!(query.limit, 50);
        assert!(query.before.is_none() && query.status.is_none());
        assert_eq!(query.window, CreatedWindow::default(), "0s are no bound");
        assert!(!query.with_counts);
        let query = ListQuery::parse(request(|r| {
            r.created_after_ms = 1_000;
            r.created_before_ms = 2_000;
            r.with_counts = true;
        }))
        .unwrap();
        assert_eq!(
            query.window,
            CreatedWindow {
                after_ms: Some(1_000),
                before_ms: Some(2_000)
            }
        );
        assert!(query.with_counts);
        type ListChange = fn(&mut v1::ListJobsRequest);
        let cases: [(ListChange, &str); 13] = [
            (|r| r.page_size = 501, "page_size: the limit is 500"),
            (
                |r| r.page_token = "nope".into(),
                "page_token: is not a token",
            ),
            (|r| r.status = 99, "status: unknown"),
            (
                |r| r.metadata = (0..17).map(|i| (format!("k{i}"), String::new())).collect(),
                "metadata: at most 16 pairs",
            ),
            (|r| r.page_size = 0, ""),
            (
                |r| r.created_after_ms = u64::MAX,
                "created_after_ms: 18446744073709551615 is not a time in Unix milliseconds",
            ),
            (
                |r| r.created_before_ms = MAX_SUBMITTED_MS + 1,
                "created_before_ms: 281474976710656 is not a time",
            ),
            (
                |r| {
                    r.created_after_ms = 2_000;
                    r.created_before_ms = 1_999;
                },
                "created_after_ms: 2000 is after created_before_ms (1999)",
            ),
            // An empty window is a question with an empty answer.
            (
                |r| {
                    r.created_after_ms = 2_000;
                    r.created_before_ms = 2_000;
                },
                "",
            ),
            (|r| r.created_after_ms = MAX_SUBMITTED_MS, ""),
            (|r| r.created_before_ms = 1, ""),
            (|r| r.created_after_ms = 1_700_000_000_000, ""),
            (|r| r.with_counts = true, ""),
        ];
        for (change, expected) in cases {
            match ListQuery::parse(request(change)) {
                Ok(_) => assert!(expected.is_empty()),
                Err(status) => {
                    assert_eq!(status.code(), Code::InvalidArgument);
                    assert!(
                        status.message().starts_with(expected),
                        "{}",
                        status.message()
                    );
                }
            }
        }
    }

    #[test]
    fn an_id_of_another_shape_or_tenant_is_not_found_before_any_read() {
        let caller = caller(None);
        let own = JobId::new("default", 1, 2);
        assert_eq!(may_own(&own, &caller).unwrap(), own);
        let legacy = "019000000001000000000000beef";
        assert_eq!(
            may_own(legacy, &caller).unwrap(),
            legacy,
            "defers to the record"
        );
        let other = JobId::new("other", 1, 2);
        for job_id in ["", "not-a-job", &"x".repeat(10_000), &other] {
            let status = may_own(job_id, &caller).unwrap_err();
            assert_eq!(status.code(), Code::NotFound);
            assert!(status.message().len() < 300);
        }
    }
}
