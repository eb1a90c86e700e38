//! One [`ChildRuntime`] per fleet member: connection, state, limits and call forwarding.
//!
//! Design note: supervision is detached. [`ChildRuntime::start`] returns at once; a supervisor
//! task connects through [`crate::probe`], lists the catalog and publishes every state change on
//! a `watch` channel. Nothing (startup, other children, sessions) waits on a child unless it
//! asks to, with its own bound. A child that fails at boot is `failed` at once (a boot failure
//! is not retried); a child that dies after coming up is restarted with exponential backoff
//! inside its restart budget.

mod client;

pub use client::{CallObserver, ChildClient, ObservedTransport};

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::Peer;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientRequest, ErrorData, ServerResult};
use rmcp::service::{PeerRequestOptions, RoleClient, ServiceError};
use serde::Serialize;
use tokio::sync::{Mutex, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::catalog::ChildCatalog;
use crate::config::{ChildSpec, Launch};
use crate::probe::{self, ProbeBounds, ProbeError};
use crate::transport::{self, TransportError};

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
    /// Last error, if any.
    pub last_error: Option<ErrorInfo>,
    /// Restarts so far.
    pub restarts: u32,
    /// Connection generation (increments on every successful connect).
    pub connection_generation: u64,
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
    /// The child answered with a JSON-RPC error (forwarded unchanged).
    #[error("child error {}: {}", .0.code.0, .0.message)]
    Rpc(ErrorData),
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
            CallError::Rpc(_) => "child-error",
        }
    }
}

struct Connection {
    peer: Peer<RoleClient>,
}

/// The runtime of one fleet member.
pub struct ChildRuntime {
    spec: ChildSpec,
    bounds: ProbeBounds,
    status: watch::Sender<ChildStatus>,
    conn: Mutex<Option<Arc<Connection>>>,
    limiter: Arc<Semaphore>,
    in_flight: AtomicU64,
    queued: AtomicU64,
    client: ChildClient,
    shutdown: CancellationToken,
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
    pub fn start(spec: ChildSpec, bounds: ProbeBounds) -> Arc<Self> {
        let (status, _) = watch::channel(ChildStatus {
            state: ChildState::Starting,
            catalog: None,
            fingerprint: None,
            last_error: None,
            restarts: 0,
            connection_generation: 0,
        });
        let rt = Arc::new(ChildRuntime {
            limiter: Arc::new(Semaphore::new(spec.limits.max_concurrency as usize)),
            client: ChildClient::new(&spec.name),
            spec,
            bounds,
            status,
            conn: Mutex::new(None),
            in_flight: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            shutdown: CancellationToken::new(),
        });
        let sup = rt.clone();
        tokio::spawn(async move { sup.supervise().await });
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
        self.conn.lock().await.take();
    }

    async fn connect_once(
        &self,
    ) -> Result<
        (
            Arc<Connection>,
            ChildCatalog,
            rmcp::service::RunningService<RoleClient, ChildClient>,
        ),
        ErrorInfo,
    > {
        let limits = &self.spec.limits;
        let running = match &self.spec.launch {
            Launch::Stdio(stdio) => {
                let transport = transport::stdio::spawn(&self.spec.name, stdio)
                    .map_err(|e| ErrorInfo::new(e.code(), e.to_string()))?;
                let transport = ObservedTransport::new(transport, &self.client);
                probe::connect(
                    self.client.clone(),
                    transport,
                    limits.initialization_timeout,
                )
                .await
            }
            Launch::Remote(_) => {
                let e = TransportError::Unsupported("remote");
                return Err(ErrorInfo::new(e.code(), e.to_string()));
            }
        }
        .map_err(|e| ErrorInfo::new(e.code(), e.to_string()))?;
        let peer = running.peer().clone();
        let catalog = match probe::list_catalog(&peer, self.bounds, limits.probe_timeout).await {
            Ok(c) => c,
            Err(e) => {
                let _ = running.cancel().await;
                return Err(probe_error(e));
            }
        };
        let conn = Arc::new(Connection { peer });
        Ok((conn, catalog, running))
    }

