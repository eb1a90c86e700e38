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
//! sessions and children. Connections are served by [`super::listener`] (`TCP_NODELAY`, a
//! header-read timeout).

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
use super::streams::HttpFront;
use crate::auth::{Credentials, Identity};
use crate::mux::Multiplexer;
use crate::mux::session_store::{
    Fetched, MemoryStore, SessionKey, SessionRecord, SessionStore, StoreTtl, now_ms,
};
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
    /// Where sessions and principals live (`None`: this process, a [`MemoryStore`]).
    pub session_store: Option<Arc<dyn SessionStore>>,
    /// Connection caps and header/body deadlines of the listener (every route).
    pub listener: super::listener::Limits,
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
            session_store: None,
            listener: super::listener::Limits::default(),
        }
    }

    /// How long stored sessions and principals live without requests.
    pub fn store_ttl(&self) -> StoreTtl {
        StoreTtl {
            session: self.sessions.idle,
            principal: super::streams::PRINCIPAL_IDLE,
        }
    }
}

/// Why the listener cannot open, with the address and the flag that chooses it.
fn listen_error(addr: SocketAddr, serve_mcp: bool, e: &std::io::Error) -> anyhow::Error {
    let flag = if serve_mcp {
        "--host/--port"
    } else {
        "--admin-addr"
    };
    let next = match e.kind() {
        std::io::ErrorKind::AddrInUse => "another process listens there: stop it or choose another",
        std::io::ErrorKind::PermissionDenied => {
            "this user may not listen there: choose a port above 1023 or another"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "no interface of this host has that address: choose another"
        }
        _ => "choose another",
    };
    anyhow::anyhow!("cannot listen on {addr}: {e}; {next} ({flag})")
}

/// A request body from this size on is followed by a trim of the allocator's free memory.
const LARGE_BODY: usize = 256 << 10;

/// Asks for the allocator's free memory to be handed back when dropped (see `memory`).
struct TrimOnDrop;

impl Drop for TrimOnDrop {
    fn drop(&mut self) {
        crate::memory::large_buffer_freed();
    }
}

/// Largest `initialize` parameters kept in the session store.
const MAX_STORED_INIT_BYTES: usize = 64 << 10;

/// `/healthz`, `/readyz` and `/metrics` over the served multiplexer (and its session store).
/// `/metrics` and `/readyz`'s details are for viewers of the status page (`Asker::viewer`:
/// the Host check and the discover scope); `/healthz` and `/readyz`'s verdict are for anyone
/// (probes).
pub fn admin_router(
    mux: Arc<Multiplexer>,
    store: Option<Arc<dyn SessionStore>>,
    credentials: Arc<Credentials>,
    hosts: Vec<String>,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(Admin {
            mux,
            store,
            credentials,
            hosts: Arc::new(hosts),
        })
}

#[derive(Clone)]
struct Admin {
    mux: Arc<Multiplexer>,
    store: Option<Arc<dyn SessionStore>>,
    credentials: Arc<Credentials>,
    /// Host names operator pages answer to (loopback names and `--allowed-host`).
    hosts: Arc<Vec<String>>,
}

/// Readiness is the ability to serve: the process is up, the front is listening (this answers)
/// and a catalog generation is served (published or adopted). Children still starting, a
/// rejected reload, a generation this replica cannot reproduce and an unreachable session store
/// are reported in the body (and in status and metrics), never as unreadiness: a config typo or
/// a store outage must not take every replica out of its Service (requests that need the store
/// get a 503 `session-store-unavailable` instead, and the store recovers by itself).
pub fn readiness(mux: &Multiplexer, store: Option<&dyn SessionStore>) -> (bool, serde_json::Value) {
    let starting: Vec<String> = mux
        .children_overview()
        .into_iter()
        .filter(|c| c.state == ChildState::Starting)
        .map(|c| c.name)
        .collect();
    let generation = mux.reconciler().served().generation;
    let ready = generation >= 1;
    let session_store = store.map(|s| {
        let health = s.health();
        serde_json::json!({
            "kind": s.kind(),
            "reachable": health.is_ok(),
            "error": health.err(),
        })
    });
    (
        ready,
        serde_json::json!({
            "ready": ready,
            "catalog_generation": generation,
            "starting": starting,
            "reload_error": mux.reload_error(),
            "generation_error": mux.follow_error(),
            "session_store": session_store,
        }),
    )
}

