//! A raw request channel beside rmcp on one stdio child connection (the forwarding hot path).
//!
//! rmcp's client service decodes every message into its typed model and re-encodes every
//! request; for a forwarded `tools/call` that is two full passes over the arguments and two over
//! the result, plus a hand-off to the connection's service task for each request. rmcp 3.11's
//! public API has no way to send bytes it did not serialize, nor to receive a response it did not
//! decode, so the hot path goes beneath it (the same place as `task_marks`):
//!
//! - **Writing.** The child's stdin is shared: rmcp writes through [`LinkWriter`], which hands
//!   each complete message to the pipe under the link's lock, and [`RawLink::send`] writes a
//!   whole line under the same lock. Lines never interleave.
//! - **Reading.** Raw requests carry ids in graph-os's own namespace (`"graph-os-raw-<n>"`,
//!   never produced by rmcp, whose ids are numbers). [`RawLink::tap`] sees every complete stdout
//!   line before rmcp does and takes the responses (no `method`) whose id is in that namespace;
//!   everything else (notifications, the child's requests, rmcp's responses) goes on to rmcp,
//!   so progress, logs and child→client requests keep their one typed path.
//! - **In order.** A call's progress and logs must reach its caller before its result, and they
//!   are routed when the transport hands them to rmcp (`child::client::ObservedTransport`),
//!   which can be later than the line is split off here. When no earlier line is still held
//!   (the common case: a response alone in its read), every earlier message has been received
//!   and routed, and the response is delivered at once. rmcp's `AsyncRwTransport` reads through
//!   a `BufReader` and asks for more bytes only when it has consumed (and parsed, with no await
//!   in between) every byte it has, so a tap with nothing held ahead runs after all of them.
//!   Otherwise a tiny placeholder notification ([`READY_METHOD`]) takes the response's place in
//!   the stream, and the response is delivered when the transport receives that placeholder
//!   ([`RawLink::ready`]), i.e. after every message the child sent before it. A child's own
//!   message with that method is dropped, so only graph-os's placeholders carry it.
//! - **Closing.** When the transport ends, every pending raw request fails at once (its
//!   receiver sees the sender dropped) and later sends fail with `BrokenPipe`.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::wire::needle::Needle;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use serde::Deserialize;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::process::ChildStdin;
use tokio::sync::{OwnedMutexGuard, oneshot};

use crate::wire::task_marks::Tapped;

/// Prefix of the JSON-RPC ids (and progress tokens) of raw requests.
pub const ID_PREFIX: &str = "graph-os-raw-";

/// Method of the placeholder that stands in the stream where a raw response arrived.
pub const READY_METHOD: &str = "notifications/graph-os/raw-ready";

const READY_LINE: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/graph-os/raw-ready"}"#;

type Pipe = Arc<tokio::sync::Mutex<Option<ChildStdin>>>;

/// One connection's raw request channel (cheap to clone).
#[derive(Clone)]
pub struct RawLink {
    inner: Arc<Inner>,
}

struct Inner {
    pipe: Pipe,
    /// Raw requests waiting for their response, by number; `None` once the link is closed.
    pending: Mutex<Option<HashMap<u64, oneshot::Sender<Vec<u8>>>>>,
    /// Responses taken from the stream, in order, each waiting for its placeholder to be
    /// received (the sender is `None` when nobody waits for it any more).
    arrived: Mutex<std::collections::VecDeque<Arrived>>,
    next: AtomicU64,
}

type Arrived = (Option<oneshot::Sender<Vec<u8>>>, Vec<u8>);

/// A raw request registered on a link: its id and where its response line arrives.
pub struct Pending {
    /// The request number (the id is [`ID_PREFIX`] + number).
    pub number: u64,
    /// The JSON string of the id (quoted), for writing into the request.
    pub id_json: String,
    /// Receives the response line; an error means the connection ended first.
    pub response: oneshot::Receiver<Vec<u8>>,
    link: RawLink,
}

impl Drop for Pending {
    fn drop(&mut self) {
        // A request that ended without its response (timeout, cancellation) leaves no entry.
        self.link.forget(self.number);
    }
}

/// The envelope of a child's message: enough to tell a response to a raw request.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    method: Option<std::borrow::Cow<'a, str>>,
}