    async fn supervise(self: Arc<Self>) {
        let mut restarts: VecDeque<Instant> = VecDeque::new();
        let mut attempt = 0u32;
        let mut ever_up = false;
        loop {
            let result = tokio::select! {
                r = self.connect_once() => r,
                _ = self.shutdown.cancelled() => return,
            };
            match result {
                Ok((conn, catalog, running)) => {
                    attempt = 0;
                    ever_up = true;
                    let fingerprint = catalog.fingerprint();
                    *self.conn.lock().await = Some(conn);
                    self.status.send_modify(|s| {
                        s.state = ChildState::Up;
                        s.connection_generation += 1;
                        if s.fingerprint.as_deref() != Some(fingerprint.as_str()) {
                            s.catalog = Some(Arc::new(catalog));
                            s.fingerprint = Some(fingerprint);
                        }
                        s.last_error = None;
                    });
                    tracing::info!(server = %self.spec.name, state = "up", "child connected");
                    let stop = running.cancellation_token();
                    let reason = tokio::select! {
                        r = running.waiting() => format!("{r:?}"),
                        _ = self.shutdown.cancelled() => {
                            stop.cancel();
                            return;
                        }
                    };
                    *self.conn.lock().await = None;
                    tracing::warn!(server = %self.spec.name, reason = %reason, "child connection closed");
                    self.status.send_modify(|s| {
                        s.last_error = Some(ErrorInfo::new(
                            "child-exited",
                            "the child's connection closed",
                        ));
                    });
                }
                Err(err) => {
                    tracing::warn!(server = %self.spec.name, code = %err.code, error = %err.message, "child failed to start");
                    if !ever_up {
                        self.status.send_modify(|s| {
                            s.state = ChildState::Failed;
                            s.last_error = Some(err);
                        });
                        return;
                    }
                    self.status.send_modify(|s| s.last_error = Some(err));
                }
            }
            // Restart budget: at most max_restarts within restart_window.
            let now = Instant::now();
            let window = self.spec.limits.restart_window;
            while restarts
                .front()
                .is_some_and(|t| now.duration_since(*t) > window)
            {
                restarts.pop_front();
            }
            if restarts.len() as u32 >= self.spec.limits.max_restarts {
                tracing::warn!(server = %self.spec.name, state = "failed", reason = "restart-budget-exhausted", "child failed");
                self.status.send_modify(|s| {
                    s.state = ChildState::Failed;
                    let prior = s.last_error.take().map(|e| e.message).unwrap_or_default();
                    s.last_error = Some(ErrorInfo::new("restart-budget-exhausted", prior));
                });
                return;
            }
            restarts.push_back(now);
            self.status.send_modify(|s| {
                s.state = ChildState::Restarting;
                s.restarts += 1;
            });
            let backoff = backoff(attempt);
            attempt += 1;
            tracing::info!(server = %self.spec.name, state = "restarting", backoff_ms = backoff.as_millis() as u64, "child restarting");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Forwards one `tools/call` to the child under its limits. `observer` receives the call's
    /// progress and log notifications; `ct` cancels the call (cancellation is sent upstream).
    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
        observer: Option<Arc<dyn CallObserver>>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, CallError> {
        let server = self.spec.name.clone();
        let limits = &self.spec.limits;
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
        self.queued.fetch_add(1, Ordering::Relaxed);
        let permit = tokio::select! {
            p = tokio::time::timeout(limits.queue_timeout, self.limiter.clone().acquire_owned()) => p,
            _ = ct.cancelled() => { self.queued.fetch_sub(1, Ordering::Relaxed); return Err(CallError::Cancelled) }
        };
        self.queued.fetch_sub(1, Ordering::Relaxed);
        let Ok(Ok(_permit)) = permit else {
            return Err(CallError::Busy {
                server,
                waited: limits.queue_timeout,
            });
        };
        let Some(conn) = self.conn.lock().await.clone() else {
            return Err(CallError::Unavailable {
                server,
                state: self.status().state,
            });
        };
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let _guard = InFlightGuard(&self.in_flight);
        let route = observer.map(|o| self.client.routes().begin(o));
        let request = ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params));
        let handle = conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .map_err(|_| CallError::TransportClosed {
                server: server.clone(),
            })?;
        if let Some(route) = &route {
            route.bind(handle.progress_token.clone());
        }
        let id = handle.id.clone();
        let peer = conn.peer.clone();
        let outcome = tokio::select! {
            r = tokio::time::timeout(limits.call_timeout, handle.await_response()) => r,
            _ = ct.cancelled() => {
                cancel_upstream(&peer, id, "cancelled by the client").await;
                return Err(CallError::Cancelled);
            }
        };
        match outcome {
            Err(_) => {
                cancel_upstream(&peer, id, "graph-os call timeout").await;
                Err(CallError::Timeout {
                    server,
                    timeout: limits.call_timeout,
                })
            }
            Ok(Ok(ServerResult::CallToolResult(r))) => Ok(r),
            Ok(Ok(_)) => Err(CallError::Rpc(ErrorData::internal_error(
                "child answered tools/call with an unexpected result type",
                None,
            ))),
            Ok(Err(ServiceError::McpError(e))) => Err(CallError::Rpc(e)),
            Ok(Err(_)) => Err(CallError::TransportClosed { server }),
        }
    }

    /// Forwards a request that is not a tool call (prompts/get, resources/read) to the child.
    pub async fn forward(
        &self,
        request: ClientRequest,
        ct: CancellationToken,
    ) -> Result<ServerResult, CallError> {
        let server = self.spec.name.clone();
        let status = self.wait_settled(Duration::from_secs(5)).await;
        if status.state != ChildState::Up {
            return Err(CallError::Unavailable {
                server,
                state: status.state,
            });
        }
        let Some(conn) = self.conn.lock().await.clone() else {
            return Err(CallError::Unavailable {
                server,
                state: self.status().state,
            });
        };
        let handle = conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .map_err(|_| CallError::TransportClosed {
                server: server.clone(),
            })?;
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
