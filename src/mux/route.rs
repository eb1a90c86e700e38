//! The front end of one forwarded call: what the child sends back while serving it (progress,
//! logs, child→client requests) travels through a [`FrontRoute`] to the caller's client.
//!
//! Design note: the child connection must never wait on a front client. Progress and logs go
//! into a bounded [`NoteQueue`] (progress coalesced to the latest value per token when full,
//! logs dropped and counted) drained into the [`FrontSink`] the protocol layer provides, beside
//! the call in the caller's task ([`FrontRoute::run`]; a parked call's route by a task of its
//! own); the drain stops when the call ends, the request is cancelled or the client is gone.
//! Relayed requests go straight to the sink (the child connection handles each on its own
//! task, with its own timeout).
// Logging, roots and resources/subscribe are SEP-2577-deprecated but still served to 2025-era peers.
#![allow(deprecated)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use rmcp::ErrorData;
use rmcp::model::{
    ClientResult, LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken,
    ServerRequest,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::child::{CallObserver, ClientCaps};

/// A notification for the caller's client.
#[derive(Debug, Clone)]
pub enum FrontNote {
    /// `notifications/progress` (token already the caller's).
    Progress(ProgressNotificationParam),
    /// `notifications/message`.
    Log(LoggingMessageNotificationParam),
}

/// How the protocol layer delivers one call's child→client traffic to its client.
pub trait FrontSink: Send + Sync {
    /// Writes a notification to the client (resolves when written, or fails when the client is
    /// gone).
    fn send(&self, note: FrontNote) -> BoxFuture<'static, Result<(), ()>>;
    /// Sends a request to the client on the stream of the call it belongs to and returns the
    /// client's answer.
    fn relay(&self, request: ServerRequest) -> BoxFuture<'static, Result<ClientResult, ErrorData>>;
    /// Whether the client connection is gone.
    fn closed(&self) -> bool;
    /// Whether the client takes `input_required` results (2026-07-28).
    fn takes_input_required(&self) -> bool {
        false
    }
}

/// A child's request for a 2026-07-28 client, and where its answer goes (it is asked with an
/// `input_required` result: see `input`).
pub(super) type Ask = (
    ServerRequest,
    tokio::sync::oneshot::Sender<Result<ClientResult, ErrorData>>,
);

/// Notes held per call before a slow client reads them.
pub const NOTE_QUEUE_CAP: usize = 256;

/// A bounded queue of a call's notes. Full: progress replaces the queued progress of the same
/// token (clients only need the latest), logs are dropped; both are counted.
pub struct NoteQueue {
    inner: Mutex<QueueInner>,
    ready: Notify,
    cap: usize,
}

#[derive(Default)]
struct QueueInner {
    notes: VecDeque<FrontNote>,
    closed: bool,
}

/// What [`NoteQueue::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued.
    Queued,
    /// Replaced the queued progress of the same token.
    Coalesced,
    /// Dropped (queue full, or closed).
    Dropped,
}

impl NoteQueue {
    /// An empty queue holding at most `cap` notes.
    pub fn new(cap: usize) -> Self {
        NoteQueue {
            inner: Mutex::new(QueueInner::default()),
            ready: Notify::new(),
            cap: cap.max(1),
        }
    }

    /// Adds a note without ever waiting.
    pub fn push(&self, note: FrontNote) -> Pushed {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.closed {
            return Pushed::Dropped;
        }
        if inner.notes.len() < self.cap {
            inner.notes.push_back(note);
            drop(inner);
            self.ready.notify_one();
            return Pushed::Queued;
        }
        let FrontNote::Progress(p) = note else {
            crate::telemetry::metrics().note_dropped("log_dropped");
            return Pushed::Dropped;
        };
        let same = inner.notes.iter_mut().rev().find_map(|n| match n {
            FrontNote::Progress(q) if q.progress_token == p.progress_token => Some(q),
            _ => None,
        });
        crate::telemetry::metrics().note_dropped("progress_coalesced");
        match same {
            Some(q) => {
                *q = p;
                Pushed::Coalesced
            }
            None => Pushed::Dropped,
        }
    }

