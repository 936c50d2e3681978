//! The connection to a stdio server: its process, and the JSON-RPC lines on
//! its stdin and stdout. Not rmcp's `TokioChildProcess`, which drops a line
//! that is too long or not a message without a word of whose answer it was,
//! so that the call waits out its timeout and is run again. Here:
//!
//! - the answer to a call is read no further than the bound of an answer
//!   ([`answer_bound`]), any other line no further than the bound of a
//!   listing; the rest of a longer one is discarded as it comes, scanned
//!   only for its `id` ([`IdScan`]), and the call it answers gets
//!   [`Defect::TooLarge`] at once (as soon as its id is read: most servers
//!   write it first);
//! - a line that is not a message for the worker (not JSON, no message's
//!   shape, an answer to no request it sent) is logged, naming the server,
//!   and every call in flight gets [`Defect::Malformed`]: any of their
//!   answers may be the one the server garbled.
//!
//! The calls learn of their defect through [`Defects`], which only this
//! module writes, so that a server cannot forge one; rmcp gets an error
//! answer for each, which ends its wait.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use rmcp::RoleClient;
use rmcp::model::{ClientRequest, ErrorCode, ErrorData, JsonRpcMessage, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, LinesCodec};
use toolfleet_proto::envelope::excerpt;
use tracing::{debug, info, warn};

use super::McpHost;
use super::config::McpServerOptions;
use super::defect::{Defect, Defects};

/// The variables a stdio server inherits from the worker; everything else
/// it gets is configured (`env`). The worker's own environment holds its
/// NATS and Redis credentials, which no tool backend may read.
const INHERITED: [&str; 5] = ["PATH", "HOME", "LANG", "LC_ALL", "TZ"];

/// Longest line of a server's stderr that is logged, in characters.
const STDERR_LINE_CHARS: usize = 1_000;

/// What is added to `runtime.max_output_bytes` to bound a server's line:
/// the JSON-RPC envelope and MCP's content blocks around the data.
const ANSWER_MARGIN: usize = 64 * 1024;

/// rmcp's own bound of a message, which a line never needs to pass.
const RMCP_MAX_LINE: usize = 16 * 1024 * 1024;

/// How long a server whose input was closed has to exit, then again after
/// SIGTERM, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// Ids of calls given up on that are remembered, so that their late
/// answers are not taken for a server's confusion.
const GIVEN_UP: usize = 256;

/// The longest answer to a call the worker reads, for a worker whose tool
/// outputs are at most `max_output_bytes`.
pub(super) fn answer_bound(max_output_bytes: usize) -> usize {
    max_output_bytes
        .saturating_add(ANSWER_MARGIN)
        .min(RMCP_MAX_LINE)
}

/// The longest line of a server the worker reads (a page of `tools/list`
/// above all): `max_listed_bytes` and the margin, at least an answer's.
pub(super) fn line_bound(answer_bound: usize, max_listed_bytes: usize) -> usize {
    max_listed_bytes
        .saturating_add(ANSWER_MARGIN)
        .clamp(answer_bound, RMCP_MAX_LINE)
}

/// The bounds of a stdio server's lines, in bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct LineBounds {
    /// The answer to a call ([`answer_bound`]).
    pub answer: usize,
    /// Any other line ([`line_bound`]).
    pub line: usize,
}

/// Starts the stdio server of `options` in `host`'s sandbox: its command
/// in a minimal environment ([`INHERITED`] and `env`), its stderr logged
/// line by line, its lines read within the bounds of `options` and `host`;
/// its calls' defects go to `defects`.
///
/// # Errors
///
/// A secret of its environment cannot be read, or it cannot be started;
/// why, for the log.
pub(super) async fn start(
    options: &McpServerOptions,
    command: &str,
    host: &McpHost,
    defects: Arc<Defects>,
) -> Result<StdioConnection, String> {
    let mut program = tokio::process::Command::new(command);
    // Killed with the worker should the shutdown not run.
    program.args(&options.args).env_clear().kill_on_drop(true);
    for name in INHERITED {
        if let Some(value) = std::env::var_os(name) {
            program.env(name, value);
        }
    }
    for (name, value) in &options.env {
        program.env(name, value.read()?);
    }
    if let Some(cwd) = &options.cwd {
        program.current_dir(cwd);
    }
    let mut child = host.sandbox.spawn(&options.name, program).await?;
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(log_stderr(options.name.clone(), stderr));
    }
    let answer = answer_bound(host.max_output_bytes);
    let bounds = LineBounds {
        answer,
        line: line_bound(answer, options.listing_bounds().bytes),
    };
    StdioConnection::new(&options.name, child, bounds, defects)
}