/// Readiness: the verdict for anyone (a probe needs nothing more); the details (starting
/// children, reload and generation errors, the store) only for a viewer of the status page.
async fn readyz(State(admin): State<Admin>, asker: super::rest::Asker) -> Response {
    let (ready, body) = readiness(&admin.mux, admin.store.as_deref());
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = match asker.viewer(&admin.hosts, &admin.credentials).await {
        Ok(_) => body,
        Err(_) => serde_json::json!({"ready": ready}),
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(admin): State<Admin>, asker: super::rest::Asker) -> Response {
    if let Err((status, code)) = asker.viewer(&admin.hosts, &admin.credentials).await {
        crate::telemetry::metrics().auth_refused(code);
        return refusal(status, code, &[]);
    }
    let mux = &admin.mux;
    let m = crate::telemetry::metrics();
    if let Some(store) = &admin.store {
        m.session_store_up(store.kind(), store.health().is_ok());
    }
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

/// The session store behind rmcp's cross-replica restore: rmcp asks it for a session it does
/// not hold and replays the recorded `initialize` (the record itself is written by [`admit`],
/// which knows the principal).
struct Restore(Arc<dyn SessionStore>);

#[async_trait::async_trait]
impl rmcp::transport::streamable_http_server::session::store::SessionStore for Restore {
    async fn load(
        &self,
        session_id: &str,
    ) -> Result<
        Option<rmcp::transport::streamable_http_server::session::store::SessionState>,
        rmcp::transport::streamable_http_server::session::store::SessionStoreError,
    > {
        let Some(key) = SessionKey::session(session_id) else {
            return Ok(None);
        };
        let record = self.0.read(&key).await?;
        Ok(record.and_then(|r| r.client).and_then(|c| {
            serde_json::from_value::<rmcp::model::InitializeRequestParams>(c)
                .ok()
                .map(rmcp::transport::streamable_http_server::session::store::SessionState::new)
        }))
    }

    async fn store(
        &self,
        _session_id: &str,
        _state: &rmcp::transport::streamable_http_server::session::store::SessionState,
    ) -> Result<(), rmcp::transport::streamable_http_server::session::store::SessionStoreError>
    {
        Ok(())
    }

    async fn delete(
        &self,
        session_id: &str,
    ) -> Result<(), rmcp::transport::streamable_http_server::session::store::SessionStoreError>
    {
        match SessionKey::session(session_id) {
            Some(key) => Ok(self.0.remove(&key).await?),
            None => Ok(()),
        }
    }
}

/// The store `opts` names, else a new in-process one.
pub fn session_store(opts: &HttpOptions) -> Arc<dyn SessionStore> {
    opts.session_store
        .clone()
        .unwrap_or_else(|| MemoryStore::new(opts.store_ttl(), opts.max_principals))
}

/// The `/mcp` router: one [`GatewayHandler`] (session) per MCP session, behind the
/// authentication and admission layer; sessions and principals live in `store`.
///
/// The [`FrontDoor`](super::listener::FrontDoor) beside it serves the same `/mcp` requests past
/// the router (same admission, same service): a listener without outer layers hands it `/mcp`.
pub fn mcp_router(
    mux: Arc<Multiplexer>,
    opts: &HttpOptions,
    store: Arc<dyn SessionStore>,
    ct: CancellationToken,
    draining: CancellationToken,
) -> (Router, Arc<McpDoor>) {
    let mut allowed_hosts = loopback_hosts(opts.addr.port());
    allowed_hosts.extend(opts.allowed_hosts.iter().cloned());
    let mut allowed_origins: Vec<String> =
        ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    allowed_origins.extend(opts.allowed_origins.iter().cloned());
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts)
        .with_allowed_origins(allowed_origins)
        .with_cancellation_token(ct);
    config.session_store = Some(Arc::new(Restore(store.clone())));
    let ledger = SessionLedger::new(opts.sessions);
    let mux_replica = mux.settings().replica_id.clone();
    let manager = Arc::new(BoundedSessionManager::new(ledger.clone(), store.clone()));
    let front = HttpFront::new(store.clone(), opts.max_principals);
    let hot = Arc::new(HotPath {
        mux: mux.clone(),
        front: front.clone(),
        allowed_hosts: super::fast::http::AllowedHosts::new(&config.allowed_hosts),
        idle: opts.sessions.idle,
    });
    let service = SharedMcp(Arc::new(StreamableHttpService::new(
        move || Ok(GatewayHandler::for_http(mux.clone(), front.clone())),
        manager.clone(),
        config,
    )));
    let gate = Gate {
        hot,
        credentials: opts.credentials.clone(),
        ledger,
        max_body: opts.max_request_bytes,
        store,
        manager,
        replica: HeaderValue::from_str(&mux_replica).ok(),
        draining,
    };
    let door = Arc::new(McpDoor {
        gate: gate.clone(),
        service: service.clone(),
    });
    let mut router =
        Router::new()
            .route_service(MCP_PATH, service)
            .layer(axum::middleware::from_fn_with_state(
                gate,
                |State(gate): State<Gate>, req, next| admit(gate, req, Inner::Next(next)),
            ));
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
    (router, door)
}

/// Where MCP is served.
const MCP_PATH: &str = "/mcp";

/// `/mcp` past the router: the same admission in front of the same rmcp service.
pub struct McpDoor {
    gate: Gate,
    service: SharedMcp,
}

impl super::listener::FrontDoor for McpDoor {
    fn takes(&self, req: &axum::extract::Request) -> bool {
        req.uri().path() == MCP_PATH
    }

    fn serve(&self, req: axum::extract::Request) -> futures::future::BoxFuture<'static, Response> {
        Box::pin(admit(
            self.gate.clone(),
            req,
            Inner::Mcp(self.service.clone()),
        ))
    }
}

