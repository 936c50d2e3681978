//! The supervision of one MCP server: a supervisor starts or reaches it,
//! with a growing pause until it answers, lists its tools, and lists them
//! again at each `notifications/tools/list_changed`. When the connection
//! closes (the process died, the endpoint went away, a request, the
//! subscription or a ping found it failed) the server's tools are taken
//! down, so that no model is offered them, and the server is started or
//! reached again. The connection and the calls over it are
//! [`McpServer`]'s (`server.rs`); what the tools are after each listing is
//! the [`Listing`]'s.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use rmcp::model::{
    ClientRequest, PaginatedRequestParams, PingRequest, ServerNotification, SubscriptionFilter,
    Tool as McpToolInfo,
};
use rmcp::{Peer, RoleClient};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::listing::{Listing, Tally};
use super::server::{Client, McpServer, connection_failed};
use crate::tool_set::ToolSet;

/// The shortest time between two listings after `list_changed`: a server
/// that floods the notification costs one `tools/list` a second.
const LISTING_GAP: Duration = Duration::from_secs(1);

/// Why a `tools/list` gave no tools.
enum ListFailed {
    /// The server failed it, or did not answer in time.
    Failed(String),
    /// The connection failed under it: the server is down.
    Gone(String),
    /// It went past a bound of the listing: the server is down.
    TooLarge(String),
}

