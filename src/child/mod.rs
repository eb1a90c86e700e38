//! One [`ChildRuntime`] per fleet member: connection, state, limits and call forwarding.
//!
//! Design note: supervision is detached. [`ChildRuntime::start`] returns at once; a supervisor
//! task connects through [`crate::probe`], lists the catalog and publishes every state change on
//! a `watch` channel. Nothing (startup, other children, sessions) waits on a child unless it
//! asks to, with its own bound. A child that fails at boot, or dies after coming up, is
//! retried with exponential backoff inside its restart budget (a missing command waits at least
//! 5 s between attempts); `maxRestarts: 0` fails it at the first failure.

mod breaker;
mod client;
pub mod connector;
mod fast;
#[cfg(test)]
pub(crate) mod memory;
mod share;
#[cfg(test)]
mod specs;
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

    /// Closes `per-session` connections whose session is gone or that sat idle past
    /// `sessionIdleTimeout`. Returns how many were closed.
    pub fn reap_sessions(&self) -> usize {
        let idle = self.spec.limits.session_idle_timeout;
        let Ok(mut map) = self.sessions.lock() else {
            return 0;
        };
        let before = map.len();
        map.retain(|_, slot| match slot.get() {
            // Still connecting: keep.
            None => true,
            Some(s) => {
                let dead = s.alive.strong_count() == 0
                    || s.stop.is_cancelled()
                    || (s.in_flight.load(Ordering::Relaxed) == 0 && s.idle_for() >= idle);
                if dead {
                    s.stop.cancel();
                }
                !dead
            }
        });
        before - map.len()
    }

    /// Open `per-session` connections.
    pub fn session_connections(&self) -> usize {
        self.sessions
            .lock()
            .map(|m| m.values().filter(|s| s.get().is_some()).count())
            .unwrap_or(0)
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

    /// Current load counters.
    pub fn load(&self) -> Load {
        Load {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
        }
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

    /// The connection a call of `session` uses: the shared pool (round-robin), or with
    /// `per-session` isolation the session's own connection, opened on first use.
    async fn lease(&self, session: Option<&SessionTag>) -> Result<Lease, CallError> {
        let server = || self.spec.name.clone();
        let tag = match (self.spec.isolation, session) {
            (SessionIsolation::PerSession, Some(tag)) => tag,
            _ => {
                return self
                    .pick()
                    .await
                    .map(|conn| Lease {
                        conn,
                        session: None,
                    })
                    .ok_or_else(|| CallError::TransportClosed { server: server() });
            }
        };
        let slot = {
            let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = map.get(&tag.id) {
                slot.clone()
            } else {
                if map.len() >= self.spec.limits.max_sessions as usize {
                    drop(map);
                    self.reap_sessions();
                    map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
                }
                if map.len() >= self.spec.limits.max_sessions as usize {
                    return Err(CallError::SessionsExhausted {
                        server: server(),
                        max: self.spec.limits.max_sessions,
                    });
                }
                map.entry(tag.id).or_default().clone()
            }
        };
        let opened = slot
            .get_or_try_init(|| self.open_session_conn(tag.alive.clone()))
            .await;
        let conn = match opened {
            Ok(c) if !c.stop.is_cancelled() => c.clone(),
            other => {
                if let Ok(mut map) = self.sessions.lock()
                    && map.get(&tag.id).is_some_and(|s| Arc::ptr_eq(s, &slot))
                {
                    map.remove(&tag.id);
                }
                return Err(match other {
                    Err(e) => CallError::SessionConnect {
                        server: server(),
                        code: e.code,
                    },
                    Ok(_) => CallError::TransportClosed { server: server() },
                });
            }
        };
        conn.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Lease {
            conn: conn.conn.clone(),
            session: Some(conn),
        })
    }

    /// Opens one session's own connection and the task that closes it when stopped.
    async fn open_session_conn(
        &self,
        alive: std::sync::Weak<()>,
    ) -> Result<Arc<SessionConn>, ErrorInfo> {
        let client = self.client.sibling();
        let Opened { running, raw } = self.connect_with(client.clone()).await?;
        let stop = self.shutdown.child_token();
        let conn = Arc::new(SessionConn {
            conn: Arc::new(Connection {
                peer: running.peer().clone(),
                routes: client.routes().clone(),
                raw,
            }),
            alive,
            last_used: std::sync::Mutex::new(Instant::now()),
            in_flight: AtomicU64::new(0),
            stop: stop.clone(),
        });
        let server = self.spec.name.clone();
        tokio::spawn(async move {
            let token = running.cancellation_token();
            let waiting = running.waiting();
            tokio::pin!(waiting);
            tokio::select! {
                _ = &mut waiting => {}
                _ = stop.cancelled() => {
                    token.cancel();
                    let _ = waiting.await;
                }
            }
            stop.cancel();
            tracing::debug!(server = %server, "per-session connection closed");
        });
        tracing::debug!(server = %self.spec.name, "per-session connection opened");
        Ok(conn)
    }

    async fn connect_one(&self) -> Result<Opened, ErrorInfo> {
        self.connect_with(self.client.clone()).await
    }

    async fn connect_with(&self, client: ChildClient) -> Result<Opened, ErrorInfo> {
        // Secrets (env, vault://, secret://, MCP_FLEET_SECRET_REFS) are materialized here, at the
        // child boundary, bound to this declaration (src/secrets/material.rs).
        let material = crate::config::material::materialize(&self.spec).await;
        // A failure's message reaches logs and status: never with this child's secret values.
        let redactor = secret_redactor(&self.spec, &material.lookup());
        self.open_connection(client, material).await.map_err(|e| {
            let message =
                crate::telemetry::redact::clip(&redactor.apply(&e.message), probe::MAX_REASON);
            ErrorInfo { message, ..e }
        })
    }

    async fn open_connection(
        &self,
        client: ChildClient,
        material: crate::config::material::Material,
    ) -> Result<Opened, ErrorInfo> {
        let timeout = self.spec.limits.initialization_timeout;
        if let Some(run_token) = &self.spec.run_token {
            let key = run_token
                .key
                .resolve_material(&material.lookup())
                .map_err(|e| ErrorInfo::new(e.code(), e.to_string()))?;
            if key.len() < crate::auth::run_token::MIN_KEY_BYTES {
                return Err(ErrorInfo::new(
                    crate::transport::client_credentials::AUTH_FAILED,
                    format!(
                        "the run-token key is shorter than {} bytes",
                        crate::auth::run_token::MIN_KEY_BYTES
                    ),
                ));
            }
            if let Ok(mut k) = self.run_token_key.lock() {
                *k = Some(Arc::from(key.into_bytes()));
            }
        }
        // Why a connection fails or ends, when the transport knows (frame bound, egress, TLS).
        let fault = client.fault().clone();
        let _ = fault.take();
        let _ = fault.take_cause();
        let known = self.era().or_else(|| {
            (self.unlearned_failures.load(Ordering::Relaxed) % 2 == 1).then_some(ChildEra::Legacy)
        });
        let dialed = self
            .connector
            .dial(connector::Dial {
                spec: &self.spec,
                client: client.clone(),
                material,
                fault: fault.clone(),
                era: known,
                timeout,
            })
            .await?;
        let raw = dialed.raw;
        let running = dialed.running.map_err(|e| {
            if self.era().is_none() {
                self.unlearned_failures.fetch_add(1, Ordering::Relaxed);
            }
            match fault.take() {
                Some((code, message)) => ErrorInfo::new(code, message),
                // rmcp's error ends at "error sending request": the transport kept the cause.
                None => match fault.take_cause() {
                    Some(cause) => ErrorInfo::new(e.code(), format!("{e}: {cause}")),
                    None => probe_error(e),
                },
            }
        })?;
        let protocol = running
            .peer()
            .peer_info()
            .map(|i| i.protocol_version.clone());
        let era = match &protocol {
            Some(v) if !v.has_initialize() => ChildEra::Modern,
            _ => ChildEra::Legacy,
        };
        if let Ok(mut known) = self.era.lock()
            && known.is_none()
        {
            tracing::info!(server = %self.spec.name, protocol = ?protocol.as_ref().map(|v| v.as_str().to_string()), "child protocol era learned");
            *known = Some(era);
        }
        let protocol = protocol.map(|v| v.as_str().to_string());
        let tasks_extension = running
            .peer()
            .peer_info()
            .is_some_and(|i| i.capabilities.supports_tasks());
        self.status.send_modify(|s| {
            s.protocol = protocol;
            s.tasks_extension = tasks_extension;
        });
        // The raw channel serves 2025-era connections only: a 2026-07-28 child's results may
        // be input rounds, which take the typed path.
        let raw = raw.filter(|_| era == ChildEra::Legacy);
        Ok(Opened { running, raw })
    }

    /// The era of this child's connections, once learned.
    pub fn era(&self) -> Option<ChildEra> {
        self.era.lock().ok().and_then(|e| *e)
    }

    /// The run-token key (`auth: run-token`), once a connection resolved it.
    pub fn run_token_key(&self) -> Option<Arc<[u8]>> {
        self.run_token_key.lock().ok().and_then(|k| k.clone())
    }

    /// Opens the connection pool: one for stdio, `poolSize` for remote children.
    async fn connect(&self) -> Result<Vec<Opened>, ErrorInfo> {
        let size = if self.spec.is_stdio() {
            1
        } else {
            self.spec.limits.pool_size.max(1) as usize
        };
        let mut pool = Vec::with_capacity(size);
        for _ in 0..size {
            match self.connect_one().await {
                Ok(r) => pool.push(r),
                Err(e) => {
                    for r in pool {
                        let _ = r.running.cancel().await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    fn transition(&self, state: ChildState, error: Option<ErrorInfo>) {
        let reason = error.as_ref().map_or("ok", |e| e.code.as_str()).to_string();
        tracing::info!(server = %self.spec.name, state = ?state, reason = %reason, "child state");
        if let (ChildState::Failed, Some(e)) = (state, &error) {
            tracing::warn!(server = %self.spec.name, code = %e.code, error = %e.message, "child failed");
        }
        crate::telemetry::metrics().transition(&self.spec.name, state);
        self.status.send_modify(|s| {
            s.state = state;
            if error.is_some() || state == ChildState::Up {
                s.last_error = error;
            }
        });
    }

    /// Publishes a freshly listed catalog; an identical one changes nothing but the time it
    /// was last confirmed (watchers are not woken for that).
    fn publish_catalog(&self, catalog: impl Into<Arc<ChildCatalog>>) {
        let catalog: Arc<ChildCatalog> = catalog.into();
        let fingerprint = catalog.fingerprint();
        self.status.send_if_modified(|s| {
            s.catalog_listed_at = Some(Instant::now());
            if s.fingerprint.as_deref() == Some(fingerprint.as_str()) {
                return false;
            }
            tracing::info!(server = %self.spec.name, tools = catalog.tools.len(), skills = catalog.skills.len(), "child catalog changed");
            s.catalog = Some(catalog);
            s.fingerprint = Some(fingerprint);
            true
        });
    }

    async fn supervise(self: Arc<Self>) {
        let mut restarts: VecDeque<Instant> = VecDeque::new();
        let mut attempt = 0u32;
        let mut ever_up = false;
        // The failure that kept the child from ever coming up (reported if the budget runs out).
        let mut boot_error: Option<ErrorInfo> = None;
        let limits = self.spec.limits.clone();
        loop {
            let connected = {
                use tracing::Instrument;
                let span = tracing::info_span!(
                    "child.probe",
                    otel.name = %format!("probe {}", self.spec.name),
                    server = %self.spec.name,
                    step = "connect",
                    attempt,
                );
                tokio::select! {
                    r = self.connect().instrument(span) => r,
                    _ = self.shutdown.cancelled() => return,
                }
            };
            // A failure before the child ever came up is retried like a crash (same backoff and
            // budget), so a dependency that starts later is picked up; a missing command waits
            // longer between attempts.
            let mut slow = false;
            match connected {
                Err(err) => {
                    slow = err.code == "child-spawn-failed";
                    tracing::warn!(
                        server = %self.spec.name,
                        code = %err.code,
                        attempt,
                        error = %err.message,
                        "child connection failed"
                    );
                    if !ever_up {
                        boot_error = Some(err.clone());
                    }
                    self.status.send_modify(|s| s.last_error = Some(err));
                }
                Ok(pool) => 'up: {
                    let peer = pool[0].running.peer().clone();
                    let peers: Vec<_> = pool
                        .iter()
                        .map(|r| (r.running.peer().clone(), r.raw.clone()))
                        .collect();
                    // One task per pool member: it reports the member closing, and stops it when
                    // this generation ends.
                    let generation = CancellationToken::new();
                    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::channel::<()>(pool.len());
                    for Opened { running, .. } in pool {
                        let token = running.cancellation_token();
                        let (generation, closed_tx) = (generation.clone(), closed_tx.clone());
                        tokio::spawn(async move {
                            let waiting = running.waiting();
                            tokio::pin!(waiting);
                            tokio::select! {
                                _ = &mut waiting => {}
                                _ = generation.cancelled() => {
                                    token.cancel();
                                    let _ = waiting.await;
                                }
                            }
                            let _ = closed_tx.send(()).await;
                        });
                    }
                    if self.era() == Some(ChildEra::Modern) {
                        let (client, peer, stop) =
                            (self.client.clone(), peer.clone(), generation.clone());
                        tokio::spawn(async move { client.follow_list_changes(peer, stop).await });
                    }
                    let stop_all = || generation.cancel();
                    let listing = {
                        use tracing::Instrument;
                        let span = tracing::info_span!(
                            "child.probe",
                            otel.name = %format!("probe {}", self.spec.name),
                            server = %self.spec.name,
                            step = "list",
                            attempt,
                        );
                        probe::list_catalog(&peer, self.bounds, limits.probe_timeout)
                            .instrument(span)
                    };
                    let listed = tokio::select! {
                        r = listing => r,
                        _ = self.shutdown.cancelled() => { stop_all(); return }
                    };
                    let catalog = match listed {
                        Ok(c) => c,
                        Err(e) if !ever_up => {
                            // Listing failed at boot: retried like a boot failure.
                            stop_all();
                            let err = probe_error(e);
                            boot_error = Some(err.clone());
                            self.status.send_modify(|s| s.last_error = Some(err));
                            break 'up;
                        }
                        Err(e) => {
                            // Keep the prior catalog (and its names) but fail the child closed.
                            stop_all();
                            self.transition(
                                ChildState::Failed,
                                Some(ErrorInfo::new(
                                    "schema-refresh-failed",
                                    format!("relisting after reconnect failed: {e}"),
                                )),
                            );
                            return;
                        }
                    };
                    attempt = 0;
                    ever_up = true;
                    boot_error = None;
                    // The replacement catalog is published before the new generation takes calls.
                    self.publish_catalog(catalog);
                    *self.conns.lock().await = peers
                        .into_iter()
                        .map(|(peer, raw)| {
                            Arc::new(Connection {
                                peer,
                                routes: self.client.routes().clone(),
                                raw,
                            })
                        })
                        .collect();
                    self.breaker.reset();
                    self.status.send_modify(|s| s.connection_generation += 1);
                    self.transition(ChildState::Up, None);
                    // Any pool member closing ends this generation.
                    loop {
                        tokio::select! {
                            _ = closed_rx.recv() => break,
                            _ = self.client.relist_requested() => {
                                match probe::list_catalog(&peer, self.bounds, limits.probe_timeout).await {
                                    Ok(c) => self.publish_catalog(c),
                                    Err(e) => {
                                        self.conns.lock().await.clear();
                                        stop_all();
                                        self.transition(
                                            ChildState::Failed,
                                            Some(ErrorInfo::new("schema-refresh-failed", format!("relisting after list_changed failed: {e}"))),
                                        );
                                        return;
                                    }
                                }
                            }
                            _ = self.shutdown.cancelled() => {
                                stop_all();
                                return;
                            }
                        }
                    }
                    stop_all();
                    self.conns.lock().await.clear();
                    // A transport fault (e.g. child-frame-too-large) names why it closed.
                    let closed = match self.client.fault().take() {
                        Some((code, message)) => ErrorInfo::new(code, message),
                        None => ErrorInfo::new("child-exited", "the child's connection closed"),
                    };
                    tracing::warn!(
                        server = %self.spec.name,
                        code = %closed.code,
                        error = %closed.message,
                        "child connection lost"
                    );
                    self.status.send_modify(|s| s.last_error = Some(closed));
                }
            }
            if self.shutdown.is_cancelled() {
                return;
            }
            // Restart budget: at most max_restarts within restart_window.
            let now = Instant::now();
            while restarts
                .front()
                .is_some_and(|t| now.duration_since(*t) > limits.restart_window)
            {
                restarts.pop_front();
            }
            if restarts.len() as u32 >= limits.max_restarts {
                let failure = match boot_error.take() {
                    // Never came up: keep the boot failure's own code.
                    Some(e) if limits.max_restarts == 0 => e,
                    Some(e) => ErrorInfo::new(
                        &e.code,
                        format!(
                            "{} (gave up after {} attempts)",
                            e.message,
                            restarts.len() + 1
                        ),
                    ),
                    None => {
                        let prior = self
                            .status()
                            .last_error
                            .map(|e| e.message)
                            .unwrap_or_default();
                        ErrorInfo::new("restart-budget-exhausted", prior)
                    }
                };
                crate::memory::release_free_memory();
                self.transition(ChildState::Failed, Some(failure));
                return;
            }
            // The dropped connection's buffers (up to a frame bound) go back to the OS.
            crate::memory::release_free_memory();
            restarts.push_back(now);
            self.status.send_modify(|s| s.restarts += 1);
            crate::telemetry::metrics().restart(&self.spec.name);
            self.transition(ChildState::Restarting, None);
            let mut backoff = backoff(attempt);
            if slow {
                backoff = backoff.max(Duration::from_secs(5));
            }
            attempt += 1;
            let after = self.status().last_error.map(|e| e.code).unwrap_or_default();
            tracing::info!(server = %self.spec.name, backoff_ms = backoff.as_millis() as u64, after = %after, "child restart scheduled");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// The next pool connection, round-robin.
    async fn pick(&self) -> Option<Arc<Connection>> {
        let conns = self.conns.lock().await;
        if conns.is_empty() {
            return None;
        }
        let i = self.next_conn.fetch_add(1, Ordering::Relaxed) as usize % conns.len();
        Some(conns[i].clone())
    }

    /// Lists the child's catalog again on its live connection under `deadline` and publishes it
    /// (an identical catalog changes nothing). Fails if the child is not up or any family fails.
    pub async fn relist(&self, deadline: Duration) -> Result<u64, ErrorInfo> {
        let (catalog, generation) = self.probe_catalog(deadline).await?;
        self.adopt_catalog(catalog, generation);
        Ok(generation)
    }

    /// Lists the child's catalog on its live connection under `deadline` without serving it (a
    /// refresh candidate is built beside the served view); returns the catalog and the
    /// connection generation it was listed on.
    pub async fn probe_catalog(
        &self,
        deadline: Duration,
    ) -> Result<(Arc<ChildCatalog>, u64), ErrorInfo> {
        let status = self.status();
        if status.state != ChildState::Up {
            return Err(ErrorInfo::new(
                "child-unavailable",
                format!("server '{}' is {:?}", self.spec.name, status.state),
            ));
        }
        let Some(conn) = self.pick().await else {
            return Err(ErrorInfo::new(
                "child-unavailable",
                format!("server '{}' has no connection", self.spec.name),
            ));
        };
        let catalog = probe::list_catalog(&conn.peer, self.bounds, deadline)
            .await
            .map_err(probe_error)?;
        Ok((Arc::new(catalog), status.connection_generation))
    }

    /// Serves a catalog from [`Self::probe_catalog`] unless the connection changed since (a
    /// newer connection listed its own). Returns whether it was adopted.
    pub fn adopt_catalog(&self, catalog: Arc<ChildCatalog>, generation: u64) -> bool {
        if self.status().connection_generation != generation {
            return false;
        }
        self.publish_catalog(catalog);
        true
    }

    /// Breaker state.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Principals whose own breaker is open on this child (their own calls timed out).
    pub fn principal_breakers_open(&self) -> usize {
        self.breaker.open_principals()
    }

    /// Forwards one `tools/call` to the child under its limits: breaker, queue timeout,
    /// concurrency bound, call timeout. `observer` receives the call's progress, logs and
    /// child→client requests; `ct` cancels it (cancellation is sent upstream); `session` picks
    /// the session's own connection under `per-session` isolation. A call with a `retry` (a
    /// read-only tool) whose attempt dies with the transport is retried once on a new
    /// connection, after its resolution agrees (see [`Self::crash_retry`]).
    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
        retry: Retry,
        observer: Option<Arc<dyn CallObserver>>,
        ct: CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<CallToolResponse, CallError> {
        self.call_tool_offering(params, retry, observer, ct, session, false)
            .await
            .map(|(response, _)| response)
    }

    /// Whether a read-only call that lost its connection (of `generation`) may be retried:
    /// shared, once the next connection generation is up (within the child's start-up time,
    /// at most 45 s); per-session, at once (the dead connection is dropped and the retry opens
    /// a new one).
    pub(crate) async fn ready_for_retry(&self, per_session: bool, generation: u64) -> bool {
        if per_session {
            self.reap_sessions();
            return true;
        }
        let limits = &self.spec.limits;
        let recovery =
            (limits.initialization_timeout + limits.probe_timeout).min(Duration::from_secs(45));
        let mut rx = self.status.subscribe();
        tokio::time::timeout(
            recovery,
            rx.wait_for(|s| {
                s.state == ChildState::Failed
                    || (s.state == ChildState::Up && s.connection_generation > generation)
            }),
        )
        .await
        .is_ok_and(|r| r.is_ok_and(|s| s.state == ChildState::Up))
    }

    /// The one crash-retry decision of the typed path and the raw hot path: a call with a
    /// `retry` whose attempt died with the connection (`outcome`) is retried once the next
    /// connection is up ([`Self::ready_for_retry`]) and only if it resolves again, as a fresh
    /// call would, to the same unchanged tool ([`Reresolve`]): a tool the drift guard now holds,
    /// or whose schema changed, is never sent to the restarted child. Returns whether to retry;
    /// a refusal of the resolution replaces `outcome`.
    async fn crash_retry<T>(
        &self,
        retry: &Retry,
        outcome: &mut Result<T, CallError>,
        per_session: bool,
        generation: u64,
    ) -> bool {
        let Some(check) = retry else {
            return false;
        };
        if !matches!(outcome, Err(CallError::TransportClosed { .. }))
            || !self.ready_for_retry(per_session, generation).await
        {
            return false;
        }
        match check.reresolve().await {
            Ok(()) => {
                tracing::info!(server = %self.spec.name, "retrying a read-only call on a new connection");
                true
            }
            Err(refusal) => {
                tracing::info!(server = %self.spec.name, code = refusal.code(), "a read-only call that died with the child is not retried");
                *outcome = Err(refusal);
                false
            }
        }
    }

    /// [`Self::call_tool`], where `offer_tasks` says the caller takes a task in answer (2026-07-28
    /// tasks extension): a connection that declares the extension is told so in the request's
    /// `clientCapabilities`, and may answer with a task, returned with the connection it lives
    /// on. Other connections are not told, and answer as for any caller.
    pub async fn call_tool_offering(
        &self,
        params: CallToolRequestParams,
        retry: Retry,
        observer: Option<Arc<dyn CallObserver>>,
        ct: CancellationToken,
        session: Option<&SessionTag>,
        offer_tasks: bool,
    ) -> Result<(CallToolResponse, Option<TaskConn>), CallError> {
        let tool = params.name.to_string();
        let code = |(response, _): &(CallToolResponse, Arc<Connection>)| match response {
            CallToolResponse::Complete(r) if r.is_error == Some(true) => "tool-error",
            CallToolResponse::InputRequired(_) => "input-required",
            CallToolResponse::Task(_) => "task",
            _ => "ok",
        };
        let attempt = || self.attempt(params.clone(), observer.clone(), &ct, session, offer_tasks);
        let (outcome, generation) = self
            .governed(&tool, &retry, &ct, session, code, attempt)
            .await;
        outcome.map(|(response, conn)| {
            let pin = matches!(response, CallToolResponse::Task(_))
                .then(|| TaskConn::new(&conn, generation));
            (response, pin)
        })
    }

    /// The one scaffolding of a forwarded call, whatever carries its bytes (the typed path and
    /// the raw hot path): the call span, admission ([`Self::admit`]), the attempt, the crash
    /// retry of a read-only call ([`Self::crash_retry`]), settling with the breaker
    /// ([`Self::settle`]), metrics. Returns the outcome and the connection generation it came
    /// from.
    pub(crate) async fn governed<T, F, Fut>(
        &self,
        tool: &str,
        retry: &Retry,
        ct: &CancellationToken,
        session: Option<&SessionTag>,
        code: impl Fn(&T) -> &'static str,
        attempt: F,
    ) -> (Result<T, CallError>, u64)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        use tracing::Instrument;
        let started = Instant::now();
        let span = tracing::info_span!(
            "child.call",
            otel.name = %format!("call {}/{}", self.spec.name, tool),
            otel.kind = "client",
            server = %self.spec.name,
            tool = %tool,
            code = tracing::field::Empty,
        );
        let run = async {
            let admitted = match self.admit(ct, session).await {
                Ok(a) => a,
                Err(e) => return (Err(e), 0),
            };
            let mut generation = admitted.generation;
            let per_session =
                self.spec.isolation == SessionIsolation::PerSession && session.is_some();
            let mut outcome = attempt().await;
            if self
                .crash_retry(retry, &mut outcome, per_session, generation)
                .await
            {
                generation = self.status().connection_generation;
                outcome = attempt().await;
            }
            self.settle(admitted, &outcome);
            (outcome, generation)
        };
        let (outcome, generation) = run.instrument(span.clone()).await;
        let recorded = match &outcome {
            Ok(t) => code(t),
            Err(e) => e.code(),
        };
        self.record_call(&span, tool, started, recorded, outcome.as_ref().err());
        (outcome, generation)
    }

    /// Records a finished call: its span's code, the call and per-tool metrics, and a warning
    /// when the child failed it.
    fn record_call(
        &self,
        span: &tracing::Span,
        tool: &str,
        started: Instant,
        code: &str,
        error: Option<&CallError>,
    ) {
        span.record("code", code);
        let elapsed = started.elapsed();
        let m = crate::telemetry::metrics();
        m.call(&self.spec.name, code, elapsed);
        m.tool_call(&self.spec.name, tool, code, elapsed);
        if let Some(e) = error {
            crate::telemetry::trace::fail(span, code);
            // The child failed the call (no answer in time, connection lost): worth a warning.
            // Refusals before the child (busy, open breaker, unavailable) are the caller's news.
            if matches!(
                e,
                CallError::Timeout { .. } | CallError::TransportClosed { .. }
            ) {
                tracing::warn!(
                    server = %self.spec.name,
                    tool = %tool,
                    code,
                    elapsed_ms = elapsed.as_millis() as u64,
                    error = %e,
                    "child call failed"
                );
            }
        }
    }

    /// Admits one request under the child's limits — the one admission of the typed path, the
    /// raw hot path and task requests: the child must be up (or settle within the queue
    /// timeout), its breaker and the principal's own closed, and within the queue timeout one
    /// of the principal's share of slots (`maxConcurrencyPerPrincipal`) and then one of the
    /// child's (`maxConcurrency`) free.
    async fn admit(
        &self,
        ct: &CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<Admitted<'_>, CallError> {
        let server = self.spec.name.clone();
        let limits = &self.spec.limits;
        let principal = session.map(|s| s.principal.clone());
        let status = self.status();
        let status = match status.state {
            ChildState::Up => status,
            ChildState::Failed => {
                return Err(CallError::Unavailable {
                    server,
                    state: status.state,
                });
            }
            _ => {
                self.wait_settled(limits.queue_timeout.min(Duration::from_secs(5)))
                    .await
            }
        };
        if status.state != ChildState::Up {
            return Err(CallError::Unavailable {
                server,
                state: status.state,
            });
        }
        let Some(ticket) = self.breaker.admit(principal.as_deref()) else {
            return Err(CallError::CircuitOpen { server });
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        let wait = {
            use tracing::Instrument;
            let span = tracing::info_span!("queue_wait", server = %server);
            // The principal's share first: a principal at its cap waits for its own calls and
            // never takes a slot another principal could have.
            let share = self.share.clone();
            let limiter = self.limiter.clone();
            let principal = principal.clone();
            let slots = async move {
                let share = match &principal {
                    Some(p) => Some(share.acquire(p).await),
                    None => None,
                };
                limiter.acquire_owned().await.map(|permit| (share, permit))
            };
            tokio::time::timeout(limits.queue_timeout, slots).instrument(span)
        };
        let permit = tokio::select! {
            p = wait => p,
            _ = ct.cancelled() => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                self.breaker.neutral(ticket, principal.as_deref());
                return Err(CallError::Cancelled);
            }
        };
        self.queued.fetch_sub(1, Ordering::Relaxed);
        let Ok(Ok((share, permit))) = permit else {
            self.breaker.neutral(ticket, principal.as_deref());
            return Err(CallError::Busy {
                server,
                waited: limits.queue_timeout,
            });
        };
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Admitted {
            ticket,
            principal,
            _share: share,
            _permit: permit,
            _guard: InFlightGuard(&self.in_flight),
            generation: status.connection_generation,
        })
    }

    /// Reports an admitted request's outcome to the breaker (timeouts and dead transports count
    /// as failures; the child's own errors as successes) and frees its slot.
    fn settle<T>(&self, admitted: Admitted<'_>, outcome: &Result<T, CallError>) {
        let ticket = admitted.ticket;
        let principal = admitted.principal.as_deref();
        let failure = match outcome {
            Ok(_) | Err(CallError::Rpc(_)) => {
                self.breaker.success(ticket, principal);
                None
            }
            Err(CallError::Timeout { .. }) => Some(Failure::Timeout),
            Err(CallError::TransportClosed { .. }) => Some(Failure::Transport),
            Err(_) => {
                self.breaker.neutral(ticket, principal);
                None
            }
        };
        if let Some(failure) = failure {
            if self.breaker.failure(ticket, principal, failure) {
                tracing::warn!(server = %self.spec.name, "circuit breaker opened");
            } else if principal.is_some_and(|p| self.breaker.principal_open(p)) {
                // A principal's own slow calls: only its calls fail fast.
                tracing::debug!(server = %self.spec.name, "a principal's own breaker is open");
            }
        }
    }

    /// One call on one connection; returns the answer and that connection.
    async fn attempt(
        &self,
        mut params: CallToolRequestParams,
        observer: Option<Arc<dyn CallObserver>>,
        ct: &CancellationToken,
        session: Option<&SessionTag>,
        offer_tasks: bool,
    ) -> Result<(CallToolResponse, Arc<Connection>), CallError> {
        let lease = self.lease(session).await?;
        let conn = lease.conn.clone();
        // The extension is offered only where the caller takes tasks and the child declared it.
        let offered = offer_tasks && tasks::extension_declared(&conn);
        let options = || {
            if offered {
                tasks::offering_tasks()
            } else {
                PeerRequestOptions::no_options()
            }
        };
        let route = observer.clone().map(|o| lease.conn.routes.begin(o));
        // Traces: the child call span's context travels in `_meta` (SEP-414; HTTP transports
        // also send it as the `traceparent` header).
        if crate::telemetry::trace::enabled() {
            let meta = params.meta.get_or_insert_with(Default::default);
            crate::telemetry::trace::inject_meta(&mut meta.0.0);
        }
        // A 2026-07-28 child asks for client input with `input_required` results: graph-os
        // relays the input requests to a 2025 client and retries with its answers (bounded
        // rounds); a 2026 client gets the result itself and retries through graph-os.
        for _round in 0..=MAX_INPUT_ROUNDS {
            let request =
                ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params.clone()));
            let input = match self
                .exchange(&lease.conn, request, options(), ct, route.as_ref())
                .await?
            {
                ServerResult::CallToolResult(r) => {
                    return Ok((CallToolResponse::Complete(r), conn));
                }
                // Only a caller that takes tasks was offered them; a task for another is a
                // child that does not follow the extension.
                ServerResult::CreateTaskResult(r) if offered => {
                    return Ok((CallToolResponse::Task(r), conn));
                }
                ServerResult::InputRequiredResult(r) => r,
                _ => {
                    return Err(CallError::Rpc(ErrorData::internal_error(
                        "child answered tools/call with an unexpected result type",
                        None,
                    )));
                }
            };
            let Some(caller) = observer.as_ref() else {
                return Err(CallError::Rpc(rmcp::model::ErrorData::new(
                    rmcp::model::ErrorCode(client::RELAY_REFUSED),
                    "the child asked for client input and no client is attached to this call",
                    Some(serde_json::json!({"code": client::relay_code::NO_CALLER})),
                )));
            };
            if caller.takes_input_required() {
                return Ok((CallToolResponse::InputRequired(input), conn));
            }
            let responses = match &input.input_requests {
                Some(requests) => Some(
                    self.client
                        .fulfil(caller, requests)
                        .await
                        .map_err(CallError::Rpc)?,
                ),
                None => None,
            };
            params.input_responses = responses;
            params.request_state = input.request_state;
        }
        Err(CallError::Rpc(ErrorData::internal_error(
            format!("the child asked for client input more than {MAX_INPUT_ROUNDS} times"),
            Some(serde_json::json!({"code": "input-rounds-exceeded"})),
        )))
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

    /// Forwards a request that is not a tool call (prompts/get, resources/read, completion,
    /// subscriptions, setLevel) to the child, on the session's connection under `per-session`.
    pub async fn forward(
        &self,
        request: ClientRequest,
        ct: CancellationToken,
        session: Option<&SessionTag>,
    ) -> Result<ServerResult, CallError> {
        let server = self.spec.name.clone();
        let status = self.wait_settled(Duration::from_secs(5)).await;
        if status.state != ChildState::Up {
            return Err(CallError::Unavailable {
                server,
                state: status.state,
            });
        }
        if self.era() == Some(ChildEra::Modern) {
            match &request {
                ClientRequest::SubscribeRequest(r) => {
                    return self.listen_resource(r.params.uri.clone(), session).await;
                }
                ClientRequest::UnsubscribeRequest(r) => {
                    let listen = self
                        .resource_listens
                        .lock()
                        .ok()
                        .and_then(|mut m| m.remove(&r.params.uri));
                    if let Some(listen) = listen {
                        listen.stop.cancel();
                        // Bounded: a wedged connection does not hold the unsubscribe.
                        let _ = tokio::time::timeout(self.spec.limits.call_timeout, listen.closed)
                            .await;
                    }
                    return Ok(ServerResult::empty(()));
                }
                _ => {}
            }
        }
        let lease = match self.lease(session).await {
            Ok(l) => l,
            Err(CallError::TransportClosed { .. }) => {
                return Err(CallError::Unavailable {
                    server,
                    state: self.status().state,
                });
            }
            Err(e) => return Err(e),
        };
        self.exchange(
            &lease.conn,
            request,
            PeerRequestOptions::no_options(),
            &ct,
            None,
        )
        .await
    }

    /// Sends one request on `conn` and waits for its answer under the call timeout; a timeout or
    /// a cancelled `ct` is sent upstream as `notifications/cancelled`. With a `route`, the
    /// request's progress token and JSON-RPC id are bound to that call's observer as soon as
    /// rmcp assigns them: the one place a request becomes evidence of association (see
    /// [`client::Routes`]), for tool calls and task requests alike.
    async fn exchange(
        &self,
        conn: &Connection,
        request: ClientRequest,
        options: PeerRequestOptions,
        ct: &CancellationToken,
        route: Option<&client::RouteGuard>,
    ) -> Result<ServerResult, CallError> {
        let server = self.spec.name.clone();
        let handle = conn
            .peer
            .send_request_with_option(request, options)
            .await
            .map_err(|_| CallError::TransportClosed {
                server: server.clone(),
            })?;
        if let Some(route) = route {
            route.bind(handle.progress_token.clone());
            route.bind_request(handle.id.clone());
        }
        let id = handle.id.clone();
        let timeout = self.spec.limits.call_timeout;
        tokio::select! {
            r = tokio::time::timeout(timeout, handle.await_response()) => match r {
                Err(_) => { cancel_upstream(&conn.peer, id, "graph-os call timeout").await; Err(CallError::Timeout { server, timeout }) }
                Ok(Ok(r)) => Ok(r),
                Ok(Err(ServiceError::McpError(e))) => Err(CallError::Rpc(e)),
                Ok(Err(_)) => Err(CallError::TransportClosed { server }),
            },
            _ = ct.cancelled() => { cancel_upstream(&conn.peer, id, "cancelled by the client").await; Err(CallError::Cancelled) }
        }
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

/// A request holding a slot of the child's limiter (see [`ChildRuntime::admit`]).
struct Admitted<'a> {
    ticket: Ticket,
    /// The caller's principal, if known.
    principal: Option<Arc<str>>,
    /// Its slot of the principal's share (released with the child's slot).
    _share: Option<share::Share>,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _guard: InFlightGuard<'a>,
    /// The connection generation when it was admitted.
    generation: u64,
}

struct InFlightGuard<'a>(&'a AtomicU64);
impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn cancel_upstream(peer: &Peer<RoleClient>, id: rmcp::model::RequestId, reason: &str) {
    let _ = peer
        .notify_cancelled(rmcp::model::CancelledNotificationParam::new(
            Some(id),
            Some(reason.to_string()),
        ))
        .await;
}

fn probe_error(e: ProbeError) -> ErrorInfo {
    ErrorInfo::new(e.code(), e.to_string())
}

/// The secret values of a child's launch, resolved as its transport resolves them: every env
/// value or header that is a reference, the client secret and the run-token key. Values that do
/// not resolve are not secrets anyone holds.
fn secret_redactor(
    spec: &ChildSpec,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> crate::telemetry::redact::Redactor {
    let mut values: Vec<&crate::secrets::SecretValue> = match &spec.launch {
        Launch::Stdio(s) => s.env.values().collect(),
        Launch::Remote(r) => {
            let mut v: Vec<_> = r.headers.values().collect();
            if let Some(grant) = &r.client_credentials {
                v.push(&grant.client_secret);
            }
            v
        }
    };
    if let Some(run_token) = &spec.run_token {
        values.push(&run_token.key);
    }
    let mut redactor = crate::telemetry::redact::Redactor::default();
    for v in values.into_iter().filter(|v| v.is_reference()) {
        if let Ok(resolved) = v.resolve_material(lookup) {
            redactor.add(&resolved);
        }
    }
    redactor
}

/// Restart backoff: 0.5 s doubling to 30 s, with ×U(0.5, 1.5) jitter.
pub fn backoff(attempt: u32) -> Duration {
    let base = (0.5f64 * 2f64.powi(attempt.min(16) as i32)).min(30.0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = 0.5 + (nanos % 1000) as f64 / 1000.0;
    Duration::from_secs_f64(base * jitter)
}
