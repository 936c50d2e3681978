//! What a fleet is made of, as a [`FleetBuilder`](crate::FleetBuilder)
//! gathers it and the in-process and process fleets read it.

use crate::servers::{Nats, ServersSpec};

/// What a fleet's workers serve.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Serving {
    /// The built-in tools, as a release worker serves them.
    #[default]
    BuiltIn,
    /// The built-in tools and the test tools (`echo`, `sleep`, `fail`, ...;
    /// `--test-tools`).
    TestTools,
    /// Only these tools, as a pool's workers serve theirs (`--tools a,b`).
    Tools(Vec<String>),
}

/// Environment variables for a service process, `(name, value)`.
pub type Env = Vec<(String, String)>;

/// A fleet's description; see [`FleetBuilder`](crate::FleetBuilder).
pub(crate) struct FleetSpec {
    pub(crate) servers: ServersSpec,
    /// A NATS the caller started and configured itself (accounts, TLS,
    /// permissions), used instead of the one `servers` describes.
    pub(crate) nats: Option<Nats>,
    pub(crate) tls: bool,
    pub(crate) workers: usize,
    pub(crate) orchestrators: usize,
    pub(crate) serving: Serving,
    pub(crate) env: Env,
    pub(crate) worker_env: Env,
    pub(crate) orchestrator_env: Env,
}

impl Default for FleetSpec {
    fn default() -> Self {
        Self {
            servers: ServersSpec::default(),
            nats: None,
            tls: false,
            workers: 2,
            orchestrators: 1,
            serving: Serving::default(),
            env: Env::new(),
            worker_env: Env::new(),
            orchestrator_env: Env::new(),
        }
    }
}

/// `env` as owned pairs.
pub(crate) fn owned<'a>(
    env: &'a [(&str, &str)],
) -> impl Iterator<Item = (String, String)> + use<'a> {
    env.iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
}
