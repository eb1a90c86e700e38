//! One [`ChildRuntime`] per fleet member: connection, state, limits and call forwarding.
//!
//! Design note: supervision is detached. [`ChildRuntime::start`] returns at once; a supervisor
//! task connects through [`crate::probe`], lists the catalog and publishes every state change on
//! a `watch` channel. Nothing (startup, other children, sessions) waits on a child unless it
//! asks to, with its own bound. A child that fails at boot, or dies after coming up, is
//! retried with exponential backoff inside its restart budget (a missing command waits at least
//! 5 s between attempts); `maxRestarts: 0` fails it at the first failure.

mod admission;
mod breaker;
mod call;
mod client;
mod connect;
pub mod connector;
mod fast;
#[cfg(test)]
pub(crate) mod memory;
mod share;
#[cfg(test)]
mod specs;
mod supervise;
mod tasks;

pub use breaker::{Breaker, BreakerState, Failure, Ticket};
pub use client::{
    CallObserver, ChildClient, ChildEvents, ClientCaps, ObservedTransport, Origin, RELAY_REFUSED,
    RelayKind, RelayPolicy, Routes, Target, relay_code, relay_refusal, serve_one_front,
};
pub use fast::{RawResult, RawToolCall};
pub use tasks::{TaskConn, TaskNeed, covers as tasks_cover};

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::Peer;
use rmcp::model::SubscriptionFilter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientRequest, ErrorData, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RoleClient, RunningService, ServiceError};
use serde::Serialize;
use tokio::sync::{Mutex, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::catalog::ChildCatalog;
use crate::config::{ChildSpec, Launch, SessionIsolation};
use crate::probe::{self, ProbeBounds, ProbeError};

/// Lifecycle state of a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildState {
    /// Connecting / listing for the first time.
    Starting,
    /// Serving.
    Up,
    /// Lost its connection; reconnecting within its restart budget.
    Restarting,
    /// Unavailable: boot failure or restart budget exhausted.
    Failed,
}

/// A stable error code with a sanitized message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorInfo {
    /// Stable code (e.g. `child-spawn-failed`).
    pub code: String,
    /// Human-readable, secret-free message.
    pub message: String,
}