impl McpServer {
    /// A connection, once the server answers (tried again with a growing
    /// pause, each failure logged), and its tools, every page of
    /// `tools/list`.
    pub(super) async fn connect_and_list(&self) -> (Client, Vec<McpToolInfo>) {
        // Jitter adds up to the pause again: 0.1 s to at most 10 s.
        let mut pauses = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(5))
            .with_jitter()
            .without_max_times()
            .build();
        let server = &self.options.name;
        loop {
            match self.connect_once_and_list().await {
                Ok(connected) => return connected,
                Err(why) => {
                    // Endless (no max_times): it always yields.
                    let pause = pauses.next().unwrap_or(Duration::from_secs(10));
                    warn!(server, why, retry_in = ?pause, "MCP server not answering");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// One attempt of [`connect_and_list`](Self::connect_and_list).
    async fn connect_once_and_list(&self) -> Result<(Client, Vec<McpToolInfo>), String> {
        let client = self.connect().await?;
        let listed = self
            .list_all(client.peer())
            .await
            .map_err(|failed| match failed {
                ListFailed::Failed(why) | ListFailed::Gone(why) | ListFailed::TooLarge(why) => why,
            })?;
        Ok((client, listed))
    }

    /// Every page of the server's `tools/list`, within `connect_timeout`
    /// and the listing's [`Bounds`](super::listing::Bounds): past one, the
    /// listing is given up on, logged with the bound, and the server is
    /// down until it lists within them.
    async fn list_all(&self, peer: &Peer<RoleClient>) -> Result<Vec<McpToolInfo>, ListFailed> {
        let server = &self.options.name;
        let bounds = self.options.listing_bounds();
        let pages = async {
            let mut tally = Tally::default();
            let mut tools = Vec::new();
            let mut cursor = None;
            loop {
                let params = PaginatedRequestParams::default().with_cursor(cursor);
                let page = peer.list_tools(Some(params)).await.map_err(|err| {
                    let why = format!("tools/list failed: {err}");
                    if connection_failed(&err) {
                        ListFailed::Gone(why)
                    } else {
                        ListFailed::Failed(why)
                    }
                })?;
                let bytes = page
                    .tools
                    .iter()
                    .map(|tool| serde_json::to_vec(tool).map_or(0, |json| json.len()))
                    .sum();
                if let Err(bound) = tally.add(page.tools.len(), bytes, &bounds) {
                    warn!(
                        server,
                        bound, "MCP server's tools are down: its listing is too large"
                    );
                    return Err(ListFailed::TooLarge(bound));
                }
                tools.extend(page.tools);
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => return Ok(tools),
                }
            }
        };
        tokio::time::timeout(self.options.connect_timeout, pages)
            .await
            .map_err(|_| ListFailed::Failed("tools/list timed out".to_owned()))?
    }

    /// Serves `tools` ((MCP name, fleet name) pairs) in `served` until
    /// `end`: connects (see [`connect_and_list`](Self::connect_and_list)),
    /// serves the tools the server lists, follows the connection, and when
    /// it closes takes them down and connects again. At `end` the server is
    /// shut down (a stdio server's input is closed, then it is signalled).
    pub(super) async fn run(
        self: Arc<Self>,
        tools: Vec<(String, String)>,
        served: ToolSet,
        end: CancellationToken,
    ) {
        let server = self.options.name.clone();
        let mut listing = Listing::new(self.clone(), tools, served);
        loop {
            let Some((client, listed)) = end.run_until_cancelled(self.connect_and_list()).await
            else {
                return;
            };
            let peer = Arc::new(client.peer().clone());
            self.peer.send_replace(Some(peer.clone()));
            listing.apply(&listed);
            let gone = self.follow(client, &peer, &mut listing, &end).await;
            self.peer.send_replace(None);
            listing.take_all_down();
            if !gone {
                return;
            }
            warn!(
                server,
                "MCP server gone; its tools are withdrawn until it is back"
            );
        }
    }

    /// Follows `client` until the server is gone (`true`: the connection
    /// closed, or a request, a ping or the subscription failed on it) or
    /// `end` (`false`, the connection closed then), listing the tools
    /// again at each `list_changed`, at most once per [`LISTING_GAP`].
    async fn follow(
        &self,
        client: Client,
        peer: &Peer<RoleClient>,
        listing: &mut Listing,
        end: &CancellationToken,
    ) -> bool {
        let server = &self.options.name;
        let closing = client.cancellation_token();
        let closed = client.waiting();
        tokio::pin!(closed);
        let mut next_listing = Instant::now();
        let subscribed = self.subscribe(peer);
        tokio::pin!(subscribed);
        let probed = self.probe(peer);
        tokio::pin!(probed);
        let mut current = self.peer.subscribe();
        let dropped = async move { current.wait_for(Option::is_none).await.is_ok() };
        tokio::pin!(dropped);
        loop {
            tokio::select! {
                _ = &mut closed => return true,
                () = end.cancelled() => break,
                // A request found the connection dead ([`Self::gone`]), or
                // a ping or the subscription did: the server is down now,
                // not when the transport notices.
                _ = &mut dropped => break,
                () = &mut subscribed => break,
                () = &mut probed => break,
                () = self.list_changed.notified() => {
                    let relisted = async {
                        tokio::time::sleep_until(next_listing).await;
                        next_listing = Instant::now() + LISTING_GAP;
                        self.list_all(peer).await
                    };
                    match end.run_until_cancelled(relisted).await {
                        None => break,
                        Some(Ok(listed)) => listing.apply(&listed),
                        // Past a bound, the server is down: reached again
                        // (and listed) after a pause, its tools withdrawn
                        // meanwhile.
                        Some(Err(ListFailed::TooLarge(_) | ListFailed::Gone(_))) => break,
                        Some(Err(ListFailed::Failed(why))) => {
                            warn!(server, why, "tools/list failed after list_changed; the tools stay as they were");
                        }
                    }
                }
            }
        }
        closing.cancel();
        !end.is_cancelled()
    }

    /// On a 2026-07-28 session, whose server sends `list_changed` only on
    /// a `subscriptions/listen` stream, keeps one open and passes each
    /// notification on as the handler does on older sessions. A stream
    /// that ends (the server closed it, or it fell behind) is opened again
    /// after a pause, and the tools are listed then, since a change may
    /// have been missed. Returns when the connection failed under it (the
    /// server is gone); on an older session, or when the server does not
    /// say its tools change, it just waits.
    async fn subscribe(&self, peer: &Peer<RoleClient>) {
        let server = &self.options.name;
        let stateless = peer.peer_info().filter(|info| {
            let changing = info
                .capabilities
                .tools
                .as_ref()
                .and_then(|t| t.list_changed);
            !info.protocol_version.has_initialize() && changing == Some(true)
        });
        if stateless.is_none() {
            return std::future::pending().await;
        }
        let filter = SubscriptionFilter::builder().tools_list_changed().build();
        let mut pauses = ExponentialBuilder::default()
            .with_min_delay(LISTING_GAP)
            .with_max_delay(Duration::from_secs(30))
            .without_max_times()
            .build();
        loop {
            match peer.listen(filter.clone()).await {
                Ok(mut subscription) => {
                    while let Ok(Some(notification)) = subscription.next().await {
                        if let ServerNotification::ToolListChangedNotification(_) = notification {
                            self.list_changed.notify_one();
                        }
                    }
                    debug!(server, end = ?subscription.end(), "MCP subscription ended");
                    self.list_changed.notify_one();
                    tokio::time::sleep(LISTING_GAP).await;
                }
                Err(err) if connection_failed(&err) => {
                    debug!(server, error = %err, "subscriptions/listen failed: the server is gone");
                    return;
                }
                Err(err) => {
                    // Endless (no max_times): it always yields.
                    let pause = pauses.next().unwrap_or(Duration::from_secs(30));
                    warn!(server, error = %err, retry_in = ?pause, "subscriptions/listen failed; tool changes are not followed until it succeeds");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Asks a Streamable HTTP server `ping` each `probe_interval`, and
    /// returns when one fails on the connection (the server is gone),
    /// which nothing else would notice while no call is sent: a stdio
    /// server's exit closes its connection, an HTTP server's does not. A
    /// ping unanswered within `connect_timeout` is only logged: a busy
    /// server is not a dead one, and taking it down would end its calls in
    /// flight. Any answer, an error included, says the server is there.
    async fn probe(&self, peer: &Peer<RoleClient>) {
        if self.options.url.is_none() {
            return std::future::pending().await;
        }
        let server = &self.options.name;
        loop {
            tokio::time::sleep(self.options.probe_interval).await;
            let ping = peer.send_request(ClientRequest::PingRequest(PingRequest::default()));
            match tokio::time::timeout(self.options.connect_timeout, ping).await {
                Ok(Err(err)) if connection_failed(&err) => {
                    debug!(server, error = %err, "ping failed: the server is gone");
                    return;
                }
                Ok(_) => {}
                Err(_) => warn!(server, "the MCP server did not answer a ping in time"),
            }
        }
    }
}