/// What serves an admitted `/mcp` request: the router's next layer, or (from the front door)
/// rmcp's service itself.
enum Inner {
    Next(axum::middleware::Next),
    Mcp(SharedMcp),
}

impl Inner {
    async fn run(self, req: axum::extract::Request) -> Response {
        match self {
            Inner::Next(next) => next.run(req).await,
            Inner::Mcp(service) => service.0.handle(req).await.map(axum::body::Body::new),
        }
    }
}

/// rmcp's streamable-HTTP service behind one `Arc`. axum clones a route's service for every
/// request, and every `from_fn` layer clones its inner service again; the service's own clone
/// copies its whole config (the Host and Origin lists), which cost ~10 % of the HTTP front's CPU
/// per forwarded call (four deep copies). rmcp's `handle` takes `&self`, so sharing is exact.
#[derive(Clone)]
struct SharedMcp(Arc<StreamableHttpService<GatewayHandler, BoundedSessionManager>>);

impl tower::Service<axum::extract::Request> for SharedMcp {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::extract::Request) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { Ok(service.handle(req).await.map(axum::body::Body::new)) })
    }
}

/// What the forwarding hot path needs (see `fast::http`).
struct HotPath {
    mux: Arc<Multiplexer>,
    front: Arc<HttpFront>,
    allowed_hosts: super::fast::http::AllowedHosts,
    idle: Duration,
}

/// Authentication and admission state of `/mcp`.
#[derive(Clone)]
struct Gate {
    hot: Arc<HotPath>,
    credentials: Arc<Credentials>,
    ledger: Arc<SessionLedger>,
    max_body: usize,
    store: Arc<dyn SessionStore>,
    manager: Arc<BoundedSessionManager>,
    /// This replica's id, sent as `Graph-Os-Replica` on every `/mcp` response (operators and
    /// tests see which replica served a request behind a load balancer).
    replica: Option<HeaderValue>,
    /// Cancelled at shutdown: existing sessions keep working (clients often open a connection
    /// per request), new sessions are refused with 503 until the listener closes.
    draining: CancellationToken,
}

/// 503 `session-store-unavailable`: the request needs the shared store and it does not answer.
fn store_unavailable(e: &crate::mux::session_store::SessionStoreError) -> Response {
    tracing::debug!(error = %e, "request refused: session store unavailable");
    crate::telemetry::metrics().session_refused("session_store_unavailable");
    refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        e.code(),
        &[(header::RETRY_AFTER, "1".into())],
    )
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
/// Read from the request up front (cheap copies); the key is formatted only when it is used.
struct DevSubject {
    handle: Option<HeaderValue>,
    addr: Option<SocketAddr>,
}

