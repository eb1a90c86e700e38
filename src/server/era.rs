//! Protocol-era bridging for results relayed from a child to the front client.
//!
//! A 2025-era child omits `resultType`; the spec says an absent field means `"complete"`, but a
//! 2026-07-28 client requires it on the wire. Relayed results are therefore normalized to carry
//! it explicitly; rmcp strips it again for fronts that negotiated an older version, so each side
//! sees its own era.

use rmcp::model::{CallToolResult, GetPromptResult, ReadResourceResult, ResultType};
use rmcp::service::{RequestContext, RoleServer};

/// Whether the request was made in the 2026-07-28 era (no `initialize`).
pub fn is_modern(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version().is_some_and(|v| !v.has_initialize())
}

/// Normalizes a relayed tool result.
pub fn call_result(mut r: CallToolResult) -> CallToolResult {
    r.result_type.get_or_insert(ResultType::COMPLETE);
    r
}

/// Normalizes a relayed prompt result.
pub fn prompt_result(mut r: GetPromptResult) -> GetPromptResult {
    r.result_type.get_or_insert(ResultType::COMPLETE);
    r
}

/// Normalizes a relayed resource read.
pub fn resource_result(mut r: ReadResourceResult) -> ReadResourceResult {
    r.result_type.get_or_insert(ResultType::COMPLETE);
    r
}
