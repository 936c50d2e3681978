//! A fleet's servers: one nats-server or a NATS cluster, one redis-server or
//! a Redis Cluster, as a [`ServersSpec`] says, started together. The bench's
//! fleet of processes and the test harness start theirs here.

use std::time::Duration;

use toolfleet_service::connect::RedisConnection;

use crate::supervisor::{
    JETSTREAM_SYNC_ALWAYS, NatsCluster, NatsServer, RedisCluster, RedisConfig, RedisServer,
    ServerOptions,
};

/// How long a Redis Cluster's replicas may take to hold their first copy.
const REPLICAS_LINKED: Duration = Duration::from_secs(60);

/// The NATS of a fleet: one server, or a cluster.
pub enum Nats {
    /// One nats-server.
    Server(Box<NatsServer>),
    /// A cluster: the services get every node as a seed.
    Cluster(NatsCluster),
}

impl Nats {
    /// What the services' `nats.url` gets: the server's URL, or every node's.
    pub fn url(&self) -> String {
        match self {
            Self::Server(server) => server.url(),
            Self::Cluster(cluster) => cluster.url(),
        }
    }

    /// A new client connection (to every node of a cluster).
    ///
    /// # Errors
    ///
    /// No server accepts the connection.
    pub async fn client(&self) -> anyhow::Result<async_nats::Client> {
        match self {
            Self::Server(server) => server.client().await,
            Self::Cluster(cluster) => cluster.client().await,
        }
    }

    /// The one server of a fleet that runs on one.
    ///
    /// # Panics
    ///
    /// The fleet runs on a cluster: a test of a cluster names its node.
    pub fn server(&self) -> &NatsServer {
        match self {
            Self::Server(server) => server,
            Self::Cluster(_) => panic!("this fleet runs on a NATS cluster"),
        }
    }

    /// The cluster of a fleet that runs on one.
    ///
    /// # Panics
    ///
    /// The fleet runs on one server.
    pub fn cluster(&self) -> &NatsCluster {
        match self {
            Self::Cluster(cluster) => cluster,
            Self::Server(_) => panic!("this fleet runs on one NATS server"),
        }
    }

    /// Each server, named `nats-server` (or `nats-server-<i>` in a cluster).
    pub fn named(&self) -> Vec<(String, &NatsServer)> {
        match self {
            Self::Server(server) => vec![("nats-server".to_owned(), server)],
            Self::Cluster(cluster) => named("nats-server", cluster.nodes()),
        }
    }
}

/// The Redis of a fleet: one server, or a Redis Cluster.
pub enum Redis {
    /// One redis-server.
    Server(Box<RedisServer>),
    /// A Redis Cluster: the services get every node as a seed.
    Cluster(RedisCluster),
}

impl Redis {
    /// What the services' `redis.url` gets: the server's URL, or every
    /// node's.
    pub fn url(&self) -> String {
        match self {
            Self::Server(server) => server.url(),
            Self::Cluster(cluster) => cluster.url(),
        }
    }

    /// A connection of the fleet's own (a test's reads, the bench's), to
    /// the server or the cluster.
    ///
    /// # Errors
    ///
    /// Redis does not accept the connection.
    pub async fn connection(&self) -> anyhow::Result<RedisConnection> {
        Ok(match self {
            Self::Server(server) => server.connection().await?.into(),
            Self::Cluster(cluster) => cluster.client()?.get_async_connection().await?.into(),
        })
    }

    /// The one server of a fleet that runs on one.
    ///
    /// # Panics
    ///
    /// The fleet runs on a Redis Cluster.
    pub fn server(&self) -> &RedisServer {
        match self {
            Self::Server(server) => server,
            Self::Cluster(_) => panic!("this fleet runs on a Redis Cluster"),
        }
    }

