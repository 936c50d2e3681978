//! Which calls wait for a person's approval before they run, decided per
//! call from three sources: the tool's manifest, the tenant and the job
//! (decision 0036, docs/approvals.md). The strictest wins: a call needs
//! approval when any of them asks, and the first that asks, in that order,
//! is the rule kept with the call and shown in its event.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolfleet_proto::manifest::names_tool;
use toolfleet_proto::{Approval, ToolManifest};

use crate::job::ApprovalPolicy;

/// How held calls wait (`approval.*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalOptions {
    /// How long a held call waits for a decision; then it is answered
    /// `APPROVAL_EXPIRED`. Default: 24h.
    #[serde(with = "toolfleet_service::config::duration")]
    pub timeout: Duration,
}

impl Default for ApprovalOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(24 * 3600),
        }
    }
}

/// Who asked for a call's approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The tool's manifest (`always`, or `when_side_effects` of a tool
    /// with side effects).
    Manifest(Approval),
    /// The tenant's `require_approval` in the tokens file.
    Tenant {
        /// It names every tool (`"*"`), not this one.
        every_tool: bool,
    },
    /// The job's `require_approval`.
    Job {
        /// It names every tool (`"*"`), not this one.
        every_tool: bool,
    },
}

impl Rule {
    /// Its name in events and records: `manifest`, `tenant` or `job`.
    pub(crate) fn source(self) -> &'static str {
        match self {
            Self::Manifest(_) => "manifest",
            Self::Tenant { .. } => "tenant",
            Self::Job { .. } => "job",
        }
    }

    /// Why a call of `tool` waits, for people: the approval event's reason.
    pub(crate) fn reason(self, tool: &str) -> String {
        let calls = |every_tool: bool| {
            if every_tool {
                "every call".to_owned()
            } else {
                format!("every call of {tool}")
            }
        };
        match self {
            Self::Manifest(Approval::WhenSideEffects) => {
                format!("{tool} has side effects, and its manifest requires approval of them")
            }
            Self::Manifest(_) => format!("the manifest of {tool} requires approval of every call"),
            Self::Tenant { every_tool } => {
                format!("the tenant requires approval of {}", calls(every_tool))
            }
            Self::Job { every_tool } => {
                format!("the job requires approval of {}", calls(every_tool))
            }
        }
    }
}

/// Whether a call of the tool `manifest` describes needs approval in a job
/// with `policy`, and the rule that says so.
pub(crate) fn needs_approval(manifest: &ToolManifest, policy: &ApprovalPolicy) -> Option<Rule> {
    let tool = manifest.name.as_str();
    let by_manifest = match manifest.approval {
        Approval::Always => true,
        Approval::WhenSideEffects => manifest.effects.changes_things(),
        Approval::Never => false,
    };
    let every_tool = |patterns: &[String]| !patterns.iter().any(|p| p == tool);
    if by_manifest {
        Some(Rule::Manifest(manifest.approval))
    } else if names_tool(&policy.tenant, tool) {
        Some(Rule::Tenant {
            every_tool: every_tool(&policy.tenant),
        })
    } else if names_tool(&policy.job, tool) {
        Some(Rule::Job {
            every_tool: every_tool(&policy.job),
        })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolfleet_proto::Effects;
    use toolfleet_proto::manifest::EVERY_TOOL;

    fn manifest(approval: Approval, side_effects: bool) -> ToolManifest {
        let effects = if side_effects {
            Effects::NotIdempotent
        } else {
            Effects::ReadOnly
        };
        ToolManifest::new("transfer", "Moves money.", json!({"type": "object"}))
            .with_approval(approval)
            .with_effects(effects)
    }

    fn policy(tenant: &[&str], job: &[&str]) -> ApprovalPolicy {
        let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
        ApprovalPolicy {
            tenant: owned(tenant),
            job: owned(job),
            ..ApprovalPolicy::default()
        }
    }

    /// The manifest's approval and side effects, the tenant's and the
    /// job's lists, and the rule that should decide.
    type Case = (
        Approval,
        bool,
        &'static [&'static str],
        &'static [&'static str],
        Option<Rule>,
    );

    #[test]
    fn the_strictest_source_wins_and_the_first_that_asks_is_the_rule() {
        use Approval::{Always, Never, WhenSideEffects};
        let cases: &[Case] = &[
            // Nobody asks.
            (Never, true, &[], &[], None),
            (WhenSideEffects, false, &[], &[], None),
            (Never, false, &["other"], &["other"], None),
            // The manifest asks.
            (Always, false, &[], &[], Some(Rule::Manifest(Always))),
            (
                WhenSideEffects,
                true,
                &[],
                &[],
                Some(Rule::Manifest(WhenSideEffects)),
            ),
            (
                Always,
                false,
                &[EVERY_TOOL],
                &["transfer"],
                Some(Rule::Manifest(Always)),
            ),
            // The tenant, by name or for every tool, before the job.
            (
                Never,
                false,
                &["transfer"],
                &[],
                Some(Rule::Tenant { every_tool: false }),
            ),
            (
                WhenSideEffects,
                false,
                &[EVERY_TOOL],
                &[EVERY_TOOL],
                Some(Rule::Tenant { every_tool: true }),
            ),
            // The job alone.
            (
                Never,
                false,
                &[],
                &["transfer"],
                Some(Rule::Job { every_tool: false }),
            ),
            (
                Never,
                false,
                &["other"],
                &["other", EVERY_TOOL],
                Some(Rule::Job { every_tool: true }),
            ),
        ];
        for (approval, side_effects, tenant, job, want) in cases {
            let got = needs_approval(&manifest(*approval, *side_effects), &policy(tenant, job));
            assert_eq!(
                got, *want,
                "{approval:?} side effects {side_effects} tenant {tenant:?} job {job:?}"
            );
        }
        // An idempotent tool changes things too: `when_side_effects` asks.
        let idempotent =
            manifest(Approval::WhenSideEffects, false).with_effects(Effects::Idempotent);
        assert_eq!(
            needs_approval(&idempotent, &policy(&[], &[])),
            Some(Rule::Manifest(Approval::WhenSideEffects))
        );
    }

    #[test]
    fn the_reason_says_who_asked_for_which_calls() {
        let reasons = [
            (
                Rule::Manifest(Approval::Always),
                "the manifest of transfer requires approval of every call",
            ),
            (
                Rule::Manifest(Approval::WhenSideEffects),
                "transfer has side effects, and its manifest requires approval of them",
            ),
            (
                Rule::Tenant { every_tool: false },
                "the tenant requires approval of every call of transfer",
            ),
            (
                Rule::Job { every_tool: true },
                "the job requires approval of every call",
            ),
        ];
        for (rule, reason) in reasons {
            assert_eq!(rule.reason("transfer"), reason);
        }
        assert_eq!(Rule::Tenant { every_tool: true }.source(), "tenant");
    }

    #[test]
    fn a_manifest_without_the_field_needs_no_approval() {
        let older = json!({"name": "transfer", "description": "d", "parameters": {},
                           "strict": true, "timeout_ms": 1000, "max_attempts": 1,
                           "side_effects": true, "version": "1"});
        let manifest: ToolManifest = serde_json::from_value(older).expect("an older manifest");
        assert_eq!(manifest.approval, Approval::Never);
        assert_eq!(needs_approval(&manifest, &ApprovalPolicy::default()), None);
        let sent = serde_json::to_value(manifest.with_approval(Approval::WhenSideEffects)).unwrap();
        assert_eq!(sent["approval"], "when_side_effects");
    }
}
