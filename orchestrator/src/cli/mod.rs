//! The `toolfleet` command line: a gRPC client of the API, and `dev`/`bench`
//! which run a local fleet.

/// The first SIGTERM/SIGINT cancels `shutdown`; a second exits at once.
pub async fn watch_signals(shutdown: tokio_util::sync::CancellationToken) {
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
    std::process::exit(130);
}
