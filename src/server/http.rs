//! The HTTP face: `/mcp` (MCP streamable HTTP), `/healthz`, `/readyz`, `/metrics`, and with
//! OAuth the RFC 9728 protected-resource metadata.
//!
//! Every `/mcp` request is authenticated here, once, before rmcp sees it (see
//! [`crate::auth::Credentials`]): no or a bad credential is 401 with `WWW-Authenticate`, a token
//! without any graph-os scope 403 `insufficient_scope`; the established [`Identity`] travels in
//! the request's extensions to the handler. Request bodies are bounded; a new session is admitted
//! by the [`SessionLedger`] (503 or 429 with `Retry-After` when full) and bound to its principal.
//! Host and Origin are validated (DNS-rebinding protection). Shutdown is graceful:
//! SIGTERM/SIGINT stops accepting, lets in-flight calls finish (up to a deadline), then closes
//! sessions and children. Accepted sockets set `TCP_NODELAY`: SSE responses are written in
//! small frames, and Nagle's algorithm meeting the client's delayed ACK cost ~40 ms per call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http_body_util::BodyExt;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::GatewayHandler;
use super::sessions::{BoundedSessionManager, Full, SessionLedger, SessionLimits};
use crate::auth::{Credentials, Identity};
use crate::mux::Multiplexer;
use crate::mux::{BreakerState, ChildState};

/// Default bound on one `/mcp` request body (tool arguments carry file contents: 4 MiB of
/// arguments by default, plus the envelope).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 8 << 20;

/// Options of the HTTP listener.
#[derive(Clone)]
pub struct HttpOptions {
    /// Listen address.
    pub addr: SocketAddr,
    /// Extra `Host` values accepted on `/mcp` (loopback names are always accepted).
    pub allowed_hosts: Vec<String>,
    /// Extra `Origin` values accepted on `/mcp` (`scheme://host[:port|:*]`).
    pub allowed_origins: Vec<String>,
    /// How long in-flight calls may run after a shutdown signal.
    pub drain_timeout: Duration,
    /// Serve `/mcp` (false = admin endpoints only, beside a stdio front).
    pub serve_mcp: bool,
    /// Credential sources for `/mcp` and the REST API.
    pub credentials: Arc<Credentials>,
    /// Bounds on 2025-era sessions.
    pub sessions: SessionLimits,
    /// 2026-era principals kept (LRU).
    pub max_principals: usize,
    /// Largest `/mcp` request body.
    pub max_request_bytes: usize,
}