impl DevSubject {
    fn of(req: &axum::extract::Request) -> Self {
        Self {
            handle: req.headers().get("mcp-principal").cloned(),
            addr: req
                .extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
        }
    }

    fn key(self) -> String {
        if let Some(handle) = self
            .handle
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .filter(|h| !h.is_empty() && h.len() <= 128)
        {
            return format!("handle:{handle}");
        }
        match self.addr {
            // Clients commonly open a connection per request, so the address (not the port) is
            // the most stable anonymous identity.
            Some(addr) => format!("addr:{}", addr.ip()),
            None => "anonymous".into(),
        }
    }
}

async fn admit(gate: Gate, req: axum::extract::Request, next: Inner) -> Response {
    if gate.draining.is_cancelled() && !req.headers().contains_key("mcp-session-id") {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "graph-os is shutting down\n",
        )
            .into_response();
    }
    let replica = gate.replica.clone();
    let post = req.method() == axum::http::Method::POST;
    let delete = req.method() == axum::http::Method::DELETE;
    let mut response = admitted(gate, req, next).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        // A session ended by DELETE is done, not queued: 204, which clients expect (the Python
        // SDK, hence FastMCP and pydantic-ai, warn "Session termination failed: 202" otherwise).
        *response.status_mut() = StatusCode::NO_CONTENT;
        response.headers_mut().remove(header::CONTENT_LENGTH);
        *response.body_mut() = axum::body::Body::empty();
    }
    let unmarked = response
        .extensions()
        .get::<super::fast::http::Unmarked>()
        .is_some();
    if post && !unmarked {
        // Task marks back into the 2025 fields (see `wire::task_marks`); the length may
        // change, so the body is sent chunked.
        response.headers_mut().remove(header::CONTENT_LENGTH);
        response = response.map(|body| {
            use futures::StreamExt;
            axum::body::Body::from_stream(
                body.into_data_stream().map(|chunk| chunk.map(unmark_chunk)),
            )
        });
    }
    if let Some(r) = replica {
        response.headers_mut().insert("graph-os-replica", r);
    }
    response
}