impl ErrorInfo {
    fn new(code: &str, message: impl Into<String>) -> Self {
        ErrorInfo {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// What a child currently is: state, served catalog, last error.
#[derive(Debug, Clone)]
pub struct ChildStatus {
    /// Lifecycle state.
    pub state: ChildState,
    /// The catalog served for this child (kept across restarts until replaced).
    pub catalog: Option<Arc<ChildCatalog>>,
    /// Fingerprint of `catalog`.
    pub fingerprint: Option<String>,
    /// When `catalog` was last listed from the child: set by every successful listing, also one
    /// that only confirms an identical catalog (that confirmation notifies no watcher). Its age
    /// is the `staleness` find_tools reports.
    pub catalog_listed_at: Option<Instant>,
    /// Last error, if any.
    pub last_error: Option<ErrorInfo>,
    /// Restarts so far.
    pub restarts: u32,
    /// Connection generation (increments on every successful connect).
    pub connection_generation: u64,
    /// The protocol version negotiated with the child (`2026-07-28` for a child opened with
    /// `server/discover`, the `initialize` answer's version otherwise).
    pub protocol: Option<String>,
    /// Whether the newest connection declared the 2026-07-28 tasks extension.
    pub tasks_extension: bool,
}

/// Most `input_required` rounds graph-os drives for one call of a 2026-07-28 child (rmcp's
/// own client default).
pub const MAX_INPUT_ROUNDS: usize = rmcp::model::DEFAULT_MRTR_MAX_ROUNDS;

/// The protocol era a child is opened in: learned at its first connection (try
/// `server/discover`, fall back to `initialize`) and kept for every later connection (pool
/// members, per-session connections, restarts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEra {
    /// 2025-era: `initialize`, sessions, notifications on the session.
    Legacy,
    /// 2026-07-28: `server/discover`, self-contained requests, `subscriptions/listen`,
    /// `input_required` results.
    Modern,
}

/// Errors of a forwarded call; each maps to a stable code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The child is not serving (failed, or not ready in time).
    #[error("server '{server}' is unavailable ({state:?})")]
    Unavailable {
        /// Server name.
        server: String,
        /// Its state.
        state: ChildState,
    },
    /// No slot freed up within the queue timeout.
    #[error("server '{server}' is busy: no slot within {waited:?}")]
    Busy {
        /// Server name.
        server: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The child did not answer within the call timeout.
    #[error("server '{server}' did not answer within {timeout:?}")]
    Timeout {
        /// Server name.
        server: String,
        /// The call timeout.
        timeout: Duration,
    },
    /// The connection died during the call.
    #[error("server '{server}' connection closed during the call")]
    TransportClosed {
        /// Server name.
        server: String,
    },
    /// The client cancelled the call.
    #[error("call cancelled by the client")]
    Cancelled,
    /// The circuit breaker is open.
    #[error("server '{server}' circuit breaker is open")]
    CircuitOpen {
        /// Server name.
        server: String,
    },
    /// `per-session`: every per-session connection slot is taken.
    #[error("server '{server}' has no free per-session connection (maxSessions {max})")]
    SessionsExhausted {
        /// Server name.
        server: String,
        /// The bound.
        max: u32,
    },
    /// `per-session`: the session's own connection could not be opened.
    #[error("server '{server}': opening this session's connection failed ({code})")]
    SessionConnect {
        /// Server name.
        server: String,
        /// Stable code of the failure.
        code: String,
    },
    /// The connection a task was created on is gone: its task is not replayed elsewhere.
    #[error("server '{server}': the connection this task was created on is gone")]
    TaskEpochChanged {
        /// Server name.
        server: String,
    },
    /// The child's connection does not declare the task capability the request needs.
    #[error("server '{server}' does not declare capabilities.tasks.{need}")]
    TaskUnsupported {
        /// Server name.
        server: String,
        /// The capability path.
        need: String,
    },
    /// The child answered with a JSON-RPC error (forwarded unchanged).
    #[error("child error {}: {}", .0.code.0, .0.message)]
    Rpc(ErrorData),
    /// A read-only call's crash retry was refused by its resolution against the recovered
    /// child's served catalog (see [`Reresolve`]): the code a fresh call gets (e.g.
    /// `drift-pending`), or `retry-tool-changed`. Nothing was sent to the restarted child.
    #[error("{message}")]
    Refused {
        /// Stable code.
        code: &'static str,
        /// Human-readable reason.
        message: String,
    },
}

impl CallError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            CallError::Unavailable { .. } => "child-unavailable",
            CallError::Busy { .. } => "child-busy",
            CallError::Timeout { .. } => "child-call-timeout",
            CallError::TransportClosed { .. } => "child-transport-closed",
            CallError::Cancelled => "call-cancelled",
            CallError::CircuitOpen { .. } => "child-circuit-open",
            CallError::SessionsExhausted { .. } => "child-sessions-exhausted",
            CallError::SessionConnect { .. } => "child-session-connect-failed",
            CallError::TaskEpochChanged { .. } => "task-epoch-changed",
            CallError::TaskUnsupported { .. } => "task-unsupported",
            CallError::Rpc(_) => "child-error",
            CallError::Refused { code, .. } => code,
        }
    }
}