impl HttpOptions {
    /// Options for `addr` with every default (no credential source).
    pub fn new(addr: SocketAddr) -> Self {
        HttpOptions {
            addr,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            drain_timeout: Duration::from_secs(30),
            serve_mcp: true,
            credentials: Arc::default(),
            sessions: SessionLimits::default(),
            max_principals: super::streams::DEFAULT_MAX_PRINCIPALS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }
}

/// `/healthz`, `/readyz` and `/metrics` over the served multiplexer.
pub fn admin_router(mux: Arc<Multiplexer>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(mux)
}

/// Readiness is the ability to serve: the process is up, the front is listening (this answers)
/// and a catalog generation is served (published or adopted). Children still starting, a
/// rejected reload and a generation this replica cannot reproduce are reported in the body (and
/// in status and metrics), never as unreadiness: a config typo must not take every replica out
/// of its Service.
pub fn readiness(mux: &Multiplexer) -> (bool, serde_json::Value) {
    let starting: Vec<String> = mux
        .children_overview()
        .into_iter()
        .filter(|c| c.state == ChildState::Starting)
        .map(|c| c.name)
        .collect();
    let generation = mux.reconciler().served().generation;
    let ready = generation >= 1;
    (
        ready,
        serde_json::json!({
            "ready": ready,
            "catalog_generation": generation,
            "starting": starting,
            "reload_error": mux.reload_error(),
            "generation_error": mux.follow_error(),
        }),
    )
}

async fn readyz(State(mux): State<Arc<Multiplexer>>) -> Response {
    let (ready, body) = readiness(&mux);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(mux): State<Arc<Multiplexer>>) -> Response {
    let m = crate::telemetry::metrics();
    for c in mux.children_overview() {
        let breaker = match c.breaker {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        };
        m.child_gauges(
            &c.name,
            c.in_flight,
            c.queued,
            breaker,
            c.tools,
            c.state == ChildState::Up,
        );
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        m.encode(),
    )
        .into_response()
}

fn loopback_hosts(port: u16) -> Vec<String> {
    ["localhost", "127.0.0.1", "::1", "[::1]"]
        .iter()
        .flat_map(|h| [h.to_string(), format!("{h}:{port}")])
        .collect()
}

/// The `/mcp` router: one [`GatewayHandler`] (session) per MCP session, behind the
/// authentication and admission layer.
pub fn mcp_router(mux: Arc<Multiplexer>, opts: &HttpOptions, ct: CancellationToken) -> Router {
    let mut allowed_hosts = loopback_hosts(opts.addr.port());
    allowed_hosts.extend(opts.allowed_hosts.iter().cloned());
    let mut allowed_origins: Vec<String> =
        ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    allowed_origins.extend(opts.allowed_origins.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts)
        .with_allowed_origins(allowed_origins)
        .with_cancellation_token(ct);
    let ledger = SessionLedger::new(opts.sessions);
    let service = StreamableHttpService::new(
        {
            let principals = Arc::new(super::Principals::with_cap(opts.max_principals));
            move || {
                Ok(GatewayHandler::with_principals(
                    mux.clone(),
                    principals.clone(),
                ))
            }
        },
        Arc::new(BoundedSessionManager::new(ledger.clone())),
        config,
    );
    let gate = Gate {
        credentials: opts.credentials.clone(),
        ledger,
        max_body: opts.max_request_bytes,
    };
    let mut router = Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(gate, admit));
    if let Some(oauth) = &opts.credentials.oauth {
        let doc = oauth.protected_resource_metadata();
        let path = oauth.resource_metadata_path();
        let serve = move || {
            let doc = doc.clone();
            async move { axum::Json(doc) }
        };
        router = router.route("/.well-known/oauth-protected-resource", get(serve.clone()));
        if path != "/.well-known/oauth-protected-resource" {
            router = router.route(&path, get(serve));
        }
    }
    router
}

/// Authentication and admission state of `/mcp`.
#[derive(Clone)]
struct Gate {
    credentials: Arc<Credentials>,
    ledger: Arc<SessionLedger>,
    max_body: usize,
}

fn refusal(status: StatusCode, code: &str, extra: &[(header::HeaderName, String)]) -> Response {
    let mut r = (status, axum::Json(serde_json::json!({"code": code}))).into_response();
    for (k, v) in extra {
        if let Ok(v) = HeaderValue::from_str(v) {
            r.headers_mut().insert(k.clone(), v);
        }
    }
    r
}

/// The anonymous key of a request when no credential source is configured: its
/// `Mcp-Principal` header (≤ 128 characters, local development), else the client address.
fn dev_subject(req: &axum::extract::Request) -> String {
    if let Some(handle) = req
        .headers()
        .get("mcp-principal")
        .and_then(|v| v.to_str().ok())
        .filter(|h| !h.is_empty() && h.len() <= 128)
    {
        return format!("handle:{handle}");
    }
    match req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        // Clients commonly open a connection per request, so the address (not the port) is
        // the most stable anonymous identity.
        Some(axum::extract::ConnectInfo(addr)) => format!("addr:{}", addr.ip()),
        None => "anonymous".into(),
    }
}

/// Just enough of a JSON-RPC message to route admission.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    method: Option<&'a str>,
}