async fn admitted(gate: Gate, req: axum::extract::Request, next: Inner) -> Response {
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let dev = DevSubject::of(&req);
    let peer_ip = dev.addr.map(|a| a.ip());
    let connection = req
        .extensions()
        .get::<super::listener::ConnectionId>()
        .copied();
    let mut identity: Identity = match gate
        .credentials
        .authenticate(authorization.as_deref(), move || dev.key())
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
    // Anonymous callers are never one principal (see `anonymous_subject`); their sessions count
    // against their address.
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .map(|v| crate::digest::sha256_hex(v.as_bytes()));
    let local_dev = !gate.credentials.configured();
    let anonymous = anonymous_subject(
        &identity,
        session.as_deref(),
        if local_dev {
            Sessionless::Program(user_agent)
        } else {
            Sessionless::Connection(connection)
        },
        peer_ip,
    );
    let cap_key = match anonymous {
        Some((subject, cap)) => {
            identity.subject = subject;
            cap
        }
        None => identity.subject.clone(),
    };
    // Not a session id: it names no session, and never reaches the store (see `SessionKey`).
    let session_key = match session.as_deref().map(SessionKey::session) {
        Some(None) => {
            crate::telemetry::metrics().auth_refused("session-id-invalid");
            return refusal(StatusCode::NOT_FOUND, "session-not-found", &[]);
        }
        Some(Some(key)) => Some(key),
        None => None,
    };
    if let Some(id) = &session
        && gate
            .ledger
            .owner(id)
            .is_some_and(|owner| owner != identity.subject)
    {
        crate::telemetry::metrics().auth_refused("session-principal-mismatch");
        return refusal(StatusCode::NOT_FOUND, "session-not-found", &[]);
    }
    let note = req
        .extensions()
        .get::<crate::telemetry::access::RequestNote>()
        .cloned();
    if let Some(note) = &note {
        note.principal(&identity.subject);
    }
    let (mut parts, body) = req.into_parts();
    let mut hot_body = None;
    let mut reservation = None;
    let mut init_params: Option<serde_json::Value> = None;
    let mut method: Option<String> = None;
    let body = if parts.method == axum::http::Method::POST {
        let bytes = match http_body_util::Limited::new(body, gate.max_body)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                crate::memory::large_buffer_freed();
                return refusal(StatusCode::PAYLOAD_TOO_LARGE, "request-too-large", &[]);
            }
        };
        // Handed back to the system once this request (and rmcp's copy) is done with it.
        let _trim = (bytes.len() > LARGE_BODY).then_some(TrimOnDrop);
        // The access log and traces want the method and tool (only when one of them is on).
        let observed = note.is_some().then(|| observed_call(&bytes));
        if let (Some(note), Some((m, tool))) = (&note, &observed) {
            note.mcp(m.as_deref(), tool.as_deref());
            let span = tracing::Span::current();
            if let Some(m) = m {
                span.record("mcp.method.name", m.as_str());
            }
            if let Some(t) = tool {
                span.record("gen_ai.tool.name", t.as_str());
            }
        }
        // Traces: a tools/call carries this request's span context to the multiplexer in its
        // `_meta` (SEP-414), the way a stdio client's does.
        let bytes = match observed.as_ref().and_then(|(m, _)| m.as_deref()) {
            Some("tools/call") if crate::telemetry::trace::enabled() => with_trace_meta(&bytes)
                .map(axum::body::Bytes::from)
                .unwrap_or(bytes),
            _ => bytes,
        };
        // 2025-11-25 task requests are renamed beneath rmcp (see `wire::task_marks`).
        let bytes = match mark_body(&bytes) {
            Some(marked) => axum::body::Bytes::from(marked),
            None => bytes,
        };
        // Only a request without a session needs its method (initialize, or a 2026-era request
        // keyed by principal), decoded by rmcp's own decoder over the very bytes rmcp gets
        // (`envelope`): a session's calls are not parsed twice on the forwarding path.
        if session.is_none() {
            let intent = super::envelope::intent(&bytes);
            method = intent.method().map(str::to_string);
            if let super::envelope::Intent::Initialize { params } = intent {
                // Kept in the store so another replica can replay this session's handshake.
                if params.to_string().len() > MAX_STORED_INIT_BYTES {
                    return refusal(StatusCode::PAYLOAD_TOO_LARGE, "initialize-too-large", &[]);
                }
                init_params = Some(params);
                match gate.ledger.reserve(&cap_key) {
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
        }
        if session.is_some() {
            hot_body = Some(bytes.clone());
        }
        axum::body::Body::from(bytes)
    } else {
        body
    };
    // The session's (or 2026 principal's) state, from the store: any replica serves any
    // session, and a store that does not answer refuses the request rather than splitting it.
    let mut adopted = None;
    if let Some(key) = &session_key {
        match gate.store.fetch(key).await {
            Err(e) => return store_unavailable(&e),
            Ok(None) => return refusal(StatusCode::NOT_FOUND, "session-not-found", &[]),
            Ok(Some(f)) if f.record.principal != identity.subject => {
                crate::telemetry::metrics().auth_refused("session-principal-mismatch");
                return refusal(StatusCode::NOT_FOUND, "session-not-found", &[]);
            }
            Ok(Some(f)) => {
                adopted = Some(f.record.principal.clone());
                parts.extensions.insert(f);
            }
        }
    } else if method
        .as_deref()
        .is_some_and(|m| m != "initialize" && m != "server/discover")
    {
        match principal_state(gate.store.as_ref(), &identity.subject).await {
            Err(e) => return store_unavailable(&e),
            Ok(f) => {
                parts.extensions.insert(f);
            }
        }
    }
    let mut subject = identity.subject.clone();
    let anonymous_caller = subject.starts_with(ANONYMOUS_PREFIX);
    // The forwarding hot path: a session's tools/call served beside rmcp (`fast::http`).
    let hot = match (&session, &hot_body, parts.extensions.get::<Fetched>()) {
        (Some(id), Some(bytes), Some(fetched))
            if super::fast::http::headers_pass(&parts.headers, &gate.hot.allowed_hosts) =>
        {
            let hot = super::fast::http::Hot {
                mux: &gate.hot.mux,
                front: &gate.hot.front,
                manager: &gate.manager,
                idle: gate.hot.idle,
            };
            super::fast::http::serve(hot, id, identity.clone(), fetched, bytes).await
        }
        _ => None,
    };
    let response = match hot {
        Some(response) => response,
        None => {
            parts.extensions.insert(identity);
            let permits = u8::from(reservation.is_some());
            super::sessions::with_admission(
                permits,
                next.run(axum::extract::Request::from_parts(parts, body)),
            )
            .await
        }
    };
    if let Some(r) = reservation {
        let id = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // An anonymous caller's session is its own principal, known once rmcp named it.
        if anonymous_caller && let Some(id) = &id {
            subject = anonymous_session_subject(id);
        }
        r.commit_to(id.as_deref(), &subject);
        if let Some(id) = id {
            let now = now_ms();
            let record = SessionRecord {
                principal: subject,
                protocol_version: init_params
                    .as_ref()
                    .and_then(|p| p.get("protocolVersion"))
                    .and_then(|v| v.as_str())
                    .map(str::to_string),
                client: init_params,
                created_ms: now,
                last_seen_ms: now,
            };
            let stored = match SessionKey::session(&id) {
                Some(key) => gate.store.create(&key, &record).await,
                None => Err(crate::mux::session_store::SessionStoreError(
                    "rmcp assigned a malformed session id".into(),
                )),
            };
            if let Err(e) = stored {
                use rmcp::transport::streamable_http_server::session::SessionManager;
                let _ = gate.manager.close_session(&id.into()).await;
                return store_unavailable(&e);
            }
        }
    } else if let (Some(id), Some(principal)) = (&session, adopted) {
        gate.ledger.adopt(id, &principal);
    }
    response
}