/// The crash retry of a read-only call goes through the same resolution as a fresh call: after
/// the child restarted, the call's exposed tool is resolved again against the served view of
/// the recovered catalog (its drift guard included) before anything is sent to the new process.
/// The multiplexer implements it; the child runtime asks it in [`ChildRuntime::crash_retry`],
/// the one retry decision of the typed path and the raw hot path. A call without one is never
/// retried.
pub trait Reresolve: Send + Sync {
    /// `Ok`: the same tool, unchanged and still read-only: retry it. `Err`: the refusal that
    /// answers the call instead ([`CallError::Refused`] with a fresh call's code).
    fn reresolve(&self) -> futures::future::BoxFuture<'_, Result<(), CallError>>;
}

/// A call's crash retry: `None` for a call that is not retried (not read-only).
pub type Retry = Option<Arc<dyn Reresolve>>;

struct Connection {
    peer: Peer<RoleClient>,
    /// Call routes of this connection (shared pool members share the child's routes).
    routes: Arc<client::Routes>,
    /// The raw request channel beside rmcp (stdio connections: the forwarding hot path).
    raw: Option<crate::transport::raw_link::RawLink>,
}

/// A connection as opened: rmcp's service and, for stdio, its raw request channel.
struct Opened {
    running: RunningService<RoleClient, ChildClient>,
    raw: Option<crate::transport::raw_link::RawLink>,
}

/// A front session at the child boundary: its key and a liveness handle (the session is gone
/// when `alive` no longer upgrades). Used by `per-session` isolation.
#[derive(Debug, Clone)]
pub struct SessionTag {
    /// Process-unique session number.
    pub id: u64,
    /// Dropped with the session.
    pub alive: std::sync::Weak<()>,
    /// The caller's principal (identity subject): its share of the child's slots and its own
    /// breaker (see `share` and `breaker`).
    pub principal: Arc<str>,
}

/// One front session's own connection (`per-session`).
struct SessionConn {
    conn: Arc<Connection>,
    alive: std::sync::Weak<()>,
    last_used: std::sync::Mutex<Instant>,
    in_flight: AtomicU64,
    stop: CancellationToken,
}

impl SessionConn {
    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }
}

/// A connection checked out for one call; `per-session` use is tracked for idle reaping.
struct Lease {
    conn: Arc<Connection>,
    session: Option<Arc<SessionConn>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(s) = &self.session {
            s.in_flight.fetch_sub(1, Ordering::Relaxed);
            if let Ok(mut t) = s.last_used.lock() {
                *t = Instant::now();
            }
        }
    }
}

/// The runtime of one fleet member.
pub struct ChildRuntime {
    spec: ChildSpec,
    bounds: ProbeBounds,
    status: watch::Sender<ChildStatus>,
    conns: Mutex<Vec<Arc<Connection>>>,
    next_conn: AtomicU64,
    limiter: Arc<Semaphore>,
    /// Each principal's share of `limiter`.
    share: Arc<share::FairShare>,
    in_flight: AtomicU64,
    queued: AtomicU64,
    client: ChildClient,
    breaker: Breaker,
    shutdown: CancellationToken,
    /// `per-session` connections by session id (slot filled once the connection is up).
    sessions: std::sync::Mutex<HashMap<u64, Arc<tokio::sync::OnceCell<Arc<SessionConn>>>>>,
    /// `auth: run-token`: the signing key, resolved at the child boundary on every connect.
    run_token_key: std::sync::Mutex<Option<Arc<[u8]>>>,
    /// The era learned at the first connection (none until then).
    era: std::sync::Mutex<Option<ChildEra>>,
    /// Connections that failed before the era was learned: every other attempt skips the
    /// `server/discover` probe (a 2025 child that dies on an unknown method still comes up).
    unlearned_failures: AtomicU64,
    /// 2026-07-28 child: the `subscriptions/listen` stream of each subscribed resource URI.
    resource_listens: Arc<std::sync::Mutex<HashMap<String, ResourceListen>>>,
    /// How connections to the child are opened ([`connector::Transports`] but in tests).
    connector: Arc<dyn connector::Connector>,
}

impl std::fmt::Debug for ChildRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildRuntime")
            .field("name", &self.spec.name)
            .finish()
    }
}