async fn admit(
    State(gate): State<Gate>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let subject = dev_subject(&req);
    let identity: Identity = match gate
        .credentials
        .authenticate(authorization.as_deref(), || subject)
        .await
    {
        Ok(id) => id,
        Err(f) => {
            crate::telemetry::metrics().auth_refused(f.code);
            let status = StatusCode::from_u16(f.status).unwrap_or(StatusCode::UNAUTHORIZED);
            return refusal(status, f.code, &[(header::WWW_AUTHENTICATE, f.challenge)]);
        }
    };
    // A session belongs to the principal that opened it; to anyone else it does not exist.
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(id) = &session
        && gate
            .ledger
            .owner(id)
            .is_some_and(|owner| owner != identity.subject)
    {
        crate::telemetry::metrics().auth_refused("session-principal-mismatch");
        return refusal(StatusCode::NOT_FOUND, "session-not-found", &[]);
    }
    let (mut parts, body) = req.into_parts();
    let mut reservation = None;
    let body = if parts.method == axum::http::Method::POST {
        let bytes = match http_body_util::Limited::new(body, gate.max_body)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return refusal(StatusCode::PAYLOAD_TOO_LARGE, "request-too-large", &[]);
            }
        };
        let initialize = session.is_none()
            && serde_json::from_slice::<Envelope>(&bytes)
                .is_ok_and(|e| e.method == Some("initialize"));
        if initialize {
            match gate.ledger.reserve(&identity.subject) {
                Ok(r) => reservation = Some(r),
                Err(full) => {
                    let (status, code) = match full {
                        Full::Global => (StatusCode::SERVICE_UNAVAILABLE, "sessions-exhausted"),
                        Full::Principal => (
                            StatusCode::TOO_MANY_REQUESTS,
                            "principal-sessions-exhausted",
                        ),
                    };
                    crate::telemetry::metrics().session_refused(code);
                    return refusal(status, code, &[(header::RETRY_AFTER, "5".into())]);
                }
            }
        }
        axum::body::Body::from(bytes)
    } else {
        body
    };
    parts.extensions.insert(identity);
    let response = next
        .run(axum::extract::Request::from_parts(parts, body))
        .await;
    if let Some(r) = reservation {
        r.commit(
            response
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok()),
        );
    }
    response
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

fn in_flight(mux: &Multiplexer) -> u64 {
    mux.children_overview()
        .iter()
        .map(|c| c.in_flight + c.queued)
        .sum()
}

/// Serves HTTP until SIGTERM/SIGINT, then drains and stops. `extra` runs beside it (the stdio
/// front when only admin endpoints are served); its end also stops the server.
pub async fn serve(mux: Arc<Multiplexer>, opts: HttpOptions) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(opts.addr).await?;
    tracing::info!(addr = %listener.local_addr()?, mcp = opts.serve_mcp, "HTTP listening");
    let sessions_ct = CancellationToken::new();
    let mut app =
        admin_router(mux.clone()).merge(super::rest::router(mux.clone(), opts.credentials.clone()));
    if opts.serve_mcp {
        app = app.merge(mcp_router(mux.clone(), &opts, sessions_ct.clone()));
    }
    // Draining: existing sessions keep working (clients often open a connection per request),
    // new sessions are refused with 503 until the listener closes.
    let draining = CancellationToken::new();
    let app = app.layer(axum::middleware::from_fn({
        let draining = draining.clone();
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let draining = draining.clone();
            async move {
                if draining.is_cancelled()
                    && req.uri().path() == "/mcp"
                    && !req.headers().contains_key("mcp-session-id")
                {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "graph-os is shutting down\n",
                    )
                        .into_response();
                }
                next.run(req).await
            }
        }
    }));
    let stop_accepting = CancellationToken::new();
    let server = {
        let stop = stop_accepting.clone();
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        });
        tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
        })
    };
    shutdown_signal().await;
    tracing::info!("shutdown requested: draining in-flight calls");
    draining.cancel();
    let deadline = tokio::time::Instant::now() + opts.drain_timeout;
    while in_flight(&mux) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the last responses flush before the session streams close.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop_accepting.cancel();
    sessions_ct.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    mux.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}
