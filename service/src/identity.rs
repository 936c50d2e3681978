//! Default identities of service replicas.

/// The configured id, or `<hostname>-<pid>-<random>` when `configured` is
/// empty. The default keeps to letters, digits and `-`, so it is safe in a
/// registry key, a lease token and a log line.
pub fn replica_id(configured: &str) -> String {
    if !configured.is_empty() {
        return configured.to_owned();
    }
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "replica".into());
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_id_wins_and_the_default_is_token_safe() {
        assert_eq!(replica_id("orchestrator-1"), "orchestrator-1");
        let id = replica_id("");
        assert!(
            id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "{id}"
        );
        assert!(id.contains(&format!("-{}-", std::process::id())), "{id}");
    }
}
