//! A cluster of JetStream-enabled `nats-server`s on loopback, for the
//! cluster tests and `toolfleet bench --nats-cluster`.

use anyhow::Context as _;
use async_nats::jetstream;

use super::free_port;
use super::nats_server::{Launch, NatsServer, Ready};
use super::process::ServerOptions;
use super::wait::start_with_attempts;

/// Name of the cluster every node joins.
const CLUSTER_NAME: &str = "toolfleet";

/// Tries at starting the nodes: a route port the kernel called free can be
/// taken by another process before its node binds it.
const START_ATTEMPTS: usize = 3;

/// `size` nats-servers routed to each other, each with JetStream in its own
/// store dir and its own client port, so that a stream can keep a copy on
/// each. Every node is a [`NatsServer`]: it can be killed and restarted on its
/// ports, with its store. Killed on drop.
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts `size` nodes as tests want them ([`ServerOptions::default`])
    /// and waits until JetStream answers on each, which needs a quorum.
    ///
    /// # Errors
    ///
    /// See [`start_with_options`](Self::start_with_options).
    pub async fn start(size: usize) -> anyhow::Result<Self> {
        Self::start_with_options(size, &ServerOptions::default()).await
    }

    /// Starts `size` nodes as `options` say (node `i`'s dir is
    /// `nats-server-<i>`) and waits until JetStream answers on each.
    ///
    /// # Errors
    ///
    /// A node that does not come up in time; the error carries its log.
    pub async fn start_with_options(size: usize, options: &ServerOptions) -> anyhow::Result<Self> {
        anyhow::ensure!(size > 0, "a NATS cluster needs at least one node");
        start_with_attempts("NATS cluster", START_ATTEMPTS, || {
            Self::try_start(size, options)
        })
        .await
    }

    async fn try_start(size: usize, options: &ServerOptions) -> anyhow::Result<Self> {
        let route_ports = (0..size)
            .map(|_| free_port())
            .collect::<anyhow::Result<Vec<_>>>()?;
        let configs: Vec<String> = (0..size)
            .map(|index| node_config(index, &route_ports))
            .collect();
        let names: Vec<String> = (0..size)
            .map(|index| format!("nats-server-{index}"))
            .collect();
        // Together: JetStream answers only once a quorum of nodes is up.
        let starts = configs.iter().zip(&names).map(|(config, name)| {
            let launch = Launch {
                name,
                config: Some(super::nats_server::Config::Text(config)),
                ready: Ready::Probe,
            };
            async move { NatsServer::launch(options, &launch).await }
        });
        let nodes = futures::future::try_join_all(starts).await?;
        Ok(Self { nodes })
    }

    /// Every node's client URL, comma separated: what `nats.url` takes.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes, in the order of their server names (`toolfleet-<index>`).
    pub fn nodes(&self) -> &[NatsServer] {
        &self.nodes
    }

    /// The `index`th node.
    ///
    /// # Panics
    ///
    /// There is no such node.
    pub fn node(&self, index: usize) -> &NatsServer {
        &self.nodes[index]
    }

    /// A client that knows every node, and fails over between them.
    ///
    /// # Errors
    ///
    /// No node accepts the connection.
    pub async fn client(&self) -> anyhow::Result<async_nats::Client> {
        let urls: Vec<String> = self.nodes.iter().map(NatsServer::url).collect();
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(urls)
            .await
            .with_context(|| format!("cannot connect to the NATS cluster at {}", self.url()))
    }

    /// Where `stream`'s copies are: the node that leads it (whose copy
    /// takes its writes), how many copies it keeps, and whether every copy
    /// has caught up with the leader.
    ///
    /// # Errors
    ///
    /// JetStream does not answer, or the stream has no leader right now.
    pub async fn stream_copies(
        &self,
        js: &jetstream::Context,
        stream: &str,
    ) -> anyhow::Result<StreamCopies> {
        let info = js
            .get_stream(stream)
            .await
            .with_context(|| format!("no stream {stream}"))?
            .info()
            .await?
            .clone();
        let cluster = info.cluster.context("the stream has no cluster info")?;
        let leader = cluster
            .leader
            .with_context(|| format!("stream {stream} has no leader"))?;
        let leader = (0..self.nodes.len())
            .find(|index| server_name(*index) == leader)
            .with_context(|| format!("leader {leader} is not a node of this cluster"))?;
        Ok(StreamCopies {
            leader,
            copies: cluster.replicas.len() + 1,
            current: cluster
                .replicas
                .iter()
                .all(|peer| peer.current && !peer.offline),
        })
    }
}

/// Where a stream's copies are ([`NatsCluster::stream_copies`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCopies {
    /// The index of the node that leads the stream.
    pub leader: usize,
    /// How many copies the stream keeps, the leader's included.
    pub copies: usize,
    /// Every copy has caught up with the leader.
    pub current: bool,
}

/// The server name of node `index`: JetStream's clustered mode needs one.
fn server_name(index: usize) -> String {
    format!("toolfleet-{index}")
}

/// Node `index`'s configuration: its name, and routes to every node (a route
/// to itself is ignored). Client and monitoring ports and the store dir
/// are the harness's command-line flags.
fn node_config(index: usize, route_ports: &[u16]) -> String {
    let routes: Vec<String> = route_ports
        .iter()
        .map(|port| format!("nats-route://127.0.0.1:{port}"))
        .collect();
    format!(
        "server_name: {name}\ncluster {{\n  name: {CLUSTER_NAME}\n  listen: 127.0.0.1:{port}\n  routes: [{routes}]\n}}\n",
        name = server_name(index),
        port = route_ports[index],
        routes = routes.join(", "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_named_and_routed_to_every_node() {
        let config = node_config(1, &[4001, 4002, 4003]);
        assert!(config.contains("server_name: toolfleet-1\n"), "{config}");
        assert!(config.contains("listen: 127.0.0.1:4002\n"), "{config}");
        assert!(
            config.contains(
                "routes: [nats-route://127.0.0.1:4001, nats-route://127.0.0.1:4002, nats-route://127.0.0.1:4003]"
            ),
            "{config}"
        );
    }
}