/// Logs a stdio server's stderr, a bounded line at a time, until it closes.
async fn log_stderr(server: String, stderr: ChildStderr) {
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(16 * 1024));
    while let Some(line) = lines.next().await {
        match line {
            Ok(line) => info!(
                server,
                line = excerpt(&line, STDERR_LINE_CHARS),
                "MCP server stderr"
            ),
            // Too long a line, or not UTF-8: said once, then skipped.
            Err(err) => debug!(server, error = %err, "MCP server stderr unreadable"),
        }
    }
}

/// The requests sent and not answered yet, and whether each is a call.
#[derive(Default)]
struct Asked {
    waiting: HashMap<RequestId, bool>,
    given_up: VecDeque<RequestId>,
}

/// A stdio server's process and its JSON-RPC connection.
pub(super) struct StdioConnection {
    server: String,
    child: Child,
    stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    lines: Lines,
    asked: Arc<Mutex<Asked>>,
    defects: Arc<Defects>,
    /// Error answers made for calls with a defect, for rmcp.
    made: VecDeque<RxJsonRpcMessage<RoleClient>>,
    /// When a malformed line was last logged, and how many were not since.
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl StdioConnection {
    /// The connection to `child` (stdin and stdout piped), the server
    /// `server`, whose lines are read within `bounds`; its calls' defects
    /// go to `defects`.
    ///
    /// # Errors
    ///
    /// The child's stdin or stdout was not piped.
    pub(super) fn new(
        server: &str,
        mut child: Child,
        bounds: LineBounds,
        defects: Arc<Defects>,
    ) -> Result<Self, String> {
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the server's stdin and stdout are not piped".to_owned());
        };
        let asked = Arc::<Mutex<Asked>>::default();
        Ok(Self {
            server: server.to_owned(),
            child,
            stdin: Arc::new(tokio::sync::Mutex::new(Some(stdin))),
            lines: Lines::new(stdout, bounds, asked.clone()),
            asked,
            defects,
            made: VecDeque::new(),
            last_logged: None,
            unlogged: 0,
        })
    }

