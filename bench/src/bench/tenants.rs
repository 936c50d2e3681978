//! `--tenants N`: the orchestrator takes bearer tokens from a tokens file
//! of N tenants made for the run, each with every quota and budget the
//! file can give (set so high that none refuses), and the load's jobs go
//! to the tenants in turn. A job's cost must not depend on how many
//! tenants there are: each of its checks names its own tenant's keys.

use std::fmt::Write as _;

use toolfleet_orchestrator::auth::token_sha256;

/// The run's tenants and their tokens.
pub(super) struct Tenants {
    tokens: Vec<String>,
}

impl Tenants {
    /// `count` tenants (at least one), each with a token of its own.
    pub(super) fn new(count: usize) -> Self {
        // A loopback fleet for one run: unguessable is enough.
        let salt = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), count);
        let tokens = (0..count.max(1))
            .map(|n| format!("bench-{n}-{salt:016x}"))
            .collect();
        Self { tokens }
    }

    /// The tokens file: each tenant's token hash, quotas and budgets.
    pub(super) fn file(&self) -> String {
        let mut file = String::new();
        for (n, token) in self.tokens.iter().enumerate() {
            let name = Self::name(n);
            // Writing to a String cannot fail.
            let _ = write!(
                file,
                "[tenants.{name}]\n\
                 token_sha256 = [\"{}\"]\n\
                 max_active_jobs = 100000\n\
                 submissions_per_second = 1000000.0\n\
                 max_calls_in_flight = 1000000\n\
                 [tenants.{name}.budget]\n\
                 tokens_per_day = 1000000000000\n\
                 cost_units_per_hour = 1000000000\n\
                 tool_calls_per_hour = 1000000000\n\
                 job_seconds_per_day = 1000000000\n",
                token_sha256(token)
            );
        }
        file
    }

    /// How many there are.
    pub(super) fn count(&self) -> usize {
        self.tokens.len()
    }

    /// The token of the `n`th job's tenant: the tenants in turn.
    pub(super) fn token(&self, n: usize) -> &str {
        &self.tokens[n % self.tokens.len()]
    }

    /// The name of the `n`th tenant.
    fn name(n: usize) -> String {
        format!("bench{n:05}")
    }
}

/// `message` as a request carrying `token` as its bearer token, if any.
pub(super) fn authorized<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = token.and_then(|t| format!("Bearer {t}").parse().ok()) {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_names_each_tenant_with_its_token_hash_and_jobs_take_turns() {
        let tenants = Tenants::new(3);
        let file: toml::Value = toml::from_str(&tenants.file()).expect("the file is TOML");
        let listed = file["tenants"].as_table().expect("a table of tenants");
        assert_eq!(listed.len(), 3);
        let second = &listed["bench00001"];
        assert_eq!(
            second["token_sha256"][0].as_str(),
            Some(token_sha256(tenants.token(1)).as_str())
        );
        assert!(second["budget"]["tool_calls_per_hour"].is_integer());
        assert_eq!(tenants.token(4), tenants.token(1));
        assert_ne!(tenants.token(0), tenants.token(1));
        let request = authorized((), Some(tenants.token(0)));
        let header = request.metadata().get("authorization").expect("a header");
        assert_eq!(
            header.to_str().ok(),
            Some(format!("Bearer {}", tenants.token(0)).as_str())
        );
    }
}
