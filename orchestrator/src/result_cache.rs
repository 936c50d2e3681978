//! The cross-run result cache: a successful result of a read-only tool that
//! may be cached (its manifest's `cache_ttl_ms`) answers a later call of
//! the same tenant to the same tool, under the same contract, with the same
//! arguments, without running it (docs/protection.md, decision 0057).
//!
//! This module says which calls may be answered so and under which key;
//! dispatch looks the key up after approval is decided (a held call never
//! gets here) and stores a result once its round's commit found it; the
//! store reads and writes the entry (`store/cache.rs`).

use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};
use toolfleet_proto::Envelope;

use crate::job::{JobSpec, ToolManifest};

/// What a `tool_call_result` event and a call span say of an envelope the
/// cache answered.
pub(crate) const CACHE: &str = "cache";

/// Where a call's result is, or will be, in its tenant's cache: the store
/// keeps it at `tf:cache:{<tenant>}:<digest>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CacheEntry {
    /// The job's tenant (checked: it is part of the job's id).
    pub tenant: String,
    /// The call's digest ([`digest`]), in hex.
    pub digest: String,
    /// How long a result stored there answers calls.
    pub ttl: Duration,
}

/// Where a call of `tool` (its manifest as the call is checked against)
/// with `arguments` is cached for the job `spec`, if it may be: the tool is
/// read-only with a cache TTL ([`ToolManifest::cache_ttl`]), the job did
/// not turn the cache off, and the arguments are JSON. A call job's call
/// may be, as a model's: the same call answers the same.
pub(crate) fn entry(spec: &JobSpec, tool: &ToolManifest, arguments: &str) -> Option<CacheEntry> {
    if spec.no_result_cache {
        return None;
    }
    let ttl = tool.cache_ttl()?;
    let arguments: Value = serde_json::from_str(arguments).ok()?;
    Some(CacheEntry {
        tenant: spec.tenant.clone(),
        digest: digest(tool, &arguments),
        ttl,
    })
}

/// The lowercase hex SHA-256 of `toolfleet.result-cache.v1`, the tool's
/// name, its contract hash and the canonical JSON of the arguments, one per
/// line: the same call under the same contract, however its arguments are
/// written (key order, spaces, `1` or `1.0`). The contract hash changes
/// with the schema, strictness or effects, so a result is never taken for
/// a call the tool now reads otherwise. Stored keys depend on it.
fn digest(tool: &ToolManifest, arguments: &Value) -> String {
    let mut hash = Sha256::new();
    for part in [
        "toolfleet.result-cache.v1",
        &tool.name,
        &tool.contract_hash(),
        &toolfleet_proto::canonical::to_string(arguments),
    ] {
        hash.update(part.as_bytes());
        hash.update(b"\n");
    }
    format!("{:x}", hash.finalize())
}

/// The envelope a cache entry's text holds, if it is one the cache may
/// answer with: a success. Anything else (an entry from a later format, or
/// written by someone else) is a miss.
pub(crate) fn answer(text: &str) -> Option<Envelope> {
    serde_json::from_str::<Envelope>(text)
        .ok()
        .filter(Envelope::is_ok)
}

/// The text to store for `envelope`, when it may answer later calls: only
/// a success is cached (a failure, retryable or not, says nothing of the
/// next call).
pub(crate) fn to_store(envelope: &Envelope) -> Option<String> {
    envelope.is_ok().then(|| envelope.to_json())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolfleet_proto::manifest::Effects;
    use toolfleet_proto::{ErrorCode, names::RedisKeys};

    fn spec(tenant: &str) -> JobSpec {
        let mut spec = crate::runner::step::tests::spec();
        spec.tenant = tenant.into();
        spec
    }

    fn lookup() -> ToolManifest {
        ToolManifest::new(
            "lookup",
            "looks up",
            json!({"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "number"}}}),
        )
        .with_effects(Effects::ReadOnly)
        .with_cache_ttl(Duration::from_secs(60))
    }

    #[test]
    fn the_same_call_under_the_same_contract_has_one_key_in_its_tenants_slot() {
        let keys = RedisKeys::default();
        let tool = lookup();
        let key = |spec: &JobSpec, tool: &ToolManifest, arguments: &str| {
            entry(spec, tool, arguments)
                .map(|entry| keys.tenant_cached_result(&entry.tenant, &entry.digest))
        };
        let acme = spec("acme");
        let one = key(&acme, &tool, r#"{"q": "x", "n": 1}"#).expect("cacheable");
        assert!(one.starts_with("tf:cache:{acme}:"), "{one}");
        assert_eq!(one.len(), "tf:cache:{acme}:".len() + 64);
        // However the arguments are written.
        assert_eq!(key(&acme, &tool, r#"{"n":1.0,"q":"x"}"#), Some(one.clone()));
        // Another tenant, other arguments, another tool or contract: another key.
        let mut renamed = tool.clone();
        renamed.name = "lookup_2".into();
        let mut reshaped = tool.clone();
        reshaped.parameters["required"] = json!(["q"]);
        let others = [
            key(&spec("other"), &tool, r#"{"q": "x", "n": 1}"#),
            key(&acme, &tool, r#"{"q": "y", "n": 1}"#),
            key(&acme, &renamed, r#"{"q": "x", "n": 1}"#),
            key(&acme, &reshaped, r#"{"q": "x", "n": 1}"#),
        ];
        let mut seen = std::collections::HashSet::from([one]);
        for other in others {
            assert!(seen.insert(other.expect("cacheable")));
        }
        // The digest never changes: stored keys depend on it.
        assert_eq!(
            digest(&tool, &json!({"q": "x", "n": 1})),
            "c6ba8125cffcc366d6ae4694036b7fd8e60c5a3d455d6c418aad3e1f317bb74f"
        );
    }

    #[test]
    fn only_a_read_only_tool_with_a_ttl_is_cached_and_a_job_may_say_no() {
        let acme = spec("acme");
        let arguments = r#"{"q": "x"}"#;
        let cached = entry(&acme, &lookup(), arguments).expect("cacheable");
        assert_eq!(cached.ttl, Duration::from_secs(60));
        let mut changes_things = lookup();
        for effects in [Effects::Idempotent, Effects::NotIdempotent] {
            changes_things.effects = effects;
            assert_eq!(entry(&acme, &changes_things, arguments), None);
        }
        let mut no_ttl = lookup();
        no_ttl.cache_ttl_ms = None;
        assert_eq!(entry(&acme, &no_ttl, arguments), None);
        let mut off = acme.clone();
        off.no_result_cache = true;
        assert_eq!(entry(&off, &lookup(), arguments), None);
        assert_eq!(entry(&acme, &lookup(), "{not json"), None);
    }

    #[test]
    fn only_a_success_is_stored_and_only_one_answers() {
        let ok = Envelope::Ok(json!({"temperature": 21}));
        let text = to_store(&ok).expect("a success is stored");
        assert_eq!(answer(&text), Some(ok));
        let failed = Envelope::terminal(ErrorCode::TOOL_EXECUTION_FAILED, "no");
        assert_eq!(to_store(&failed), None);
        assert_eq!(answer(&failed.to_json()), None);
        for garbage in ["", "null", "{\"ok\":1}", "[1]"] {
            assert_eq!(answer(garbage), None, "{garbage}");
        }
    }
}
