//! An MCP server's tool as a fleet tool: its manifest, made from what the
//! server lists and what the configuration says, and its calls.

use std::sync::Arc;

use rmcp::model::Tool as McpToolInfo;
use serde_json::Value;
use toolfleet_proto::manifest::{MAX_DESCRIPTION_BYTES, MAX_SCHEMA_BYTES};
use toolfleet_proto::{Effects, ToolManifest};

use super::config::McpServerOptions;
use super::server::McpServer;
use crate::tool::{Applied, Tool, ToolContext, ToolError};

/// A tool of an MCP server, served under its fleet name.
pub struct McpTool {
    server: Arc<McpServer>,
    /// The name the server knows it by, for `tools/call`.
    mcp_name: String,
    manifest: ToolManifest,
}

impl McpTool {
    /// The tool `info` of `server`, served as `fleet_name`; `None`, with the
    /// reason, when its description cannot be served.
    pub fn new(
        server: Arc<McpServer>,
        fleet_name: String,
        info: &McpToolInfo,
    ) -> Result<Self, String> {
        let manifest = manifest(server.options(), fleet_name, info)?;
        Ok(Self {
            server,
            mcp_name: info.name.to_string(),
            manifest,
        })
    }
}

impl Tool for McpTool {
    fn manifest(&self) -> ToolManifest {
        self.manifest.clone()
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<Value, ToolError> {
        let effects = self.manifest.effects;
        self.server.call(&self.mcp_name, args, effects, &ctx).await
    }

    /// What the server's task of the call says, if the call saved one: a
    /// task that completed is the call's result (decision 0044).
    async fn probe(&self, _args: Value, ctx: ToolContext) -> Applied {
        self.server.probe_task(&ctx).await
    }

    /// A call the server runs as a task saves the task's id, to be
    /// followed by the next worker should this one die.
    fn saves_checkpoints(&self) -> bool {
        true
    }
}

/// The manifest of the tool `info` of the server `options`, under
/// `fleet_name`: the server's schema (bounded, and strict only when it
/// is), a bounded description, effects from the configuration or else
/// the server's hints, the approval the configuration asks for.
fn manifest(
    options: &McpServerOptions,
    fleet_name: String,
    info: &McpToolInfo,
) -> Result<ToolManifest, String> {
    let schema = Value::Object((*info.input_schema).clone());
    let schema_bytes = schema.to_string().len();
    if schema_bytes > MAX_SCHEMA_BYTES {
        return Err(format!(
            "its input schema is {schema_bytes} bytes; the limit is {MAX_SCHEMA_BYTES}"
        ));
    }
    if let Err(err) = jsonschema::validator_for(&schema) {
        return Err(format!("its input schema does not compile: {err}"));
    }
    let description = info
        .description
        .as_deref()
        .or(info.title.as_deref())
        .unwrap_or_default();
    let hints = info.annotations.as_ref();
    let read_only = hints.and_then(|h| h.read_only_hint).unwrap_or(false);
    let idempotent = hints.and_then(|h| h.idempotent_hint).unwrap_or(false);
    let destructive = hints.and_then(|h| h.destructive_hint).unwrap_or(true);
    let effects = options
        .effects
        .get(info.name.as_ref())
        .copied()
        .unwrap_or_else(|| effects_of_hints(read_only, idempotent));
    let mut manifest = ToolManifest::new(fleet_name, bounded(description), schema.clone())
        .with_timeout(options.call_timeout)
        .with_effects(effects)
        .with_approval(options.approval.for_tool(effects, destructive));
    manifest.strict = is_strict(&schema);
    manifest.version = "mcp".into();
    if let Some(ttl) = options.cache_ttl.get(info.name.as_ref()) {
        if effects == Effects::ReadOnly {
            manifest = manifest.with_cache_ttl(ttl.0);
        } else {
            tracing::warn!(
                server = %options.name,
                tool = %manifest.name,
                %effects,
                "cache_ttl is set, but the server says the tool's calls are not read-only: \
                 its results are not cached (set its `effects` to read_only if they are)"
            );
        }
    }
    Ok(manifest)
}

/// What a server's hints say a tool's calls may do (docs/tools/mcp.md):
/// `readOnlyHint` wins, then `idempotentHint`; with neither, the MCP
/// defaults (false, false) make it `not_idempotent`.
pub fn effects_of_hints(read_only: bool, idempotent: bool) -> Effects {
    match (read_only, idempotent) {
        (true, _) => Effects::ReadOnly,
        (false, true) => Effects::Idempotent,
        (false, false) => Effects::NotIdempotent,
    }
}

/// `text` cut to the manifest's limit, on a character boundary.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_DESCRIPTION_BYTES {
        return text.to_owned();
    }
    let mut cut = MAX_DESCRIPTION_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].to_owned()
}

