//! The MCP face of graph-os: protocol glue only.
//!
//! - [`handler`]: the rmcp `ServerHandler`; turns each request into a `Caller` and one
//!   multiplexer call.
//! - [`meta_table`]: the meta tools' descriptors and the table from name to multiplexer method.
//! - [`streams`]: notification streams of sessions and the 2026-era principals table.
//! - [`observer`]: the protocol half of a call's child→client traffic (a `FrontSink`).
//! - [`era`]: result translation between protocol eras.
//! - [`wire`]: the one mapping of errors to JSON-RPC errors, tool-error results and HTTP statuses.
//! - [`http`], [`sessions`], [`rest`]: the HTTP listener (authentication, session caps), and the
//!   admin REST API.
//!
//! Nothing here touches a child: every child operation is a `Multiplexer` method taking a
//! `Caller`, so authorization, bounds and tenant routing are decided in one place
//! (`tests/structure.rs` keeps this true).

pub mod era;
pub mod handler;
pub mod http;
pub mod meta_table;
pub mod observer;
pub mod rest;
pub mod sessions;
pub mod streams;
pub mod wire;

use std::sync::Arc;

pub use handler::GatewayHandler;
pub use meta_table::{META_TOOLS, meta_tools};
pub use streams::{FrontSession, FrontStreams, Principals};
pub use wire::{ERROR_META_KEY, error_result};

use crate::mux::Multiplexer;

/// Serves MCP on stdin/stdout until the client disconnects.
pub async fn serve_stdio(mux: Arc<Multiplexer>) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let handler = GatewayHandler::new(mux.clone());
    let running = handler.serve(rmcp::transport::stdio()).await?;
    let reason = running.waiting().await;
    tracing::info!(?reason, "stdio client disconnected");
    mux.shutdown().await;
    Ok(())
}
