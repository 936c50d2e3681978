//! Fleet names for MCP tools. MCP allows names ours do not (dots, slashes,
//! up to 128 characters); a fleet name must match `^[a-zA-Z0-9_-]{1,64}$`
//! (`toolfleet_proto::manifest::is_valid_tool_name`). The mapping is
//! documented in docs/tools/mcp.md and must never change: a tool's queue,
//! permissions and keys are named after it.

/// Longest fleet name.
const MAX: usize = 64;
/// `_` and eight hex digits: the suffix of a shortened name.
const SUFFIX: usize = 9;

/// The fleet name of the MCP tool `mcp_name` under `prefix`: the prefix,
/// then the name with every character other than an ASCII letter, digit,
/// `_` or `-` replaced by `_`; when that is longer than 64 characters, cut
/// to fit `_` and the FNV-1a hash of the MCP name in eight hex digits.
/// `None` for an empty name, or a prefix that leaves no room.
pub fn fleet_name(prefix: &str, mcp_name: &str) -> Option<String> {
    if mcp_name.is_empty() {
        return None;
    }
    let mapped: String = mcp_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let whole = format!("{prefix}{mapped}");
    if whole.len() <= MAX {
        return Some(whole);
    }
    let room = MAX
        .checked_sub(prefix.len() + SUFFIX)
        .filter(|room| *room > 0)?;
    // `mapped` is ASCII: any byte is a character boundary.
    Some(format!(
        "{prefix}{}_{:08x}",
        &mapped[..room],
        fnv1a(mcp_name)
    ))
}

/// FNV-1a, 32 bits: small, and stable across versions and platforms, which
/// a name needs (std's hashers promise neither).
fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_proto::manifest::is_valid_tool_name;

    #[test]
    fn names_map_as_documented_and_never_change() {
        assert_eq!(
            fleet_name("w__", "get_forecast").as_deref(),
            Some("w__get_forecast")
        );
        assert_eq!(
            fleet_name("w__", "get.forecast").as_deref(),
            Some("w__get_forecast")
        );
        assert_eq!(
            fleet_name("w__", "files/read é").as_deref(),
            Some("w__files_read__")
        );
        // Pinned: a queue is named after it.
        let long = "x".repeat(100);
        assert_eq!(
            fleet_name("srv__", &long).as_deref(),
            Some(format!("srv__{}_ac246ad5", "x".repeat(50)).as_str())
        );
        assert_eq!(fnv1a(""), 0x811c_9dc5);
        assert_eq!(fnv1a("a"), 0xe40c_292c);
        assert_eq!(fleet_name("w__", ""), None);
        assert_eq!(fleet_name(&"p".repeat(60), &long), None);
    }

    #[test]
    fn every_name_maps_to_a_valid_tool_name_or_to_none() {
        for name in ["a", "ä", "a.b/c d", &"y".repeat(128), "----", "💥"] {
            for prefix in ["", "s__", &"p".repeat(40)] {
                if let Some(fleet) = fleet_name(prefix, name) {
                    assert!(
                        is_valid_tool_name(&fleet),
                        "{prefix:?} {name:?} -> {fleet:?}"
                    );
                }
            }
        }
    }
}