    fn asked(&self) -> MutexGuard<'_, Asked> {
        lock(&self.asked)
    }

    /// The message of one line, if it is one for rmcp.
    fn accept(&mut self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = match read_line(line) {
            Read::Empty | Read::UnknownNotification => return None,
            Read::Malformed(what) => {
                self.malformed(what, line.len());
                return None;
            }
            Read::Message(message) => *message,
        };
        let id = match &message {
            JsonRpcMessage::Response(response) => &response.id,
            JsonRpcMessage::Error(error) => match &error.id {
                Some(id) => id,
                None => {
                    debug!(
                        server = self.server,
                        "the MCP server answered an error without an id"
                    );
                    return None;
                }
            },
            JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => return Some(message),
        };
        let mut asked = self.asked();
        if asked.waiting.remove(id).is_some() {
            return Some(message);
        }
        let late = asked.given_up.contains(id);
        drop(asked);
        if !late {
            self.malformed("an answer to no request the worker sent", line.len());
        }
        None
    }

    /// A line past its bound: the request it answers fails (a call with
    /// [`Defect::TooLarge`]); one that answers nothing is logged, and a
    /// message that is no answer (a notification) skipped.
    fn too_long(&mut self, id: Option<RequestId>, method: bool) {
        let asked = id.and_then(|id| {
            let call = self.asked().waiting.remove(&id)?;
            Some((id, call))
        });
        let bounds = self.lines.bounds;
        match (asked, method) {
            (Some((id, true)), _) => {
                self.fail(id, Some(Defect::TooLarge(bounds.answer)), bounds.answer);
            }
            (Some((id, false)), _) => self.fail(id, None, bounds.line),
            (None, true) => warn!(
                server = self.server,
                bound = bounds.line,
                "the MCP server sent a message over the bound; skipped"
            ),
            (None, false) => self.malformed("an answer over the bound, to no request", bounds.line),
        }
    }

    /// The server wrote `what` (of `bytes` bytes): logged (at most once a
    /// second, with the count of those not logged), and every call in
    /// flight fails with [`Defect::Malformed`].
    fn malformed(&mut self, what: &'static str, bytes: usize) {
        let now = Instant::now();
        if self
            .last_logged
            .is_some_and(|at| now < at + Duration::from_secs(1))
        {
            self.unlogged += 1;
        } else {
            warn!(
                server = self.server,
                what,
                bytes,
                not_logged = self.unlogged,
                "the MCP server wrote what is not a message for the worker; its calls in flight are failed"
            );
            (self.last_logged, self.unlogged) = (Some(now), 0);
        }
        let calls: Vec<RequestId> = self
            .asked()
            .waiting
            .extract_if(|_, call| *call)
            .map(|(id, _)| id)
            .collect();
        for id in calls {
            self.fail(id, Some(Defect::Malformed(what)), bytes);
        }
    }

    /// Gives the request `id` up: a call reads its `defect`, and rmcp gets
    /// an error answer that ends its wait, saying why (for the log of a
    /// listing: `bytes` is the size of what the server wrote).
    fn fail(&mut self, id: RequestId, defect: Option<Defect>, bytes: usize) {
        let mut asked = self.asked();
        if asked.given_up.len() == GIVEN_UP {
            asked.given_up.pop_front();
        }
        asked.given_up.push_back(id.clone());
        drop(asked);
        let why = match &defect {
            Some(Defect::Malformed(what)) => format!("the server wrote {what}"),
            Some(Defect::TooLarge(_)) | None => {
                format!("the answer is over the worker's bound of {bytes} bytes")
            }
        };
        if let Some(defect) = defect {
            self.defects.put(id.clone(), defect);
        }
        let error = ErrorData::new(ErrorCode::INTERNAL_ERROR, why, None);
        self.made.push_back(JsonRpcMessage::error(error, Some(id)));
    }

    /// Closes the server's input, then signals and kills it if it does not
    /// exit in time (the MCP specification's stdio shutdown).
    async fn shut_down(&mut self) -> std::io::Result<()> {
        drop(self.stdin.lock().await.take());
        if tokio::time::timeout(EXIT_GRACE, self.child.wait())
            .await
            .is_ok()
        {
            return Ok(());
        }
        let pid = self.child.id().and_then(|id| i32::try_from(id).ok());
        if let Some(pid) = pid.and_then(rustix::process::Pid::from_raw)
            && rustix::process::kill_process(pid, rustix::process::Signal::TERM).is_ok()
            && tokio::time::timeout(EXIT_GRACE, self.child.wait())
                .await
                .is_ok()
        {
            return Ok(());
        }
        self.child.kill().await
    }
}

impl Transport<RoleClient> for StdioConnection {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let JsonRpcMessage::Request(request) = &item {
            let call = matches!(request.request, ClientRequest::CallToolRequest(_));
            self.asked().waiting.insert(request.id.clone(), call);
        }
        let stdin = self.stdin.clone();
        async move {
            let mut line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let mut stdin = stdin.lock().await;
            let stdin = stdin
                .as_mut()
                .ok_or_else(|| std::io::Error::other("the server's input is closed"))?;
            stdin.write_all(&line).await?;
            stdin.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            if let Some(made) = self.made.pop_front() {
                return Some(made);
            }
            match self.lines.next().await {
                Next::Line(line) => {
                    if let Some(message) = self.accept(&line) {
                        return Some(message);
                    }
                }
                Next::TooLong { id, method } => self.too_long(id, method),
                Next::End => return None,
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.shut_down().await
    }
}

/// What one whole line is.
#[derive(Debug)]
enum Read {
    Empty,
    Message(Box<RxJsonRpcMessage<RoleClient>>),
    /// A notification of a method rmcp does not know: skipped, as rmcp
    /// and the other SDKs do.
    UnknownNotification,
    Malformed(&'static str),
}

/// Reads one line of a server (without its newline).
fn read_line(line: &[u8]) -> Read {
    const BOM: &[u8] = b"\xEF\xBB\xBF";
    let line = line.strip_prefix(BOM).unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Read::Empty;
    }
    match serde_json::from_slice(line) {
        Ok(message) => Read::Message(Box::new(message)),
        Err(err) if err.is_syntax() || err.is_eof() => Read::Malformed("a line that is not JSON"),
        Err(_) => match serde_json::from_slice::<Value>(line) {
            Ok(Value::Object(fields))
                if !fields.contains_key("id")
                    && fields.get("method").is_some_and(Value::is_string) =>
            {
                Read::UnknownNotification
            }
            _ => Read::Malformed("JSON that is not a JSON-RPC message"),
        },
    }
}

/// What the next read of a server's output gives.
enum Next {
    /// A whole line within the bound, without its newline.
    Line(Vec<u8>),
    /// A line past the bound: its `id` when it has one, and whether it has
    /// a `method` (a request or notification, not an answer). Told once
    /// the id is known (most servers write it first), else at the line's
    /// end.
    TooLong { id: Option<RequestId>, method: bool },
    /// The output closed (or failed).
    End,
}

/// A server's output, a bounded line at a time. Each read is cancel-safe:
/// rmcp polls `receive` in a `select!`, and all state lives here.
struct Lines {
    reader: BufReader<ChildStdout>,
    bounds: LineBounds,
    /// The requests in flight, to tell an answer to a call by its id.
    asked: Arc<Mutex<Asked>>,
    line: Vec<u8>,
    /// The scan of a line past the bound of an answer, kept while it is
    /// within the bound of a line (unless it answers a call).
    scan: Option<IdScan>,
    /// The line past its bound, being discarded.
    over: Option<Over>,
}

struct Over {
    scan: IdScan,
    told: bool,
}

impl Lines {
    fn new(stdout: ChildStdout, bounds: LineBounds, asked: Arc<Mutex<Asked>>) -> Self {
        Self {
            reader: BufReader::new(stdout),
            bounds,
            asked,
            line: Vec::new(),
            scan: None,
            over: None,
        }
    }