impl RawLink {
    /// A link writing to `stdin`, and the writer rmcp's transport uses for the same pipe.
    pub fn new(stdin: ChildStdin) -> (RawLink, LinkWriter) {
        let pipe: Pipe = Arc::new(tokio::sync::Mutex::new(Some(stdin)));
        let link = RawLink {
            inner: Arc::new(Inner {
                pipe: pipe.clone(),
                pending: Mutex::new(Some(HashMap::new())),
                arrived: Mutex::default(),
                next: AtomicU64::new(1),
            }),
        };
        (link, LinkWriter::new(pipe))
    }

    /// Registers a raw request; `None` once the link is closed.
    pub fn register(&self) -> Option<Pending> {
        let number = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut pending = self.inner.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.as_mut()?.insert(number, tx);
        Some(Pending {
            number,
            id_json: format!("\"{ID_PREFIX}{number}\""),
            response: rx,
            link: self.clone(),
        })
    }

    fn forget(&self, number: u64) {
        let mut pending = self.inner.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pending.as_mut() {
            p.remove(&number);
        }
    }

    /// Writes one message (a complete line, newline included) to the child.
    pub async fn send(&self, line: &[u8]) -> io::Result<()> {
        let mut pipe = self.inner.pipe.lock().await;
        let Some(stdin) = pipe.as_mut() else {
            return Err(io::ErrorKind::BrokenPipe.into());
        };
        stdin.write_all(line).await?;
        stdin.flush().await
    }

    /// Whether the link still takes requests.
    pub fn is_open(&self) -> bool {
        self.inner
            .pending
            .lock()
            .map(|p| p.is_some())
            .unwrap_or(false)
    }

    /// Looks at one stdout line (without its newline) before rmcp: the response to a raw
    /// request is taken, and delivered at once when nothing is `ahead` of it (no earlier line
    /// still held for rmcp, no earlier response waiting), or else a placeholder goes on in its
    /// place (a late or unknown raw response too: its placeholder delivers nothing); a child's
    /// own placeholder-method message is dropped; everything else passes.
    pub fn tap(&self, line: &[u8], ahead: bool) -> Tapped {
        // Cheap test first: rmcp's own traffic never carries these.
        static OURS: Needle = Needle::new(ID_PREFIX.as_bytes());
        static READY: Needle = Needle::new(b"graph-os/raw-ready");
        if !OURS.found_in(line) && !READY.found_in(line) {
            return Tapped::Pass;
        }
        let Ok(env) = serde_json::from_slice::<Envelope>(line) else {
            return Tapped::Pass;
        };
        if let Some(method) = env.method {
            return if method == READY_METHOD {
                Tapped::Taken
            } else {
                Tapped::Pass
            };
        }
        let Some(number) = env
            .id
            .as_deref()
            .and_then(|id| id.strip_prefix(ID_PREFIX))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            return Tapped::Pass;
        };
        let sender = {
            let mut pending = self.inner.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.as_mut().and_then(|p| p.remove(&number))
        };
        let mut arrived = self.inner.arrived.lock().unwrap_or_else(|p| p.into_inner());
        if !ahead && arrived.is_empty() {
            drop(arrived);
            if let Some(tx) = sender {
                let _ = tx.send(line.to_vec());
            }
            return Tapped::Taken;
        }
        arrived.push_back((sender, line.to_vec()));
        Tapped::Replaced(READY_LINE.to_vec())
    }

    /// The transport received a placeholder: the response it stands for is delivered now,
    /// after everything the child sent before it.
    pub fn ready(&self) {
        let next = self
            .inner
            .arrived
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        if let Some((Some(tx), line)) = next {
            let _ = tx.send(line);
        }
    }

    /// Whether a received message is a placeholder (see [`Self::ready`]).
    pub fn is_ready_method(method: &str) -> bool {
        method == READY_METHOD
    }

    /// Ends the link: pending requests fail now, later ones at registration.
    pub fn close(&self) {
        let drained = self
            .inner
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(drained);
        let arrived =
            std::mem::take(&mut *self.inner.arrived.lock().unwrap_or_else(|p| p.into_inner()));
        drop(arrived);
    }
}

