//! The access log: one line per HTTP request, target `graph_os::access` (off unless
//! `--access-log`).
//!
//! Fields: `method`, `path` (never the query), `status`, `duration_ms` (until the response body
//! ended: a streamed answer counts whole), `principal` (the first 16 hex digits of the SHA-256
//! of the authenticated subject: stable per caller, never the token or subject itself; `-`
//! when unknown), `mcp_method` and `tool` (for a JSON-RPC request on `/mcp`; `-` otherwise).
//! `mcp_method`, `tool` and `path` are client text: text lines escape them (and every other
//! field) in the one field formatter, [`super::logs::EscapedFields`], never here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

static ENABLED: AtomicBool = AtomicBool::new(false);

pub(super) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether access lines are written.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The stable, non-reversible digest of a principal that logs and traces carry.
pub fn principal_digest(subject: &str) -> String {
    crate::digest::sha256_hex(subject.as_bytes())[..16].to_string()
}

/// What the layers beneath learn about a request (who, which MCP method and tool), shared
/// with the access line through the request's extensions.
#[derive(Clone, Debug, Default)]
pub struct RequestNote(Arc<Mutex<NoteFields>>);

#[derive(Debug, Default)]
struct NoteFields {
    principal: Option<String>,
    mcp_method: Option<String>,
    tool: Option<String>,
}

/// Longest MCP method or tool name kept in a note (a name is at most 64 characters; anything
/// longer is a client sending junk).
const MAX_NAME: usize = 128;

fn bounded(s: &str) -> String {
    super::redact::clip(s, MAX_NAME)
}

impl RequestNote {
    /// The authenticated subject (stored as its digest).
    pub fn principal(&self, subject: &str) {
        if let Ok(mut f) = self.0.lock() {
            f.principal = Some(principal_digest(subject));
        }
    }

    /// The JSON-RPC method and, for `tools/call`, the tool name.
    pub fn mcp(&self, method: Option<&str>, tool: Option<&str>) {
        if let Ok(mut f) = self.0.lock() {
            f.mcp_method = method.map(bounded);
            f.tool = tool.map(bounded);
        }
    }

    fn fields(&self) -> (String, String, String) {
        let f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let dash = || "-".to_string();
        (
            f.principal.clone().unwrap_or_else(dash),
            f.mcp_method.clone().unwrap_or_else(dash),
            f.tool.clone().unwrap_or_else(dash),
        )
    }
}

/// Writes the access line of one request when dropped (after its response body ended).
pub struct AccessLine {
    /// The request's note.
    pub note: RequestNote,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Response status.
    pub status: u16,
    /// When the request arrived.
    pub started: Instant,
}

impl Drop for AccessLine {
    fn drop(&mut self) {
        let (principal, mcp_method, tool) = self.note.fields();
        let duration_ms = (self.started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        tracing::info!(
            target: "graph_os::access",
            method = %self.method,
            path = %self.path,
            status = self.status,
            duration_ms,
            principal = %principal,
            mcp_method = %mcp_method,
            tool = %tool,
            "request"
        );
    }
}