    async fn next(&mut self) -> Next {
        loop {
            let chunk = match self.reader.fill_buf().await {
                Ok([]) => return Next::End,
                Ok(chunk) => chunk,
                Err(err) => {
                    debug!(error = %err, "cannot read the MCP server's output");
                    return Next::End;
                }
            };
            let newline = chunk.iter().position(|&b| b == b'\n');
            let taken = newline.map_or(chunk.len(), |at| at + 1);
            let part = &chunk[..newline.unwrap_or(taken)];
            match &mut self.over {
                Some(over) => over.scan.feed(part),
                None => {
                    let length = self.line.len() + part.len();
                    if let Some(scan) = &mut self.scan {
                        scan.feed(part);
                    } else if length > self.bounds.answer {
                        let mut scan = IdScan::default();
                        scan.feed(&self.line);
                        scan.feed(part);
                        self.scan = Some(scan);
                    }
                    match self.scan.take() {
                        Some(scan) if length > bound_of(self.bounds, &self.asked, &scan) => {
                            self.line = Vec::new();
                            self.over = Some(Over { scan, told: false });
                        }
                        scan => {
                            self.scan = scan;
                            self.line.extend_from_slice(part);
                        }
                    }
                }
            }
            self.reader.consume(taken);
            if newline.is_some() {
                self.scan = None;
                match self.over.take() {
                    Some(over) if !over.told => return over.tell(),
                    Some(_) => {}
                    None => return Next::Line(std::mem::take(&mut self.line)),
                }
            } else if let Some(over) = &mut self.over
                && !over.told
                && over.scan.id().is_some()
            {
                over.told = true;
                return over.tell();
            }
        }
    }
}

/// The bound of the line `scan` has read of: an answer's once its id says
/// it answers a call `asked`, else a line's.
fn bound_of(bounds: LineBounds, asked: &Mutex<Asked>, scan: &IdScan) -> usize {
    let call = scan
        .id()
        .is_some_and(|id| lock(asked).waiting.get(&id) == Some(&true));
    if call { bounds.answer } else { bounds.line }
}

impl Over {
    fn tell(&self) -> Next {
        Next::TooLong {
            id: self.scan.id(),
            method: self.scan.method,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Finds the top-level `id` (and whether there is a `method`) of a JSON
/// object given a piece at a time, in constant memory: the scan of a line
/// too long to keep. Hand-written: no streaming JSON parser in the tree
/// skips a value without keeping it.
#[derive(Default)]
struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1: a key is read next (not a value).
    in_key: bool,
    /// The key being read, cut at [`IdScan::KEY`] bytes.
    key: Vec<u8>,
    /// The raw value of `id`, while it is read and after.
    id: Vec<u8>,
    reading_id: bool,
    method: bool,
}

impl IdScan {
    /// The longest key kept: `method`.
    const KEY: usize = 6;
    /// The longest raw id kept.
    const ID: usize = 256;

    fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.step(byte);
        }
    }