    /// The next note; `None` once closed and drained.
    pub async fn pop(&self) -> Option<FrontNote> {
        loop {
            let notified = self.ready.notified();
            {
                let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(n) = inner.notes.pop_front() {
                    return Some(n);
                }
                if inner.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// No more notes will be pushed; queued ones are still popped.
    pub fn close(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        self.ready.notify_waiters();
        self.ready.notify_one();
    }

    /// Queued notes.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.notes.len()).unwrap_or_default()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The child-facing observer of one front call (see the module note).
pub struct FrontRoute {
    session: u64,
    caps: ClientCaps,
    /// The caller's progress token (a parked call's resuming request brings its own).
    token: Mutex<Option<ProgressToken>>,
    min_level: rmcp::model::LoggingLevel,
    queue: Arc<NoteQueue>,
    /// Where notes go (a parked call's resuming request brings its own stream).
    sink: Mutex<Arc<dyn FrontSink>>,
    /// 2026-07-28 front: the child's requests for the client go here, to be asked with an
    /// `input_required` result.
    asks: Option<tokio::sync::mpsc::Sender<Ask>>,
}

impl FrontRoute {
    /// A route for a call of `session` whose client can answer `caps`; progress is delivered
    /// only if the caller asked for it (`token`), logs from `min_level` up.
    pub fn new(
        session: u64,
        caps: ClientCaps,
        token: Option<ProgressToken>,
        min_level: rmcp::model::LoggingLevel,
        sink: Arc<dyn FrontSink>,
    ) -> Arc<Self> {
        Self::build(session, caps, token, min_level, sink, None)
    }

    /// A route whose relayed requests go to `asks` instead of the sink (2026-07-28 front).
    pub(super) fn asking(
        session: u64,
        caps: ClientCaps,
        token: Option<ProgressToken>,
        min_level: rmcp::model::LoggingLevel,
        sink: Arc<dyn FrontSink>,
        asks: tokio::sync::mpsc::Sender<Ask>,
    ) -> Arc<Self> {
        Self::build(session, caps, token, min_level, sink, Some(asks))
    }

    fn build(
        session: u64,
        caps: ClientCaps,
        token: Option<ProgressToken>,
        min_level: rmcp::model::LoggingLevel,
        sink: Arc<dyn FrontSink>,
        asks: Option<tokio::sync::mpsc::Sender<Ask>>,
    ) -> Arc<Self> {
        Arc::new(FrontRoute {
            session,
            caps,
            token: Mutex::new(token),
            min_level,
            queue: Arc::new(NoteQueue::new(NOTE_QUEUE_CAP)),
            sink: Mutex::new(sink),
            asks,
        })
    }

    fn sink(&self) -> Arc<dyn FrontSink> {
        self.sink.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A parked call resumed by a new front request: its notes follow that request (its stream
    /// and its progress token; none when the new request asked for no progress).
    pub(super) fn redirect(&self, sink: Arc<dyn FrontSink>, token: Option<ProgressToken>) {
        *self.sink.lock().unwrap_or_else(|p| p.into_inner()) = sink;
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = token;
    }

    /// Starts the task that writes queued notes to the client, in order, until [`Self::finish`]
    /// (then drains), `ct` is cancelled or the client is gone.
    /// A parkable call's route (2026 front) outlives the stream of the request that started it:
    /// a note that stream can no longer take is dropped, and later ones follow the resuming
    /// request's stream.
    pub fn spawn_drain(self: &Arc<Self>, ct: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.clone().drain(ct))
    }

    /// Writes queued notes to the client, in order, until [`Self::finish`] (then drains), `ct`
    /// is cancelled or the client is gone.
    async fn drain(self: Arc<Self>, ct: CancellationToken) {
        loop {
            let note = tokio::select! {
                n = self.queue.pop() => n,
                _ = ct.cancelled() => None,
            };
            let Some(note) = note else { break };
            let sink = self.sink();
            if (sink.closed() || sink.send(note).await.is_err()) && self.asks.is_none() {
                break;
            }
        }
        // Nothing more reaches this client: let the child side drop instead of queueing.
        self.queue.close();
    }

    /// The call ended: no more notes are accepted; queued ones are still written.
    pub fn finish(&self) {
        self.queue.close();
    }

    /// Runs one call with its route (if it has one): the notes are written to the client beside
    /// the call, in this task; when the call ends no more are accepted, and the queued ones are
    /// written before its outcome returns (or `ct` is cancelled): every notification of a call
    /// precedes its result.
    ///
    /// In the caller's task rather than a task of its own: most calls send no note, and a drain
    /// task per call cost a spawn and a cross-thread wake-up on the forwarding path. The drain
    /// is still polled independently of the call, so a client that does not read blocks only
    /// the drain (the queue then coalesces), never the call or the child connection.
    pub async fn run<F: Future>(
        route: Option<&Arc<Self>>,
        ct: &CancellationToken,
        call: F,
    ) -> F::Output {
        let Some(route) = route else {
            return call.await;
        };
        let drain = route.clone().drain(ct.clone());
        tokio::pin!(call, drain);
        let mut drained = false;
        let outcome = loop {
            tokio::select! {
                biased;
                outcome = &mut call => break outcome,
                () = &mut drain, if !drained => drained = true,
            }
        };
        route.finish();
        if !drained {
            tokio::select! {
                () = drain => {}
                () = ct.cancelled() => {}
            }
        }
        outcome
    }
}

impl CallObserver for FrontRoute {
    fn session(&self) -> u64 {
        self.session
    }

    fn caps(&self) -> ClientCaps {
        self.caps
    }

    fn progress(&self, mut params: ProgressNotificationParam) {
        let token = self.token.lock().ok().and_then(|t| t.clone());
        if let Some(token) = token {
            params.progress_token = token;
            self.queue.push(FrontNote::Progress(params));
        }
    }

    fn log(&self, params: LoggingMessageNotificationParam) {
        if super::level_rank(params.level) >= super::level_rank(self.min_level) {
            self.queue.push(FrontNote::Log(params));
        }
    }

    fn relay(&self, request: ServerRequest) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        let Some(asks) = self.asks.clone() else {
            return self.sink().relay(request);
        };
        Box::pin(async move {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let gone = || {
                crate::child::relay_refusal(
                    "relay-input-failed",
                    "the call ended before the client answered",
                )
            };
            asks.send((request, tx)).await.map_err(|_| gone())?;
            rx.await.unwrap_or_else(|_| Err(gone()))
        })
    }

    fn takes_input_required(&self) -> bool {
        self.sink().takes_input_required()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(token: i64, value: f64) -> FrontNote {
        FrontNote::Progress(ProgressNotificationParam::new(
            ProgressToken(rmcp::model::NumberOrString::Number(token)),
            value,
        ))
    }

    fn log(text: &str) -> FrontNote {
        FrontNote::Log(LoggingMessageNotificationParam::new(
            rmcp::model::LoggingLevel::Info,
            serde_json::json!(text),
        ))
    }

    #[tokio::test]
    async fn a_full_queue_keeps_only_the_latest_progress_and_drops_logs() {
        let q = NoteQueue::new(2);
        assert_eq!(q.push(progress(1, 1.0)), Pushed::Queued);
        assert_eq!(q.push(log("a")), Pushed::Queued);
        // Full: progress of the same token replaces the queued one, a log is dropped.
        for i in 2..1000 {
            assert_eq!(q.push(progress(1, i as f64)), Pushed::Coalesced);
        }
        assert_eq!(q.push(log("b")), Pushed::Dropped);
        assert_eq!(q.push(progress(2, 1.0)), Pushed::Dropped);
        assert_eq!(q.len(), 2);
        q.close();
        let Some(FrontNote::Progress(p)) = q.pop().await else {
            panic!("progress first")
        };
        assert_eq!(p.progress, 999.0);
        assert!(matches!(q.pop().await, Some(FrontNote::Log(_))));
        assert!(q.pop().await.is_none());
        assert_eq!(q.push(log("late")), Pushed::Dropped);
    }

    #[tokio::test]
    async fn pop_waits_for_a_note_or_the_close() {
        let q = Arc::new(NoteQueue::new(4));
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await.is_some() }
        });
        tokio::task::yield_now().await;
        q.push(log("x"));
        assert!(waiter.await.unwrap());
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await.is_none() }
        });
        tokio::task::yield_now().await;
        q.close();
        assert!(waiter.await.unwrap());
    }

    /// A sink recording what reaches the client; `blocked` never completes a send (a client
    /// that does not read).
    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<String>>,
        blocked: bool,
    }

    impl FrontSink for Recorder {
        fn send(&self, note: FrontNote) -> BoxFuture<'static, Result<(), ()>> {
            if self.blocked {
                return Box::pin(futures::future::pending());
            }
            let text = match note {
                FrontNote::Progress(p) => format!("progress {}", p.progress),
                FrontNote::Log(l) => format!("log {}", l.data),
            };
            self.seen.lock().unwrap().push(text);
            Box::pin(async { Ok(()) })
        }
        fn relay(&self, _: ServerRequest) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
            Box::pin(async { Err(ErrorData::internal_error("no relay", None)) })
        }
        fn closed(&self) -> bool {
            false
        }
    }

    fn route(sink: Arc<Recorder>) -> Arc<FrontRoute> {
        let token = ProgressToken(rmcp::model::NumberOrString::Number(7));
        FrontRoute::new(
            1,
            ClientCaps::default(),
            Some(token),
            rmcp::model::LoggingLevel::Debug,
            sink,
        )
    }

    fn child_progress(value: f64) -> ProgressNotificationParam {
        // The child's own token: the route writes the caller's.
        ProgressNotificationParam::new(
            ProgressToken(rmcp::model::NumberOrString::Number(99)),
            value,
        )
    }

    #[tokio::test]
    async fn every_note_of_a_call_reaches_the_client_before_its_outcome() {
        let ct = CancellationToken::new();
        let sink = Arc::new(Recorder::default());
        let r = route(sink.clone());
        let call = {
            let r = r.clone();
            async move {
                r.log(LoggingMessageNotificationParam::new(
                    rmcp::model::LoggingLevel::Info,
                    serde_json::json!("one"),
                ));
                tokio::task::yield_now().await;
                r.progress(child_progress(0.5));
                r.progress(child_progress(1.0));
                "result"
            }
        };
        assert_eq!(FrontRoute::run(Some(&r), &ct, call).await, "result");
        assert_eq!(
            *sink.seen.lock().unwrap(),
            ["log \"one\"", "progress 0.5", "progress 1"]
        );
        // The call is over: a late note is not taken.
        r.log(LoggingMessageNotificationParam::new(
            rmcp::model::LoggingLevel::Info,
            serde_json::json!("late"),
        ));
        assert_eq!(sink.seen.lock().unwrap().len(), 3);
        // A call without a route just runs.
        assert_eq!(FrontRoute::run(None, &ct, async { 5 }).await, 5);
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_blocks_neither_the_call_nor_the_child() {
        let ct = CancellationToken::new();
        let sink = Arc::new(Recorder {
            blocked: true,
            ..Recorder::default()
        });
        let r = route(sink.clone());
        let ended = Arc::new(Notify::new());
        let call = {
            let (r, ended) = (r.clone(), ended.clone());
            async move {
                // Far more notes than the queue holds, while the drain is stuck on the first.
                for i in 0..10 * NOTE_QUEUE_CAP {
                    r.progress(child_progress(i as f64));
                    tokio::task::yield_now().await;
                }
                ended.notify_one();
                "done"
            }
        };
        let outcome = tokio::spawn({
            let (r, ct) = (r.clone(), ct.clone());
            async move { FrontRoute::run(Some(&r), &ct, call).await }
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), ended.notified())
            .await
            .expect("the call ran to its end");
        assert!(r.queue.len() <= NOTE_QUEUE_CAP, "the queue stayed bounded");
        // Its outcome waits for the notes (every note precedes the result) until the request
        // is cancelled.
        tokio::task::yield_now().await;
        assert!(!outcome.is_finished());
        ct.cancel();
        assert_eq!(outcome.await.unwrap(), "done");
        assert!(sink.seen.lock().unwrap().is_empty());
    }
}