/// Counters exposed by multiplexer_status.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Load {
    /// Calls holding a slot.
    pub in_flight: u64,
    /// Calls waiting for a slot.
    pub queued: u64,
}

impl ChildRuntime {
    /// Creates the runtime and starts its detached supervisor.
    pub fn start(
        spec: ChildSpec,
        bounds: ProbeBounds,
        events: Option<Arc<dyn ChildEvents>>,
    ) -> Arc<Self> {
        Self::start_with(spec, bounds, events, Arc::new(connector::Transports))
    }

    /// [`Self::start`], with connections opened by `connector`.
    pub fn start_with(
        spec: ChildSpec,
        bounds: ProbeBounds,
        events: Option<Arc<dyn ChildEvents>>,
        connector: Arc<dyn connector::Connector>,
    ) -> Arc<Self> {
        let (status, _) = watch::channel(ChildStatus {
            state: ChildState::Starting,
            catalog: None,
            fingerprint: None,
            catalog_listed_at: None,
            last_error: None,
            restarts: 0,
            connection_generation: 0,
            protocol: None,
            tasks_extension: false,
        });
        let policy = RelayPolicy {
            roots: spec
                .roots
                .iter()
                .map(|r| {
                    // Roots are SEP-2577-deprecated but still asked for by 2025-era children.
                    #[allow(deprecated)]
                    let mut root = rmcp::model::Root::new(r.uri.clone());
                    #[allow(deprecated)]
                    {
                        root.name = r.name.clone();
                    }
                    root
                })
                .collect(),
            timeout: spec.limits.relay_timeout,
        };
        let rt = Arc::new(ChildRuntime {
            limiter: Arc::new(Semaphore::new(spec.limits.max_concurrency as usize)),
            share: share::FairShare::new(spec.limits.max_concurrency_per_principal),
            client: ChildClient::new(&spec.name, events, policy),
            sessions: std::sync::Mutex::new(HashMap::new()),
            breaker: Breaker::new(spec.limits.breaker_threshold, spec.limits.breaker_cooldown),
            spec,
            bounds,
            status,
            conns: Mutex::new(Vec::new()),
            next_conn: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            shutdown: CancellationToken::new(),
            run_token_key: std::sync::Mutex::new(None),
            era: std::sync::Mutex::new(None),
            unlearned_failures: AtomicU64::new(0),
            resource_listens: Arc::default(),
            connector,
        });
        let sup = rt.clone();
        tokio::spawn(async move { sup.supervise().await });
        if rt.spec.isolation == SessionIsolation::PerSession {
            let weak = Arc::downgrade(&rt);
            let every = (rt.spec.limits.session_idle_timeout / 4)
                .clamp(Duration::from_millis(50), Duration::from_secs(5));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let Some(rt) = weak.upgrade() else { return };
                    if rt.shutdown.is_cancelled() {
                        return;
                    }
                    rt.reap_sessions();
                }
            });
        }
        rt
    }

    /// The declaration this runtime serves.
    pub fn spec(&self) -> &ChildSpec {
        &self.spec
    }

    /// Server name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// A snapshot of the current status.
    pub fn status(&self) -> ChildStatus {
        self.status.borrow().clone()
    }

    /// Whether the child's newest connection declared the 2026-07-28 tasks extension (cheap:
    /// read on every 2026 front request).
    pub fn declares_tasks_extension(&self) -> bool {
        self.status.borrow().tasks_extension
    }

    /// Subscribes to status changes.
    pub fn subscribe(&self) -> watch::Receiver<ChildStatus> {
        self.status.subscribe()
    }

    /// Waits until the child leaves `starting`/`restarting`, at most `budget`.
    pub async fn wait_settled(&self, budget: Duration) -> ChildStatus {
        let mut rx = self.status.subscribe();
        let _ = tokio::time::timeout(
            budget,
            rx.wait_for(|s| matches!(s.state, ChildState::Up | ChildState::Failed)),
        )
        .await;
        self.status()
    }

    /// Stops the child and its supervisor.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.conns.lock().await.clear();
        let slots: Vec<_> = self
            .sessions
            .lock()
            .map(|mut m| m.drain().map(|(_, s)| s).collect())
            .unwrap_or_default();
        for slot in slots {
            if let Some(s) = slot.get() {
                s.stop.cancel();
            }
        }
    }

    /// `resources/subscribe` to a 2026-07-28 child (which has no such method): a
    /// `subscriptions/listen` stream for the URI, whose updates reach the multiplexer as a 2025
    /// child's notifications do. One stream per URI; it ends with unsubscribe or the connection.
    async fn listen_resource(
        &self,
        uri: String,
        session: Option<&SessionTag>,
    ) -> Result<ServerResult, CallError> {
        let server = self.spec.name.clone();
        if self
            .resource_listens
            .lock()
            .is_ok_and(|m| m.contains_key(&uri))
        {
            return Ok(ServerResult::empty(()));
        }
        let lease = self.lease(session).await?;
        let filter = SubscriptionFilter::builder()
            .resource_subscriptions([uri.clone()])
            .build();
        let timeout = self.spec.limits.call_timeout;
        let mut subscription =
            match tokio::time::timeout(timeout, lease.conn.peer.listen(filter)).await {
                Err(_) => return Err(CallError::Timeout { server, timeout }),
                Ok(Err(ServiceError::McpError(e))) => return Err(CallError::Rpc(e)),
                Ok(Err(_)) => return Err(CallError::TransportClosed { server }),
                Ok(Ok(s)) => s,
            };
        let accepted = subscription
            .acknowledged()
            .resource_subscriptions
            .as_ref()
            .is_some_and(|u| u.contains(&uri));
        if !accepted {
            return Err(CallError::Rpc(ErrorData::invalid_params(
                "the child did not accept a subscription to this resource",
                None,
            )));
        }
        let stop = self.shutdown.child_token();
        static LISTENS: AtomicU64 = AtomicU64::new(0);
        let id = LISTENS.fetch_add(1, Ordering::Relaxed);
        let (closed_tx, closed) = tokio::sync::oneshot::channel::<()>();
        if let Ok(mut m) = self.resource_listens.lock() {
            m.insert(
                uri.clone(),
                ResourceListen {
                    id,
                    stop: stop.clone(),
                    closed,
                },
            );
        }
        let listens = self.resource_listens.clone();
        tokio::spawn(async move {
            // Dropped when this task ends: the unsubscribe waiting on it may answer.
            let _closed = closed_tx;
            loop {
                tokio::select! {
                    // The updates themselves reach the multiplexer from the connection's
                    // transport (`ObservedTransport`), like a 2025 child's; the stream is drained
                    // so it stays open.
                    n = subscription.next() => match n {
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    },
                    _ = stop.cancelled() => {
                        // Unsubscribed: the child hears `notifications/cancelled` before the
                        // unsubscribe answers, so a request after it finds the stream gone.
                        let _ = subscription.cancel().await;
                        break;
                    }
                }
            }
            // The stream ended by itself (connection closed): a later subscribe listens anew.
            if let Ok(mut m) = listens.lock()
                && m.get(&uri).is_some_and(|l| l.id == id)
            {
                m.remove(&uri);
            }
        });
        Ok(ServerResult::empty(()))
    }
}

/// One `subscriptions/listen` stream a 2026-07-28 child holds for a subscribed resource URI.
struct ResourceListen {
    /// Tells an entry apart from a later one for the same URI.
    id: u64,
    /// Ends the stream (unsubscribe).
    stop: CancellationToken,
    /// Resolves once the stream's task ended (its cancellation was sent to the child).
    closed: tokio::sync::oneshot::Receiver<()>,
}