    fn step(&mut self, byte: u8) {
        if self.reading_id
            && self.id.len() < Self::ID
            && !(self.depth == 1 && !self.in_string && matches!(byte, b',' | b'}'))
        {
            self.id.push(byte);
        }
        if self.in_string {
            match (self.escaped, byte) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.in_string = false,
                (false, _) => {}
            }
            if self.depth == 1 && self.in_key && self.in_string && self.key.len() <= Self::KEY {
                self.key.push(byte);
            }
            return;
        }
        match byte {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.in_key {
                    self.key.clear();
                }
            }
            b',' | b'}' if self.depth == 1 => {
                self.reading_id = false;
                self.in_key = byte == b',';
                if byte == b'}' {
                    self.depth = 0;
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.in_key = byte == b'{';
                }
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b':' if self.depth == 1 && self.in_key => {
                self.in_key = false;
                let first_id = self.key == b"id" && self.id.is_empty();
                self.reading_id = first_id;
                self.method |= self.key == b"method";
            }
            _ => {}
        }
    }

    /// The id, once read whole and valid.
    fn id(&self) -> Option<RequestId> {
        if self.reading_id || self.id.len() >= Self::ID {
            return None;
        }
        serde_json::from_slice(self.id.trim_ascii()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(pieces: &[&str]) -> (Option<RequestId>, bool) {
        let mut scan = IdScan::default();
        for piece in pieces {
            scan.feed(piece.as_bytes());
        }
        (scan.id(), scan.method)
    }

    #[test]
    fn the_scan_finds_the_top_level_id_wherever_it_is() {
        let number = |n| Some(RequestId::Number(n));
        let text = |s: &str| Some(RequestId::String(s.into()));
        for (pieces, id, method) in [
            (
                &[r#"{"jsonrpc":"2.0","id":7,"result":{"x":1}}"#][..],
                number(7),
                false,
            ),
            (
                &[r#"{"result":{"id":9,"s":"}\"{"},"id":12}"#],
                number(12),
                false,
            ),
            (
                &[r#"{"id" : "a\"b" , "result":[1,{"id":3}]}"#],
                text("a\"b"),
                false,
            ),
            (
                &[r#"{"jsonrpc":"2.0","i"#, r#"d":4"#, r#"2,"result":"x"}"#],
                number(42),
                false,
            ),
            (
                &[r#"{"method":"notifications/progress","params":{"id":1}}"#],
                None,
                true,
            ),
            (&[r#"{"result":"no id at all"}"#], None, false),
            (&[r#"{"id":[1,2],"result":1}"#], None, false),
            // Not yet whole: the id is still being read.
            (&[r#"{"id":12"#], None, false),
            (&[r#"{"id":1,"id":2}"#], number(1), false),
        ] {
            assert_eq!(scan(pieces), (id, method), "{pieces:?}");
        }
    }

    #[test]
    fn a_line_is_a_message_an_unknown_notification_or_malformed() {
        let message = |line: &str| matches!(read_line(line.as_bytes()), Read::Message(_));
        assert!(message(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        assert!(message(
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\r"
        ));
        assert!(matches!(read_line(b"  "), Read::Empty));
        assert!(matches!(
            read_line(br#"{"jsonrpc":"2.0","method":"$/lsp","params":1}"#),
            Read::UnknownNotification | Read::Message(_)
        ));
        assert!(matches!(
            read_line(b"Loading model..."),
            Read::Malformed("a line that is not JSON")
        ));
        assert!(matches!(
            read_line(br#"{"jsonrpc":"2.0","id":1}"#),
            Read::Malformed("JSON that is not a JSON-RPC message")
        ));
    }

    #[test]
    fn the_bounds_are_the_limits_and_a_margin_within_rmcps() {
        let answer = answer_bound(1024 * 1024);
        assert_eq!(answer, 1024 * 1024 + ANSWER_MARGIN);
        assert_eq!(answer_bound(usize::MAX), RMCP_MAX_LINE);
        assert_eq!(line_bound(answer, 4096), answer, "never below an answer's");
        assert_eq!(line_bound(answer, 4 << 20), (4 << 20) + ANSWER_MARGIN);
        assert_eq!(line_bound(answer, 64 << 20), RMCP_MAX_LINE);
    }
}