/// rmcp's side of a shared child stdin: whole messages, written under the link's lock.
///
/// rmcp's codec writes a message in pieces and then flushes; the pieces are collected here and
/// written to the pipe in one locked run at the flush, so a raw line can never land inside one
/// of rmcp's messages.
pub struct LinkWriter {
    pipe: Pipe,
    buf: Vec<u8>,
    written: usize,
    locking: Option<BoxFuture<'static, OwnedMutexGuard<Option<ChildStdin>>>>,
    guard: Option<OwnedMutexGuard<Option<ChildStdin>>>,
}

impl LinkWriter {
    fn new(pipe: Pipe) -> Self {
        LinkWriter {
            pipe,
            buf: Vec::new(),
            written: 0,
            locking: None,
            guard: None,
        }
    }

    /// Holds the pipe's lock (polling for it).
    fn poll_lock(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.guard.is_some() {
            return Poll::Ready(());
        }
        let pipe = self.pipe.clone();
        let locking = self
            .locking
            .get_or_insert_with(|| Box::pin(async move { pipe.lock_owned().await }));
        let guard = std::task::ready!(locking.as_mut().poll(cx));
        self.locking = None;
        self.guard = Some(guard);
        Poll::Ready(())
    }
}

impl AsyncWrite for LinkWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            return Poll::Ready(Ok(()));
        }
        std::task::ready!(this.poll_lock(cx));
        let result = {
            let Some(stdin) = this.guard.as_mut().and_then(|g| g.as_mut()) else {
                this.guard = None;
                this.buf.clear();
                this.written = 0;
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            };
            loop {
                if this.written < this.buf.len() {
                    match Pin::new(&mut *stdin).poll_write(cx, &this.buf[this.written..]) {
                        Poll::Ready(Ok(0)) => break Err(io::ErrorKind::WriteZero.into()),
                        Poll::Ready(Ok(n)) => this.written += n,
                        Poll::Ready(Err(e)) => break Err(e),
                        Poll::Pending => return Poll::Pending,
                    }
                } else {
                    match Pin::new(&mut *stdin).poll_flush(cx) {
                        Poll::Ready(r) => break r,
                        Poll::Pending => return Poll::Pending,
                    }
                }
            }
        };
        this.guard = None;
        this.buf.clear();
        this.written = 0;
        Poll::Ready(result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.as_mut().poll_flush(cx))?;
        let this = self.get_mut();
        std::task::ready!(this.poll_lock(cx));
        // Dropping the pipe closes the child's stdin (EOF: the MCP stdio shutdown sequence).
        if let Some(g) = this.guard.as_mut() {
            g.take();
        }
        this.guard = None;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, BufReader};

    /// A `cat` child: what is written to its stdin comes back on its stdout.
    fn cat() -> (
        tokio::process::Child,
        ChildStdin,
        tokio::process::ChildStdout,
    ) {
        let mut child = tokio::process::Command::new("cat")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (i, o) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        (child, i, o)
    }

    #[tokio::test]
    async fn raw_lines_and_rmcp_messages_never_interleave() {
        let (_child, stdin, stdout) = cat();
        let (link, mut writer) = RawLink::new(stdin);
        // Read while writing: the pipes hold 64 KiB.
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let (mut raw, mut big) = (0, 0);
            while raw + big < 220 {
                let line = lines.next_line().await.unwrap().unwrap();
                let v: serde_json::Value = serde_json::from_str(&line).expect("a whole line");
                if v.get("raw").is_some() {
                    raw += 1;
                } else {
                    big += 1;
                }
            }
            (raw, big)
        });
        let big = format!("{{\"rmcp\":\"{}\"}}\n", "r".repeat(200_000));
        let rmcp = tokio::spawn(async move {
            for _ in 0..20 {
                // rmcp's codec: the message in pieces, then a flush.
                let (a, b) = big.as_bytes().split_at(1000);
                writer.write_all(a).await.unwrap();
                writer.write_all(b).await.unwrap();
                writer.flush().await.unwrap();
            }
        });
        for i in 0..200 {
            link.send(format!("{{\"raw\":{i}}}\n").as_bytes())
                .await
                .unwrap();
        }
        rmcp.await.unwrap();
        let (raw, big) = reader.await.unwrap();
        assert_eq!((raw, big), (200, 20));
    }

    #[tokio::test]
    async fn only_responses_in_the_raw_namespace_are_taken() {
        let (_child, stdin, _stdout) = cat();
        let (link, _writer) = RawLink::new(stdin);
        let pending = link.register().unwrap();
        let id = pending.id_json.clone();
        // A notification mentioning the id (a progress token) and rmcp's own responses pass.
        let progress = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{id},"progress":1}}}}"#
        );
        assert_eq!(link.tap(progress.as_bytes(), true), Tapped::Pass);
        assert_eq!(
            link.tap(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#, true),
            Tapped::Pass
        );
        assert_eq!(link.tap(b"not json graph-os-raw-1", true), Tapped::Pass);
        // The response is taken, a placeholder goes on, and it is delivered whole when the
        // placeholder is received.
        let response = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[]}}}}"#);
        assert_eq!(
            link.tap(response.as_bytes(), true),
            Tapped::Replaced(READY_LINE.to_vec())
        );
        let mut pending = pending;
        assert!(
            pending.response.try_recv().is_err(),
            "not before the placeholder is received"
        );
        link.ready();
        assert_eq!((&mut pending.response).await.unwrap(), response.as_bytes());
        // A late or unknown raw response is taken too, never passed to rmcp.
        assert_eq!(
            link.tap(
                br#"{"jsonrpc":"2.0","id":"graph-os-raw-999","result":{}}"#,
                true
            ),
            Tapped::Replaced(READY_LINE.to_vec())
        );
        link.ready();
        // A child cannot forge a placeholder.
        assert_eq!(link.tap(READY_LINE, true), Tapped::Taken);
    }

    #[tokio::test]
    async fn a_response_with_nothing_ahead_of_it_is_delivered_at_once() {
        let (_child, stdin, _stdout) = cat();
        let (link, _writer) = RawLink::new(stdin);
        let mut first = link.register().unwrap();
        let mut second = link.register().unwrap();
        let response =
            |p: &Pending| format!(r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#, p.id_json);
        // Every earlier line has been received: no placeholder, no wait.
        let line = response(&first);
        assert_eq!(link.tap(line.as_bytes(), false), Tapped::Taken);
        assert_eq!((&mut first.response).await.unwrap(), line.as_bytes());
        // Behind an earlier response still waiting for its placeholder, a response waits too
        // (responses keep their order).
        let mut third = link.register().unwrap();
        assert!(matches!(
            link.tap(response(&second).as_bytes(), true),
            Tapped::Replaced(_)
        ));
        assert!(matches!(
            link.tap(response(&third).as_bytes(), false),
            Tapped::Replaced(_)
        ));
        link.ready();
        assert!((&mut second.response).await.is_ok());
        assert!(third.response.try_recv().is_err());
        link.ready();
        assert!((&mut third.response).await.is_ok());
    }

    #[tokio::test]
    async fn closing_fails_pending_requests_and_refuses_new_ones() {
        let (_child, stdin, _stdout) = cat();
        let (link, _writer) = RawLink::new(stdin);
        let mut pending = link.register().unwrap();
        let mut arrived = link.register().unwrap();
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
            arrived.id_json
        );
        assert!(matches!(
            link.tap(line.as_bytes(), true),
            Tapped::Replaced(_)
        ));
        link.close();
        assert!((&mut pending.response).await.is_err());
        assert!(
            (&mut arrived.response).await.is_err(),
            "its placeholder never came"
        );
        assert!(link.register().is_none());
        assert!(!link.is_open());
    }

    #[tokio::test]
    async fn a_dropped_request_leaves_no_entry() {
        let (_child, stdin, _stdout) = cat();
        let (link, _writer) = RawLink::new(stdin);
        let pending = link.register().unwrap();
        drop(pending);
        let count = link.inner.pending.lock().unwrap().as_ref().unwrap().len();
        assert_eq!(count, 0);
    }

    #[tokio::test]
    async fn shutdown_closes_the_pipe_for_both_writers() {
        let (_child, stdin, stdout) = cat();
        let (link, mut writer) = RawLink::new(stdin);
        writer.shutdown().await.unwrap();
        assert_eq!(
            link.send(b"{}\n").await.unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
        // cat sees EOF and ends its stdout.
        let mut lines = BufReader::new(stdout).lines();
        assert!(lines.next_line().await.unwrap().is_none());
    }
}
