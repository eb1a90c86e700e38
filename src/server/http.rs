//! The HTTP face: `/mcp` (MCP streamable HTTP), `/healthz`, `/readyz`, `/metrics`.
//!
//! Host and Origin are validated on `/mcp` (DNS-rebinding protection): a foreign `Host` or a
//! foreign `Origin` gets 403. Shutdown is graceful: SIGTERM/SIGINT stops accepting, lets
//! in-flight calls finish (up to a deadline), then closes sessions and children.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::GatewayHandler;
use crate::child::ChildState;
use crate::mux::Multiplexer;

/// Options of the HTTP listener.
#[derive(Debug, Clone)]
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
    /// Bearer tokens for the REST API and MCP scopes.
    pub tokens: Arc<super::auth::Tokens>,
}

/// `/healthz`, `/readyz` and `/metrics` over the served multiplexer.
pub fn admin_router(mux: Arc<Multiplexer>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(mux)
}

/// Readiness: the configuration is valid (no rejected reload pending) and every child has
/// settled (up or failed) so the catalog is being served.
pub fn readiness(mux: &Multiplexer) -> (bool, serde_json::Value) {
    let fleet = mux.fleet();
    let starting: Vec<&String> = fleet
        .children
        .iter()
        .filter(|(_, c)| matches!(c.status().state, ChildState::Starting))
        .map(|(n, _)| n)
        .collect();
    let reload_error = mux.reload_error();
    // A replica that cannot reproduce the recorded generation is not ready.
    let follow_error = mux.follow_error();
    let ready = starting.is_empty() && reload_error.is_none() && follow_error.is_none();
    (
        ready,
        serde_json::json!({"ready": ready, "starting": starting, "reload_error": reload_error, "generation_error": follow_error}),
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
    let view = mux.view();
    for (name, child) in &mux.fleet().children {
        let load = child.load();
        let breaker = match child.breaker_state() {
            crate::child::BreakerState::Closed => 0,
            crate::child::BreakerState::HalfOpen => 1,
            crate::child::BreakerState::Open => 2,
        };
        let tools = view.tools.values().filter(|t| &t.server == name).count();
        m.child_gauges(
            name,
            load.in_flight,
            load.queued,
            breaker,
            tools,
            child.status().state == ChildState::Up,
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

/// The `/mcp` router: one [`GatewayHandler`] (session) per MCP session.
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
    let service = StreamableHttpService::new(
        {
            let principals = Arc::new(super::Principals::default());
            let tokens = opts.tokens.clone();
            move || {
                Ok(GatewayHandler::with_principals(
                    mux.clone(),
                    principals.clone(),
                    tokens.clone(),
                ))
            }
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new().route_service("/mcp", service)
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
    mux.fleet()
        .children
        .values()
        .map(|c| c.load().in_flight + c.load().queued)
        .sum()
}

/// Serves HTTP until SIGTERM/SIGINT, then drains and stops. `extra` runs beside it (the stdio
/// front when only admin endpoints are served); its end also stops the server.
pub async fn serve(mux: Arc<Multiplexer>, opts: HttpOptions) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(opts.addr).await?;
    tracing::info!(addr = %listener.local_addr()?, mcp = opts.serve_mcp, "HTTP listening");
    let sessions_ct = CancellationToken::new();
    let mut app =
        admin_router(mux.clone()).merge(super::rest::router(mux.clone(), opts.tokens.clone()));
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