/// Subjects graph-os gives anonymous callers itself (never a name or address they share).
const ANONYMOUS_PREFIX: &str = "anon:";

/// The principal of an anonymous 2025 session: its own id's digest (the id, 256 random bits,
/// is the session's only credential).
fn anonymous_session_subject(session: &str) -> String {
    format!(
        "{ANONYMOUS_PREFIX}s:{}",
        &crate::digest::sha256_hex(session.as_bytes())[..32]
    )
}

/// What keys an anonymous request without a session.
enum Sessionless {
    /// Local development (no credential source, loopback): the client program on this host (its
    /// `User-Agent`'s digest), so two programs keep apart while one program's several
    /// connections (a 2026 client's listen stream beside its calls) share one loaded set.
    Program(Option<String>),
    /// `--anonymous-scope` beside a credential source: the connection, never reused.
    Connection(Option<super::listener::ConnectionId>),
}

/// An anonymous caller's own principal and the key its sessions are counted under, or `None`
/// for every other caller. Anonymous callers are never one principal by name — they would list
/// each other's tasks and share, load and unload each other's tools:
/// - a request of a 2025 session is that session's principal (`anon:s:<digest of its id>`);
/// - a session-less request (2026 era, or an `initialize` until rmcp names the session) is its
///   connection's with `--anonymous-scope` (`anon:c:<random connection id>`), and in local
///   development its client program's on this host (`anon:p:<address>:<user-agent digest>`);
/// - an explicit handle (`Mcp-Principal`, local development) or an unverifiable bearer keeps
///   the key it names: the client chose to share it.
///
/// Sessions are counted against the caller's address (`anon-addr:<ip>`): one host cannot take
/// every session by being a new principal each time.
fn anonymous_subject(
    identity: &Identity,
    session: Option<&str>,
    sessionless: Sessionless,
    ip: Option<std::net::IpAddr>,
) -> Option<(String, String)> {
    if identity.kind != crate::auth::CredentialKind::Anonymous
        || identity.subject.starts_with("handle:")
        || identity.subject.starts_with("bearer:")
    {
        return None;
    }
    let address = ip.map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
    let subject = match (session, sessionless) {
        (Some(id), _) => anonymous_session_subject(id),
        (None, Sessionless::Connection(Some(c))) => format!("{ANONYMOUS_PREFIX}c:{:032x}", c.0),
        (None, Sessionless::Program(agent)) => format!(
            "{ANONYMOUS_PREFIX}p:{address}:{}",
            agent.as_deref().map_or("none", |a| &a[..16])
        ),
        // No connection (a request served without the listener): its own principal.
        (None, Sessionless::Connection(None)) => format!(
            "{ANONYMOUS_PREFIX}r:{:032x}",
            super::listener::ConnectionId::new().0
        ),
    };
    Some((subject, format!("anon-addr:{address}")))
}

