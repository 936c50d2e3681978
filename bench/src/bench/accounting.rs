//! What a bench phase cost, process by process: CPU and memory of every
//! process of the fleet (from /proc, Linux), the Redis commands it ran
//! (`INFO commandstats`) and the messages NATS moved (`/varz`), each read
//! before and after the phase.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

/// A process to account for.
#[derive(Debug, Clone)]
pub(super) struct Probe {
    /// `orchestrator`, `worker-0`, `nats-server`, ...
    pub(super) name: String,
    pub(super) pid: u32,
}

impl Probe {
    pub(super) fn new(name: impl Into<String>, pid: u32) -> Self {
        Self {
            name: name.into(),
            pid,
        }
    }

    /// This process.
    pub(super) fn this(name: impl Into<String>) -> Self {
        Self::new(name, std::process::id())
    }
}

/// Where the fleet's servers can be asked what they did.
#[derive(Debug, Clone, Default)]
pub(super) struct Sources {
    pub(super) processes: Vec<Probe>,
    /// Every Redis server, for `INFO commandstats` (plain `redis://` only).
    /// A Redis Cluster's replicas count the writes they copy.
    pub(super) redis_urls: Vec<String>,
    /// Every NATS server's monitoring endpoint, for `/varz`. A cluster's
    /// servers count what they pass each other too.
    pub(super) nats_monitoring: Vec<String>,
}

/// One reading of everything in [`Sources`].
#[derive(Debug, Clone, Default)]
pub(super) struct Reading {
    usage: BTreeMap<String, Usage>,
    /// Calls so far, and Redis's time in them, by command.
    redis_calls: Option<BTreeMap<String, CommandStats>>,
    nats: Option<NatsCounters>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    cpu: Duration,
    rss_bytes: u64,
    /// The most resident memory so far (`VmHWM`).
    peak_rss_bytes: u64,
}

/// A command's line of `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CommandStats {
    calls: u64,
    /// Microseconds Redis spent running them.
    usec: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct NatsCounters {
    in_msgs: u64,
    out_msgs: u64,
    in_bytes: u64,
    out_bytes: u64,
}

impl Sources {
    /// Reads every source; one that cannot be read is left out.
    pub(super) async fn read(&self) -> Reading {
        let usage = self
            .processes
            .iter()
            .filter_map(|p| usage(p.pid).map(|u| (p.name.clone(), u)))
            .collect();
        // Summed over the servers; left out if any cannot be read.
        let mut redis_calls = (!self.redis_urls.is_empty()).then(BTreeMap::new);
        for url in &self.redis_urls {
            match (redis_commandstats(url).await, redis_calls.as_mut()) {
                (Ok(calls), Some(sum)) => {
                    for (command, stats) in calls {
                        let total: &mut CommandStats = sum.entry(command).or_default();
                        total.calls += stats.calls;
                        total.usec += stats.usec;
                    }
                }
                _ => redis_calls = None,
            }
        }
        let mut nats = (!self.nats_monitoring.is_empty()).then(NatsCounters::default);
        for url in &self.nats_monitoring {
            match (nats_varz(url).await, nats.as_mut()) {
                (Ok(counters), Some(sum)) => {
                    sum.in_msgs += counters.in_msgs;
                    sum.out_msgs += counters.out_msgs;
                    sum.in_bytes += counters.in_bytes;
                    sum.out_bytes += counters.out_bytes;
                }
                _ => nats = None,
            }
        }
        Reading {
            usage,
            redis_calls,
            nats,
        }
    }
}

impl Sources {
    /// Whether every server says it fsyncs every write before acknowledging
    /// it (JetStream's `sync_always`, Redis's `appendonly yes` with
    /// `appendfsync always`); `None` when one cannot be asked.
    pub(super) async fn fsync_every_write(&self) -> Option<bool> {
        if self.nats_monitoring.is_empty() || self.redis_urls.is_empty() {
            return None;
        }
        let mut every = true;
        for monitoring in &self.nats_monitoring {
            let varz: Value = reqwest::Client::new()
                .get(format!("{monitoring}/varz"))
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            every &= varz["jetstream"]["config"]["sync_always"]
                .as_bool()
                .unwrap_or(false);
        }
        for url in &self.redis_urls {
            let client = redis::Client::open(url.as_str()).ok()?;
            let mut connection = client.get_multiplexed_async_connection().await.ok()?;
            let mut setting = async |name: &str| -> Option<String> {
                let reply: Vec<String> = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg(name)
                    .query_async(&mut connection)
                    .await
                    .ok()?;
                reply.get(1).cloned()
            };
            every &= setting("appendonly").await? == "yes";
            every &= setting("appendfsync").await? == "always";
        }
        Some(every)
    }
}

