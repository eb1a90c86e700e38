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

pub mod envelope;
pub mod era;
pub use fast::hot_call_view;
mod fast;
pub mod handler;
pub mod http;
pub mod listener;
pub mod meta_table;
pub mod observer;
pub mod rest;
mod self_wake;
pub mod sessions;
pub mod status_page;
mod stdio_io;
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
    use crate::wire::task_marks::{MappedLines, mark_front_request, unmark_front_message};
    use rmcp::ServiceExt;
    let handler = GatewayHandler::new(mux.clone());
    // One writer to stdout for rmcp and the hot path (`fast`): whole lines, in order.
    let (out, lines) = fast::FrontOut::new();
    let pump = tokio::spawn(fast::pump_out(
        lines,
        stdio_io::stdout(),
        unmark_front_message,
    ));
    let hot = fast::StdioFast::new(mux.clone(), handler.clone(), out.clone());
    let tap = hot.clone();
    // 2025-11-25 task requests and fields rmcp does not model travel as marks beneath it (see
    // `wire::task_marks`): requests are renamed on the way in, marks turned back on the
    // way out by the pump. The hot path sees each request first.
    let input = MappedLines::new(stdio_io::stdin(), mark_front_request)
        .with_max_line(MAX_STDIN_LINE)
        .with_tap(Arc::new(move |line: &[u8], _ahead| tap.tap(line)));
    let signal = http::shutdown_signal();
    tokio::pin!(signal);
    tracing::info!("waiting for an MCP client on stdin (logs go to stderr)");
    let served = tokio::select! {
        served = handler.serve((input, out.writer())) => served,
        name = &mut signal => {
            tracing::info!(signal = name, "stopping: no client had initialized");
            mux.shutdown().await;
            return Ok(());
        }
    };
    let running = match served {
        Ok(running) => running,
        // stdin ended before `initialize` (a client that only probed, or none): not a failure.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            tracing::info!("the stdio client left before initialize");
            mux.shutdown().await;
            return Ok(());
        }
        Err(e) => {
            mux.shutdown().await;
            return Err(e.into());
        }
    };
    hot.ready(running.peer().clone());
    drop(out);
    let stop = running.cancellation_token();
    let waiting = running.waiting();
    tokio::pin!(waiting);
    tokio::select! {
        reason = &mut waiting => tracing::info!(?reason, "stdio client disconnected"),
        name = &mut signal => {
            tracing::info!(signal = name, "stopping on signal");
            stop.cancel();
            let _ = waiting.await;
        }
    }
    drop(hot);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), pump).await;
    mux.shutdown().await;
    Ok(())
}

/// Longest stdin line (one JSON-RPC message) the stdio front reads.
pub const MAX_STDIN_LINE: usize = 64 * 1024 * 1024;