/// Just enough of a JSON-RPC request for the access log and the front span.
#[derive(serde::Deserialize)]
struct Observed<'a> {
    #[serde(borrow, default)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<ObservedParams<'a>>,
}

#[derive(serde::Deserialize)]
struct ObservedParams<'a> {
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
}

/// The JSON-RPC method of a POST body and, for `tools/call`, its tool name, as the access log
/// and the front span name them (public for the differential fuzz target `admission_diff`).
pub fn observed_call(bytes: &[u8]) -> (Option<String>, Option<String>) {
    let Ok(o) = serde_json::from_slice::<Observed>(bytes) else {
        return (None, None);
    };
    let method = o.method.map(|m| m.into_owned());
    let tool = match method.as_deref() {
        Some("tools/call") => o.params.and_then(|p| p.name).map(|n| n.into_owned()),
        _ => None,
    };
    (method, tool)
}

/// A `tools/call` body whose `params._meta` carries the current (front) span's trace context.
fn with_trace_meta(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut message: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let params = message.get_mut("params")?.as_object_mut()?;
    let meta = params
        .entry("_meta")
        .or_insert_with(|| serde_json::Value::Object(Default::default()))
        .as_object_mut()?;
    crate::telemetry::trace::inject_meta(meta);
    serde_json::to_vec(&message).ok()
}

/// The front span of an HTTP request (`/mcp` only, when traces are on) and its access line:
/// the span's parent is the request's `traceparent` header; the line is written when the
/// response body has ended.
async fn observe(mut req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use crate::telemetry::{access, trace};
    use tracing::Instrument;
    let traced = trace::enabled() && req.uri().path() == "/mcp";
    if !access::enabled() && !traced {
        return next.run(req).await;
    }
    let started = std::time::Instant::now();
    let note = access::RequestNote::default();
    req.extensions_mut().insert(note.clone());
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let span = if traced {
        let span = tracing::info_span!(
            "mcp.http",
            otel.name = %format!("{method} /mcp"),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            http.request.method = %method,
            url.path = %path,
            http.response.status_code = tracing::field::Empty,
            mcp.method.name = tracing::field::Empty,
            gen_ai.tool.name = tracing::field::Empty,
            mcp.session.id = tracing::field::Empty,
        );
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        trace::set_remote_parent(
            &span,
            header(trace::TRACEPARENT).as_deref(),
            header(trace::TRACESTATE).as_deref(),
        );
        if let Some(id) = header("mcp-session-id") {
            span.record("mcp.session.id", id.as_str());
        }
        span
    } else {
        tracing::Span::none()
    };
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    let line = access::enabled().then(|| access::AccessLine {
        note,
        method,
        path,
        status: status.as_u16(),
        started,
    });
    // The span and the line end with the body (a streamed answer is part of the request).
    response.map(|body| {
        axum::body::Body::new(http_body_util::BodyExt::map_frame(body, move |frame| {
            let _ = (&span, &line);
            frame
        }))
    })
}

/// A POST body with its 2025 task request renamed, if it holds one.
fn mark_body(bytes: &[u8]) -> Option<Vec<u8>> {
    crate::wire::task_marks::mark_front_request(bytes)
}