/// What a phase of `jobs` jobs cost, per job, by process and server.
#[derive(Debug, Default, Serialize)]
pub(super) struct Accounting {
    /// CPU milliseconds per job of each process (user + system).
    pub(super) cpu_ms_per_job_by_process: BTreeMap<String, f64>,
    /// Their sum: every process of the fleet, NATS and Redis included.
    pub(super) cpu_ms_per_job_total: f64,
    /// CPU of all of them over the phase's wall time, in cores.
    pub(super) cores_busy: f64,
    /// Resident memory of each process at the end of the phase, in MB.
    pub(super) rss_mb_by_process: BTreeMap<String, f64>,
    /// Resident memory of each process before any job, in MB.
    pub(super) idle_rss_mb_by_process: BTreeMap<String, f64>,
    /// The most resident memory of each process up to the end of the phase
    /// (its `VmHWM`: the peak of the load, unless warm-up held more), in MB.
    pub(super) peak_rss_mb_by_process: BTreeMap<String, f64>,
    /// Redis commands per job (`INFO commandstats`), and by command.
    pub(super) redis_commands_per_job: Option<f64>,
    pub(super) redis_commands_per_job_by_name: BTreeMap<String, f64>,
    /// Microseconds Redis spent per job running each command (its own
    /// count, `INFO commandstats`): which commands its CPU goes to.
    pub(super) redis_usec_per_job_by_name: BTreeMap<String, f64>,
    /// Messages and bytes NATS received and sent per job (`/varz`).
    pub(super) nats_messages_in_per_job: Option<f64>,
    pub(super) nats_messages_out_per_job: Option<f64>,
    pub(super) nats_bytes_in_per_job: Option<f64>,
    pub(super) nats_bytes_out_per_job: Option<f64>,
}

/// The readings a phase is accounted from.
#[derive(Clone, Copy)]
pub(super) struct Readings<'a> {
    /// Before any job: the processes' memory at rest.
    pub(super) idle: &'a Reading,
    /// When the phase started.
    pub(super) before: &'a Reading,
    /// When it ended.
    pub(super) after: &'a Reading,
}

impl Accounting {
    /// The difference of `readings.after` and `readings.before`, over
    /// `jobs` jobs that took `elapsed`; `readings.idle` gives the memory
    /// before any job.
    pub(super) fn of(readings: Readings<'_>, jobs: usize, elapsed: Duration) -> Self {
        let Readings {
            idle,
            before,
            after,
        } = readings;
        let per_job = |n: f64| n / jobs.max(1) as f64;
        let mb = |bytes: u64| bytes as f64 / 1_048_576.0;
        let mut accounting = Self::default();
        for (name, end) in &after.usage {
            let Some(start) = before.usage.get(name) else {
                continue;
            };
            let cpu_ms = end.cpu.saturating_sub(start.cpu).as_secs_f64() * 1000.0;
            accounting
                .cpu_ms_per_job_by_process
                .insert(name.clone(), per_job(cpu_ms));
            accounting.cpu_ms_per_job_total += per_job(cpu_ms);
            accounting.cores_busy += cpu_ms / 1000.0 / elapsed.as_secs_f64().max(1e-9);
            accounting
                .rss_mb_by_process
                .insert(name.clone(), mb(end.rss_bytes));
            accounting
                .peak_rss_mb_by_process
                .insert(name.clone(), mb(end.peak_rss_bytes));
        }
        accounting.idle_rss_mb_by_process = idle
            .usage
            .iter()
            .map(|(name, u)| (name.clone(), mb(u.rss_bytes)))
            .collect();
        if let (Some(start), Some(end)) = (&before.redis_calls, &after.redis_calls) {
            let mut total = 0.0;
            for (name, stats) in end {
                // The bench's own `INFO` is not the fleet's.
                if name == "info" {
                    continue;
                }
                let earlier = start.get(name).copied().unwrap_or_default();
                let done = stats.calls.saturating_sub(earlier.calls) as f64;
                if done > 0.0 {
                    accounting
                        .redis_commands_per_job_by_name
                        .insert(name.clone(), per_job(done));
                    let usec = stats.usec.saturating_sub(earlier.usec) as f64;
                    accounting
                        .redis_usec_per_job_by_name
                        .insert(name.clone(), per_job(usec));
                    total += done;
                }
            }
            accounting.redis_commands_per_job = Some(per_job(total));
        }
        if let (Some(start), Some(end)) = (before.nats, after.nats) {
            let delta = |a: u64, b: u64| Some(per_job(a.saturating_sub(b) as f64));
            accounting.nats_messages_in_per_job = delta(end.in_msgs, start.in_msgs);
            accounting.nats_messages_out_per_job = delta(end.out_msgs, start.out_msgs);
            accounting.nats_bytes_in_per_job = delta(end.in_bytes, start.in_bytes);
            accounting.nats_bytes_out_per_job = delta(end.out_bytes, start.out_bytes);
        }
        accounting
    }
}

/// CPU time (user + system) of `pid` so far, from /proc.
pub(super) fn cpu_of(pid: u32) -> Option<Duration> {
    usage(pid).map(|u| u.cpu)
}

