//! A Redis Cluster on loopback: primaries, each with its replicas, formed
//! with `redis-cli --cluster create`, for the cluster tests and
//! `toolfleet bench --redis-cluster`.

use std::time::Duration;

use anyhow::Context as _;

use super::free_port;
use super::process::ServerOptions;
use super::redis_server::{RedisConfig, RedisServer, redis_cli};
use super::wait::{start_with_attempts, wait_until};

/// Tries at forming the cluster: a port the kernel called free can be taken
/// by another process before its node binds it.
const START_ATTEMPTS: usize = 3;

/// How long the formed cluster may take to agree that every slot is served.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// `primaries` redis-servers in cluster mode, each primary with `replicas`
/// replicas, every slot assigned. Each node is a [`RedisServer`]: it can be
/// killed and restarted on its port, with its data (with
/// [`RedisConfig::append_only`]) and its `nodes.conf`, and so rejoins as
/// itself. Killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// How many primaries it was formed with: the slots' owners.
    primaries: usize,
}

/// A node's place in the cluster, as `CLUSTER NODES` says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    port: u16,
    primary: bool,
    failed: bool,
    /// Slot ranges it serves (a primary's), inclusive.
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts and forms the cluster as tests want it
    /// ([`ServerOptions::default`]), every node configured by `config` (its
    /// TLS and ACL settings are not supported here).
    ///
    /// # Errors
    ///
    /// See [`start_with_options`](Self::start_with_options).
    pub async fn start(
        primaries: usize,
        replicas: usize,
        config: RedisConfig,
    ) -> anyhow::Result<Self> {
        Self::start_with_options(primaries, replicas, config, &ServerOptions::default()).await
    }

    /// Starts `primaries * (1 + replicas)` nodes as `options` say (node
    /// `i`'s dir is `redis-server-<i>`), forms the cluster, and waits until
    /// every node serves every slot.
    ///
    /// # Errors
    ///
    /// Fewer than three primaries (Redis Cluster's minimum), no `redis-cli`,
    /// a node that does not start, or a cluster that does not form in time.
    pub async fn start_with_options(
        primaries: usize,
        replicas: usize,
        config: RedisConfig,
        options: &ServerOptions,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(primaries >= 3, "a Redis Cluster needs at least 3 primaries");
        anyhow::ensure!(
            config.tls.is_none() && config.include.is_none(),
            "the harness's Redis Cluster runs without TLS and ACL files"
        );
        start_with_attempts("Redis Cluster", START_ATTEMPTS, || {
            Self::try_start(primaries, replicas, &config, options)
        })
        .await
    }

    async fn try_start(
        primaries: usize,
        replicas: usize,
        config: &RedisConfig,
        options: &ServerOptions,
    ) -> anyhow::Result<Self> {
        let count = primaries * (1 + replicas);
        let mut starts = Vec::new();
        for index in 0..count {
            let config = RedisConfig {
                cluster_bus_port: Some(free_port()?),
                ..config.clone()
            };
            let name = format!("redis-server-{index}");
            starts.push(async move { RedisServer::launch(&name, config, options).await });
        }
        let nodes = futures::future::try_join_all(starts).await?;
        let cluster = Self { nodes, primaries };
        cluster.form(replicas).await?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create`: the first `primaries` nodes get the
    /// slots, the others replicate them.
    async fn form(&self, replicas: usize) -> anyhow::Result<()> {
        let mut command = tokio::process::Command::new(redis_cli()?);
        command.arg("--cluster").arg("create");
        command.args(
            self.nodes
                .iter()
                .map(|node| format!("127.0.0.1:{}", node.port())),
        );
        command.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let output = command
            .output()
            .await
            .context("cannot run redis-cli --cluster create")?;
        anyhow::ensure!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        self.wait_healthy(FORM_TIMEOUT).await
    }

    /// Every node's URL, comma separated: what `redis.url` takes with
    /// `redis.cluster`.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes, in the order they were started.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The `index`th node.
    ///
    /// # Panics
    ///
    /// There is no such node.
    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index]
    }

    /// A client of the whole cluster, for the harness's own reads.
    ///
    /// # Errors
    ///
    /// The URLs cannot be parsed.
    pub fn client(&self) -> anyhow::Result<redis::cluster::ClusterClient> {
        let urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        Ok(redis::cluster::ClusterClient::new(urls)?)
    }

    /// Waits until every running node says the cluster is ok: every slot
    /// served by a primary that is up.
    ///
    /// # Errors
    ///
    /// Not within `timeout`.
    pub async fn wait_healthy(&self, timeout: Duration) -> anyhow::Result<()> {
        wait_until(
            "every node of the Redis Cluster to serve every slot",
            timeout,
            || async {
                for node in self.nodes.iter().filter(|node| node.process().is_running()) {
                    let mut connection = node.client().get_multiplexed_async_connection().await?;
                    let info: String = redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query_async(&mut connection)
                        .await?;
                    anyhow::ensure!(
                        info.contains("cluster_state:ok")
                            && info.contains("cluster_slots_ok:16384"),
                        "node on {} is not ready: {}",
                        node.port(),
                        info.lines().take(3).collect::<Vec<_>>().join(", ")
                    );
                }
                anyhow::Ok(())
            },
        )
        .await
    }

    /// The indexes of the running nodes that are replicas right now, as
    /// each says of itself.
    ///
    /// # Errors
    ///
    /// A running node does not answer.
    pub async fn replicas(&self) -> anyhow::Result<Vec<usize>> {
        let mut replicas = Vec::new();
        for (index, info) in self.replication_infos().await? {
            if info.contains("role:slave") {
                replicas.push(index);
            }
        }
        Ok(replicas)
    }

    /// Waits until every running replica is linked to its primary and
    /// done with its initial copy, and no running node beyond the cluster's
    /// primaries calls itself one: from then on each write of a primary
    /// reaches its replicas.
    ///
    /// A primary restarted after its replica took its place says it is a
    /// primary, with its old slots, until the others tell it otherwise
    /// (and its cluster state is `ok` meanwhile); until then its successor
    /// has no replica.
    ///
    /// # Errors
    ///
    /// Not within `timeout`.
    pub async fn wait_replicas_linked(&self, timeout: Duration) -> anyhow::Result<()> {
        wait_until(
            "every replica of the Redis Cluster to be linked to its primary",
            timeout,
            || async {
                let mut primaries = Vec::new();
                for (index, info) in self.replication_infos().await? {
                    if !info.contains("role:slave") {
                        primaries.push(index);
                        continue;
                    }
                    anyhow::ensure!(
                        info.contains("master_link_status:up")
                            && info.contains("master_sync_in_progress:0"),
                        "node {index} is a replica not in sync yet"
                    );
                }
                anyhow::ensure!(
                    primaries.len() <= self.primaries,
                    "nodes {primaries:?} say they are primaries, of a cluster formed with {}",
                    self.primaries
                );
                anyhow::Ok(())
            },
        )
        .await
    }

    /// `INFO replication` of every running node, by index.
    async fn replication_infos(&self) -> anyhow::Result<Vec<(usize, String)>> {
        let mut infos = Vec::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if !node.process().is_running() {
                continue;
            }
            let mut connection = node.client().get_multiplexed_async_connection().await?;
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut connection)
                .await?;
            infos.push((index, info));
        }
        Ok(infos)
    }

    /// The index of the node that serves `key`'s slot as its primary right
    /// now, as a running node sees it.
    ///
    /// # Errors
    ///
    /// No running node answers, or none serves the slot.
    pub async fn primary_of(&self, key: &str) -> anyhow::Result<usize> {
        let node = self
            .nodes
            .iter()
            .find(|node| node.process().is_running())
            .context("no node of the Redis Cluster runs")?;
        let mut connection = node.client().get_multiplexed_async_connection().await?;
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut connection)
            .await?;
        let lines: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut connection)
            .await?;
        let port = parse_nodes(&lines)
            .into_iter()
            .find(|line| {
                line.primary
                    && !line.failed
                    && line
                        .slots
                        .iter()
                        .any(|(from, to)| (*from..=*to).contains(&slot))
            })
            .map(|line| line.port)
            .with_context(|| format!("no primary serves slot {slot}"))?;
        self.nodes
            .iter()
            .position(|node| node.port() == port)
            .with_context(|| format!("port {port} is not a node of this cluster"))
    }
}

/// `CLUSTER NODES`: `<id> <ip:port@bus[,host]> <flags> <primary> <ping>
/// <pong> <epoch> <link> <slot or range>...`.
fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let address = fields.get(1)?.split(['@', ',']).next()?;
            let port = address.rsplit_once(':')?.1.parse().ok()?;
            let flags = fields.get(2)?;
            let slots = fields
                .iter()
                .skip(8)
                // `[slot->-node]` entries are slots in migration.
                .filter(|field| !field.starts_with('['))
                .filter_map(|field| match field.split_once('-') {
                    Some((from, to)) => Some((from.parse().ok()?, to.parse().ok()?)),
                    None => field.parse().ok().map(|slot| (slot, slot)),
                })
                .collect();
            Some(NodeLine {
                port,
                primary: flags.split(',').any(|flag| flag == "master"),
                failed: flags
                    .split(',')
                    .any(|flag| flag == "fail" || flag == "fail?"),
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_give_each_primary_its_slots() {
        let text = "\
07c3 127.0.0.1:30004@31004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@31002,host master - 0 1426238316232 2 connected 5461-10922
e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 16000 [93->-292f]
292f 127.0.0.1:30003@31003 master,fail - 1426238316232 1426238316232 3 disconnected
";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 4);
        assert_eq!(
            nodes[0],
            NodeLine {
                port: 30004,
                primary: false,
                failed: false,
                slots: vec![]
            }
        );
        assert_eq!(nodes[1].slots, [(5461, 10922)]);
        assert_eq!(nodes[2].slots, [(0, 5460), (16000, 16000)]);
        assert!(nodes[2].primary && !nodes[2].failed);
        assert!(nodes[3].primary && nodes[3].failed);
    }
}