/// Whether `schema` meets OpenAI's strict subset, as far as it can be told:
/// an object whose every object (nested ones too) lists all its properties
/// as required and allows no others. A schema this cannot tell (`$ref`,
/// `anyOf` at an object) is not strict: the model is then asked without
/// `strict`, and the worker still checks every call against the schema.
pub fn is_strict(schema: &Value) -> bool {
    let Some(fields) = schema.as_object() else {
        return false;
    };
    if [
        "$ref",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "patternProperties",
    ]
    .iter()
    .any(|key| fields.contains_key(*key))
    {
        return false;
    }
    match fields.get("type").and_then(Value::as_str) {
        Some("object") => {
            let properties = fields.get("properties").and_then(Value::as_object);
            let required: Vec<&str> = fields
                .get("required")
                .and_then(Value::as_array)
                .map(|names| names.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            fields.get("additionalProperties") == Some(&Value::Bool(false))
                && properties.is_none_or(|properties| {
                    properties
                        .iter()
                        .all(|(name, sub)| required.contains(&name.as_str()) && is_strict(sub))
                })
        }
        Some("array") => fields.get("items").is_none_or(is_strict),
        Some(_) => true,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hints_map_to_effects_as_documented() {
        assert_eq!(effects_of_hints(true, false), Effects::ReadOnly);
        assert_eq!(effects_of_hints(true, true), Effects::ReadOnly);
        assert_eq!(effects_of_hints(false, true), Effects::Idempotent);
        assert_eq!(effects_of_hints(false, false), Effects::NotIdempotent);
    }

    #[test]
    fn strictness_is_claimed_only_where_it_can_be_told() {
        let strict = json!({"type": "object", "additionalProperties": false,
            "required": ["a", "b"], "properties": {
                "a": {"type": "string"},
                "b": {"type": "array", "items": {"type": "object", "additionalProperties": false,
                      "required": ["c"], "properties": {"c": {"type": "integer"}}}}}});
        assert!(is_strict(&strict));
        // The Python SDK's schemas: no additionalProperties.
        let open =
            json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}});
        assert!(!is_strict(&open));
        let optional = json!({"type": "object", "additionalProperties": false,
            "properties": {"a": {"type": "string"}}});
        assert!(!is_strict(&optional));
        let referenced = json!({"type": "object", "additionalProperties": false,
            "required": ["a"], "properties": {"a": {"$ref": "#/$defs/a"}}});
        assert!(!is_strict(&referenced));
    }

    #[test]
    fn a_cache_ttl_is_kept_only_for_a_tool_whose_calls_are_read_only() {
        let options: McpServerOptions = serde_json::from_value(json!({
            "name": "crm", "command": "x", "tools": ["find", "add"],
            "cache_ttl": {"find": "10m", "add": "10m"},
        }))
        .expect("options");
        let info = |name: &str, read_only: bool| -> McpToolInfo {
            serde_json::from_value(json!({
                "name": name, "inputSchema": {"type": "object"},
                "annotations": {"readOnlyHint": read_only},
            }))
            .expect("a tool")
        };
        let find = manifest(&options, "crm_find".into(), &info("find", true)).expect("served");
        assert_eq!(find.cache_ttl_ms, Some(600_000));
        assert_eq!(find.check("crm_find"), Ok(()));
        // The server says otherwise: served, never cached.
        let add = manifest(&options, "crm_add".into(), &info("add", false)).expect("served");
        assert_eq!(
            (add.effects, add.cache_ttl_ms),
            (Effects::NotIdempotent, None)
        );
    }

    #[test]
    fn a_long_description_is_cut_on_a_character() {
        let long = "é".repeat(MAX_DESCRIPTION_BYTES);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_DESCRIPTION_BYTES && cut.chars().all(|c| c == 'é'));
    }
}