/// Resident memory of `pid` now, in bytes, from /proc.
pub(super) fn rss_of(pid: u32) -> Option<u64> {
    usage(pid).map(|u| u.rss_bytes)
}

/// CPU (user + system) and resident memory of `pid`, from /proc.
fn usage(pid: u32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at ") ".
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |field: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some(Usage {
        // Linux reports clock ticks; USER_HZ is 100 on every mainstream platform.
        cpu: Duration::from_millis((utime + stime) * 10),
        rss_bytes: kb("VmRSS:")? * 1024,
        peak_rss_bytes: kb("VmHWM:")? * 1024,
    })
}

/// Calls so far of every command, and Redis's time in them, from
/// `INFO commandstats`.
async fn redis_commandstats(url: &str) -> anyhow::Result<BTreeMap<String, CommandStats>> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await?;
    Ok(parse_commandstats(&info))
}

/// `cmdstat_evalsha:calls=12,usec=340,...` lines to `{"evalsha": 12 calls
/// in 340 µs}`; subcommands (`cmdstat_client|setname`) count under their
/// own names.
fn parse_commandstats(info: &str) -> BTreeMap<String, CommandStats> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| -> Option<u64> {
                stats
                    .split(',')
                    .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            let stats = CommandStats {
                calls: field("calls")?,
                usec: field("usec")?,
            };
            Some((name.to_owned(), stats))
        })
        .collect()
}

/// NATS's message and byte counters, from `/varz`.
async fn nats_varz(monitoring: &str) -> anyhow::Result<NatsCounters> {
    let varz: Value = reqwest::Client::new()
        .get(format!("{monitoring}/varz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let counter = |key: &str| {
        varz[key]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("/varz has no {key}"))
    };
    Ok(NatsCounters {
        in_msgs: counter("in_msgs")?,
        out_msgs: counter("out_msgs")?,
        in_bytes: counter("in_bytes")?,
        out_bytes: counter("out_bytes")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_are_read_by_name_with_subcommands_apart() {
        let info = "# Commandstats\r\n\
                    cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_client|setname:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_broken:usec=1\r\n";
        let stats = parse_commandstats(info);
        let evalsha = CommandStats {
            calls: 12,
            usec: 340,
        };
        assert_eq!(stats.get("evalsha"), Some(&evalsha));
        assert_eq!(stats.get("client|setname").map(|s| s.calls), Some(2));
        assert_eq!(stats.len(), 2);
    }

    #[test]
    fn a_phase_is_the_difference_per_job() {
        let reading = |cpu_ms: u64, rss: u64, evalsha: u64, msgs: u64| Reading {
            usage: BTreeMap::from([(
                "orchestrator".to_owned(),
                Usage {
                    cpu: Duration::from_millis(cpu_ms),
                    rss_bytes: rss,
                    // The peak here: 5 MB over what the process holds.
                    peak_rss_bytes: rss + (5 << 20),
                },
            )]),
            redis_calls: Some(BTreeMap::from([
                (
                    "evalsha".to_owned(),
                    CommandStats {
                        calls: evalsha,
                        usec: 10 * evalsha,
                    },
                ),
                (
                    "info".to_owned(),
                    CommandStats {
                        calls: evalsha,
                        usec: evalsha,
                    },
                ),
            ])),
            nats: Some(NatsCounters {
                in_msgs: msgs,
                out_msgs: 2 * msgs,
                in_bytes: 100 * msgs,
                out_bytes: 200 * msgs,
            }),
        };
        let idle = reading(0, 10 << 20, 0, 0);
        let before = reading(1_000, 20 << 20, 50, 10);
        let after = reading(3_000, 30 << 20, 250, 110);
        let accounting = Accounting::of(
            Readings {
                idle: &idle,
                before: &before,
                after: &after,
            },
            100,
            Duration::from_secs(4),
        );
        assert_eq!(accounting.cpu_ms_per_job_by_process["orchestrator"], 20.0);
        assert_eq!(accounting.cpu_ms_per_job_total, 20.0);
        assert_eq!(accounting.cores_busy, 0.5);
        assert_eq!(accounting.rss_mb_by_process["orchestrator"], 30.0);
        assert_eq!(accounting.idle_rss_mb_by_process["orchestrator"], 10.0);
        assert_eq!(accounting.peak_rss_mb_by_process["orchestrator"], 35.0);
        assert_eq!(accounting.redis_commands_per_job, Some(2.0));
        assert_eq!(accounting.redis_usec_per_job_by_name["evalsha"], 20.0);
        assert!(
            !accounting
                .redis_commands_per_job_by_name
                .contains_key("info")
        );
        assert_eq!(accounting.nats_messages_in_per_job, Some(1.0));
        assert_eq!(accounting.nats_messages_out_per_job, Some(2.0));
        assert_eq!(accounting.nats_bytes_out_per_job, Some(200.0));
    }
}