/// A response chunk (one JSON body, or SSE events) with task marks turned back into the 2025
/// fields. rmcp writes each SSE event as one chunk; a chunk without a mark is passed as is.
fn unmark_chunk(chunk: axum::body::Bytes) -> axum::body::Bytes {
    use crate::wire::task_marks::{may_hold_marks, unmark_front_message};
    if !may_hold_marks(&chunk) {
        return chunk;
    }
    if let Some(json) = unmark_front_message(&chunk) {
        return json.into();
    }
    let mut out = Vec::with_capacity(chunk.len());
    let mut changed = false;
    for line in chunk.split_inclusive(|b| *b == b'\n') {
        let (body, end) = match line.strip_suffix(b"\n") {
            Some(b) => (b, &b"\n"[..]),
            None => (line, &b""[..]),
        };
        let (body, cr) = match body.strip_suffix(b"\r") {
            Some(b) => (b, &b"\r"[..]),
            None => (body, &b""[..]),
        };
        let data = body
            .strip_prefix(b"data: ")
            .or_else(|| body.strip_prefix(b"data:"));
        match data.and_then(unmark_front_message) {
            Some(json) => {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&json);
                changed = true;
            }
            None => out.extend_from_slice(body),
        }
        out.extend_from_slice(cr);
        out.extend_from_slice(end);
    }
    if changed { out.into() } else { chunk }
}

/// A 2026-era principal's state, created on its first request.
async fn principal_state(
    store: &dyn SessionStore,
    subject: &str,
) -> Result<Fetched, crate::mux::session_store::SessionStoreError> {
    let key = SessionKey::principal(subject);
    if let Some(f) = store.fetch(&key).await? {
        return Ok(f);
    }
    let now = now_ms();
    let record = SessionRecord {
        principal: subject.to_string(),
        created_ms: now,
        last_seen_ms: now,
        ..SessionRecord::default()
    };
    store.create(&key, &record).await?;
    Ok(store.fetch(&key).await?.unwrap_or(Fetched {
        record,
        ..Fetched::default()
    }))
}

/// SIGINT or SIGTERM: which one came (`"SIGINT"`, `"SIGTERM"`). The handlers are installed
/// when this is called, not when the future is first polled: a signal that arrives after the
/// caller said it is ready is never left to the default disposition (which kills silently).
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = &'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).ok();
        let mut int = signal(SignalKind::interrupt()).ok();
        async move {
            let term = async {
                match term.as_mut() {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            let int = async {
                match int.as_mut() {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! { _ = int => "SIGINT", _ = term => "SIGTERM" }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
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
    // Before anything says it listens: a SIGTERM from then on drains (see `shutdown_signal`).
    let signal = shutdown_signal();
    let listener = tokio::net::TcpListener::bind(opts.addr)
        .await
        .map_err(|e| listen_error(opts.addr, opts.serve_mcp, &e))?;
    tracing::info!(addr = %listener.local_addr()?, mcp = opts.serve_mcp, "HTTP listening");
    let sessions_ct = CancellationToken::new();
    let store = opts.serve_mcp.then(|| session_store(&opts));
    let operator_hosts = {
        let mut hosts = loopback_hosts(opts.addr.port());
        hosts.extend(opts.allowed_hosts.iter().cloned());
        hosts
    };
    let mut app = admin_router(
        mux.clone(),
        store.clone(),
        opts.credentials.clone(),
        operator_hosts.clone(),
    )
    .merge(super::rest::router(mux.clone(), opts.credentials.clone()))
    .merge(super::status_page::router(
        mux.clone(),
        opts.credentials.clone(),
        operator_hosts,
    ));
    // Draining (see `Gate::draining`).
    let draining = CancellationToken::new();
    let mut door = None;
    if let Some(store) = store {
        tracing::info!(kind = store.kind(), "session store");
        let (mcp, mcp_door) = mcp_router(
            mux.clone(),
            &opts,
            store,
            sessions_ct.clone(),
            draining.clone(),
        );
        app = app.merge(mcp);
        door = Some(mcp_door as Arc<dyn super::listener::FrontDoor>);
    }
    // Outermost: the access line and the front span see every request, refusals included.
    // Both are switched on at start or never; without them the layer is left out (each layer
    // costs every request, the forwarding hot path included), and `/mcp` takes the front door
    // past the router.
    if crate::telemetry::access::enabled() || crate::telemetry::trace::enabled() {
        app = app.layer(axum::middleware::from_fn(observe));
        door = None;
    }
    let stop_accepting = CancellationToken::new();
    let server = tokio::spawn(super::listener::serve(
        listener,
        app,
        door,
        stop_accepting.clone(),
        opts.listener,
    ));
    let name = signal.await;
    tracing::info!(
        signal = name,
        "shutdown requested: draining in-flight calls"
    );
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
