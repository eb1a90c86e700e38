//! Protocol-era bridging for results relayed from a child to the front client.
//!
//! A 2025-era child omits `resultType`; the spec says an absent field means `"complete"`, but a
//! 2026-07-28 client requires it on the wire. Relayed results are therefore normalized to carry
//! it explicitly; rmcp strips it again for fronts that negotiated an older version, so each side
//! sees its own era.

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResult, GetPromptResponse, GetPromptResult, ReadResourceResponse, ReadResourceResult,
    ResultType,
};
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

/// A 2026-07-28 child's `input_required` answer to prompts/get or resources/read: a 2026 client
/// gets it (and retries through graph-os); a 2025 client cannot, and graph-os relays client
/// input for tools/call only.
fn input_unsupported(method: &str) -> McpError {
    McpError::new(
        rmcp::model::ErrorCode(crate::mux::RELAY_REFUSED),
        format!(
            "the child asked for client input on {method}; a 2025-era client can answer that only for tools/call"
        ),
        Some(serde_json::json!({"code": "input-required-unsupported"})),
    )
}

/// Normalizes a relayed prompts/get answer for the front's era.
pub fn prompt_response(r: GetPromptResponse, modern: bool) -> Result<GetPromptResponse, McpError> {
    match r {
        GetPromptResponse::Complete(r) => Ok(GetPromptResponse::Complete(prompt_result(r))),
        GetPromptResponse::InputRequired(_) if !modern => Err(input_unsupported("prompts/get")),
        other => Ok(other),
    }
}

/// Normalizes a relayed resources/read answer for the front's era.
pub fn resource_response(
    r: ReadResourceResponse,
    modern: bool,
) -> Result<ReadResourceResponse, McpError> {
    match r {
        ReadResourceResponse::Complete(r) => Ok(ReadResourceResponse::Complete(resource_result(r))),
        ReadResourceResponse::InputRequired(_) if !modern => {
            Err(input_unsupported("resources/read"))
        }
        other => Ok(other),
    }
}