    /// The Redis Cluster of a fleet that runs on one.
    ///
    /// # Panics
    ///
    /// The fleet runs on one server.
    pub fn cluster(&self) -> &RedisCluster {
        match self {
            Self::Cluster(cluster) => cluster,
            Self::Server(_) => panic!("this fleet runs on one Redis server"),
        }
    }

    /// Each server, named `redis-server` (or `redis-server-<i>` in a
    /// cluster).
    pub fn named(&self) -> Vec<(String, &RedisServer)> {
        match self {
            Self::Server(server) => vec![("redis-server".to_owned(), server)],
            Self::Cluster(cluster) => named("redis-server", cluster.nodes()),
        }
    }
}

/// `<kind>-<i>` for the `i`th node.
fn named<'a, T>(kind: &str, nodes: &'a [T]) -> Vec<(String, &'a T)> {
    nodes
        .iter()
        .enumerate()
        .map(|(index, node)| (format!("{kind}-{index}"), node))
        .collect()
}

/// A Redis Cluster's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisClusterShape {
    /// Primaries, each with its share of the slots.
    pub primaries: usize,
    /// Replicas of each primary.
    pub replicas: usize,
}

/// What servers a fleet runs on.
#[derive(Debug, Clone, Default)]
pub struct ServersSpec {
    /// A NATS cluster of this many nodes; `None`: one server.
    pub nats_nodes: Option<usize>,
    /// What one nats-server's configuration file adds (accounts, TLS); not
    /// for a cluster.
    pub nats_config: Option<String>,
    /// JetStream and Redis fsync every write before acknowledging it.
    pub fsync_always: bool,
    /// A Redis Cluster; `None`: one server.
    pub redis_cluster: Option<RedisClusterShape>,
    /// Every redis-server's configuration.
    pub redis: RedisConfig,
    /// Where the servers' dirs go, their process group, their logs.
    pub options: ServerOptions,
}

impl ServersSpec {
    /// Starts NATS and Redis together; a Redis Cluster's replicas hold
    /// their first copy before this returns (writes that wait for a
    /// replica fail until then).
    ///
    /// # Errors
    ///
    /// A server did not start (the error names which), or the spec asks
    /// for what a cluster cannot do here (a configuration file, fsync).
    pub async fn start(&self) -> anyhow::Result<(Nats, Redis)> {
        tokio::try_join!(self.start_nats(), self.start_redis())
    }

    async fn start_nats(&self) -> anyhow::Result<Nats> {
        let options = &self.options;
        let mut config = self.nats_config.clone().unwrap_or_default();
        if self.fsync_always {
            config += JETSTREAM_SYNC_ALWAYS;
        }
        Ok(match self.nats_nodes {
            Some(_) if !config.is_empty() => anyhow::bail!(
                "a NATS cluster here runs without a configuration of its own (accounts, TLS, fsync)"
            ),
            Some(nodes) => Nats::Cluster(NatsCluster::start_with_options(nodes, options).await?),
            None if config.is_empty() => {
                Nats::Server(NatsServer::start_with_options(options).await?.into())
            }
            None => Nats::Server(
                NatsServer::start_with_config(options, &config)
                    .await?
                    .into(),
            ),
        })
    }

    /// Starts Redis alone, for a fleet on a NATS of its caller's; a Redis
    /// Cluster's replicas hold their first copy before this returns.
    pub(crate) async fn start_redis(&self) -> anyhow::Result<Redis> {
        let config = RedisConfig {
            append_only: self.redis.append_only || self.fsync_always,
            ..self.redis.clone()
        };
        let options = &self.options;
        Ok(match self.redis_cluster {
            Some(shape) => {
                let cluster = RedisCluster::start_with_options(
                    shape.primaries,
                    shape.replicas,
                    config,
                    options,
                )
                .await?;
                cluster.wait_replicas_linked(REPLICAS_LINKED).await?;
                Redis::Cluster(cluster)
            }
            None => Redis::Server(
                RedisServer::start_with_options(config, options)
                    .await?
                    .into(),
            ),
        })
    }
}
