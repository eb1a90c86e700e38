//! Logging setup. Logs always go to stderr: stdout belongs to the stdio MCP transport.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `GRAPH_OS_LOG` (or `RUST_LOG`) sets the filter; default `info`.
pub fn init(default: &str) {
    let filter = std::env::var("GRAPH_OS_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("{default},rmcp=warn")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
