//! Signal handling of every toolfleet binary: the first SIGTERM or SIGINT
//! starts the drain, a second one exits at once.

use tokio_util::sync::CancellationToken;

/// The first SIGTERM/SIGINT cancels `shutdown` (the drain starts); a second
/// exits at once with status 130.
pub async fn watch_signals(shutdown: CancellationToken) {
    watch_signals_then(shutdown, || {}).await;
}

/// Like [`watch_signals`], and on the second signal runs `before_exit` just
/// before the process exits: destructors do not run then, so cleanup that must
/// not be skipped (killing child processes, removing a temp dir) goes here.
pub async fn watch_signals_then(shutdown: CancellationToken, before_exit: impl FnOnce() + Send) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the process with SIGKILL");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("signal received; draining (send it again to exit at once)");
    shutdown.cancel();
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::warn!("second signal; exiting without draining");
    before_exit();
    std::process::exit(130);
}
