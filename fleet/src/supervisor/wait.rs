//! Polling with a deadline: the one way the harness waits for anything.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use anyhow::bail;

/// First pause between two attempts; it doubles up to [`POLL_MAX`], so quick
/// conditions are seen quickly and slow ones don't spin.
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);

/// What a [`wait_until`] probe returns.
///
/// `true`, `Some(value)` and `Ok(value)` end the wait. An `Err` keeps waiting, and
/// the last one is quoted in the timeout error, so a probe that fails for a reason
/// ("connection refused") should return a `Result` rather than a `bool`.
pub trait Outcome {
    /// What the wait returns once the condition holds.
    type Output;

    /// `Ok` when the condition holds; otherwise why not, if known.
    fn into_ready(self) -> Result<Self::Output, Option<String>>;
}

impl Outcome for bool {
    type Output = ();

    fn into_ready(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Outcome for Option<T> {
    type Output = T;

    fn into_ready(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: std::fmt::Display> Outcome for Result<T, E> {
    type Output = T;

    fn into_ready(self) -> Result<T, Option<String>> {
        // `{:#}` prints an anyhow error's whole chain, and is plain `Display` for others.
        self.map_err(|err| Some(format!("{err:#}")))
    }
}

/// Calls `probe` until it reports ready, pausing a little longer after each miss,
/// and returns what it produced.
///
/// `what` completes the sentence "waiting for ...", e.g. `"the job to finish"`.
/// The deadline is wall-clock time, so a test that paused tokio's clock still gets
/// real seconds to wait for real processes.
///
/// # Errors
///
/// When `timeout` passes first: the error names `what` and quotes the probe's last
/// error, if it returned one.
///
/// ```no_run
/// # async fn example(counter: &std::sync::atomic::AtomicU64) -> anyhow::Result<()> {
/// use std::{sync::atomic::Ordering, time::Duration};
/// use toolfleet_fleet::supervisor::wait_until;
///
/// wait_until("the counter to reach 3", Duration::from_secs(5), || async {
///     counter.load(Ordering::SeqCst) >= 3
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
pub async fn wait_until<F, Fut>(
    what: &str,
    timeout: Duration,
    probe: F,
) -> anyhow::Result<<Fut::Output as Outcome>::Output>
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Outcome,
{
    poll(what, timeout, probe, || None).await
}

/// [`wait_until`], plus `give_up`: checked after each miss, it ends the wait
/// early with its error (e.g. the process being waited on has exited).
pub(crate) async fn poll<F, Fut>(
    what: &str,
    timeout: Duration,
    mut probe: F,
    mut give_up: impl FnMut() -> Option<anyhow::Error>,
) -> anyhow::Result<<Fut::Output as Outcome>::Output>
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Outcome,
{
    let deadline = Instant::now() + timeout;
    let mut pause = POLL_MIN;
    let mut last_error = None;
    loop {
        match probe().await.into_ready() {
            Ok(output) => return Ok(output),
            Err(reason) => last_error = reason.or(last_error),
        }
        if let Some(err) = give_up() {
            return Err(err.context(format!("gave up waiting for {what}")));
        }
        let now = Instant::now();
        if now >= deadline {
            match last_error {
                Some(err) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {err}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(POLL_MAX);
    }
}

/// Runs `start` up to `attempts` times until it succeeds, logging each
/// failure but the last, which is returned: for starting a cluster, whose
/// ports the kernel called free can be taken by another process before its
/// nodes bind them.
pub(super) async fn start_with_attempts<T, F, Fut>(
    what: &str,
    attempts: usize,
    mut start: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let mut attempt = 1;
    loop {
        match start().await {
            Ok(started) => return Ok(started),
            Err(err) if attempt < attempts => {
                tracing::warn!(error = %format!("{err:#}"), "{what} did not start, once more");
                attempt += 1;
            }
            Err(err) => return Err(err),
        }
    }
}
